//! The simulated network: a writer's (or the manager's) connection to a simulated node, whose
//! every frame goes through the real encoder and decoder, and which the faults of the run
//! (crashes, partitions, freezes, stalls) reach.

use super::*;

/// A client connection to a simulated node.
#[derive(Debug)]
pub(crate) struct SimConn {
    pub(crate) node: Arc<SimNode>,
    /// The process that opened it: when it dies, so does the connection.
    pub(crate) proc_: Arc<Proc>,
    pub(crate) generation: u64,
    pub(crate) token: u64,
    pub(crate) rng: SharedRng,
    pub(crate) closed: AtomicBool,
}

impl SimConn {
    async fn send(
        &self,
        header: Header,
        payload: Bytes,
        crc: Option<u32>,
    ) -> Result<Frame, TransportError> {
        let delay = rand(&self.rng).below(300);
        tokio::time::sleep(Duration::from_micros(20 + delay)).await;
        let node = self.deliverable().await?;
        let mut f = over_the_wire(&header, payload, crc).map_err(|e| self.closed(&e))?;
        f.origin = self.token;
        let resp = node.handle(f).await;
        let resp = over_the_wire(&resp.header, resp.payload, None).map_err(|e| self.closed(&e))?;
        let back = rand(&self.rng).below(300);
        tokio::time::sleep(Duration::from_micros(20 + back)).await;
        // A process that crashed after applying the request never answers; a writer that
        // died meanwhile never reads the answer.
        if self.proc_.dead() {
            std::future::pending::<()>().await;
        }
        {
            let s = self.node.st();
            if s.down || s.generation != self.generation {
                return Err(self.closed("peer crashed"));
            }
        }
        Ok(resp)
    }

    fn closed(&self, why: &str) -> TransportError {
        self.closed.store(true, Ordering::Release);
        TransportError::Closed {
            peer: format!("sim:{}", self.node.id),
            reason: why.into(),
        }
    }

    /// Waits until the node would take the request: not while frozen or cut off.
    async fn deliverable(&self) -> Result<Arc<Node>, TransportError> {
        loop {
            let wait = {
                let s = self.node.st();
                if s.down || s.generation != self.generation || self.proc_.dead() {
                    return Err(self.closed("peer gone"));
                }
                if s.partitioned {
                    Some(Duration::from_millis(10))
                } else {
                    match s.frozen_until {
                        Some(t) if t > Instant::now() => Some(t - Instant::now()),
                        _ => None,
                    }
                }
            };
            match wait {
                Some(d) => tokio::time::sleep(d).await,
                None => return Ok(self.node.st().node.clone()),
            }
        }
    }
}

/// A frame as it crosses the wire: its header encoded by the real encoder (checksums and all;
/// `crc` is the payload checksum a writer computed once for several replicas), then decoded and
/// checked by the real decoder on the other side. A frame the decoder refuses closes the link,
/// as the stream transport does.
pub(crate) fn over_the_wire(
    header: &Header,
    payload: Bytes,
    crc: Option<u32>,
) -> Result<Frame, String> {
    let bytes = match crc {
        Some(crc) => header.encode_with_crc(payload.len(), crc),
        None => header.encode(&payload),
    };
    let h = trireme_proto::decode_header(&bytes).map_err(|e| e.to_string())?;
    trireme_proto::check_payload(&h, &payload).map_err(|e| e.to_string())?;
    Ok(Frame::new(h, payload))
}

impl Connection for SimConn {
    fn call_crc(
        &self,
        header: Header,
        payload: Bytes,
        crc: Option<u32>,
    ) -> BoxFuture<'_, Result<Frame, TransportError>> {
        Box::pin(self.send(header, payload, crc))
    }

    fn info(&self) -> ConnectionInfo {
        ConnectionInfo {
            transport: "sim".into(),
            peer: format!("sim:{}", self.node.id),
            streams: 1,
            lanes: None,
            fallback: None,
        }
    }

    fn is_closed(&self) -> bool {
        if self.closed.load(Ordering::Acquire) {
            return true;
        }
        let s = self.node.st();
        s.down || s.generation != self.generation || self.proc_.dead()
    }
}

#[derive(Debug)]
pub(crate) struct SimConnector {
    pub(crate) nodes: Vec<Arc<SimNode>>,
    pub(crate) rng: SharedRng,
    pub(crate) tokens: Arc<AtomicU64>,
    /// The writer process that connects.
    pub(crate) proc_: Arc<Proc>,
}

impl Connector for SimConnector {
    fn connect<'a>(
        &'a self,
        target: &'a ReplicaTarget,
    ) -> BoxFut<'a, Result<Arc<dyn Connection>, VolumeError>> {
        Box::pin(async move {
            let n = self
                .nodes
                .iter()
                .find(|n| n.id == target.node)
                .expect("known node")
                .clone();
            let generation = {
                let s = n.st();
                if s.down {
                    return Err(VolumeError::Transport {
                        node: n.id,
                        source: TransportError::Connect {
                            addr: target.addr.clone(),
                            source: std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
                        },
                    });
                }
                s.generation
            };
            Ok(Arc::new(SimConn {
                node: n,
                proc_: self.proc_.clone(),
                generation,
                token: self.tokens.fetch_add(1, Ordering::Relaxed),
                rng: self.rng.clone(),
                closed: AtomicBool::new(false),
            }) as Arc<dyn Connection>)
        })
    }
}
