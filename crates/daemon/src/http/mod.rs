//! The HTTP endpoint of every long-running process (`--http ADDR`).
//!
//! * `/metrics` — Prometheus's OpenMetrics text: what this process knows (see [`scrape`]).
//! * `/targets` — Prometheus HTTP service discovery: this process, every node's endpoint and
//!   every writer's that reports one (`trireme attach --http`),
//!   from the cluster metadata, so one `http_sd_configs` entry finds the whole cluster.
//! * `/` — the dashboard, where this process holds the manager role (`trireme up`, or the node
//!   daemon that is the manager); `/api/board` is its state as JSON, `/api/events` the same as
//!   server-sent events, one a second. Read-only: nothing here changes the cluster.
//!
//! The endpoint listens on the address given (127.0.0.1 by default) and answers only requests
//! that carry its token ([`Token`]: a file only its owner reads, as the control socket takes
//! only its owner's processes). Its address is written to a file beside the process's data.

pub(crate) mod board;
mod scrape;
mod token;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use tokio::sync::watch;
use trireme_control::Manager;

use crate::DaemonError;

pub use board::{Board, BoardState, VolumeRates};
pub use token::Token;

/// What a process shows on its endpoint.
#[derive(Debug, Clone, Default)]
pub struct HttpSources {
    /// The node this process serves.
    pub node: Option<Arc<trireme_node::Node>>,
    /// The manager, while this process holds the role (`None` inside: not now).
    pub manager: Option<watch::Receiver<Option<Arc<Manager>>>>,
    /// Volumes this process writes whose links no manager here reports (`trireme attach`).
    pub writers: Vec<Arc<trireme_client::Volume>>,
    /// The cluster's metadata, where this process can read it while not the manager (a node
    /// daemon): `/targets` lists the cluster from it, and `/` sends a browser to the manager.
    pub meta: Option<trireme_meta::ClusterMeta>,
    /// Where writers beside this process leave their endpoint files (`up`'s data directory,
    /// for `trireme nbd`): `/targets` lists them too.
    pub beside: Option<std::path::PathBuf>,
}

impl HttpSources {
    /// The manager, if this process holds the role now.
    pub fn manager(&self) -> Option<Arc<Manager>> {
        self.manager.as_ref().and_then(|m| m.borrow().clone())
    }
}

/// A fixed manager (`trireme up`: it never hands the role over).
pub fn always(m: Arc<Manager>) -> watch::Receiver<Option<Arc<Manager>>> {
    let (tx, rx) = watch::channel(Some(m));
    // The receiver reads the last value after the sender is gone.
    drop(tx);
    rx
}

#[derive(Debug)]
struct Shared {
    sources: HttpSources,
    board: Board,
    addr: SocketAddr,
    token: Token,
}

/// A running endpoint; stops when dropped.
#[derive(Debug)]
pub struct HttpServer {
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
    /// The file it wrote its address to: removed when it stops (a process killed leaves it,
    /// and `/targets` drops it then, see [`beside`]).
    file: Option<std::path::PathBuf>,
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.task.abort();
        if let Some(f) = &self.file {
            let _ = std::fs::remove_file(f);
        }
    }
}

/// The endpoints of the writers beside a cluster's process (`trireme nbd` next to `up`: each
/// writes `nbd-VOLUME.http` in the data directory): those that take a connection. A file
/// whose endpoint refuses one was left by a writer that was killed: it goes.
async fn beside(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in entries.flatten() {
        let p = e.path();
        let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
        if !name.is_some_and(|n| n.starts_with("nbd-") && n.ends_with(".http")) {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&p) else {
            continue;
        };
        let addr = text.trim().to_string();
        let live = tokio::time::timeout(
            std::time::Duration::from_millis(300),
            tokio::net::TcpStream::connect(&addr),
        )
        .await;
        match live {
            Ok(Ok(_)) => out.push(addr),
            Ok(Err(_)) => {
                tracing::info!(file = %p.display(), "a writer's endpoint file its process left: removed");
                let _ = std::fs::remove_file(&p);
            }
            Err(_) => {}
        }
    }
    out
}

/// Parses `--http`: an address, or `off`.
pub fn parse_addr(s: &str) -> Result<Option<SocketAddr>, String> {
    if s == "off" {
        return Ok(None);
    }
    s.parse::<SocketAddr>().map(Some).map_err(|_| {
        format!(
            "{s:?} is not an address (HOST:PORT, e.g. 127.0.0.1:9464; port 0 picks one) or `off`"
        )
    })
}

