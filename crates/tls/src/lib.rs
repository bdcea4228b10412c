//! Identity and encryption: a cluster CA, certificates that name their role, and the rustls
//! configurations every TLS link of trireme uses.
//!
//! A cluster has one CA (`ca-cert.pem`, `ca-key.pem`; `trireme up` creates one in its data
//! directory, `trireme ca init` for several servers). Every certificate it issues names its
//! holder's role in a URI subject alternative name, `urn:trireme:node:3`,
//! `urn:trireme:client:NAME` or `urn:trireme:server`, so a peer is authorized by what the CA
//! said it is, never by an address. Certificates are written in the layout qemu's
//! `tls-creds-x509` and libnbd's `tls-certificates=DIR` read: `ca-cert.pem` beside
//! `client-cert.pem` / `client-key.pem` (or `server-…`, `node-…`). Private keys are 0600.
//!
//! Crypto is rustls over *ring*, TLS 1.2 and 1.3 with rustls' safe defaults; keys are ECDSA
//! P-256.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

pub mod crl;
pub mod local;
pub mod reload;
pub mod revoke;

pub use rustls;
pub use tokio_rustls;

/// The CA's certificate (beside every issued certificate too).
pub const CA_CERT: &str = "ca-cert.pem";
/// The CA's private key (only in the CA's directory).
pub const CA_KEY: &str = "ca-key.pem";

/// How long the CA is valid.
const CA_DAYS: i64 = 20 * 365;
/// How long an issued certificate is valid by default: a year. A certificate is re-issued in
/// place (`trireme ca issue ... --out` over its files) and picked up with no restart
/// (`reload.rs`); one that leaks is revoked (`trireme ca revoke`).
pub const LEAF_DAYS: i64 = 365;

/// Who a certificate's holder is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Role {
    /// The storage daemon of node N.
    Node(u32),
    /// A client: a host that attaches volumes, a remote CLI, an NBD client.
    Client(String),
    /// A TLS server that is not a node: an NBD export, a control port.
    Server,
    /// An operator, or the manager of `trireme up`: may do anything a node may (create and
    /// delete replicas, attach any volume).
    Admin,
}

impl Role {
    const PREFIX: &'static str = "urn:trireme:";

    fn uri(&self) -> String {
        match self {
            Role::Node(n) => format!("{}node:{n}", Self::PREFIX),
            Role::Client(name) => format!("{}client:{name}", Self::PREFIX),
            Role::Server => format!("{}server", Self::PREFIX),
            Role::Admin => format!("{}admin", Self::PREFIX),
        }
    }

    /// The role a certificate's URI names, if it is one of ours.
    pub fn from_uri(uri: &str) -> Option<Role> {
        let rest = uri.strip_prefix(Self::PREFIX)?;
        if rest == "server" {
            return Some(Role::Server);
        }
        if rest == "admin" {
            return Some(Role::Admin);
        }
        if let Some(n) = rest.strip_prefix("node:") {
            return n.parse().ok().filter(|&n| n > 0).map(Role::Node);
        }
        let name = rest.strip_prefix("client:")?;
        check_client_name(name).ok()?;
        Some(Role::Client(name.to_string()))
    }

    /// The file-name stem of its certificate and key (`client` → `client-cert.pem`).
    pub fn stem(&self) -> &'static str {
        match self {
            Role::Node(_) => "node",
            Role::Client(_) => "client",
            Role::Server => "server",
            Role::Admin => "admin",
        }
    }

    /// True for the roles trusted with every node operation: nodes (which run the manager)
    /// and operators.
    pub fn is_cluster(&self) -> bool {
        matches!(self, Role::Node(_) | Role::Admin)
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Role::Node(n) => write!(f, "node {n}"),
            Role::Client(name) => write!(f, "client {name}"),
            Role::Server => f.write_str("server"),
            Role::Admin => f.write_str("admin"),
        }
    }
}

/// A client name: what a volume's access list holds.
pub fn check_client_name(name: &str) -> Result<(), TlsError> {
    let ok = (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(TlsError::Usage(format!(
            "client name {name:?}: 1 to 64 letters, digits, '.', '_' or '-'"
        )))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: {what}")]
    Bad { path: String, what: String },
    #[error("issuing a certificate: {0}")]
    Issue(#[from] rcgen::Error),
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
    #[error("{0}")]
    Usage(String),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> TlsError + '_ {
    move |source| TlsError::Io {
        path: path.display().to_string(),
        source,
    }
}

fn read(path: &Path) -> Result<String, TlsError> {
    std::fs::read_to_string(path).map_err(io(path))
}

/// Writes `text` to `path` atomically, readable by its owner only when `secret`.
fn write(path: &Path, text: &str, secret: bool) -> Result<(), TlsError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(if secret { 0o600 } else { 0o644 })
        .open(&tmp)
        .map_err(io(&tmp))?;
    f.write_all(text.as_bytes()).map_err(io(&tmp))?;
    f.sync_all().map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io(path))
}

