//! One NBD connection: handshake, then transmission.

use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite};

use crate::options::{greet, options};
use crate::transmission::transmission;
use crate::{BlockDevice, Exports};

/// Option payloads above this are refused with `NBD_REP_ERR_TOO_BIG`.
pub(crate) const MAX_OPTION: u32 = 64 * 1024;
/// Option payloads above this close the connection instead of being skipped.
pub(crate) const MAX_OPTION_SKIP: u32 = 16 * 1024 * 1024;
/// In-flight budget per connection, in 64 KiB units (64 MiB, two of the largest requests):
/// requests being served and replies not yet written to the socket both hold theirs, so a
/// client that stops reading its replies stops this connection, and pins at most this much
/// memory. Every connection's units come out of the process's budget too
/// ([`PROCESS_UNITS`]), so what clients pin is bounded per process, not per connection.
pub(crate) const INFLIGHT_UNITS: u32 = 1024;
/// In-flight budget of the whole process, in 64 KiB units (256 MiB): four connections whose
/// clients stop reading take it all, and the others then wait for them.
pub(crate) const PROCESS_UNITS: u32 = 4096;

/// Why a connection ended abnormally.
#[derive(Debug, thiserror::Error)]
pub enum NbdError {
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("protocol violation: {0}")]
    Protocol(String),
    /// The client is not allowed in (no TLS where it is required, a failed TLS handshake, a
    /// certificate that names no client).
    #[error("refused: {0}")]
    Refused(String),
}

/// TLS on an NBD listener: nothing but `NBD_OPT_STARTTLS` (and abort) is served before TLS is
/// on (the protocol's FORCEDTLS mode), and the client must present a certificate of the
/// cluster's CA that names a client.
#[derive(Clone)]
pub struct NbdTls {
    pub acceptor: tokio_rustls::TlsAcceptor,
    /// Which client (by its certificate's name) may open which export; `None`: every client
    /// of the CA may open every export.
    pub allow: Option<Allow>,
}

/// `allow(export, client)`: true if that client may open that export.
pub type Allow = Arc<dyn Fn(&str, &str) -> bool + Send + Sync>;

/// The client on a TLS connection, and what it may open.
pub(crate) struct Allowed<'a> {
    pub(crate) client: &'a str,
    pub(crate) allow: &'a Allow,
}

impl Allowed<'_> {
    pub(crate) fn denies(gate: Option<&Self>, export: &str) -> bool {
        static REFUSED: trireme_net::Throttles = trireme_net::Throttles::per_second();
        match gate {
            Some(g) if !(g.allow)(export, g.client) => {
                trireme_net::warn_throttled_by!(
                    REFUSED,
                    g.client,
                    client = g.client,
                    export,
                    "refused: the client is not on the volume's access list"
                );
                true
            }
            _ => false,
        }
    }
}

impl std::fmt::Debug for NbdTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NbdTls")
    }
}

/// Where the option haggling stands with TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tls {
    /// A plain listener: STARTTLS is not offered.
    Off,
    /// TLS is required and not on yet: only STARTTLS and abort are served.
    Required,
    /// TLS is on.
    On,
}

/// How the option haggling ended.
pub(crate) enum Outcome<B> {
    Go(Session<B>),
    StartTls,
    Quit,
}

/// What the handshake agreed on.
pub(crate) struct Session<B> {
    pub(crate) backend: Arc<B>,
    pub(crate) structured: bool,
    /// The metadata contexts the client set, with the ids they were given.
    pub(crate) contexts: Vec<(u32, String)>,
    /// Requests are checked against the device's size now, not the one negotiated: the
    /// kernel's client, which `map` tells of a new size (`trireme_daemon::kernel_size`).
    pub(crate) live_size: bool,
}

/// How long a client has from connecting to picking its export (TLS handshake included): a
/// client that connects and says nothing, or haggles forever, holds its place no longer.
pub const NEGOTIATION: std::time::Duration = std::time::Duration::from_secs(10);

/// A connection's place at its listener: among the handshakes until the client picks an
/// export, then among the established sessions (see `trireme_net::Gate`).
#[derive(Debug)]
pub struct Admission {
    pub gate: Arc<trireme_net::Gate>,
    pub handshake: trireme_net::Handshaking,
}

impl Admission {
    fn go(self) -> Result<trireme_net::Admitted, NbdError> {
        self.gate
            .establish(self.handshake)
            .ok_or_else(|| NbdError::Refused("the listener serves all the sessions it may".into()))
    }
}

/// The client answered the greeting: among handshakes to evict, it goes after silent ones.
fn spoke(admission: Option<&Admission>) {
    if let Some(a) = admission {
        a.handshake.spoke();
    }
}

