//! `volume diff`, `import-diff`, `backup` and `restore`: incremental backups in Ceph's
//! `rbd export-diff` format (`trireme-backup`), read from snapshots without disturbing the
//! writer, applied through a writer of their own.

#[allow(unused_imports)]
use super::*;

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use trireme_backup::catalog::{self, Catalog, Entry};
use trireme_backup::rbd_diff::{DiffReader, Version};
use trireme_backup::{BackupError, DiffStats};
use trireme_control::SnapshotInfo;

fn diff_err(e: trireme_backup::rbd_diff::DiffError) -> CliError {
    runtime_err(e.into())
}

fn runtime_err(e: BackupError) -> CliError {
    match e {
        BackupError::Invalid(m)
        | BackupError::Diff(trireme_backup::rbd_diff::DiffError::Format(m)) => CliError::Usage(m),
        e => CliError::Runtime(e.to_string()),
    }
}

/// `VOLUME@SNAPSHOT` split.
fn split(s: &str) -> Result<(&str, &str), CliError> {
    match s.split_once('@') {
        Some((v, n)) if !v.is_empty() && !n.is_empty() => Ok((v, n)),
        _ => Err(CliError::Usage(format!(
            "{s:?}: give a snapshot as VOLUME@SNAPSHOT"
        ))),
    }
}

/// Where `volume` lives, and its snapshots.
async fn located(
    cc: &mut ControlClient,
    volume: &str,
) -> Result<(trireme_client::AttachInfo, Vec<SnapshotInfo>), CliError> {
    let info: trireme_client::AttachInfo = cc
        .call(&Request::Locate {
            name: volume.to_string(),
        })
        .await
        .map_err(usage_if_remote)?;
    let list: Vec<SnapshotInfo> = cc
        .call(&Request::SnapshotList {
            name: volume.to_string(),
        })
        .await
        .map_err(usage_if_remote)?;
    Ok((info, list))
}

fn ready<'a>(list: &'a [SnapshotInfo], name: &str) -> Option<&'a SnapshotInfo> {
    list.iter().find(|s| s.name == name && s.state == "ready")
}

fn options(cli: &Cli) -> trireme_client::VolumeOptions {
    trireme_client::VolumeOptions {
        kind: cli.transport.kind(),
        replica_timeout: std::time::Duration::from_secs(5),
        ..Default::default()
    }
}

/// Writes the diff (of `version`) from `from` (or nothing) to snapshot `to` of `volume` to
/// `out`.
#[allow(clippy::too_many_arguments)]
async fn diff_to<W: Write>(
    cli: &Cli,
    cc: &mut ControlClient,
    volume: &str,
    from: Option<&str>,
    to: &str,
    out: W,
    version: Version,
    label: &str,
) -> Result<(W, DiffStats), CliError> {
    let (info, list) = located(cc, volume).await?;
    let reader = Arc::new(
        trireme_daemon::export::snapshot_reader(&info, &list, to, options(cli))
            .map_err(CliError::Usage)?,
    );
    let from = match from {
        None => None,
        Some(f) => {
            let s = ready(&list, f).ok_or_else(|| {
                CliError::Usage(format!(
                    "volume {volume} has no snapshot named {f:?} ready (`trireme volume snapshot list {volume}`)"
                ))
            })?;
            if s.id >= reader.id() {
                return Err(CliError::Usage(format!(
                    "snapshot {volume}@{f} is not older than {volume}@{to}: a diff goes from an older snapshot to a newer one"
                )));
            }
            Some((f, s.id))
        }
    };
    let mut bar = crate::progress::Progress::new(label, info.size, cli.output == Output::Text);
    let r = trireme_backup::make_diff(&reader, to, from, out, version, &mut |done, _| {
        bar.set(done)
    })
    .await;
    bar.finish();
    r.map_err(runtime_err)
}

/// A writer of the volume for applying a diff: through `up`'s control socket, or attached
/// on etcd with a lease, as `trireme attach` does.
enum Writer {
    Up(Arc<trireme_client::Volume>),
    Etcd(trireme_daemon::attach::Attached),
}

