//! A process's own certificate, picked up again when its files change: re-issuing a
//! certificate in place (`trireme ca issue ... --out DIR` over the old files) rotates it with
//! no restart. Every handshake asks for the current one; the files are looked at again at most
//! every [`CHECK_EVERY`], and a new pair is taken only if it loads and is of the same role (a
//! half-written or wrong file keeps the old one, with a warning).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use rustls::client::ResolvesClientCert;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::SignatureScheme;

use crate::{Identity, Role, TlsError};

/// How often the certificate's files are looked at, at most.
#[cfg(not(test))]
pub const CHECK_EVERY: Duration = Duration::from_secs(10);
#[cfg(test)]
pub const CHECK_EVERY: Duration = Duration::ZERO;

#[derive(Debug)]
struct State {
    current: Arc<CertifiedKey>,
    /// The files' modification times when `current` was loaded.
    stamp: (Option<SystemTime>, Option<SystemTime>),
    checked: Instant,
}

/// The certificate and key of `<dir>/<stem>-cert.pem` and `-key.pem`, reloaded when they
/// change (see the module docs).
#[derive(Debug)]
pub struct Reloading {
    dir: PathBuf,
    stem: String,
    role: Role,
    provider: Arc<rustls::crypto::CryptoProvider>,
    state: Mutex<State>,
}

fn stamp(dir: &std::path::Path, stem: &str) -> (Option<SystemTime>, Option<SystemTime>) {
    let m = |f: String| {
        std::fs::metadata(dir.join(f))
            .and_then(|m| m.modified())
            .ok()
    };
    (m(format!("{stem}-cert.pem")), m(format!("{stem}-key.pem")))
}

fn certified(
    id: &Identity,
    provider: &rustls::crypto::CryptoProvider,
) -> Result<Arc<CertifiedKey>, TlsError> {
    let key = provider
        .key_provider
        .load_private_key(id.key.clone_key())
        .map_err(TlsError::Config)?;
    Ok(Arc::new(CertifiedKey::new(id.certs.clone(), key)))
}

impl Reloading {
    pub(crate) fn new(
        id: &Identity,
        dir: PathBuf,
        stem: String,
        provider: Arc<rustls::crypto::CryptoProvider>,
    ) -> Result<Reloading, TlsError> {
        let current = certified(id, &provider)?;
        let st = stamp(&dir, &stem);
        Ok(Reloading {
            role: id.role.clone(),
            state: Mutex::new(State {
                current,
                stamp: st,
                checked: Instant::now(),
            }),
            dir,
            stem,
            provider,
        })
    }

    /// The certificate to present now.
    pub fn current(&self) -> Arc<CertifiedKey> {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if s.checked.elapsed() >= CHECK_EVERY {
            s.checked = Instant::now();
            let now = stamp(&self.dir, &self.stem);
            if now != s.stamp {
                match self.load() {
                    Ok(k) => {
                        tracing::info!(dir = %self.dir.display(), "TLS certificate reloaded");
                        s.current = k;
                        s.stamp = now;
                    }
                    Err(e) => tracing::warn!(
                        dir = %self.dir.display(),
                        "TLS certificate changed but not taken, the old one stays: {e}"
                    ),
                }
            }
        }
        s.current.clone()
    }

    fn load(&self) -> Result<Arc<CertifiedKey>, TlsError> {
        let id = Identity::load(&self.dir, &self.stem)?;
        if id.role != self.role {
            return Err(TlsError::Usage(format!(
                "it names {}, not {}",
                id.role, self.role
            )));
        }
        certified(&id, &self.provider)
    }
}

impl ResolvesServerCert for Reloading {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

impl ResolvesClientCert for Reloading {
    fn resolve(&self, _: &[&[u8]], _: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }

    fn has_certs(&self) -> bool {
        true
    }
}