/// Runs `f` (the negotiation) within [`NEGOTIATION`], unless the listener evicts the
/// connection first to make room for another client's.
async fn within<T>(
    admission: Option<&Admission>,
    f: impl std::future::Future<Output = Result<T, NbdError>>,
) -> Result<T, NbdError> {
    let timed = async {
        tokio::time::timeout(NEGOTIATION, f).await.map_err(|_| {
            NbdError::Refused(format!(
                "no export picked within {NEGOTIATION:?} of connecting"
            ))
        })?
    };
    match admission {
        Some(a) => a.handshake.run(timed).await.unwrap_or_else(|| {
            Err(NbdError::Refused(
                "still negotiating when the listener needed its place for another client".into(),
            ))
        }),
        None => timed.await,
    }
}

/// Serves one client connection to the end, in plain text.
pub async fn serve_connection<S, B>(stream: S, exports: Arc<Exports<B>>) -> Result<(), NbdError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    B: BlockDevice,
{
    serve_admitted(stream, exports, None).await
}

/// [`serve_connection`] for a connection that holds a place at its listener: exchanged for an
/// established one when the client picks its export.
pub async fn serve_admitted<S, B>(
    mut stream: S,
    exports: Arc<Exports<B>>,
    admission: Option<Admission>,
) -> Result<(), NbdError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    B: BlockDevice,
{
    let outcome = within(admission.as_ref(), async {
        let no_zeroes = greet(&mut stream).await?;
        spoke(admission.as_ref());
        options(&mut stream, &exports, no_zeroes, Tls::Off, None).await
    })
    .await?;
    match outcome {
        Outcome::Go(session) => {
            let _place = admission.map(Admission::go).transpose()?;
            let (rd, wr) = tokio::io::split(stream);
            transmission(rd, wr, session).await
        }
        Outcome::StartTls | Outcome::Quit => Ok(()),
    }
}

/// Serves the transmission phase alone on `stream`, for the kernel's NBD client (`nbd.ko`),
/// which negotiates nothing: its device was set up over netlink with the size of `device`
/// and the flags [`kernel_flags`] gives. Simple replies, no metadata contexts. Returns when
/// the kernel disconnects (`NBD_CMD_DISC`) or the stream ends.
pub async fn serve_kernel<S, B>(stream: S, device: Arc<B>) -> Result<(), NbdError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    B: BlockDevice,
{
    let (rd, wr) = tokio::io::split(stream);
    let session = Session {
        backend: device,
        structured: false,
        contexts: Vec::new(),
        live_size: true,
    };
    transmission(rd, wr, session).await
}

/// The transmission flags to set a kernel device up with for `device`.
pub fn kernel_flags<B: BlockDevice>(device: &B) -> u16 {
    crate::options::transmission_flags(device, false)
}

/// Serves one client connection to the end over TLS (see [`NbdTls`]).
pub async fn serve_connection_tls<S, B>(
    stream: S,
    exports: Arc<Exports<B>>,
    tls: &NbdTls,
) -> Result<(), NbdError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    B: BlockDevice,
{
    serve_admitted_tls(stream, exports, tls, None).await
}

/// [`serve_connection_tls`] for a connection that holds a place at its listener.
pub async fn serve_admitted_tls<S, B>(
    mut stream: S,
    exports: Arc<Exports<B>>,
    tls: &NbdTls,
    admission: Option<Admission>,
) -> Result<(), NbdError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    B: BlockDevice,
{
    let negotiated = within(admission.as_ref(), async {
        let no_zeroes = greet(&mut stream).await?;
        spoke(admission.as_ref());
        match options(&mut stream, &exports, no_zeroes, Tls::Required, None).await? {
            Outcome::StartTls => {}
            Outcome::Go(_) | Outcome::Quit => return Ok(None),
        }
        let mut stream = tls
            .acceptor
            .accept(stream)
            .await
            .map_err(|e| NbdError::Refused(format!("TLS handshake failed: {e}")))?;
        let client = match trireme_tls::peer_role(stream.get_ref().1) {
            Some(trireme_tls::Role::Client(name)) => {
                tracing::debug!(client = %name, "NBD client on TLS");
                name
            }
            other => {
                return Err(NbdError::Refused(format!(
                    "the certificate names {}, not a client",
                    other.map_or_else(|| "no trireme role".to_string(), |r| r.to_string())
                )))
            }
        };
        let gate = tls.allow.as_ref().map(|allow| Allowed {
            client: &client,
            allow,
        });
        match options(&mut stream, &exports, no_zeroes, Tls::On, gate.as_ref()).await? {
            Outcome::Go(session) => Ok(Some((stream, session))),
            Outcome::StartTls | Outcome::Quit => Ok(None),
        }
    })
    .await?;
    let Some((stream, session)) = negotiated else {
        return Ok(());
    };
    let _place = admission.map(Admission::go).transpose()?;
    let (rd, wr) = tokio::io::split(stream);
    transmission(rd, wr, session).await
}