impl Writer {
    async fn attach(
        cli: &Cli,
        cc: &mut ControlClient,
        volume: &str,
        force: bool,
    ) -> Result<Writer, CliError> {
        if cli.etcd.is_some() {
            let meta = etcd_meta(cli).await?;
            let cfg = trireme_daemon::attach::AttachConfig {
                volume: volume.to_string(),
                force,
                lease_ttl: std::time::Duration::from_secs(5),
                opts: options(cli),
            };
            let att = trireme_daemon::attach::attach(meta, &cfg, Vec::new())
                .await
                .map_err(daemon_err)?;
            return Ok(Writer::Etcd(att));
        }
        let v: trireme_control::VolumeInfo = cc
            .call(&Request::VolumeInfo {
                name: volume.to_string(),
            })
            .await
            .map_err(usage_if_remote)?;
        if !v.client_links.is_empty() && !force {
            return Err(CliError::Usage(format!(
                "volume {volume} is attached (its writer runs in `trireme up`): give --force to fence it while the diff is applied"
            )));
        }
        let vol = trireme_daemon::writer_slot::attach(
            &control_path(&cli.data_dir),
            volume,
            options(cli),
            Some(trireme_control::WriterHello::me(Vec::new())),
        )
        .await
        .map_err(CliError::Runtime)?;
        Ok(Writer::Up(vol))
    }

    fn volume(&self) -> &Arc<trireme_client::Volume> {
        match self {
            Writer::Up(v) => v,
            Writer::Etcd(a) => &a.volume,
        }
    }

    async fn detach(self) -> Result<(), CliError> {
        match self {
            Writer::Up(v) => v
                .detach()
                .await
                .map_err(|e| CliError::Runtime(e.to_string())),
            Writer::Etcd(a) => a.detach().await.map_err(daemon_err),
        }
    }
}

/// Applies the diff `r` to `volume` (after its checks), then takes the snapshot it ends at
/// if `snapshot_to`. What was applied.
async fn apply<R: std::io::Read>(
    cli: &Cli,
    cc: &mut ControlClient,
    volume: &str,
    mut r: DiffReader<R>,
    force: bool,
    label: &str,
) -> Result<(trireme_backup::DiffHead, trireme_backup::Applied), CliError> {
    let head = trireme_backup::read_head(&mut r).map_err(runtime_err)?;
    let (info, list) = located(cc, volume).await?;
    if let Some(f) = &head.from {
        if ready(&list, f).is_none() {
            return Err(CliError::Usage(format!(
                "the diff starts from snapshot {f:?}, which volume {volume} does not have: apply the diffs before it first"
            )));
        }
    }
    if let Some(t) = &head.to {
        trireme_meta::check_name(t).map_err(|e| {
            CliError::Usage(format!(
                "the diff ends at a snapshot named {t:?}, which is not a valid name ({e}); nothing was applied"
            ))
        })?;
        if list.iter().any(|s| &s.name == t) {
            return Err(CliError::Usage(format!(
                "volume {volume} already has snapshot {t:?}, where the diff ends"
            )));
        }
    }
    let w = Writer::attach(cli, cc, volume, force).await?;
    // The volume takes the size of the image the diff ends at, grown or shrunk, as `rbd
    // import-diff` does (a diff between snapshots of two sizes, or a backup after a resize):
    // through the writer just attached, before any byte of the diff. A shrink drops the
    // head's bytes past the new end (the diff's image has none there); the snapshot the diff
    // starts from keeps its own size and bytes.
    if head.size != info.size {
        if let Err(e) = w.volume().resize(head.size).await {
            let _ = w.detach().await;
            return Err(CliError::Runtime(format!(
                "the diff is of a {}-byte image and volume {volume} has {} bytes; resizing it: {e}; nothing was applied",
                head.size, info.size
            )));
        }
    }
    let mut bar = crate::progress::Progress::new(label, head.size, cli.output == Output::Text);
    let r = trireme_backup::apply_diff(w.volume(), &mut r, head.clone(), &mut |done, _| {
        bar.set(done)
    })
    .await;
    bar.finish();
    let detached = w.detach().await;
    let applied = r.map_err(runtime_err)?;
    detached?;
    if let Some(t) = &head.to {
        let _: SnapshotInfo = cc
            .call(&Request::SnapshotCreate {
                name: volume.to_string(),
                snapshot: t.clone(),
            })
            .await
            .map_err(usage_if_remote)?;
    }
    Ok((head, applied))
}

