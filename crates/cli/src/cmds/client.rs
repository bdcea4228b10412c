//! The commands that talk to a cluster's manager: volumes, nodes, status, maintenance.

#[allow(unused_imports)]
use super::*;

pub(crate) async fn client_cmd(cli: &Cli) -> Result<(), CliError> {
    let mut cc = control_client(cli).await?;
    let out = cli.output;
    match &cli.cmd {
        Cmd::Node(NodeCmd::List) => {
            let nodes: Vec<NodeStatus> = cc.call(&Request::NodeList).await?;
            print(out, &nodes, |n| nodes_table(n));
        }
        Cmd::Node(NodeCmd::Stop { id })
        | Cmd::Node(NodeCmd::Start { id })
        | Cmd::Node(NodeCmd::Undrain { id }) => {
            let req = match &cli.cmd {
                Cmd::Node(NodeCmd::Stop { .. }) => Request::NodeStop { id: *id },
                Cmd::Node(NodeCmd::Start { .. }) => Request::NodeStart { id: *id },
                _ => Request::NodeUndrain { id: *id },
            };
            let msg: String = cc.call(&req).await.map_err(usage_if_remote)?;
            print(out, &msg, |m| format!("{m}\n"));
        }
        Cmd::Node(NodeCmd::Lost { id, force }) => {
            let req = Request::NodeLost {
                id: *id,
                force: *force,
            };
            let r: NodeLostReport = cc.call(&req).await.map_err(usage_if_remote)?;
            print(out, &r, lost_text);
            if r.applied && !r.left.is_empty() {
                return Err(CliError::Usage(format!(
                    "node {id}: {} volume(s) left waiting for it",
                    r.left.len()
                )));
            }
        }
        Cmd::Node(NodeCmd::Set { id, iops_capacity }) => {
            qos::node_set(&mut cc, out, *id, *iops_capacity).await?
        }
        Cmd::Node(NodeCmd::Restart { id }) => {
            if matches!(out, Output::Text) {
                eprintln!("restarting node {id}...");
            }
            let restart = restart_node(cli, &mut cc, *id);
            let r = with_progress(cli, &format!("node {id} resync"), restart, resync_to(*id))
                .await
                .map_err(usage_if_remote)?;
            print(out, &r, |r| format!("{}\n", restart_text(r)));
        }
        Cmd::Maintenance(MaintenanceCmd::Rolling) => {
            let t0 = std::time::Instant::now();
            let nodes: Vec<NodeStatus> = cc.call(&Request::NodeList).await?;
            let ids: Vec<u32> = nodes
                .iter()
                .filter(|n| n.state != trireme_meta::NodeState::Removed)
                .map(|n| n.id)
                .collect();
            let mut done = Vec::new();
            for (k, id) in ids.iter().enumerate() {
                wait_in_sync(&mut cc).await?;
                if matches!(out, Output::Text) {
                    eprintln!("[{}/{}] restarting node {id}...", k + 1, ids.len());
                }
                let restart = restart_node(cli, &mut cc, *id);
                let r = with_progress(cli, &format!("node {id} resync"), restart, resync_to(*id))
                    .await
                    .map_err(|e| CliError::Runtime(format!("node {id}: {e}")))?;
                if matches!(out, Output::Text) {
                    eprintln!("[{}/{}] {}", k + 1, ids.len(), restart_text(&r));
                }
                done.push(r);
            }
            let report = RollingReport {
                total_ms: t0.elapsed().as_millis() as u64,
                nodes: done,
            };
            print(out, &report, |r| {
                let mut s = String::from("node  down (s)  back in sync (s)  resynced\n");
                for n in &r.nodes {
                    s += &format!(
                        "{:<5} {:>8.1}  {:>16.1}  {}{}\n",
                        n.node,
                        n.down_ms as f64 / 1000.0,
                        n.total_ms as f64 / 1000.0,
                        human(n.resynced_bytes),
                        if n.full { " (full compare)" } else { "" }
                    );
                }
                s += &format!(
                    "rolling restart of {} nodes done in {:.1} s\n",
                    r.nodes.len(),
                    r.total_ms as f64 / 1000.0
                );
                s
            });
        }
        Cmd::Node(NodeCmd::Drain(a)) | Cmd::Node(NodeCmd::Remove(a)) => {
            let remove = matches!(&cli.cmd, Cmd::Node(NodeCmd::Remove(_)));
            let req = if remove {
                Request::NodeRemove {
                    id: a.id,
                    rate: a.rate,
                }
            } else {
                Request::NodeDrain {
                    id: a.id,
                    rate: a.rate,
                }
            };
            let job: MoveStatus = cc.call(&req).await.map_err(usage_if_remote)?;
            let job = if a.no_wait {
                job
            } else {
                wait_move(&mut cc, out, job).await?
            };
            if job.state != MoveState::Failed {
                print(out, &job, move_text);
                // A node removed for good keeps no etcd user (with an operator's identity).
                if remove && job.state == MoveState::Done {
                    rbac_follow(cli).await;
                }
            } else {
                return Err(CliError::Runtime(format!(
                    "node {} {}: {}",
                    job.node,
                    job.kind,
                    job.error.as_deref().unwrap_or("failed")
                )));
            }
        }
        Cmd::Pool => {
            let s: StatusReport = cc.call(&Request::Status).await?;
            let pool = trireme_control::pool::PoolReport::from_status(&s);
            print(out, &pool, |p| p.text());
        }
        Cmd::Events { last } => {
            let l: Vec<trireme_meta::ClusterEvent> =
                cc.call(&Request::Events { limit: *last }).await?;
            print(out, &l, |l| events_text(l));
        }
        Cmd::Status { watch: None } => {
            let s: StatusReport = cc.call(&Request::Status).await?;
            print(out, &s, status_text);
        }
        Cmd::Status { watch: Some(every) } => {
            use std::io::{IsTerminal, Write};
            let every = (*every).max(std::time::Duration::from_millis(100));
            let tty = std::io::stdout().is_terminal();
            loop {
                // The control port closes a connection idle for a minute: a slow watch
                // connects again.
                let s: StatusReport = match cc.call(&Request::Status).await {
                    Ok(s) => s,
                    Err(_) => {
                        cc = control_client(cli).await?;
                        cc.call(&Request::Status).await?
                    }
                };
                let mut o = std::io::stdout().lock();
                match out {
                    // One document per line: a stream a program can follow.
                    Output::Json => {
                        let _ = writeln!(o, "{}", serde_json::to_string(&s).expect("json"));
                    }
                    _ if tty => {
                        // Home, draw, then clear what the last, longer frame left below.
                        let _ = write!(
                            o,
                            "\x1b[H{}\x1b[J",
                            status_text(&s).replace('\n', "\x1b[K\n")
                        );
                    }
                    _ => {
                        let _ = writeln!(o, "{}", status_text(&s));
                    }
                }
                let _ = o.flush();
                drop(o);
                tokio::select! {
                    _ = tokio::time::sleep(every) => {}
                    _ = tokio::signal::ctrl_c() => return Ok(()),
                }
            }
        }
        Cmd::Volume(VolumeCmd::Access { name, allow, deny }) => {
            if allow.is_empty() && deny.is_empty() {
                return Err(CliError::Usage(
                    "volume access: give --allow NAME or --deny NAME".into(),
                ));
            }
            let v: VolumeRecord = cc
                .call(&Request::VolumeAccess {
                    name: name.clone(),
                    allow: allow.clone(),
                    deny: deny.clone(),
                })
                .await
                .map_err(usage_if_remote)?;
            rbac_follow(cli).await;
            print(out, &v, |v| {
                format!("volume {}: access {}\n", v.name, access_text(&v.access))
            });
        }
        Cmd::Volume(VolumeCmd::Set {
            name,
            min_copies,
            tier,
            limits,
            qos_policy,
        }) => {
            let limits = limits.change();
            if min_copies.is_none() && tier.is_none() && limits.is_empty() && qos_policy.is_none() {
                return Err(CliError::Usage(
                    "volume set: give --min-copies N, --tier auto|fast|slow, a limit (--iops-limit N, ...) or --qos-policy NAME".into(),
                ));
            }
            let v: Warned<VolumeRecord> = cc
                .call(&Request::VolumeSet {
                    name: name.clone(),
                    min_copies: *min_copies,
                    tier: tier.map(|t| t.policy()),
                    limits,
                    qos_policy: qos_policy.clone(),
                })
                .await
                .map_err(usage_if_remote)?;
            qos::print_warned(out, &v, |v| {
                format!(
                    "volume {}: min copies {}, tier {}, limits {}{}\n",
                    v.name,
                    v.min_copies(),
                    v.tier.as_str(),
                    v.limits_in_force(),
                    qos::policy_text(v)
                )
            });
        }
        Cmd::Volume(VolumeCmd::Create {
            name,
            size,
            replicas,
            allow,
            min_copies,
            tier,
            preallocate,
            parity,
            mirror_share,
            limits,
            qos_policy,
        }) => {
            let layout = parity
                .as_deref()
                .map(|spec| trireme_replication::Parity::parse(spec, *mirror_share))
                .transpose()
                .map_err(|e| CliError::Usage(e.to_string()))?
                .map(trireme_replication::Layout::Parity);
            let v: Warned<VolumeRecord> = cc
                .call(&Request::VolumeCreate {
                    layout,
                    preallocate: *preallocate,
                    name: name.clone(),
                    size: *size,
                    replicas: replicas.map_or(0, |r| r as usize),
                    access: (!allow.is_empty()).then(|| allow.clone()),
                    min_copies: *min_copies,
                    tier: Some(tier.policy()),
                    limits: limits.change(),
                    qos_policy: qos_policy.clone(),
                })
                .await
                .map_err(usage_if_remote)?;
            rbac_follow(cli).await;
            qos::print_warned(out, &v, |v| match v.layout.is_mirror() {
                true => format!(
                    "created {} ({}, {}), {} replica{} on {}\n",
                    v.name,
                    human(v.size),
                    if v.preallocate { "thick" } else { "thin" },
                    v.replicas.len(),
                    if v.replicas.len() == 1 { "" } else { "s" },
                    on_nodes(v)
                ),
                false => format!(
                    "created {} ({}, thin): {}; on {}\n",
                    v.name,
                    human(v.size),
                    v.layout.summary(v.replicas.len()),
                    on_nodes(v)
                ),
            });
        }
        Cmd::Volume(VolumeCmd::Clone { snapshot, name }) => {
            let (source, snap) = match snapshot.split_once('@') {
                Some((v, n)) if !v.is_empty() && !n.is_empty() => (v, n),
                _ => {
                    return Err(CliError::Usage(format!(
                        "{snapshot:?}: give the snapshot to clone as VOLUME@SNAPSHOT"
                    )))
                }
            };
            let v: VolumeRecord = cc
                .call(&Request::VolumeClone {
                    source: source.to_string(),
                    snapshot: snap.to_string(),
                    name: name.clone(),
                })
                .await
                .map_err(usage_if_remote)?;
            rbac_follow(cli).await;
            print(out, &v, |v| {
                format!(
                    "created {} ({}), a clone of {snapshot} sharing its blocks, on {}\n",
                    v.name,
                    human(v.size),
                    on_nodes(v)
                )
            });
        }
        Cmd::Volume(VolumeCmd::Flatten { name }) => {
            let v: VolumeRecord = cc
                .call(&Request::VolumeFlatten { name: name.clone() })
                .await
                .map_err(usage_if_remote)?;
            print(out, &v, |v| {
                format!(
                    "{} flattened: it shares no block with another volume\n",
                    v.name
                )
            });
        }
        Cmd::Volume(VolumeCmd::Resize {
            name,
            size,
            allow_shrink,
        }) => {
            let before: VolumeRecord = cc
                .call(&Request::VolumeInfo { name: name.clone() })
                .await
                .map(|i: trireme_control::VolumeInfo| i.record)
                .map_err(usage_if_remote)?;
            let v: VolumeRecord = cc
                .call(&Request::VolumeResize {
                    name: name.clone(),
                    size: *size,
                    allow_shrink: *allow_shrink,
                })
                .await
                .map_err(usage_if_remote)?;
            print(out, &v, |v| {
                if v.size == before.size {
                    format!("{} is already {}\n", v.name, human(v.size))
                } else {
                    format!(
                        "resized {} from {} to {}; new NBD connections see the new size (connected clients when they reconnect)\n",
                        v.name,
                        human(before.size),
                        human(v.size)
                    )
                }
            });
        }
        Cmd::Qos(QosCmd::Policy(c)) => qos::policy_cmd(&mut cc, out, c).await?,
        Cmd::Volume(VolumeCmd::List) => {
            let vs: Vec<VolumeRecord> = cc.call(&Request::VolumeList).await?;
            print(out, &vs, |vs| volumes_table(vs));
        }
        Cmd::Volume(VolumeCmd::Info { name }) => {
            let v: trireme_control::VolumeInfo = cc
                .call(&Request::VolumeInfo { name: name.clone() })
                .await
                .map_err(usage_if_remote)?;
            print(out, &v, |v| {
                let mut s = volumes_table(std::slice::from_ref(&v.record));
                if let Some(l) = &v.resiliency {
                    s += &format!("layout: {}\n", l.summary);
                    if let Some(r) = &l.regions {
                        s += &format!("regions: {}\n", r.line());
                    }
                }
                if let Some(w) = &v.writer {
                    s += &format!("attached by {}\n", w.text);
                }
                for l in &v.client_links {
                    s += &format!(
                        "attached by this cluster's process: link to node {} over {} ({})\n",
                        l.node, l.transport, l.peer
                    );
                }
                s += &match v.nvmf.is_empty() {
                    false => nvmf_text("", &v.nvmf),
                    true => format!(
                        "nvme/tcp: not served; `trireme nvmf serve {} --listen ADDR:4420` on a server serves it as {}\n",
                        v.record.name,
                        trireme_nvmf::volume_nqn(&nvmf_cluster(), &v.record.name)
                    ),
                };
                if let Some(p) = &v.record.parent {
                    s += &format!(
                        "clone of {}@{}: blocks not written since read from it\n",
                        p.volume, p.snapshot
                    );
                }
                if !v.record.tier.is_auto() || !v.tiers.is_empty() {
                    s += &format!("tier: {}\n", v.record.tier.as_str());
                }
                if !v.record.limits_in_force().is_default() {
                    s += &format!(
                        "limits: {}{}\n",
                        v.record.limits_in_force(),
                        qos::policy_text(&v.record)
                    );
                }
                for t in &v.tiers {
                    s += &format!("{}\n", replica_tier_text(t));
                }
                s += &scrub_text(v.scrub.as_ref(), v.next_scrub);
                if !v.snapshots.is_empty() {
                    s += &snapshots_table(&v.record.name, &v.snapshots);
                }
                s
            });
        }
        Cmd::Volume(VolumeCmd::Delete { name, force, keep }) => {
            let t: trireme_meta::TrashRecord = cc
                .call(&Request::VolumeDelete {
                    name: name.clone(),
                    force: *force,
                    keep_secs: Some(keep.as_secs()),
                })
                .await
                .map_err(usage_if_remote)?;
            rbac_follow(cli).await;
            print(out, &t, |t| {
                format!(
                    "deleted {} (id {}): in the trash until {}; `trireme volume trash restore {}` brings it back\n",
                    t.volume.name,
                    t.volume.id,
                    utc_time(t.purge_at),
                    t.volume.name
                )
            });
        }
        Cmd::Volume(VolumeCmd::Snapshot(SnapshotCmd::Create { volume, name })) => {
            let s: trireme_control::SnapshotInfo = cc
                .call(&Request::SnapshotCreate {
                    name: volume.clone(),
                    snapshot: name.clone(),
                })
                .await
                .map_err(usage_if_remote)?;
            print(out, &s, |s| {
                format!(
                    "snapshot {volume}@{} taken (id {}) on node{} {}\n",
                    s.name,
                    s.id,
                    if s.nodes.len() == 1 { "" } else { "s" },
                    s.nodes
                        .iter()
                        .map(u32::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            });
        }
        Cmd::Volume(VolumeCmd::Snapshot(SnapshotCmd::List { volume })) => {
            let l: Vec<trireme_control::SnapshotInfo> = cc
                .call(&Request::SnapshotList {
                    name: volume.clone(),
                })
                .await
                .map_err(usage_if_remote)?;
            print(out, &l, |l| snapshots_table(volume, l));
        }
        Cmd::Volume(VolumeCmd::Snapshot(SnapshotCmd::Delete {
            volume,
            name,
            force,
        })) => {
            let () = cc
                .call(&Request::SnapshotDelete {
                    name: volume.clone(),
                    snapshot: name.clone(),
                    force: *force,
                })
                .await
                .map_err(usage_if_remote)?;
            print(out, &(), |_| format!("deleted snapshot {volume}@{name}\n"));
        }
        Cmd::Volume(VolumeCmd::Rollback {
            volume,
            name,
            force,
        }) => {
            let () = cc
                .call(&Request::VolumeRollback {
                    name: volume.clone(),
                    snapshot: name.clone(),
                    force: *force,
                })
                .await
                .map_err(usage_if_remote)?;
            print(out, &(), |_| {
                format!(
                    "{volume} rolled back to snapshot {name}; it holds what the snapshot holds\n"
                )
            });
        }
        Cmd::Volume(VolumeCmd::Trash(TrashCmd::List)) => {
            let l: Vec<trireme_meta::TrashRecord> = cc.call(&Request::TrashList).await?;
            print(out, &l, |l| trash_table(l));
        }
        Cmd::Volume(VolumeCmd::Trash(TrashCmd::Restore { name })) => {
            let v: VolumeRecord = cc
                .call(&Request::TrashRestore { name: name.clone() })
                .await
                .map_err(usage_if_remote)?;
            rbac_follow(cli).await;
            print(out, &v, |v| {
                format!("restored {} (id {}) from the trash\n", v.name, v.id)
            });
        }
        Cmd::Volume(VolumeCmd::Trash(TrashCmd::Purge { name, .. })) => {
            let l: Vec<trireme_meta::TrashRecord> = cc
                .call(&Request::TrashPurge { name: name.clone() })
                .await
                .map_err(usage_if_remote)?;
            print(out, &l, |l| {
                if l.is_empty() {
                    return "nothing to purge\n".to_string();
                }
                l.iter()
                    .map(|t| {
                        format!(
                            "purged {} (id {}): its replicas are freed\n",
                            t.volume.name, t.volume.id
                        )
                    })
                    .collect()
            });
        }
        Cmd::Volume(VolumeCmd::Scrub { name, region, rate }) => {
            let req = Request::VolumeScrub {
                name: name.clone(),
                region: *region,
                rate: *rate,
            };
            let call = cc.call::<trireme_client::ScrubReport>(&req);
            // The scrub runs in the writer's process: its progress comes through `status`.
            let pick = |st: &StatusReport| {
                st.volumes
                    .iter()
                    .find(|v| v.name == *name)
                    .and_then(|v| v.scrub.as_ref())
                    .map(|p| (p.done_bytes, p.total_bytes))
            };
            let r = with_progress(cli, &format!("scrub {name}"), call, pick)
                .await
                .map_err(usage_if_remote)?;
            print(out, &r, |r| {
                let mut s = format!(
                    "volume {}: scrubbed {} on nodes {:?}: {} region(s) differed ({} bad copies by checksum), {} copy(ies) repaired, {} without a majority\n",
                    r.volume,
                    human(r.bytes_compared),
                    r.replicas,
                    r.mismatched_regions,
                    r.bad_copies,
                    r.repaired.len(),
                    r.unresolved.len()
                );
                if r.stripes_checked > 0 {
                    s += &format!(
                        "  {} parity stripe(s) checked against their data\n",
                        r.stripes_checked
                    );
                }
                for (off, node) in &r.repaired {
                    s += &format!("  repaired offset {off} on node {node}\n");
                }
                for off in &r.unresolved {
                    s += &format!("  no majority at offset {off}: left alone\n");
                }
                s
            });
            if !r.unresolved.is_empty() {
                return Err(CliError::Runtime(format!(
                    "{} region(s) differ with no majority copy",
                    r.unresolved.len()
                )));
            }
        }
        Cmd::Volume(VolumeCmd::Verify { name, region }) => {
            // Checksums are asked at the volume's current epoch. A writer attaching right
            // then (its epoch recorded, not yet on every node), or a newer one attaching
            // during the scan, makes a node refuse it: the scan starts again, a few times.
            let mut tries = 0;
            let r = loop {
                let info: trireme_client::AttachInfo = cc
                    .call(&Request::Locate { name: name.clone() })
                    .await
                    .map_err(usage_if_remote)?;
                let vol =
                    trireme_client::Volume::connect(info, trireme_transport::TransportKind::Tcp, 1)
                        .await?;
                let mut bar = crate::progress::Progress::new(
                    &format!("verify {name}"),
                    vol.size(),
                    out == Output::Text,
                );
                let r = trireme_client::verify_replicas_with(&vol, *region, &mut |done, _| {
                    bar.set(done)
                })
                .await;
                bar.finish();
                let r = match r {
                    Ok(mut r) => {
                        // Then every snapshot, on the copies that hold it.
                        let list: Vec<trireme_control::SnapshotInfo> = cc
                            .call(&Request::SnapshotList { name: name.clone() })
                            .await
                            .map_err(usage_if_remote)?;
                        let mut failed = None;
                        for s in list.iter().filter(|s| s.state == "ready") {
                            // Its own size (0 from a manager that did not say: the volume's).
                            let size = match s.size {
                                0 => vol.size(),
                                n => n,
                            };
                            let mut bar = crate::progress::Progress::new(
                                &format!("verify {name}@{}", s.name),
                                size,
                                out == Output::Text,
                            );
                            let v = trireme_client::verify_snapshot(
                                &vol,
                                &s.name,
                                s.id,
                                &s.nodes,
                                size,
                                *region,
                                &mut |done, _| bar.set(done),
                            )
                            .await;
                            bar.finish();
                            match v {
                                Ok(v) => r.snapshots.push(v),
                                Err(e) => {
                                    failed = Some(e);
                                    break;
                                }
                            }
                        }
                        match failed {
                            Some(e) => Err(e),
                            None => Ok(r),
                        }
                    }
                    Err(e) => Err(e),
                };
                match r {
                    Err(e) if e.is_epoch_mismatch() && tries < 5 => {
                        tries += 1;
                        tracing::info!("verify {name}: {e}; starting again");
                        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                    }
                    r => break r?,
                }
            };
            print(out, &r, |r| {
                let mut s = format!(
                    "volume {}: compared {} across replicas on nodes {:?}: {} mismatching region(s)\n",
                    r.volume,
                    human(r.bytes_compared),
                    r.replicas,
                    r.mismatches.len()
                );
                for m in &r.mismatches {
                    s += &format!(
                        "  offset {} length {}: (node, crc32c) {:?}",
                        m.offset, m.length, m.checksums
                    );
                    if !m.bad_copies.is_empty() {
                        s += &format!(
                            ", bad copy (fails block checksums) on nodes {:?}",
                            m.bad_copies
                        );
                    }
                    s += "\n";
                }
                for v in &r.snapshots {
                    s += &format!(
                        "  snapshot {}: compared on nodes {:?}: {} mismatching region(s)\n",
                        v.name,
                        v.nodes,
                        v.mismatches.len()
                    );
                    for m in &v.mismatches {
                        s += &format!(
                            "    offset {} length {}: (node, crc32c) {:?}, bad copies {:?}\n",
                            m.offset, m.length, m.checksums, m.bad_copies
                        );
                    }
                }
                s
            });
            let in_snapshots: usize = r.snapshots.iter().map(|v| v.mismatches.len()).sum();
            if !r.mismatches.is_empty() || in_snapshots > 0 {
                return Err(CliError::Runtime(format!(
                    "{} region(s) differ between replicas, {in_snapshots} between snapshot copies",
                    r.mismatches.len()
                )));
            }
        }
        Cmd::Volume(
            VolumeCmd::Diff { .. }
            | VolumeCmd::ImportDiff { .. }
            | VolumeCmd::Backup { .. }
            | VolumeCmd::Restore { .. },
        ) => backup::run(cli, &mut cc).await?,
        Cmd::Up(_)
        | Cmd::Nbd(_)
        | Cmd::Attach(_)
        | Cmd::Map(_)
        | Cmd::Nvmf(_)
        | Cmd::Unmap(_)
        | Cmd::Device(_)
        | Cmd::Csi(_)
        | Cmd::Bench(_)
        | Cmd::Ca(_)
        | Cmd::Etcd(_)
        | Cmd::Node(NodeCmd::Serve(_))
        | Cmd::Node(NodeCmd::Run(_)) => {
            unreachable!("dispatched in run()")
        }
    }
    Ok(())
}
