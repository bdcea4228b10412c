//! The etcd backend (etcd v3 API through the `etcd-client` crate; etcd 3.4 or later).
//!
//! Every call has a deadline ([`CALL_TIMEOUT`]): while etcd is unreachable calls fail with
//! [`MetaError::Unavailable`] instead of hanging, and the caller decides whether to retry (a
//! writer taking a replica out retries until it is recorded; the data path never calls here).

use std::collections::HashMap;
use std::time::Duration;

use etcd_client::{
    Client, Compare as ECompare, CompareOp, ConnectOptions, EventType, GetOptions, PutOptions,
    Txn as ETxn, TxnOp, TxnOpResponse, WatchOptions,
};

use crate::kv::{
    CmpOp, KeyValue, LeaseId, MetaFut, MetaStore, Op, Target, Txn, TxnResult, Watch, WatchEvent,
    WATCH_BUFFER,
};
use crate::MetaError;

/// The longest any one etcd call may take.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(3);

/// Cluster metadata in etcd.
pub struct EtcdMeta {
    client: Client,
    endpoints: Vec<String>,
    keepers: tokio::sync::Mutex<
        HashMap<LeaseId, (etcd_client::LeaseKeeper, etcd_client::LeaseKeepAliveStream)>,
    >,
}

impl EtcdMeta {
    /// The etcd client, for what the key-value seam does not cover (etcd's access control,
    /// `rbac.rs`).
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// The endpoints this store was reached at.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }
}

impl std::fmt::Debug for EtcdMeta {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdMeta")
            .field("endpoints", &self.endpoints)
            .finish()
    }
}

/// Splits `--etcd` (`http://a:2379,http://b:2379` or `a:2379,b:2379`) into endpoints.
pub fn parse_endpoints(s: &str) -> Result<Vec<String>, MetaError> {
    let eps: Vec<String> = s
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|e| {
            if e.contains("://") {
                e.to_string()
            } else {
                format!("http://{e}")
            }
        })
        .collect();
    if eps.is_empty() {
        return Err(MetaError::BadEndpoints(s.to_string()));
    }
    for e in &eps {
        let rest = e.split_once("://").map_or("", |(_, r)| r);
        let ok = (e.starts_with("http://") || e.starts_with("https://"))
            && rest
                .rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
        if !ok {
            return Err(MetaError::BadEndpoints(format!(
                "{e:?} (expected HOST:PORT, http://HOST:PORT or https://HOST:PORT)"
            )));
        }
    }
    Ok(eps)
}

fn unavailable(e: impl std::fmt::Display) -> MetaError {
    MetaError::Unavailable(e.to_string())
}

/// etcd's answer as a [`MetaError`]. The calls made here (key-value, transactions, leases) get
/// `NOT_FOUND` only for a lease that expired or never existed, and the client's keep-alive
/// stream says so in the one message it has for it; the caller fills in the lease's id. This
/// is the one place that reads etcd's wording.
fn from_etcd_error(e: etcd_client::Error) -> MetaError {
    match e {
        etcd_client::Error::GRpcStatus(s) if s.code() == tonic::Code::NotFound => {
            MetaError::NoLease(0)
        }
        etcd_client::Error::LeaseKeepAliveError(m) if m == "lease not found" => {
            MetaError::NoLease(0)
        }
        // etcd's access control: the certificate's name is no user, or its roles do not
        // cover the key. Said as it is, never waited out as an outage.
        etcd_client::Error::GRpcStatus(s)
            if matches!(
                s.code(),
                tonic::Code::PermissionDenied | tonic::Code::Unauthenticated
            ) || s.message().contains("user name not found")
                || s.message().contains("permission denied") =>
        {
            MetaError::Denied(format!(
                "{} (a certificate's common name is its etcd user: `trireme etcd rbac` sets the users and roles up)",
                s.message()
            ))
        }
        e => unavailable(e),
    }
}

async fn timed<T>(
    f: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, MetaError> {
    match tokio::time::timeout(CALL_TIMEOUT, f).await {
        Ok(r) => r.map_err(from_etcd_error),
        Err(_) => Err(MetaError::Unavailable(format!(
            "etcd did not answer within {CALL_TIMEOUT:?}"
        ))),
    }
}

fn from_etcd(kv: &etcd_client::KeyValue) -> Result<KeyValue, MetaError> {
    Ok(KeyValue {
        key: String::from_utf8(kv.key().to_vec()).map_err(|e| MetaError::Corrupt {
            key: String::from_utf8_lossy(kv.key()).into_owned(),
            what: format!("key is not UTF-8: {e}"),
        })?,
        value: kv.value().to_vec(),
        create_revision: kv.create_revision(),
        mod_revision: kv.mod_revision(),
        version: kv.version(),
        lease: kv.lease(),
    })
}

/// How to reach etcd over TLS: PEM bytes of the CA that issued etcd's certificate, and of the
/// client certificate and key this process presents.
#[derive(Clone)]
pub struct EtcdTls {
    pub ca_pem: Vec<u8>,
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
}

impl std::fmt::Debug for EtcdTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EtcdTls")
    }
}