fn validity(params: &mut CertificateParams, days: i64) {
    let now = time::OffsetDateTime::now_utc();
    // An hour back, for clocks a little behind the CA's.
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(days);
}

/// A name a certificate is valid for: a DNS name or an IP address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum San {
    Dns(String),
    Ip(IpAddr),
}

impl std::str::FromStr for San {
    type Err = TlsError;
    fn from_str(s: &str) -> Result<San, TlsError> {
        if let Ok(ip) = s.parse() {
            return Ok(San::Ip(ip));
        }
        let ok = !s.is_empty()
            && s.len() <= 253
            && s.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            });
        if ok {
            Ok(San::Dns(s.to_string()))
        } else {
            Err(TlsError::Usage(format!(
                "{s:?} is neither an IP address nor a DNS name"
            )))
        }
    }
}

/// The cluster's certificate authority.
pub struct Ca {
    cert_pem: String,
    key: KeyPair,
    dir: PathBuf,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca").field("dir", &self.dir).finish()
    }
}

impl Ca {
    /// Creates a new CA in `dir` (created if needed). Refuses to replace an existing one.
    pub fn init(dir: &Path) -> Result<Ca, TlsError> {
        if dir.join(CA_KEY).exists() || dir.join(CA_CERT).exists() {
            return Err(TlsError::Usage(format!(
                "{} already holds a CA; certificates it issued would stop working if it were replaced",
                dir.display()
            )));
        }
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                .map_err(io(dir))?;
        }
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        // A name of its own, so two clusters' CAs are told apart (in logs and by verifiers).
        let tag = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            ^ u64::from(std::process::id()).rotate_left(32);
        params.distinguished_name.push(
            DnType::CommonName,
            format!("trireme cluster CA {:08x}", tag as u32),
        );
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        validity(&mut params, CA_DAYS);
        let cert = params.self_signed(&key)?;
        let cert_pem = cert.pem();
        write(&dir.join(CA_KEY), &key.serialize_pem(), true)?;
        write(&dir.join(CA_CERT), &cert_pem, false)?;
        let ca = Ca {
            cert_pem,
            key,
            dir: dir.to_path_buf(),
        };
        // An empty revocation list from the start: etcd refuses every connection while the
        // file its `--client-crl-file` names is missing.
        ca.write_crl()?;
        Ok(ca)
    }

    /// Opens the CA in `dir`.
    pub fn open(dir: &Path) -> Result<Ca, TlsError> {
        let cert_pem = read(&dir.join(CA_CERT))?;
        let key_path = dir.join(CA_KEY);
        let key = KeyPair::from_pem(&read(&key_path)?).map_err(|e| TlsError::Bad {
            path: key_path.display().to_string(),
            what: e.to_string(),
        })?;
        // Checks that the certificate parses and goes with the key.
        let ca = Ca {
            cert_pem,
            key,
            dir: dir.to_path_buf(),
        };
        ca.issuer()?;
        Ok(ca)
    }

    /// Opens the CA in `dir`, creating it first if there is none. Returns whether it was new.
    pub fn open_or_init(dir: &Path) -> Result<(Ca, bool), TlsError> {
        if dir.join(CA_KEY).exists() {
            Ok((Ca::open(dir)?, false))
        } else {
            Ok((Ca::init(dir)?, true))
        }
    }

    fn issuer(&self) -> Result<Issuer<'static, &KeyPair>, TlsError> {
        Issuer::from_ca_cert_pem(&self.cert_pem, &self.key).map_err(|e| TlsError::Bad {
            path: self.dir.join(CA_CERT).display().to_string(),
            what: e.to_string(),
        })
    }

    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Issues a certificate for `role`, valid as a server for `names` (a node's or server's
    /// addresses; clients need none), for [`LEAF_DAYS`].
    pub fn issue(&self, role: &Role, names: &[San]) -> Result<Issued, TlsError> {
        self.issue_for(role, names, LEAF_DAYS)
    }

    /// [`Ca::issue`], valid for `days` (1 to 3650).
    pub fn issue_for(&self, role: &Role, names: &[San], days: i64) -> Result<Issued, TlsError> {
        if !(1..=3650).contains(&days) {
            return Err(TlsError::Usage(format!(
                "a certificate is valid for 1 to 3650 days, not {days}"
            )));
        }
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        // The common name is the holder's etcd user (etcd's access control knows a client by
        // it): one per node, so that removing a node or revoking its certificate takes its
        // etcd user away and no other node's; one per client name, whose volumes differ.
        params.distinguished_name.push(
            DnType::CommonName,
            match role {
                Role::Node(n) => format!("trireme node {n}"),
                Role::Client(c) => format!("trireme client {c}"),
                Role::Server => "trireme server".to_string(),
                Role::Admin => "trireme admin".to_string(),
            },
        );
        params.subject_alt_names.push(SanType::URI(
            role.uri()
                .try_into()
                .map_err(|e: rcgen::Error| TlsError::Usage(e.to_string()))?,
        ));
        for n in names {
            params.subject_alt_names.push(match n {
                San::Ip(ip) => SanType::IpAddress(*ip),
                San::Dns(d) => SanType::DnsName(
                    d.clone()
                        .try_into()
                        .map_err(|e: rcgen::Error| TlsError::Usage(e.to_string()))?,
                ),
            });
        }
        // Key encipherment too: GnuTLS (qemu, libnbd) checks for it whatever the key type.
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        // Nodes are servers to writers and clients of each other; a client only connects; a
        // server (an NBD export) only serves.
        params.extended_key_usages = match role {
            Role::Node(_) => vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
            Role::Client(_) | Role::Admin => vec![ExtendedKeyUsagePurpose::ClientAuth],
            Role::Server => vec![ExtendedKeyUsagePurpose::ServerAuth],
        };
        params.use_authority_key_identifier_extension = true;
        validity(&mut params, days);
        let cert = params.signed_by(&key, &self.issuer()?)?;
        Ok(Issued {
            role: role.clone(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            ca_pem: self.cert_pem.clone(),
        })
    }
}

/// A certificate just issued, with its key and the CA's certificate.
pub struct Issued {
    pub role: Role,
    pub cert_pem: String,
    pub key_pem: String,
    pub ca_pem: String,
}

impl std::fmt::Debug for Issued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issued").field("role", &self.role).finish()
    }
}

