//! A small NBD client: fixed-newstyle handshake with `NBD_OPT_GO`, simple replies, many requests
//! in flight matched by cookie. Used by `trireme bench` for `nbd://` and `nbd+unix://` targets.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::oneshot;

use crate::codec::{encode_request, Request};
use crate::consts::*;

/// Errors of the NBD client.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ClientError {
    #[error("connect to {uri}: {what}")]
    Connect { uri: String, what: String },
    #[error(
        "bad NBD URI {0:?}: expected nbd://HOST[:PORT]/EXPORT or nbd+unix:///EXPORT?socket=PATH"
    )]
    BadUri(String),
    #[error("handshake: {0}")]
    Handshake(String),
    #[error("server answered errno {errno} to {command}")]
    Errno { command: &'static str, errno: u32 },
    #[error("connection closed: {0}")]
    Closed(String),
}

/// Where an NBD export is, parsed from a URI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    Tcp { addr: String, export: String },
    Unix { path: String, export: String },
}

/// Parses `nbd://host[:port][/export]` and `nbd+unix:///[export]?socket=PATH`.
pub fn parse_uri(uri: &str) -> Result<Endpoint, ClientError> {
    let bad = || ClientError::BadUri(uri.to_string());
    if let Some(rest) = uri.strip_prefix("nbd+unix://") {
        let (path_part, query) = rest.split_once('?').ok_or_else(bad)?;
        let export = path_part.strip_prefix('/').unwrap_or(path_part).to_string();
        let socket = query
            .split('&')
            .find_map(|kv| kv.strip_prefix("socket="))
            .filter(|s| !s.is_empty())
            .ok_or_else(bad)?;
        return Ok(Endpoint::Unix {
            path: socket.to_string(),
            export,
        });
    }
    if let Some(rest) = uri.strip_prefix("nbd://") {
        let (hostport, export) = match rest.split_once('/') {
            Some((h, e)) => (h, e.to_string()),
            None => (rest, String::new()),
        };
        if hostport.is_empty() {
            return Err(bad());
        }
        let addr = if hostport
            .rsplit_once(':')
            .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
        {
            hostport.to_string()
        } else {
            format!("{hostport}:10809")
        };
        return Ok(Endpoint::Tcp { addr, export });
    }
    Err(bad())
}

type Waiters = Arc<
    Mutex<(
        Option<String>,
        HashMap<u64, oneshot::Sender<Result<Bytes, ClientError>>>,
    )>,
>;

/// One NBD connection.
pub struct NbdClient {
    size: u64,
    flags: u16,
    writer: tokio::sync::Mutex<Box<dyn AsyncWrite + Send + Unpin>>,
    waiters: Waiters,
    next_cookie: AtomicU64,
    /// Expected read length per cookie, so the reader knows how much data follows a reply.
    read_lens: Arc<Mutex<HashMap<u64, u32>>>,
}

impl std::fmt::Debug for NbdClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NbdClient")
            .field("size", &self.size)
            .field("flags", &self.flags)
            .finish()
    }
}

impl NbdClient {
    /// Connects to `uri` and negotiates the export.
    pub async fn connect(uri: &str) -> Result<NbdClient, ClientError> {
        let ep = parse_uri(uri)?;
        let cerr = |e: std::io::Error| ClientError::Connect {
            uri: uri.to_string(),
            what: e.to_string(),
        };
        match ep {
            Endpoint::Tcp { addr, export } => {
                let s = tokio::net::TcpStream::connect(&addr).await.map_err(cerr)?;
                let _ = s.set_nodelay(true);
                let (r, w) = s.into_split();
                Self::handshake(r, Box::new(w), &export).await
            }
            Endpoint::Unix { path, export } => {
                let s = tokio::net::UnixStream::connect(&path).await.map_err(cerr)?;
                let (r, w) = s.into_split();
                Self::handshake(r, Box::new(w), &export).await
            }
        }
    }