impl EtcdMeta {
    /// Connects to etcd at `endpoints` (any member; calls go to whichever answers).
    /// `https://` endpoints need `tls`: the CA that issued etcd's certificate and the client
    /// certificate etcd checks (`--client-cert-auth`).
    pub async fn connect(
        endpoints: &[String],
        tls: Option<&EtcdTls>,
    ) -> Result<EtcdMeta, MetaError> {
        let mut opts = ConnectOptions::new()
            .with_connect_timeout(CALL_TIMEOUT)
            .with_timeout(CALL_TIMEOUT)
            .with_keep_alive(Duration::from_secs(2), Duration::from_secs(2))
            .with_keep_alive_while_idle(true);
        let secure = endpoints
            .iter()
            .filter(|e| e.starts_with("https://"))
            .count();
        match (secure, tls) {
            (0, _) => {}
            (n, Some(t)) if n == endpoints.len() => {
                opts = opts.with_tls(
                    etcd_client::TlsOptions::new()
                        .ca_certificate(etcd_client::Certificate::from_pem(&t.ca_pem))
                        .identity(etcd_client::Identity::from_pem(&t.cert_pem, &t.key_pem)),
                );
            }
            (n, Some(_)) if n < endpoints.len() => {
                return Err(MetaError::BadEndpoints("mixed http:// and https://".into()))
            }
            _ => {
                return Err(MetaError::BadEndpoints(
                    "https:// needs a TLS identity (--tls-identity DIR, or --tls-dir for a node)"
                        .into(),
                ))
            }
        }
        let client = timed(Client::connect(endpoints, Some(opts))).await?;
        Ok(EtcdMeta {
            client,
            endpoints: endpoints.to_vec(),
            keepers: Default::default(),
        })
    }
}

fn compare(c: &crate::kv::Compare) -> ECompare {
    let op = match c.op {
        CmpOp::Equal => CompareOp::Equal,
        CmpOp::NotEqual => CompareOp::NotEqual,
        CmpOp::Greater => CompareOp::Greater,
        CmpOp::Less => CompareOp::Less,
    };
    let k = c.key.as_bytes().to_vec();
    match &c.target {
        Target::Version(v) => ECompare::version(k, op, *v),
        Target::CreateRevision(v) => ECompare::create_revision(k, op, *v),
        Target::ModRevision(v) => ECompare::mod_revision(k, op, *v),
        Target::Value(v) => ECompare::value(k, op, v.clone()),
        Target::Lease(v) => ECompare::lease(k, op, *v),
    }
}

fn op(o: &Op) -> TxnOp {
    match o {
        Op::Put { key, value, lease } => {
            let opts = (*lease != 0).then(|| PutOptions::new().with_lease(*lease));
            TxnOp::put(key.as_bytes(), value.clone(), opts)
        }
        Op::Delete { key } => TxnOp::delete(key.as_bytes(), None),
        Op::Get { key } => TxnOp::get(key.as_bytes(), None),
    }
}

