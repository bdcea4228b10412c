//! What a volume's writer asks of the manager: attaching (its attach record), its replica
//! states, its size, its answers to the manager's requests, detaching.
//!
//! The manager is the only process a client's certificate reaches that writes the cluster's
//! records: etcd lets a client write its own writer report alone (`trireme_meta::rbac`).
//! Each of these requests from a client is checked here first: the volume's access list names
//! the client, and, but for an attach, the volume's attach record (which only the manager
//! writes) names it as the writer at the request's epoch. So a client on a volume's access
//! list that is not its writer cannot take a copy out, mark one in sync, move the epoch,
//! resize the volume or answer a request in the writer's place. Nodes, operators and the
//! process's own socket (`Peer::Trusted`) pass as before.

use trireme_meta::{AttachRecord, MetaError, VolumeRecord};
use trireme_transport::Peer;

use super::{Manager, Result};
use crate::api::{Request, WriterAttached};
use crate::error::ManagerError;

/// The client name of a client certificate; `None` for the cluster's own identities.
fn client_of(peer: &Peer) -> Option<&str> {
    match peer {
        Peer::Cert(r) => match &**r {
            trireme_tls::Role::Client(n) => Some(n),
            _ => None,
        },
        Peer::Trusted => None,
    }
}

/// How a writer of record reads in a refusal: "client alice (pid 12 on host h, epoch 4)".
fn writer_words(a: &AttachRecord) -> String {
    format!(
        "{} (pid {} on host {}, epoch {})",
        a.identity.as_deref().unwrap_or("a writer of the cluster"),
        a.pid,
        a.host,
        a.epoch
    )
}

fn denied(peer: &Peer, what: String) -> ManagerError {
    trireme_net::warn_throttled_by!(
        super::REFUSED,
        "writer request",
        %peer,
        "refused a writer's request: {what}"
    );
    ManagerError::Denied(what)
}

impl Manager {
    /// The volume, if `peer` may write it: a client only if its access list names it.
    async fn writable_by(&self, peer: &Peer, name: &str) -> Result<VolumeRecord> {
        let v = self.meta.volume(name).await?;
        if let Some(me) = client_of(peer) {
            if !v
                .access
                .iter()
                .any(|a| a == me || a == trireme_meta::ANY_CLIENT)
            {
                return Err(denied(
                    peer,
                    format!("client {me} is not on volume {name}'s access list"),
                ));
            }
        }
        Ok(v)
    }

    /// Refuses `peer` unless it is `name`'s writer of record at `epoch` (always true of the
    /// cluster's own identities: they are checked by the epoch alone, as before).
    async fn check_writer(&self, peer: &Peer, name: &str, epoch: u64) -> Result<()> {
        let Some(me) = client_of(peer) else {
            return Ok(());
        };
        self.writable_by(peer, name).await?;
        let ident = format!("client {me}");
        match self.meta.attachment(name).await? {
            Some((a, _)) if a.identity.as_deref() == Some(ident.as_str()) && a.epoch == epoch => {
                Ok(())
            }
            Some((a, _)) => Err(denied(
                peer,
                format!(
                    "{ident} is not volume {name}'s writer at epoch {epoch}: {} writes it",
                    writer_words(&a)
                ),
            )),
            None => Err(denied(
                peer,
                format!("{ident} is not volume {name}'s writer: no writer is attached"),
            )),
        }
    }

    /// Requests of a volume's writer (see the module's docs).
    pub(super) async fn handle_writer(
        &self,
        req: Request,
        peer: &Peer,
    ) -> Result<serde_json::Value> {
        fn to<T: serde::Serialize>(v: Result<T>) -> Result<serde_json::Value> {
            v.map(|x| serde_json::to_value(x).expect("serializable"))
        }
        match req {
            Request::WriterAttach {
                name,
                record,
                lease,
                force,
            } => to(self.writer_attach(peer, &name, record, lease, force).await),
            Request::WriterReattach {
                name,
                mut record,
                lease,
            } => to(async {
                self.check_writer(peer, &name, record.epoch).await?;
                if let Some(me) = client_of(peer) {
                    record.identity = Some(format!("client {me}"));
                }
                Ok(self.meta.reattach(&name, &record, lease).await?)
            }
            .await),
            Request::WriterRelease { name, epoch } => to(async {
                self.check_writer(peer, &name, epoch).await?;
                Ok(self.meta.release_attachment(&name, epoch).await?)
            }
            .await),
            Request::WriterAnswer {
                name,
                epoch,
                at,
                answer,
            } => to(async {
                self.check_writer(peer, &name, epoch).await?;
                Ok(self.meta.answer_request(&name, epoch, at, &answer).await?)
            }
            .await),
            Request::WriterReport {
                name,
                epoch,
                report,
            } => to(self.writer_report(peer, &name, epoch, report).await),
            Request::NvmfExport { record, lease } => {
                to(self.nvmf_export(peer, record, lease).await)
            }
            Request::SetReplicaState {
                name,
                epoch,
                node,
                state,
                incarnation,
            } => to(async {
                self.check_writer(peer, &name, epoch).await?;
                self.set_replica_state(&name, epoch, node, state, incarnation)
                    .await
            }
            .await),
            Request::Detach { name, epoch } => to(async {
                self.check_writer(peer, &name, epoch).await?;
                self.detach(&name, epoch).await
            }
            .await),
            Request::SetVolumeSize { name, epoch, size } => to(async {
                self.check_writer(peer, &name, epoch).await?;
                // A writer grows its volume online; only the manager shrinks one, while
                // nobody writes it.
                if client_of(peer).is_some() {
                    let now = self.meta.volume(&name).await?.size;
                    if size < now {
                        return Err(denied(
                            peer,
                            format!(
                                "a writer does not shrink volume {name} ({now} to {size} bytes)"
                            ),
                        ));
                    }
                }
                self.set_volume_size(&name, epoch, size).await
            }
            .await),
            Request::SetRegion {
                name,
                id,
                epoch,
                region,
                to: kind,
            } => to(async {
                self.check_writer(peer, &name, epoch).await?;
                self.set_region(&name, id, epoch, region, kind).await
            }
            .await),
            other => Err(ManagerError::Refused(format!(
                "not a writer's request: {other:?}"
            ))),
        }
    }

