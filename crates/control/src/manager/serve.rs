//! The control API's listener: admission, who may ask what, one connection's request lines.

use crate::error::ManagerError;
use std::path::Path;
use std::sync::Arc;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use trireme_meta::MetaError;
use trireme_replication::TransitionError;
use trireme_transport::Peer;

use crate::api::{ErrorCode, Refusal, Reply, Request, MAX_LINE};

use super::{Manager, Result};

/// How many control connections a process admits (unix and TCP together), of which TLS
/// handshakes in progress, few per source address.
pub const CONTROL_LIMITS: trireme_net::Limits = trireme_net::Limits {
    established: 256,
    handshakes: 64,
    handshakes_per_source: 8,
};

/// A control connection that moves no byte either way for this long is closed: between
/// requests, or halfway through one. A request the manager takes long to answer (a restart)
/// is not held to it: nothing is read then.
pub const CONTROL_IDLE: std::time::Duration = std::time::Duration::from_secs(60);

/// How long a new same-host control connection may take to start its first request.
pub const FIRST_REQUEST: std::time::Duration = std::time::Duration::from_secs(10);

/// The process's admission to its control listeners.
pub fn control_gate() -> &'static Arc<trireme_net::Gate> {
    static G: std::sync::OnceLock<Arc<trireme_net::Gate>> = std::sync::OnceLock::new();
    G.get_or_init(|| trireme_net::Gate::new("control", CONTROL_LIMITS))
}

/// Refused control connections: one log line a second at most.
pub static REFUSED: trireme_net::Throttles = trireme_net::Throttles::per_second();

/// Serves the control API on a unix socket at `path`, for good: a failed accept is retried
/// (see `trireme_net::accept`).
pub async fn serve(path: &Path, manager: Arc<Manager>) -> std::io::Result<()> {
    let listener = trireme_tls::local::bind_private(path)?;
    loop {
        let (sock, _) = trireme_net::accept("control (unix)", || listener.accept()).await;
        if let Err(why) = trireme_tls::local::check_peer(&sock) {
            trireme_net::warn_throttled_by!(
                REFUSED,
                &why.to_string(),
                "refused a control connection: {why}"
            );
            continue;
        }
        // It holds a handshake's place (evictable) until its first request starts.
        let Some(handshake) = control_gate().handshake(None) else {
            continue;
        };
        let m = manager.clone();
        tokio::spawn(async move {
            let spoke = handshake
                .run(tokio::time::timeout(
                    FIRST_REQUEST,
                    trireme_net::io::first_bytes(&sock),
                ))
                .await;
            if !matches!(spoke, Some(Ok(Ok(())))) {
                return;
            }
            let Some(place) = control_gate().establish(handshake) else {
                return;
            };
            let sock = trireme_net::Guarded::new(sock, CONTROL_IDLE, Some(place));
            serve_conn(sock, m, Peer::Trusted).await
        });
    }
}

/// Refuses a request `peer` may not make: a client's certificate reads the cluster's state,
/// and makes a writer's requests (checked against the volume's writer of record in
/// `writers.rs`); nodes, operators (`admin`) and trusted links may do everything.
fn authorize(peer: &Peer, req: &Request) -> Result<()> {
    if peer.is_cluster() {
        return Ok(());
    }
    let read_only = matches!(
        req,
        Request::NodeList
            | Request::VolumeList
            | Request::VolumeInfo { .. }
            | Request::Locate { .. }
            | Request::SnapshotList { .. }
            | Request::Status
            | Request::Events { .. }
            | Request::QosPolicyList
    ) || req.is_writer();
    match peer {
        Peer::Cert(r) if read_only && matches!(**r, trireme_tls::Role::Client(_)) => Ok(()),
        _ => {
            let cmd = serde_json::to_value(req)
                .ok()
                .and_then(|v| v.get("cmd").and_then(|c| c.as_str()).map(String::from))
                .unwrap_or_default();
            trireme_net::warn_throttled_by!(
                REFUSED,
                &cmd,
                %peer,
                cmd,
                "refused a control request: only operators and nodes may"
            );
            Err(ManagerError::Denied(format!(
                "{peer} may not {cmd}: only an operator (`trireme ca issue admin`) or a node may"
            )))
        }
    }
}

/// One control connection: a request line in, a reply line out, until it closes. `peer` is
/// who is on the other end (see [`authorize`]).
pub async fn serve_conn<S: crate::api::ControlStream>(sock: S, m: Arc<Manager>, peer: Peer) {
    let mut s = BufReader::new(sock);
    loop {
        let mut buf = Vec::new();
        let n = match (&mut s).take(MAX_LINE).read_until(b'\n', &mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let reply = if n as u64 >= MAX_LINE && buf.last() != Some(&b'\n') {
            let r = Reply::Error(Refusal::new(
                ErrorCode::Invalid,
                format!("request line over {MAX_LINE} bytes"),
            ));
            let _ = write_reply(&mut s, &r).await;
            return;
        } else {
            match serde_json::from_slice::<Request>(&buf) {
                Ok(req) => match authorize(&peer, &req) {
                    Err(e) => Reply::Error(e.refusal()),
                    Ok(()) if m.hands_over_for(&req) => Reply::Elsewhere(format!(
                        "node {} holds the manager role: it hands the role to another daemon, which runs the restart",
                        m.own_node()
                    )),
                    Ok(()) => {
                        let writer = req.is_writer();
                        match m.handle(req, &peer).await {
                            Ok(v) => Reply::Ok(v),
                            // A writer waits for a manager that can record it: it asks again.
                            Err(e) if writer && e.is_transient() => Reply::Elsewhere(e.to_string()),
                            Err(e) => error_reply(e),
                        }
                    }
                },
                Err(e) => Reply::Error(Refusal::new(
                    ErrorCode::Invalid,
                    format!("bad request: {e}"),
                )),
            }
        };
        if write_reply(&mut s, &reply).await.is_err() {
            return;
        }
    }
}

/// A failed request's reply: the message, and for a replica not on record its own variant.
pub(crate) fn error_reply(e: ManagerError) -> Reply {
    match e {
        ManagerError::Meta(MetaError::Transition(TransitionError::NoSuchReplica(node))) => {
            Reply::NotOnRecord {
                node,
                message: e.to_string(),
            }
        }
        e if e.is_state() => Reply::Failed(e.refusal()),
        e => Reply::Error(e.refusal()),
    }
}

async fn write_reply<S: crate::api::ControlStream>(
    s: &mut BufReader<S>,
    r: &Reply,
) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(r).expect("replies serialize");
    line.push(b'\n');
    s.get_mut().write_all(&line).await
}
