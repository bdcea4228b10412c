//! The cluster manager: the one writer of the metadata store.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixListener;
use trireme_client::{AttachInfo, ReplicaTarget};
use trireme_meta::{MetaStore, NodeRecord, VolumeRecord};
use trireme_proto::{Header, Op, Status};
use trireme_replication::{place, NodeLoad};
use trireme_transport::TransportKind;

use crate::api::{
    LinkStatus, NodeStatus, ReplicaStatus, Reply, Request, StatusReport, VolumeStatus, MAX_LINE,
};

/// How long the manager waits for a node on the control path.
const NODE_TIMEOUT: Duration = Duration::from_secs(3);
/// Largest volume accepted (1 PiB, the replica format's limit).
const MAX_VOLUME: u64 = 1 << 50;

/// The cluster manager. Cheap to share (`Arc`); every method is safe to call concurrently.
#[derive(Debug)]
pub struct Manager {
    meta: Arc<dyn MetaStore>,
    /// Serialises volume creation and deletion (placement reads then writes the metadata).
    volume_lock: tokio::sync::Mutex<()>,
    /// Volume clients running in this process (the `up` NBD export), shown by `status`.
    clients: std::sync::Mutex<Vec<Arc<trireme_client::Volume>>>,
}

type Result<T> = std::result::Result<T, String>;

impl Manager {
    pub fn new(meta: Arc<dyn MetaStore>) -> Manager {
        Manager {
            meta,
            volume_lock: tokio::sync::Mutex::new(()),
            clients: std::sync::Mutex::default(),
        }
    }

    /// Lets `status` report the links of a volume client running in this process.
    pub fn register_client(&self, v: Arc<trireme_client::Volume>) {
        self.clients
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(v);
    }

    fn client_links(&self, volume: &str) -> Vec<LinkStatus> {
        let clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::new();
        for c in clients.iter().filter(|c| c.info().name == volume) {
            for (i, link) in c.connections().into_iter().enumerate() {
                if let Some(l) = link {
                    out.push(LinkStatus {
                        node: c.info().replicas[i].node,
                        transport: l.transport,
                        peer: l.peer,
                        streams: l.streams,
                    });
                }
            }
        }
        out
    }

    pub fn meta(&self) -> &Arc<dyn MetaStore> {
        &self.meta
    }

    async fn node_call(&self, node: &NodeRecord, h: Header) -> Result<trireme_transport::Frame> {
        let fut = async {
            let c = trireme_transport::connect(TransportKind::Tcp, &node.addr, 1)
                .await
                .map_err(|e| e.to_string())?;
            c.call(h, Bytes::new()).await.map_err(|e| e.to_string())
        };
        tokio::time::timeout(NODE_TIMEOUT, fut)
            .await
            .map_err(|_| {
                format!(
                    "node {} at {} did not answer in {NODE_TIMEOUT:?}",
                    node.id, node.addr
                )
            })?
            .map_err(|e| format!("node {}: {e}", node.id))
    }

    fn node(&self, id: u32) -> Result<NodeRecord> {
        self.meta
            .nodes()
            .map_err(|e| e.to_string())?
            .into_iter()
            .find(|n| n.id == id)
            .ok_or_else(|| format!("node {id} is not registered"))
    }

    async fn replica_op(&self, node: &NodeRecord, op: Op, v: &VolumeRecord) -> Result<Status> {
        let h = Header {
            volume: v.id,
            length: v.size,
            ..Header::request(op, 0)
        };
        let f = self.node_call(node, h).await?;
        Ok(f.header.status)
    }