/// Binds the endpoint's address (before the rest of the process starts, so the address can
/// be registered).
pub async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener, DaemonError> {
    tokio::net::TcpListener::bind(addr).await.map_err(|e| {
        DaemonError::Runtime(format!(
            "--http {addr}: {e} (pick another address, or `off`)"
        ))
    })
}

/// Serves on `listener` until the returned server is dropped; the bound address is written to
/// `addr_file` (replaced atomically) if given.
pub fn serve(
    listener: tokio::net::TcpListener,
    sources: HttpSources,
    token: Token,
    addr_file: Option<&Path>,
) -> Result<HttpServer, DaemonError> {
    let bound = listener.local_addr()?;
    if let Some(f) = addr_file {
        if let Some(dir) = f.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let tmp = f.with_extension("tmp");
        std::fs::write(&tmp, format!("{bound}\n"))?;
        std::fs::rename(&tmp, f)?;
    }
    let shared = Arc::new(Shared {
        board: Board::new(),
        sources,
        addr: bound,
        token,
    });
    let app = axum::Router::new()
        .route("/metrics", get(metrics))
        .route("/targets", get(targets))
        .route("/", get(page))
        .route("/api/board", get(board_json))
        .route("/api/events", get(events))
        .layer(axum::middleware::from_fn_with_state(shared.clone(), gate))
        .with_state(shared);
    let listener = Guarded {
        listener,
        gate: trireme_net::Gate::evicting_idle("http", HTTP_LIMITS),
    };
    let task = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::warn!("http endpoint stopped: {e}");
        }
    });
    tracing::info!(%bound, "metrics on http://{bound}/metrics");
    Ok(HttpServer {
        addr: bound,
        task,
        file: addr_file.map(Path::to_path_buf),
    })
}

/// Connections the endpoint serves at once (Prometheus, a few browsers and scripts need a
/// handful); a newcomer past them closes the one idle the longest.
const HTTP_LIMITS: trireme_net::Limits = trireme_net::Limits {
    established: 128,
    handshakes: 128,
    handshakes_per_source: 128,
};
/// A connection that moves no byte either way for this long is closed: a half-sent request
/// or an idle keep-alive. The dashboard's event stream sends every second; Prometheus scrapes
/// every few seconds.
const HTTP_IDLE: std::time::Duration = std::time::Duration::from_secs(30);

/// The endpoint's listener: accepts through every transient error, admits at most
/// [`HTTP_LIMITS`], and closes connections idle for [`HTTP_IDLE`].
struct Guarded {
    listener: tokio::net::TcpListener,
    gate: Arc<trireme_net::Gate>,
}

impl axum::serve::Listener for Guarded {
    type Io = trireme_net::Guarded<tokio::net::TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let (sock, peer) = trireme_net::accept("http", || self.listener.accept()).await;
            let Some(place) = self
                .gate
                .handshake_tcp(sock.local_addr().ok(), peer)
                .and_then(|h| self.gate.establish(h))
            else {
                continue;
            };
            return (
                trireme_net::Guarded::new(sock, HTTP_IDLE, Some(place)),
                peer,
            );
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.listener.local_addr()
    }
}

/// Lets through only requests that carry the token; one that brought it in its query gets it
/// back as a cookie (the page's own requests then carry it).
async fn gate(
    State(s): State<Arc<Shared>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let mut resp = authorized(&s, req, next).await;
    // The page's address may carry its token (`/?token=`): no other site is told it, and no
    // cache keeps a page, the metrics or the API's answers.
    let h = resp.headers_mut();
    h.insert(
        header::REFERRER_POLICY,
        axum::http::HeaderValue::from_static("no-referrer"),
    );
    h.insert(
        header::CACHE_CONTROL,
        axum::http::HeaderValue::from_static("no-store"),
    );
    resp
}

async fn authorized(
    s: &Shared,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let cookie = token::cookie(s.addr.port());
    match Token::carried(&req, &cookie) {
        Some((t, from_query)) if s.token.matches(&t) => {
            let mut resp = next.run(req).await;
            if from_query {
                let cookie = format!(
                    "{cookie}={}; Path=/; HttpOnly; SameSite=Strict",
                    s.token.as_str()
                );
                if let Ok(v) = axum::http::HeaderValue::from_str(&cookie) {
                    resp.headers_mut().insert(header::SET_COOKIE, v);
                }
            }
            resp
        }
        _ => (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "this endpoint needs its token (the file http-token beside the process's data): \
             send `Authorization: Bearer TOKEN`, or open /?token=TOKEN in a browser\n",
        )
            .into_response(),
    }
}

