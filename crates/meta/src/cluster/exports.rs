//! NVMe/TCP export records (`nvmf/<volume>/<port id>`): each server that serves a volume over
//! NVMe/TCP says where, under which subsystem NQN, in which ANA state and to which hosts. The
//! key is bound to the serving process's own lease, so it goes when that process dies; one
//! process at a time holds a port id of a volume (the host's multipath needs them distinct).

use serde::{Deserialize, Serialize};

use super::*;
use crate::kv::Op;
use crate::MetaError;

/// Most connected hosts one record lists (the rest are counted in `more_hosts`).
pub const MAX_EXPORT_HOSTS: usize = 32;

/// One server's NVMe/TCP export of a volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvmfExportRecord {
    pub volume: String,
    /// 1 to 15: which range of controller ids this server's controllers take.
    pub port_id: u16,
    /// Where it listens (`host:port`).
    pub addr: String,
    /// The subsystem hosts connect to.
    pub nqn: String,
    pub host: String,
    pub pid: u32,
    /// `optimized` (it holds the volume's writer) or `inaccessible` (a standby).
    pub ana: String,
    /// The NQNs of the hosts connected now, one per controller.
    #[serde(default)]
    pub hosts: Vec<String>,
    /// Controllers beyond [`MAX_EXPORT_HOSTS`].
    #[serde(default, skip_serializing_if = "is_zero")]
    pub more_hosts: usize,
    /// The identity of the process (its certificate's role), if it uses TLS: set by the
    /// manager from the caller's certificate, whatever the record says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<String>,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl NvmfExportRecord {
    /// Refuses a record no server of ours writes: an id out of range, an unknown ANA state,
    /// an address, NQN or host list out of bounds (the manager writes a client's record only
    /// if this passes).
    pub fn check(&self) -> Result<(), MetaError> {
        let bad = |what: String| {
            Err(MetaError::Refused(format!(
                "an NVMe/TCP export record: {what}"
            )))
        };
        crate::check_name(&self.volume)?;
        if !(1..=15).contains(&self.port_id) {
            return bad(format!("port id {} (1 to 15)", self.port_id));
        }
        if !matches!(self.ana.as_str(), "optimized" | "inaccessible") {
            return bad(format!("ANA state {:?}", self.ana));
        }
        if self.addr.len() > 64 || self.host.len() > 255 {
            return bad("an address or host name too long".into());
        }
        if !crate::is_host_nqn(&self.nqn) || crate::check_access_entry(&self.nqn).is_err() {
            return bad(format!("subsystem NQN {:?}", self.nqn));
        }
        if self.hosts.len() > MAX_EXPORT_HOSTS {
            return bad(format!(
                "{} hosts (at most {MAX_EXPORT_HOSTS})",
                self.hosts.len()
            ));
        }
        for h in &self.hosts {
            if crate::check_access_entry(h).is_err() {
                return bad(format!("host {h:?}"));
            }
        }
        Ok(())
    }
}

impl ClusterMeta {
    fn export_key(volume: &str, port_id: u16) -> String {
        key(&format!("nvmf/{volume}/{port_id}"))
    }

    /// Every export record, by volume then port id. One that does not decode is skipped,
    /// named in a warning.
    pub async fn nvmf_exports(&self) -> Result<Vec<NvmfExportRecord>, MetaError> {
        self.exports_under(&key("nvmf/")).await
    }

    /// The export records of `volume`.
    pub async fn nvmf_exports_of(&self, volume: &str) -> Result<Vec<NvmfExportRecord>, MetaError> {
        self.exports_under(&key(&format!("nvmf/{volume}/"))).await
    }

    async fn exports_under(&self, dir: &str) -> Result<Vec<NvmfExportRecord>, MetaError> {
        let (kvs, _) = self.store.range(dir).await?;
        let mut out: Vec<NvmfExportRecord> = kvs
            .iter()
            .filter_map(|kv| match decode(kv) {
                Ok(r) => Some(r),
                Err(e) => {
                    tracing::warn!("skipping an NVMe/TCP export record: {e}");
                    None
                }
            })
            .collect();
        out.sort_by(|a, b| (&a.volume, a.port_id).cmp(&(&b.volume, b.port_id)));
        Ok(out)
    }

    /// Writes `rec` under `lease` if its port id of its volume is free or already bound to
    /// `lease` (this process's own record). Returns the record of the process that holds the
    /// port id otherwise, and writes nothing.
    pub async fn put_nvmf_export(
        &self,
        rec: &NvmfExportRecord,
        lease: LeaseId,
    ) -> Result<Option<NvmfExportRecord>, MetaError> {
        let k = Self::export_key(&rec.volume, rec.port_id);
        for _ in 0..MAX_TRIES {
            let compare = match self.store.get(&k).await? {
                None => Compare::absent(k.clone()),
                Some(kv) if kv.lease == lease => Compare::lease(k.clone(), lease),
                Some(kv) => {
                    let held = decode(&kv)?;
                    return Ok(Some(held));
                }
            };
            let put = Op::put_leased(k.clone(), encode(rec), lease);
            if self.write(vec![compare], vec![put]).await?.is_some() {
                return Ok(None);
            }
        }
        Err(MetaError::Contended {
            what: format!("recording the NVMe/TCP export of volume {:?}", rec.volume),
            tries: MAX_TRIES,
        })
    }
}