    pub async fn create_volume(
        &self,
        name: &str,
        size: u64,
        replicas: usize,
    ) -> Result<VolumeRecord> {
        if size == 0 || !size.is_multiple_of(4096) || size > MAX_VOLUME {
            return Err(format!(
                "volume size {size} must be a non-zero multiple of 4096 up to {MAX_VOLUME}"
            ));
        }
        let _g = self.volume_lock.lock().await;
        let nodes = self.meta.nodes().map_err(|e| e.to_string())?;
        let vols = self.meta.volumes().map_err(|e| e.to_string())?;
        let loads: Vec<NodeLoad> = nodes
            .iter()
            .map(|n| NodeLoad {
                node: n.id,
                replicas: vols
                    .iter()
                    .filter(|v| v.replicas.iter().any(|r| r.node == n.id))
                    .count(),
            })
            .collect();
        let chosen = place(&loads, replicas).map_err(|e| e.to_string())?;
        let v = self
            .meta
            .create_volume(name, size, &chosen)
            .map_err(|e| e.to_string())?;
        let mut created = Vec::new();
        for &id in &chosen {
            let node = self.node(id)?;
            match self.replica_op(&node, Op::CreateReplica, &v).await {
                Ok(Status::Ok) => created.push(node),
                outcome => {
                    // Undo: a volume exists with all its replicas or not at all.
                    for n in &created {
                        let _ = self.replica_op(n, Op::DeleteReplica, &v).await;
                    }
                    let _ = self.meta.delete_volume(name);
                    let why = match outcome {
                        Ok(s) => s.as_str().to_string(),
                        Err(e) => e,
                    };
                    return Err(format!(
                        "creating the replica of {name:?} on node {id} failed: {why}"
                    ));
                }
            }
        }
        tracing::info!(volume = name, size, nodes = ?chosen, "volume created");
        Ok(v)
    }

    pub async fn delete_volume(&self, name: &str) -> Result<VolumeRecord> {
        let _g = self.volume_lock.lock().await;
        let v = self.meta.volume(name).map_err(|e| e.to_string())?;
        for r in &v.replicas {
            let node = self.node(r.node)?;
            match self.replica_op(&node, Op::DeleteReplica, &v).await? {
                Status::Ok | Status::NoReplica => {}
                s => {
                    return Err(format!(
                        "deleting the replica on node {}: {}",
                        r.node,
                        s.as_str()
                    ))
                }
            }
        }
        self.meta.delete_volume(name).map_err(|e| e.to_string())
    }

    fn attach_info(&self, v: &VolumeRecord) -> Result<AttachInfo> {
        let nodes = self.meta.nodes().map_err(|e| e.to_string())?;
        let mut replicas = Vec::new();
        for r in &v.replicas {
            let n = nodes
                .iter()
                .find(|n| n.id == r.node)
                .ok_or_else(|| format!("node {} is not registered", r.node))?;
            replicas.push(ReplicaTarget {
                node: n.id,
                addr: n.addr.clone(),
                local_addr: n.local_addr.clone(),
                state: r.state,
            });
        }
        Ok(AttachInfo {
            name: v.name.clone(),
            id: v.id,
            size: v.size,
            epoch: v.epoch,
            replicas,
        })
    }

    /// A new writer: bumps the epoch durably, then says where the replicas are.
    pub fn attach(&self, name: &str) -> Result<AttachInfo> {
        let v = self.meta.next_epoch(name).map_err(|e| e.to_string())?;
        self.attach_info(&v)
    }

    pub fn locate(&self, name: &str) -> Result<AttachInfo> {
        let v = self.meta.volume(name).map_err(|e| e.to_string())?;
        self.attach_info(&v)
    }

    async fn node_status(&self, n: &NodeRecord, vols: &[VolumeRecord]) -> NodeStatus {
        let t0 = Instant::now();
        let up = self
            .node_call(n, Header::request(Op::Ping, 0))
            .await
            .is_ok();
        NodeStatus {
            id: n.id,
            addr: n.addr.clone(),
            store: n.store.clone(),
            up,
            ping_us: up.then(|| t0.elapsed().as_micros() as u64),
            transport: "tcp".into(),
            replicas: vols
                .iter()
                .filter(|v| v.replicas.iter().any(|r| r.node == n.id))
                .count(),
        }
    }

    pub async fn status(&self) -> Result<StatusReport> {
        let nodes = self.meta.nodes().map_err(|e| e.to_string())?;
        let vols = self.meta.volumes().map_err(|e| e.to_string())?;
        let mut ns = Vec::new();
        for n in &nodes {
            ns.push(self.node_status(n, &vols).await);
        }
        let mut vs = Vec::new();
        for v in &vols {
            let mut reps = Vec::new();
            for r in &v.replicas {
                let mut st = ReplicaStatus {
                    node: r.node,
                    state: r.state.to_string(),
                    allocated_bytes: None,
                    epoch: None,
                };
                match nodes.iter().find(|n| n.id == r.node) {
                    None => st.state = "unreachable".into(),
                    Some(n) => {
                        let h = Header {
                            volume: v.id,
                            ..Header::request(Op::ReplicaInfo, 0)
                        };
                        match self.node_call(n, h).await {
                            Ok(f) if f.header.status == Status::Ok => {
                                st.allocated_bytes = Some(f.header.offset);
                                st.epoch = Some(f.header.epoch);
                            }
                            Ok(f) if f.header.status == Status::NoReplica => {
                                st.state = "missing".into()
                            }
                            _ => st.state = "unreachable".into(),
                        }
                    }
                }
                reps.push(st);
            }
            vs.push(VolumeStatus {
                name: v.name.clone(),
                id: v.id,
                size: v.size,
                epoch: v.epoch,
                replicas: reps,
                client_links: self.client_links(&v.name),
            });
        }
        Ok(StatusReport {
            nodes: ns,
            volumes: vs,
        })
    }