async fn metrics(State(s): State<Arc<Shared>>) -> Response {
    let text = scrape::scrape(&s.sources).await;
    (
        [(header::CONTENT_TYPE, trireme_metrics::expo::CONTENT_TYPE)],
        text,
    )
        .into_response()
}

/// Prometheus HTTP service discovery: one target group per process kind.
async fn targets(State(s): State<Arc<Shared>>) -> Response {
    let mut groups = vec![serde_json::json!({
        "targets": [s.addr.to_string()],
        "labels": { "trireme_role": match (s.sources.manager().is_some(), s.sources.node.is_some()) {
            (true, _) => "manager",
            (false, true) => "node",
            (false, false) => "writer",
        } },
    })];
    let meta = s
        .sources
        .manager()
        .map(|m| m.meta().clone())
        .or_else(|| s.sources.meta.clone());
    if let Some(meta) = meta {
        let nodes: Vec<String> = match meta.nodes().await {
            Ok(ns) => ns
                .into_iter()
                .filter(|n| n.state != trireme_meta::NodeState::Removed)
                .filter_map(|n| n.http)
                .filter(|h| *h != s.addr.to_string())
                .collect(),
            Err(e) => {
                return (
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("cluster metadata: {e}\n"),
                )
                    .into_response()
            }
        };
        if !nodes.is_empty() {
            groups.push(serde_json::json!({
                "targets": nodes,
                "labels": { "trireme_role": "node" },
            }));
        }
        // Writers on other hosts (`trireme attach` with `--http`), from their reports.
        let mut writers: Vec<String> = meta
            .reports()
            .await
            .unwrap_or_default()
            .into_iter()
            .filter_map(|(_, r)| r.http)
            .filter(|h| *h != s.addr.to_string())
            .collect();
        if let Some(dir) = &s.sources.beside {
            writers.extend(beside(dir).await);
        }
        writers.sort();
        writers.dedup();
        if !writers.is_empty() {
            groups.push(serde_json::json!({
                "targets": writers,
                "labels": { "trireme_role": "writer" },
            }));
        }
    }
    axum::Json(groups).into_response()
}

const PAGE: &str = include_str!("dashboard.html");

async fn page(State(s): State<Arc<Shared>>, uri: axum::http::Uri) -> Response {
    if s.sources.manager().is_some() {
        return Html(PAGE).into_response();
    }
    // A node daemon that is not the manager sends the browser to the one that is.
    if let Some(meta) = &s.sources.meta {
        if let Ok(Some((m, _))) = meta.manager().await {
            if let Some(h) = m.http.filter(|h| *h != s.addr.to_string()) {
                let query = uri.query().map(|q| format!("?{q}")).unwrap_or_default();
                return axum::response::Redirect::temporary(&format!("http://{h}/{query}"))
                    .into_response();
            }
        }
    }
    // Not the manager: say where it is, if the metadata knows.
    let elsewhere = match &s.sources.node {
        Some(_) => "the node daemon that holds the manager role (see `trireme status`)",
        None => "the manager's process (`trireme up`, or the node daemon that holds the role)",
    };
    (
        StatusCode::NOT_FOUND,
        Html(format!(
            "<!doctype html><title>trireme</title><p>This process serves metrics at \
             <a href=\"/metrics\">/metrics</a>. The dashboard is served by {elsewhere}.</p>"
        )),
    )
        .into_response()
}

/// The board's routes where this process is not the manager.
fn not_manager() -> Response {
    (
        StatusCode::NOT_FOUND,
        "this process does not hold the manager role\n",
    )
        .into_response()
}

async fn board_json(State(s): State<Arc<Shared>>) -> Response {
    let Some(m) = s.sources.manager() else {
        return not_manager();
    };
    let state = s.board.sample_now(&m).await;
    axum::Json(state).into_response()
}

/// The board, a JSON document per second, as server-sent events (`event: board`).
async fn events(State(s): State<Arc<Shared>>) -> Response {
    let Some(m) = s.sources.manager() else {
        return not_manager();
    };
    let rx = s.board.subscribe(m);
    let stream = tokio_stream::wrappers::WatchStream::new(rx);
    let stream = tokio_stream::StreamExt::filter_map(stream, |json: Option<Arc<String>>| {
        json.map(|j| Ok::<_, std::convert::Infallible>(Event::default().event("board").data(&*j)))
    });
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}
