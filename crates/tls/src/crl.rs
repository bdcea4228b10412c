//! The CA's certificate revocation list, for etcd (`--client-crl-file`): etcd keeps its own
//! trust and never sees trireme's deny list (`revoke.rs`), so every `trireme ca revoke` also
//! puts the certificate's serial number here, and the operator copies `crl.pem` to each etcd
//! member. etcd reads the file at every new connection: no restart.
//!
//! The serials live in `revoked-serials` beside the CA's key, one line each (hex serial,
//! seconds since the Unix epoch); `crl.pem` is rewritten from them, signed by the CA, at each
//! revocation. The list only grows.

use std::path::{Path, PathBuf};

use rcgen::{CertificateRevocationListParams, KeyIdMethod, RevokedCertParams, SerialNumber};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

use crate::{io, write, Ca, TlsError, LEAF_DAYS};

/// The CRL's file in the CA's directory.
pub const CA_CRL: &str = "crl.pem";
/// The revoked serials the CRL is made from.
pub const REVOKED_SERIALS: &str = "revoked-serials";

/// Most serials the list holds: a bound on what a corrupt or hostile file makes us read.
const MAX_SERIALS: usize = 100_000;

fn parse_x509<'a>(
    der: &'a [u8],
    what: impl FnOnce() -> String,
) -> Result<x509_parser::certificate::X509Certificate<'a>, TlsError> {
    x509_parser::parse_x509_certificate(der)
        .map(|(_, x)| x)
        .map_err(|e| TlsError::Bad {
            path: what(),
            what: e.to_string(),
        })
}

/// A certificate's serial number, lower-case hex.
pub fn serial_of(cert: &CertificateDer<'_>) -> Result<String, TlsError> {
    let x = parse_x509(cert, || "the certificate".into())?;
    Ok(hex(x.tbs_certificate.raw_serial()))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.is_empty() || !s.len().is_multiple_of(2) || s.len() > 64 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// One revoked serial and when.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    serial: Vec<u8>,
    at: i64,
}

fn parse(path: &Path, text: &str) -> Result<Vec<Entry>, TlsError> {
    let bad = |n: usize, what: &str| TlsError::Bad {
        path: path.display().to_string(),
        what: format!("line {n}: {what}"),
    };
    let mut out = Vec::new();
    for (n, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        if out.len() == MAX_SERIALS {
            return Err(bad(n + 1, "more serials than a CRL of ours holds"));
        }
        let mut f = line.split_whitespace();
        let (Some(s), Some(at), None) = (f.next(), f.next(), f.next()) else {
            return Err(bad(n + 1, "expected `SERIAL SECONDS`"));
        };
        let serial = unhex(s).ok_or_else(|| bad(n + 1, "the serial is not hex"))?;
        let at = at
            .parse()
            .map_err(|_| bad(n + 1, "the time is not a number"))?;
        out.push(Entry { serial, at });
    }
    Ok(out)
}

/// How many serials a `revoked-serials` text holds, or what is wrong with it (for the fuzz
/// target: every text is refused or read, never a panic).
pub fn check_serials(text: &str) -> Result<usize, TlsError> {
    parse(Path::new(REVOKED_SERIALS), text).map(|l| l.len())
}