/// Deletes snapshot `volume@snap`, the snapshot of `what`, which nothing needs any more; a
/// failure is only logged (the snapshot stays, listed, for an operator to delete).
async fn drop_snapshot(cc: &mut ControlClient, volume: &str, snap: &str, what: &str) {
    let r: Result<(), _> = cc
        .call(&Request::SnapshotDelete {
            name: volume.to_string(),
            snapshot: snap.to_string(),
            force: false,
        })
        .await;
    if let Err(e) = r {
        tracing::warn!("deleting snapshot {volume}@{snap}, of {what}: {e}");
    }
}

/// Opens FILE, or standard input for `-`.
/// Opens a diff to read, once: a regular file that no other user may write (what is checked
/// is then what is applied, read again from the same descriptor after a rewind).
fn open_input(path: &Path) -> Result<std::fs::File, CliError> {
    use std::os::unix::fs::MetadataExt;
    let bad = |e: String| CliError::Usage(format!("{}: {e}", path.display()));
    // O_NONBLOCK: opening a FIFO must not wait for a writer (a regular file ignores it).
    let f = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
            .map_err(|e| bad(e.to_string()))?
    };
    let m = f.metadata().map_err(|e| bad(e.to_string()))?;
    if !m.file_type().is_file() {
        return Err(bad(
            "not a regular file (a diff is read twice: checked whole, then applied; give a file, or - for standard input)".into(),
        ));
    }
    if m.mode() & 0o022 != 0 {
        return Err(bad(format!(
            "other users may write it (mode {:o}): it could change between the check and the apply (chmod go-w)",
            m.mode() & 0o7777
        )));
    }
    Ok(f)
}

/// `f` read from its start, buffered.
fn from_start(f: &std::fs::File) -> Result<Box<dyn std::io::Read + '_>, CliError> {
    use std::io::Seek;
    let mut r = f;
    r.seek(std::io::SeekFrom::Start(0))?;
    Ok(Box::new(std::io::BufReader::with_capacity(1 << 20, r)))
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