    /// Writes the report of `name`'s writer at `epoch` (see `Request::WriterReport`): under
    /// the attach record's lease, so it goes when the writer does.
    async fn writer_report(
        &self,
        peer: &Peer,
        name: &str,
        epoch: u64,
        report: trireme_meta::WriterReport,
    ) -> Result<()> {
        self.check_writer(peer, name, epoch).await?;
        if report.epoch != epoch {
            return Err(denied(
                peer,
                format!(
                    "a report of epoch {} sent as the writer of epoch {epoch}",
                    report.epoch
                ),
            ));
        }
        let size = serde_json::to_vec(&report).map_or(usize::MAX, |v| v.len());
        if size > trireme_meta::MAX_REPORT {
            return Err(denied(
                peer,
                format!(
                    "a report of {size} bytes for volume {name} (at most {})",
                    trireme_meta::MAX_REPORT
                ),
            ));
        }
        self.paced(name, &format!("volume {name}'s writer reported"))?;
        let Some((_, kv)) = self.meta.attachment(name).await? else {
            return Err(ManagerError::Refused(format!(
                "volume {name} has no writer attached"
            )));
        };
        Ok(self
            .meta
            .put_report(name, client_of(peer), &report, kv.lease)
            .await?)
    }

    /// Refuses (busy) a second write of `key` within [`crate::api::REPORT_EVERY`]: a client
    /// that writes in a loop grows etcd's history no faster than that. `what` says what was
    /// written last.
    fn paced(&self, key: &str, what: &str) -> Result<()> {
        let mut last = self.reported.lock().unwrap_or_else(|e| e.into_inner());
        let now = tokio::time::Instant::now();
        if last
            .get(key)
            .is_some_and(|t| now.duration_since(*t) < crate::api::REPORT_EVERY)
        {
            return Err(ManagerError::Busy(format!(
                "{what} less than {:?} ago: try again later",
                crate::api::REPORT_EVERY
            )));
        }
        last.insert(key.to_string(), now);
        Ok(())
    }

    /// Records a server's NVMe/TCP export (see `Request::NvmfExport`): at most one write per
    /// export each [`crate::api::REPORT_EVERY`], like a writer's report.
    async fn nvmf_export(
        &self,
        peer: &Peer,
        mut record: trireme_meta::NvmfExportRecord,
        lease: i64,
    ) -> Result<Option<trireme_meta::NvmfExportRecord>> {
        self.writable_by(peer, &record.volume).await?;
        if let Err(e) = record.check() {
            return Err(denied(peer, e.to_string()));
        }
        record.identity = client_of(peer).map(|c| format!("client {c}"));
        self.paced(
            &format!("nvmf/{}/{}", record.volume, record.port_id),
            &format!(
                "volume {}'s export {} was recorded",
                record.volume, record.port_id
            ),
        )?;
        Ok(self.meta.put_nvmf_export(&record, lease).await?)
    }

    /// Attaches a writer on another host (see `Request::WriterAttach`).
    async fn writer_attach(
        &self,
        peer: &Peer,
        name: &str,
        mut record: AttachRecord,
        lease: i64,
        force: bool,
    ) -> Result<WriterAttached> {
        self.writable_by(peer, name).await?;
        if let Some(me) = client_of(peer) {
            let ident = format!("client {me}");
            if force {
                if let Some((a, _)) = self.meta.attachment(name).await? {
                    if a.identity.as_deref() != Some(ident.as_str()) {
                        return Err(denied(
                            peer,
                            format!(
                                "{ident} may not fence volume {name}'s writer, {}: only its own client or an operator may (`trireme volume delete --force`, or wait for its lease)",
                                writer_words(&a)
                            ),
                        ));
                    }
                }
            }
            record.identity = Some(ident);
        }
        match self.meta.attach(name, &record, lease, force).await {
            Ok((volume, unclean)) => {
                tracing::info!(
                    volume = name,
                    epoch = volume.epoch,
                    writer = record.identity.as_deref().unwrap_or(""),
                    host = record.host,
                    "a writer attached through the manager"
                );
                Ok(WriterAttached::Attached {
                    volume: Box::new(volume),
                    unclean,
                })
            }
            Err(MetaError::Attached {
                pid, host, epoch, ..
            }) => Ok(WriterAttached::Held { pid, host, epoch }),
            Err(e) => Err(e.into()),
        }
    }
}