impl MetaStore for EtcdMeta {
    fn backend(&self) -> &'static str {
        "etcd"
    }

    fn range<'a>(&'a self, prefix: &'a str) -> MetaFut<'a, (Vec<KeyValue>, i64)> {
        Box::pin(async move {
            let mut c = self.client.clone();
            let r = timed(c.get(prefix, Some(GetOptions::new().with_prefix()))).await?;
            let rev = r.header().map_or(0, |h| h.revision());
            let kvs = r.kvs().iter().map(from_etcd).collect::<Result<_, _>>()?;
            Ok((kvs, rev))
        })
    }

    fn txn(&self, txn: Txn) -> MetaFut<'_, TxnResult> {
        Box::pin(async move {
            let t = ETxn::new()
                .when(txn.compare.iter().map(compare).collect::<Vec<_>>())
                .and_then(txn.success.iter().map(op).collect::<Vec<_>>())
                .or_else(txn.failure.iter().map(op).collect::<Vec<_>>());
            let mut c = self.client.clone();
            let r = match timed(c.txn(t)).await {
                Err(MetaError::NoLease(_)) => {
                    let lease = txn
                        .success
                        .iter()
                        .chain(&txn.failure)
                        .find_map(|o| match o {
                            Op::Put { lease, .. } if *lease != 0 => Some(*lease),
                            _ => None,
                        })
                        .unwrap_or(0);
                    return Err(MetaError::NoLease(lease));
                }
                r => r?,
            };
            let mut gets = Vec::new();
            for resp in r.op_responses() {
                if let TxnOpResponse::Get(g) = resp {
                    gets.push(g.kvs().first().map(from_etcd).transpose()?);
                }
            }
            Ok(TxnResult {
                succeeded: r.succeeded(),
                revision: r.header().map_or(0, |h| h.revision()),
                gets,
            })
        })
    }

    fn compact(&self, revision: i64) -> MetaFut<'_, ()> {
        Box::pin(async move {
            let mut c = self.client.clone();
            match timed(c.compact(revision, None)).await {
                // Compacted there (or further) already, by etcd's own schedule.
                Err(e) if e.to_string().contains("compacted") => Ok(()),
                r => r.map(|_| ()),
            }
        })
    }

    fn alarms(&self) -> MetaFut<'_, Vec<String>> {
        Box::pin(async move {
            let mut c = self.client.clone();
            let r = timed(c.alarm(
                etcd_client::AlarmAction::Get,
                etcd_client::AlarmType::None,
                None,
            ))
            .await?;
            Ok(r.alarms()
                .iter()
                .map(|a| {
                    let what = match a.alarm() {
                        etcd_client::AlarmType::Nospace => crate::kv::ALARM_NOSPACE,
                        etcd_client::AlarmType::Corrupt => "CORRUPT",
                        etcd_client::AlarmType::None => "NONE",
                    };
                    format!("{what} on member {:x}", a.member_id())
                })
                .collect())
        })
    }

    fn grant(&self, ttl: Duration) -> MetaFut<'_, LeaseId> {
        Box::pin(async move {
            let mut c = self.client.clone();
            let secs = ttl.as_secs().max(1) as i64;
            Ok(timed(c.lease_grant(secs, None)).await?.id())
        })
    }

    fn keep_alive(&self, lease: LeaseId) -> MetaFut<'_, bool> {
        Box::pin(async move {
            let mut keepers = self.keepers.lock().await;
            if let std::collections::hash_map::Entry::Vacant(slot) = keepers.entry(lease) {
                let mut c = self.client.clone();
                let k = match timed(c.lease_keep_alive(lease)).await {
                    Err(MetaError::NoLease(_)) => return Ok(false),
                    r => r?,
                };
                slot.insert(k);
            }
            let (keeper, stream) = keepers.get_mut(&lease).expect("inserted above");
            let res = async {
                keeper.keep_alive().await?;
                stream.message().await
            };
            match timed(res).await {
                Ok(Some(r)) if r.ttl() > 0 => Ok(true),
                Ok(_) => {
                    keepers.remove(&lease);
                    Ok(false)
                }
                Err(e) => {
                    // The stream may be broken: the next call opens a new one.
                    keepers.remove(&lease);
                    match e {
                        MetaError::NoLease(_) => Ok(false),
                        e => Err(e),
                    }
                }
            }
        })
    }

    fn revoke(&self, lease: LeaseId) -> MetaFut<'_, ()> {
        Box::pin(async move {
            self.keepers.lock().await.remove(&lease);
            let mut c = self.client.clone();
            match timed(c.lease_revoke(lease)).await {
                Ok(_) => Ok(()),
                Err(MetaError::NoLease(_)) => Ok(()),
                Err(e) => Err(e),
            }
        })
    }

    fn watch<'a>(&'a self, prefix: &'a str, from_revision: i64) -> MetaFut<'a, Watch> {
        Box::pin(async move {
            let mut c = self.client.clone();
            let mut opts = WatchOptions::new().with_prefix();
            if from_revision > 0 {
                opts = opts.with_start_revision(from_revision);
            }
            let mut stream = timed(c.watch(prefix, Some(opts))).await?;
            // The first answer says whether the watch was created (or its start compacted).
            let first = timed(stream.message()).await?;
            match first {
                Some(r) if r.canceled() && r.compact_revision() > 0 => {
                    return Err(MetaError::Compacted {
                        asked: from_revision,
                        oldest: r.compact_revision(),
                    })
                }
                Some(r) if r.canceled() => {
                    return Err(MetaError::Unavailable(format!(
                        "etcd canceled the watch: {}",
                        r.cancel_reason()
                    )))
                }
                Some(_) => {}
                None => return Err(unavailable("etcd closed the watch stream")),
            }
            let (tx, rx) = tokio::sync::mpsc::channel(WATCH_BUFFER);
            tokio::spawn(async move {
                // `stream` holds the request side open; dropping it cancels the watch.
                while let Ok(Some(r)) = stream.message().await {
                    if r.canceled() {
                        return;
                    }
                    for ev in r.events() {
                        let Some(kv) = ev.kv() else { continue };
                        let Ok(kv) = from_etcd(kv) else { continue };
                        let e = WatchEvent {
                            deleted: ev.event_type() == EventType::Delete,
                            kv,
                        };
                        if tx.try_send(e).is_err() {
                            return;
                        }
                    }
                }
            });
            Ok(Watch { rx })
        })
    }
}