pub(crate) async fn run(cli: &Cli, cc: &mut ControlClient) -> Result<(), CliError> {
    let out = cli.output;
    match &cli.cmd {
        Cmd::Volume(VolumeCmd::Diff {
            snapshots,
            file: output,
            export_format,
        }) => {
            let version = Version::numbered(*export_format).ok_or_else(|| {
                CliError::Usage(format!("no rbd diff version {export_format}: 1 or 2"))
            })?;
            let (volume, to) = split(snapshots.last().expect("clap: 1 or 2"))?;
            let from = match &snapshots[..] {
                [f, _] => {
                    let (v, f) = split(f)?;
                    if v != volume {
                        return Err(CliError::Usage(format!(
                            "{v}@{f} and {volume}@{to} are snapshots of different volumes"
                        )));
                    }
                    Some(f)
                }
                _ => None,
            };
            let label = format!("diff {volume}@{to}");
            let st = if output == Path::new("-") {
                let o = std::io::BufWriter::with_capacity(1 << 20, std::io::stdout().lock());
                diff_to(cli, cc, volume, from, to, o, version, &label)
                    .await?
                    .1
            } else {
                // Written aside, synced, then renamed: a FILE is whole or absent. In a
                // directory only this user writes, created new and private (it holds data).
                let dir = match output.parent() {
                    Some(p) if !p.as_os_str().is_empty() => p,
                    _ => Path::new("."),
                };
                catalog::check_private_dir(dir).map_err(|e| CliError::Usage(e.to_string()))?;
                let part = output.with_extension("part");
                let f = catalog::create_private(&part)
                    .map_err(|e| CliError::Usage(format!("{}: {e}", part.display())))?;
                let r = diff_to(
                    cli,
                    cc,
                    volume,
                    from,
                    to,
                    std::io::BufWriter::with_capacity(1 << 20, f),
                    version,
                    &label,
                )
                .await;
                let (w, st) = match r {
                    Ok(x) => x,
                    Err(e) => {
                        let _ = std::fs::remove_file(&part);
                        return Err(e);
                    }
                };
                let f = w
                    .into_inner()
                    .map_err(|e| CliError::Runtime(e.to_string()))?;
                f.sync_all()?;
                std::fs::rename(&part, output)?;
                st
            };
            if output != Path::new("-") {
                print(out, &st, |s| {
                    format!(
                        "wrote {} ({} changed: {} of data, {} zeroed; read {}) to {}\n",
                        human(s.file_bytes),
                        human(s.changed_bytes),
                        human(s.data_bytes),
                        human(s.zero_bytes),
                        human(s.read_bytes),
                        output.display()
                    )
                });
            }
        }
        Cmd::Volume(VolumeCmd::ImportDiff {
            file,
            volume,
            force,
        }) => {
            let label = format!("import-diff {volume}");
            let (head, applied) = if file == Path::new("-") {
                let stdin = std::io::BufReader::with_capacity(1 << 20, std::io::stdin());
                let r = DiffReader::new(stdin).map_err(diff_err)?;
                apply(cli, cc, volume, r, *force, &label).await?
            } else {
                // All of it is read first, from the one descriptor it is applied from: a
                // damaged or cut file changes nothing.
                let f = open_input(file)?;
                trireme_backup::validate(from_start(&f)?).map_err(|e| {
                    CliError::Usage(format!("{}: {e}; nothing was applied", file.display()))
                })?;
                let r = DiffReader::new(from_start(&f)?).map_err(diff_err)?;
                apply(cli, cc, volume, r, *force, &label).await?
            };
            print(out, &applied, |a| {
                format!(
                    "applied {} of data and {} of zeros to {volume}{}\n",
                    human(a.written_bytes),
                    human(a.zeroed_bytes),
                    head.to
                        .as_ref()
                        .map(|t| format!("; took snapshot {volume}@{t}"))
                        .unwrap_or_default()
                )
            });
        }
        Cmd::Volume(VolumeCmd::Backup { volume, to, full }) => {
            {
                use std::os::unix::fs::DirBuilderExt;
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(to)
                    .map_err(|e| CliError::Usage(format!("{}: {e}", to.display())))?;
            }
            catalog::check_private_dir(to).map_err(|e| CliError::Usage(e.to_string()))?;
            let e = backup(cli, cc, volume, to, *full).await?;
            print(out, &e, |e| {
                format!(
                    "backed up {volume} as {} ({}, {} changed, read {}) to {}\n",
                    e.snapshot,
                    match &e.from {
                        Some(f) => format!("incremental since {f}"),
                        None => "full".into(),
                    },
                    human(e.stats.changed_bytes),
                    human(e.stats.read_bytes),
                    to.join(&e.file).display()
                )
            });
        }
        Cmd::Volume(VolumeCmd::Restore {
            dir,
            name,
            at,
            replicas,
        }) => {
            let chain = restore(cli, cc, dir, name, at.as_deref(), *replicas).await?;
            print(out, &chain, |c| {
                format!(
                    "restored {name} from {} backup(s): {}\n",
                    c.len(),
                    c.join(", ")
                )
            });
        }
        _ => unreachable!("not a backup command"),
    }
    Ok(())
}

/// `volume backup`: the new catalog entry.
async fn backup(
    cli: &Cli,
    cc: &mut ControlClient,
    volume: &str,
    dir: &Path,
    full: bool,
) -> Result<Entry, CliError> {
    let mut cat = match Catalog::load(dir).map_err(runtime_err)? {
        Some(c) if c.volume != volume => {
            return Err(CliError::Usage(format!(
                "{} holds backups of volume {}, not {volume}",
                dir.display(),
                c.volume
            )))
        }
        Some(c) => c,
        None => Catalog {
            volume: volume.to_string(),
            size: 0,
            backups: Vec::new(),
        },
    };
    let (info, list) = located(cc, volume).await?;
    // The newest backup whose snapshot the volume still has is the base, whatever the sizes
    // (a diff says its image's size; a restore resizes to each in turn).
    let base = (!full)
        .then(|| {
            cat.backups
                .iter()
                .rev()
                .find(|e| ready(&list, &e.snapshot).is_some())
                .map(|e| e.snapshot.clone())
        })
        .flatten();
    let created = now_secs();
    let mut name = format!("backup-{}", utc_stamp(created));
    while list.iter().any(|s| s.name == name) || cat.backups.iter().any(|e| e.snapshot == name) {
        name.push('x');
    }
    let _: SnapshotInfo = cc
        .call(&Request::SnapshotCreate {
            name: volume.to_string(),
            snapshot: name.clone(),
        })
        .await
        .map_err(usage_if_remote)?;
    let (file, path) = catalog::file_for(dir, &name);
    let part = path.with_extension("part");
    let written = async {
        let f = catalog::create_private(&part)?;
        let w = catalog::Summed {
            inner: std::io::BufWriter::with_capacity(1 << 20, f),
            crc: 0,
        };
        let label = format!("backup {volume}");
        let (w, st) = diff_to(
            cli,
            cc,
            volume,
            base.as_deref(),
            &name,
            w,
            Version::default(),
            &label,
        )
        .await?;
        let crc = w.crc;
        let f = w
            .inner
            .into_inner()
            .map_err(|e| CliError::Runtime(e.to_string()))?;
        f.sync_all()?;
        std::fs::rename(&part, &path)?;
        catalog::sync_dir(dir).map_err(runtime_err)?;
        Ok::<_, CliError>((st, crc))
    }
    .await;
    let (stats, crc) = match written {
        Ok(x) => x,
        Err(e) => {
            // Nothing refers to the snapshot: it goes again.
            let _ = std::fs::remove_file(&part);
            drop_snapshot(cc, volume, &name, "a backup that failed").await;
            return Err(e);
        }
    };
    let entry = Entry {
        snapshot: name,
        from: base.clone(),
        file,
        created,
        crc32c: crc,
        stats,
    };
    cat.size = info.size;
    cat.backups.push(entry.clone());
    cat.save(dir).map_err(runtime_err)?;
    // The new snapshot is the next backup's base: the one before it is no longer needed.
    if let Some(b) = base {
        drop_snapshot(cc, volume, &b, "the previous backup").await;
    }
    Ok(entry)
}