    pub(crate) async fn handshake<R: AsyncRead + Unpin + Send + 'static>(
        mut r: R,
        mut w: Box<dyn AsyncWrite + Send + Unpin>,
        export: &str,
    ) -> Result<NbdClient, ClientError> {
        let hs = |e: std::io::Error| ClientError::Handshake(e.to_string());
        if r.read_u64().await.map_err(hs)? != NBDMAGIC
            || r.read_u64().await.map_err(hs)? != IHAVEOPT
        {
            return Err(ClientError::Handshake("not an NBD newstyle server".into()));
        }
        let server_flags = r.read_u16().await.map_err(hs)?;
        if server_flags & FLAG_FIXED_NEWSTYLE == 0 {
            return Err(ClientError::Handshake(
                "server is not fixed-newstyle".into(),
            ));
        }
        let mut cflags = CLIENT_FIXED_NEWSTYLE;
        if server_flags & FLAG_NO_ZEROES != 0 {
            cflags |= CLIENT_NO_ZEROES;
        }
        let mut out = Vec::new();
        out.extend_from_slice(&cflags.to_be_bytes());
        let mut data = Vec::new();
        data.extend_from_slice(&(export.len() as u32).to_be_bytes());
        data.extend_from_slice(export.as_bytes());
        data.extend_from_slice(&0u16.to_be_bytes());
        out.extend_from_slice(&IHAVEOPT.to_be_bytes());
        out.extend_from_slice(&OPT_GO.to_be_bytes());
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        out.extend_from_slice(&data);
        w.write_all(&out).await.map_err(hs)?;
        w.flush().await.map_err(hs)?;
        let (mut size, mut flags) = (None, 0u16);
        loop {
            if r.read_u64().await.map_err(hs)? != REPLY_MAGIC {
                return Err(ClientError::Handshake("bad option reply magic".into()));
            }
            let _opt = r.read_u32().await.map_err(hs)?;
            let kind = r.read_u32().await.map_err(hs)?;
            let len = r.read_u32().await.map_err(hs)?;
            if len > 64 * 1024 {
                return Err(ClientError::Handshake(format!(
                    "option reply of {len} bytes"
                )));
            }
            let mut d = vec![0u8; len as usize];
            r.read_exact(&mut d).await.map_err(hs)?;
            match kind {
                REP_ACK => break,
                REP_INFO if d.len() >= 12 && u16::from_be_bytes([d[0], d[1]]) == INFO_EXPORT => {
                    size = Some(u64::from_be_bytes(d[2..10].try_into().expect("8 bytes")));
                    flags = u16::from_be_bytes([d[10], d[11]]);
                }
                REP_INFO => {}
                k if k & (1 << 31) != 0 => {
                    return Err(ClientError::Handshake(format!(
                        "export {export:?} refused ({k:#x}): {}",
                        String::from_utf8_lossy(&d)
                    )))
                }
                k => {
                    return Err(ClientError::Handshake(format!(
                        "unexpected option reply {k}"
                    )))
                }
            }
        }
        let size = size.ok_or_else(|| ClientError::Handshake("no export size".into()))?;
        let waiters: Waiters = Arc::default();
        let read_lens: Arc<Mutex<HashMap<u64, u32>>> = Arc::default();
        let (wt, rl) = (waiters.clone(), read_lens.clone());
        tokio::spawn(async move {
            let reason = read_replies(BufReader::with_capacity(256 * 1024, r), &wt, &rl).await;
            let mut g = wt.lock().unwrap_or_else(|e| e.into_inner());
            g.0 = Some(reason.clone());
            for (_, tx) in g.1.drain() {
                let _ = tx.send(Err(ClientError::Closed(reason.clone())));
            }
        });
        Ok(NbdClient {
            size,
            flags,
            writer: tokio::sync::Mutex::new(w),
            waiters,
            next_cookie: AtomicU64::new(1),
            read_lens,
        })
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn can_flush(&self) -> bool {
        self.flags & TF_SEND_FLUSH != 0
    }

    async fn request(
        &self,
        command: u16,
        flags: u16,
        offset: u64,
        length: u32,
        payload: &[u8],
    ) -> Result<Bytes, ClientError> {
        let cookie = self.next_cookie.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let mut g = self.waiters.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(reason) = &g.0 {
                return Err(ClientError::Closed(reason.clone()));
            }
            g.1.insert(cookie, tx);
        }
        if command == CMD_READ {
            self.read_lens
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(cookie, length);
        }
        let req = encode_request(&Request {
            flags,
            command,
            cookie,
            offset,
            length,
        });
        {
            let mut w = self.writer.lock().await;
            let sent = async {
                w.write_all(&req).await?;
                if !payload.is_empty() {
                    w.write_all(payload).await?;
                }
                w.flush().await
            }
            .await;
            if let Err(e) = sent {
                return Err(ClientError::Closed(e.to_string()));
            }
        }
        rx.await
            .map_err(|_| ClientError::Closed("reader stopped".into()))?
    }

    pub async fn read(&self, offset: u64, len: u32) -> Result<Bytes, ClientError> {
        self.request(CMD_READ, 0, offset, len, &[]).await
    }

    pub async fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), ClientError> {
        let flags = if fua { CMD_FLAG_FUA } else { 0 };
        self.request(CMD_WRITE, flags, offset, data.len() as u32, data)
            .await
            .map(|_| ())
    }

    pub async fn flush(&self) -> Result<(), ClientError> {
        self.request(CMD_FLUSH, 0, 0, 0, &[]).await.map(|_| ())
    }
}