    /// After a restart: replicas on volatile stores come back empty, so they are re-created.
    /// A replica missing from a persistent store is reported, never silently re-created empty.
    pub async fn ensure_replicas(&self) -> Result<()> {
        let nodes = self.meta.nodes().map_err(|e| e.to_string())?;
        for v in self.meta.volumes().map_err(|e| e.to_string())? {
            for r in &v.replicas {
                let Some(n) = nodes.iter().find(|n| n.id == r.node) else {
                    continue;
                };
                let h = Header {
                    volume: v.id,
                    ..Header::request(Op::ReplicaInfo, 0)
                };
                let f = self.node_call(n, h).await?;
                if f.header.status != Status::NoReplica {
                    continue;
                }
                let volatile = trireme_store_kind_is_volatile(&n.store);
                if volatile {
                    self.replica_op(n, Op::CreateReplica, &v).await?;
                } else {
                    tracing::error!(volume = %v.name, node = n.id, "replica is missing from a persistent store; not re-creating it empty");
                }
            }
        }
        Ok(())
    }

    async fn handle(&self, req: Request) -> Result<serde_json::Value> {
        fn to<T: serde::Serialize>(v: Result<T>) -> Result<serde_json::Value> {
            v.map(|x| serde_json::to_value(x).expect("serializable"))
        }
        match req {
            Request::NodeList => {
                let vols = self.meta.volumes().map_err(|e| e.to_string())?;
                let mut out = Vec::new();
                for n in self.meta.nodes().map_err(|e| e.to_string())? {
                    out.push(self.node_status(&n, &vols).await);
                }
                to(Ok(out))
            }
            Request::VolumeCreate {
                name,
                size,
                replicas,
            } => to(self.create_volume(&name, size, replicas).await),
            Request::VolumeList => to(self.meta.volumes().map_err(|e| e.to_string())),
            Request::VolumeInfo { name } => to(self.meta.volume(&name).map_err(|e| e.to_string())),
            Request::VolumeDelete { name } => to(self.delete_volume(&name).await),
            Request::Attach { name } => to(self.attach(&name)),
            Request::Locate { name } => to(self.locate(&name)),
            Request::Status => to(self.status().await),
        }
    }
}

fn trireme_store_kind_is_volatile(store: &str) -> bool {
    store != "file"
}

/// Serves the control API on a unix socket at `path` until the listener fails.
pub async fn serve(path: &Path, manager: Arc<Manager>) -> std::io::Result<()> {
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path)?;
    loop {
        let (sock, _) = listener.accept().await?;
        let m = manager.clone();
        tokio::spawn(async move {
            let mut s = BufReader::new(sock);
            loop {
                let mut buf = Vec::new();
                let n = match (&mut s).take(MAX_LINE).read_until(b'\n', &mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                let reply = if n as u64 >= MAX_LINE && buf.last() != Some(&b'\n') {
                    let r = Reply::Error(format!("request line over {MAX_LINE} bytes"));
                    let _ = write_reply(&mut s, &r).await;
                    return;
                } else {
                    match serde_json::from_slice::<Request>(&buf) {
                        Ok(req) => match m.handle(req).await {
                            Ok(v) => Reply::Ok(v),
                            Err(e) => Reply::Error(e),
                        },
                        Err(e) => Reply::Error(format!("bad request: {e}")),
                    }
                };
                if write_reply(&mut s, &reply).await.is_err() {
                    return;
                }
            }
        });
    }
}

async fn write_reply(s: &mut BufReader<tokio::net::UnixStream>, r: &Reply) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(r).expect("replies serialize");
    line.push(b'\n');
    s.get_mut().write_all(&line).await
}
