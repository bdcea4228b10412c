//! Revoked certificates: a deny list of SHA-256 fingerprints that every handshake checks, on
//! both sides (a client's certificate at a server, a server's at a client). The list lives in
//! the cluster's metadata (`trireme ca revoke`); each process that serves TLS follows it and
//! sets it here ([`set_revoked`]). A certificate taken off a host that was lost is then refused
//! everywhere within moments, before it expires.

use std::collections::HashSet;
use std::sync::{Arc, RwLock};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, SignatureScheme};

static REVOKED: RwLock<Option<HashSet<String>>> = RwLock::new(None);

/// A certificate's SHA-256 fingerprint, in lower-case hex (what `openssl x509 -fingerprint
/// -sha256` prints, without colons).
pub fn fingerprint(cert: &CertificateDer<'_>) -> String {
    ring::digest::digest(&ring::digest::SHA256, cert)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Replaces the deny list (fingerprints, see [`fingerprint`]).
pub fn set_revoked(fingerprints: impl IntoIterator<Item = String>) {
    let set: HashSet<String> = fingerprints.into_iter().collect();
    *REVOKED.write().unwrap_or_else(|e| e.into_inner()) = Some(set);
}

/// Whether `cert` is on the deny list.
pub fn is_revoked(cert: &CertificateDer<'_>) -> bool {
    let g = REVOKED.read().unwrap_or_else(|e| e.into_inner());
    g.as_ref()
        .is_some_and(|s| !s.is_empty() && s.contains(&fingerprint(cert)))
}

fn refuse_revoked(cert: &CertificateDer<'_>) -> Result<(), rustls::Error> {
    if is_revoked(cert) {
        return Err(rustls::Error::InvalidCertificate(CertificateError::Revoked));
    }
    Ok(())
}

/// A client-certificate verifier that refuses revoked certificates, then asks `inner`.
#[derive(Debug)]
pub(crate) struct ClientDeny(pub(crate) Arc<dyn ClientCertVerifier>);

impl ClientCertVerifier for ClientDeny {
    fn offer_client_auth(&self) -> bool {
        self.0.offer_client_auth()
    }
    fn client_auth_mandatory(&self) -> bool {
        self.0.client_auth_mandatory()
    }
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.0.root_hint_subjects()
    }
    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        refuse_revoked(end_entity)?;
        self.0.verify_client_cert(end_entity, intermediates, now)
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// A server-certificate verifier that refuses revoked certificates, then asks `inner`.
#[derive(Debug)]
pub(crate) struct ServerDeny(pub(crate) Arc<dyn ServerCertVerifier>);

impl ServerCertVerifier for ServerDeny {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        refuse_revoked(end_entity)?;
        self.0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}