impl Issued {
    /// Writes `ca-cert.pem`, `<stem>-cert.pem` and `<stem>-key.pem` (0600) into `dir`.
    pub fn write(&self, dir: &Path) -> Result<(), TlsError> {
        use std::os::unix::fs::PermissionsExt;
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        // The directory holds a key: only its owner may list or enter it.
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(io(dir))?;
        let stem = self.role.stem();
        write(&dir.join(CA_CERT), &self.ca_pem, false)?;
        write(&dir.join(format!("{stem}-key.pem")), &self.key_pem, true)?;
        write(&dir.join(format!("{stem}-cert.pem")), &self.cert_pem, false)
    }
}

/// A process's TLS identity: its certificate and key, and the CA whose certificates it trusts.
#[derive(Debug, Clone)]
pub struct Identity {
    pub role: Role,
    certs: Vec<CertificateDer<'static>>,
    key: Arc<PrivateKeyDer<'static>>,
    roots: Arc<rustls::RootCertStore>,
    /// Where it was loaded from (`dir`, `stem`): configurations built from it pick up a
    /// re-issued certificate there (`reload.rs`).
    from: Option<(PathBuf, String)>,
}

fn bad(path: &Path, what: impl std::fmt::Display) -> TlsError {
    TlsError::Bad {
        path: path.display().to_string(),
        what: what.to_string(),
    }
}

fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs: Vec<_> = CertificateDer::pem_slice_iter(read(path)?.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| bad(path, e))?;
    if certs.is_empty() {
        return Err(bad(path, "no certificate in it"));
    }
    Ok(certs)
}

/// The CA certificate in `path` as a trust store.
pub fn load_roots(path: &Path) -> Result<Arc<rustls::RootCertStore>, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for c in load_certs(path)? {
        roots.add(c).map_err(|e| bad(path, e))?;
    }
    Ok(Arc::new(roots))
}

impl Identity {
    /// The identity a client process uses from `dir`: an operator's (`admin-*.pem`) if the
    /// directory holds one, else a client's (`client-*.pem`).
    pub fn load_client(dir: &Path) -> Result<Identity, TlsError> {
        if dir.join("admin-cert.pem").exists() {
            Identity::load(dir, "admin")
        } else {
            Identity::load(dir, "client")
        }
    }