async fn read_replies<R: AsyncRead + Unpin>(
    mut r: R,
    waiters: &Waiters,
    read_lens: &Mutex<HashMap<u64, u32>>,
) -> String {
    loop {
        let magic = match r.read_u32().await {
            Ok(m) => m,
            Err(e) => return e.to_string(),
        };
        if magic != SIMPLE_REPLY_MAGIC {
            return format!("unexpected reply magic {magic:#x}");
        }
        let (errno, cookie) = match (r.read_u32().await, r.read_u64().await) {
            (Ok(e), Ok(c)) => (e, c),
            _ => return "short reply".into(),
        };
        let len = read_lens
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&cookie);
        let result = match (errno, len) {
            (0, Some(n)) => {
                let mut b = BytesMut::zeroed(n as usize);
                if let Err(e) = r.read_exact(&mut b).await {
                    return e.to_string();
                }
                Ok(b.freeze())
            }
            (0, None) => Ok(Bytes::new()),
            (e, _) => Err(ClientError::Errno {
                command: if len.is_some() { "read" } else { "request" },
                errno: e,
            }),
        };
        let tx = waiters
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .1
            .remove(&cookie);
        match tx {
            Some(tx) => {
                let _ = tx.send(result);
            }
            None => return format!("reply to unknown cookie {cookie}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris() {
        assert_eq!(
            parse_uri("nbd+unix:///vol0?socket=/tmp/x.sock").unwrap(),
            Endpoint::Unix {
                path: "/tmp/x.sock".into(),
                export: "vol0".into()
            }
        );
        assert_eq!(
            parse_uri("nbd://127.0.0.1:10810/vol0").unwrap(),
            Endpoint::Tcp {
                addr: "127.0.0.1:10810".into(),
                export: "vol0".into()
            }
        );
        assert_eq!(
            parse_uri("nbd://localhost").unwrap(),
            Endpoint::Tcp {
                addr: "localhost:10809".into(),
                export: String::new()
            }
        );
        for bad in [
            "nbd+unix:///vol0",
            "http://x",
            "nbd://",
            "nbd+unix:///v?socket=",
        ] {
            assert!(parse_uri(bad).is_err(), "{bad}");
        }
    }
}