/// `volume restore`: the backups applied, oldest first.
async fn restore(
    cli: &Cli,
    cc: &mut ControlClient,
    dir: &Path,
    name: &str,
    at: Option<&str>,
    replicas: Option<u32>,
) -> Result<Vec<String>, CliError> {
    let cat = Catalog::load(dir)
        .map_err(runtime_err)?
        .ok_or_else(|| CliError::Usage(format!("{} has no backup catalog", dir.display())))?;
    let chain = cat.chain(at).map_err(runtime_err)?;
    // Every file whole before anything is created, each opened once: what is checked is
    // what is applied.
    let mut files = Vec::new();
    for e in &chain {
        let p = dir.join(&e.file);
        let f = open_input(&p)?;
        let crc = catalog::crc_of(from_start(&f)?)
            .map_err(|err| CliError::Usage(format!("{}: {err}", p.display())))?;
        files.push(f);
        if crc != e.crc32c {
            return Err(CliError::Usage(format!(
                "{} is damaged: its checksum is {crc:#010x}, the catalog says {:#010x}",
                p.display(),
                e.crc32c
            )));
        }
    }
    // Created at the first backup's size; each diff applied resizes it to its own (a backup
    // after a resize is a diff between snapshots of two sizes).
    let size = {
        let first = files.first().expect("a chain");
        let mut r = DiffReader::new(from_start(first)?).map_err(diff_err)?;
        trireme_backup::read_head(&mut r).map_err(runtime_err)?.size
    };
    let _: trireme_meta::VolumeRecord = cc
        .call(&Request::VolumeCreate {
            preallocate: false,
            name: name.to_string(),
            size,
            replicas: replicas.map_or(0, |r| r as usize),
            access: None,
            min_copies: None,
            tier: None,
            layout: None,
            limits: Default::default(),
            qos_policy: None,
        })
        .await
        .map_err(usage_if_remote)?;
    let mut done: Vec<String> = Vec::new();
    for (e, f) in chain.iter().zip(&files) {
        let label = format!("restore {name} ({})", e.snapshot);
        let applied = async {
            let r = DiffReader::new(from_start(f)?).map_err(diff_err)?;
            apply(cli, cc, name, r, false, &label).await.map(|_| ())
        }
        .await;
        if let Err(CliError::Usage(err) | CliError::Runtime(err)) = applied {
            return Err(CliError::Runtime(format!(
                "restoring {} into {name}: {err}; the partly restored volume {name} is left as it is (`trireme volume delete {name}`)",
                e.snapshot
            )));
        }
        // Only the newest backup's snapshot stays on the new volume: the base a further
        // `import-diff` builds on.
        if let Some(prev) = done.last() {
            drop_snapshot(cc, name, prev, "a backup the next one builds on").await;
        }
        done.push(e.snapshot.clone());
    }
    Ok(done)
}