impl Ca {
    fn serials(&self) -> Result<Vec<Entry>, TlsError> {
        let path = self.dir.join(REVOKED_SERIALS);
        match std::fs::read_to_string(&path) {
            Ok(text) => parse(&path, &text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(io(&path)(e)),
        }
    }

    /// Refuses a certificate this CA did not issue.
    pub fn check_issued(&self, cert: &CertificateDer<'_>) -> Result<(), TlsError> {
        self.issued_serial(cert).map(|_| ())
    }

    /// The serial of `cert`, if this CA issued it.
    fn issued_serial(&self, cert: &CertificateDer<'_>) -> Result<Vec<u8>, TlsError> {
        let x = parse_x509(cert, || "the certificate".into())?;
        let ca_der = CertificateDer::from_pem_slice(self.cert_pem.as_bytes()).map_err(|e| {
            TlsError::Bad {
                path: self.dir.join(crate::CA_CERT).display().to_string(),
                what: e.to_string(),
            }
        })?;
        let ca = parse_x509(&ca_der, || {
            self.dir.join(crate::CA_CERT).display().to_string()
        })?;
        if x.issuer() != ca.subject() {
            return Err(TlsError::Usage(format!(
                "the certificate was issued by {}, not by the CA in {} ({})",
                x.issuer(),
                self.dir.display(),
                ca.subject()
            )));
        }
        Ok(x.tbs_certificate.raw_serial().to_vec())
    }

    /// Puts `cert`'s serial on the CA's revocation list (once) and rewrites `crl.pem`; returns
    /// its path. The certificate must be one this CA issued.
    pub fn revoke(&self, cert: &CertificateDer<'_>) -> Result<PathBuf, TlsError> {
        let serial = self.issued_serial(cert)?;
        let mut list = self.serials()?;
        if !list.iter().any(|e| e.serial == serial) {
            list.push(Entry {
                serial,
                at: time::OffsetDateTime::now_utc().unix_timestamp(),
            });
            let text: String = list
                .iter()
                .map(|e| format!("{} {}\n", hex(&e.serial), e.at))
                .collect();
            write(&self.dir.join(REVOKED_SERIALS), &text, false)?;
        }
        self.write_crl_of(&list)
    }

    /// Writes `crl.pem` from the revoked serials (an empty list at first); returns its path.
    pub fn write_crl(&self) -> Result<PathBuf, TlsError> {
        let list = self.serials()?;
        self.write_crl_of(&list)
    }

    fn write_crl_of(&self, list: &[Entry]) -> Result<PathBuf, TlsError> {
        let now = time::OffsetDateTime::now_utc();
        let params = CertificateRevocationListParams {
            this_update: now - time::Duration::hours(1),
            next_update: now + time::Duration::days(LEAF_DAYS),
            // Later lists have larger numbers: the time they were made.
            crl_number: SerialNumber::from(now.unix_timestamp().max(0) as u64),
            issuing_distribution_point: None,
            revoked_certs: list
                .iter()
                .map(|e| RevokedCertParams {
                    serial_number: SerialNumber::from_slice(&e.serial),
                    revocation_time: time::OffsetDateTime::from_unix_timestamp(e.at).unwrap_or(now),
                    reason_code: None,
                    invalidity_date: None,
                })
                .collect(),
            key_identifier_method: KeyIdMethod::Sha256,
        };
        let crl = params.signed_by(&self.issuer()?)?;
        let path = self.dir.join(CA_CRL);
        write(&path, &crl.pem()?, false)?;
        Ok(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serial_lines_parse_and_bad_ones_are_named() {
        let p = Path::new("revoked-serials");
        let ok = parse(p, "0a1b 1700000000\n\nff 1\n").unwrap();
        assert_eq!(ok.len(), 2);
        assert_eq!(ok[0].serial, vec![0x0a, 0x1b]);
        for bad in ["zz 1", "0a", "0a 1 2", "0a1 5", "0a x"] {
            let e = parse(p, bad).unwrap_err().to_string();
            assert!(e.contains("line 1"), "{bad}: {e}");
        }
    }

    fn crl_serials(path: &Path) -> Vec<String> {
        use rustls::pki_types::pem::PemObject;
        let der = rustls::pki_types::CertificateRevocationListDer::from_pem_file(path).unwrap();
        let (_, crl) = x509_parser::parse_x509_crl(&der).unwrap();
        crl.iter_revoked_certificates()
            .map(|r| hex(r.raw_serial()))
            .collect()
    }

    #[test]
    fn a_revoked_certificate_is_in_the_crl_once_and_a_foreign_one_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let ca = Ca::init(&d.path().join("ca")).unwrap();
        let empty = ca.write_crl().unwrap();
        assert!(crl_serials(&empty).is_empty());
        let leaf = |ca: &Ca| {
            let i = ca.issue(&crate::Role::Node(3), &[]).unwrap();
            let pem = i.cert_pem.clone();
            use rustls::pki_types::pem::PemObject;
            CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
        };
        let (a, b) = (leaf(&ca), leaf(&ca));
        ca.revoke(&a).unwrap();
        ca.revoke(&a).unwrap();
        let path = ca.revoke(&b).unwrap();
        let got = crl_serials(&path);
        assert_eq!(got, vec![serial_of(&a).unwrap(), serial_of(&b).unwrap()]);
        // What etcd reads: the CRL as PEM, in the CA's directory.
        assert!(std::fs::read_to_string(&path)
            .unwrap()
            .starts_with("-----BEGIN X509 CRL-----"));
        let other = Ca::init(&d.path().join("other")).unwrap();
        let e = ca.revoke(&leaf(&other)).unwrap_err().to_string();
        assert!(e.contains("not by the CA"), "{e}");
    }
}