    /// Loads `<stem>-cert.pem`, `<stem>-key.pem` and `ca-cert.pem` from `dir`; the role is read
    /// from the certificate.
    pub fn load(dir: &Path, stem: &str) -> Result<Identity, TlsError> {
        let cert_path = dir.join(format!("{stem}-cert.pem"));
        let key_path = dir.join(format!("{stem}-key.pem"));
        let certs = load_certs(&cert_path)?;
        let role = role_of(&certs[0]).ok_or_else(|| {
            bad(
                &cert_path,
                "not a trireme certificate (no urn:trireme: name)",
            )
        })?;
        let key = PrivateKeyDer::from_pem_slice(read(&key_path)?.as_bytes())
            .map_err(|e| bad(&key_path, e))?;
        let roots = load_roots(&dir.join(CA_CERT))?;
        Ok(Identity {
            role,
            certs,
            key: Arc::new(key),
            roots,
            from: Some((dir.to_path_buf(), stem.to_string())),
        })
    }

    /// The certificate's SHA-256 fingerprint (what `trireme ca revoke` puts on the deny list).
    pub fn fingerprint(&self) -> String {
        revoke::fingerprint(&self.certs[0])
    }

    /// What presents this identity's certificate in a handshake: one that follows its files
    /// when it was loaded from some, else the certificate as it is.
    fn resolver(
        &self,
        provider: &Arc<rustls::crypto::CryptoProvider>,
    ) -> Result<Arc<reload::Reloading>, TlsError> {
        let (dir, stem) = self
            .from
            .clone()
            .unwrap_or_else(|| (PathBuf::new(), String::new()));
        Ok(Arc::new(reload::Reloading::new(
            self,
            dir,
            stem,
            provider.clone(),
        )?))
    }

    /// A TLS server that requires a client certificate from this identity's CA.
    pub fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        let provider = provider();
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            self.roots.clone(),
            provider.clone(),
        )
        .build()
        .map_err(|e| TlsError::Usage(format!("client verifier: {e}")))?;
        let resolver = self.resolver(&provider)?;
        let cfg = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_client_cert_verifier(Arc::new(revoke::ClientDeny(verifier)))
            .with_cert_resolver(resolver);
        Ok(Arc::new(cfg))
    }

    /// A TLS client presenting this identity and trusting only this identity's CA.
    pub fn client_config(&self) -> Result<Arc<rustls::ClientConfig>, TlsError> {
        let provider = provider();
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            self.roots.clone(),
            provider.clone(),
        )
        .build()
        .map_err(|e| TlsError::Usage(format!("server verifier: {e}")))?;
        let resolver = self.resolver(&provider)?;
        let cfg = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(revoke::ServerDeny(verifier)))
            .with_client_cert_resolver(resolver);
        Ok(Arc::new(cfg))
    }
}

/// ring's cipher suites, AES-128-GCM first: on the data path every byte is sealed and opened
/// once per link, and 128-bit AES does 10 rounds where 256-bit does 14 (both are TLS 1.3's
/// mandatory, constant-time, hardware-accelerated suites). Peers that prefer another of the
/// default suites (an NBD client on GnuTLS) still get it.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    let mut p = rustls::crypto::ring::default_provider();
    p.cipher_suites
        .sort_by_key(|s| s.suite() != rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
    Arc::new(p)
}

/// The fingerprint (see [`revoke::fingerprint`]) and role of the certificate in the PEM file
/// `path` (its first one).
pub fn cert_file(path: &Path) -> Result<(String, Option<Role>), TlsError> {
    let certs = load_certs(path)?;
    Ok((revoke::fingerprint(&certs[0]), role_of(&certs[0])))
}

/// The first certificate in the PEM file at `path`.
pub fn load_first_cert(path: &Path) -> Result<CertificateDer<'static>, TlsError> {
    Ok(load_certs(path)?.remove(0))
}

/// The role a certificate names, if it is a trireme certificate.
pub fn role_of(cert: &CertificateDer<'_>) -> Option<Role> {
    let (_, x) = x509_parser::parse_x509_certificate(cert).ok()?;
    let san = x.subject_alternative_name().ok()??;
    san.value.general_names.iter().find_map(|n| match n {
        x509_parser::extensions::GeneralName::URI(u) => Role::from_uri(u),
        _ => None,
    })
}

/// The role of the peer of an established TLS connection (its first certificate).
pub fn peer_role(conn: &rustls::CommonState) -> Option<Role> {
    conn.peer_certificates()?.first().and_then(role_of)
}

#[cfg(test)]
mod tests;
