//! The node service: stage (map the volume as a kernel block device, make its filesystem if
//! it has none, mount it), publish (bind-mount it, or the device itself for a raw block
//! volume, where the pod asks), and back; stats and filesystem growth. Every call idempotent:
//! a path already holding what was asked is success, holding something else ALREADY_EXISTS.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tonic::{Request, Status};
use trireme_control::Request as Ctl;

use crate::args::check_caps;
use crate::busy::Busy;
use crate::errors::{invalid, not_found, ok, status, Answer};
use crate::pb::{self, node_server::Node, volume_capability::AccessType};
use crate::{ids, Connect};

mod maps;
mod mounts;

use maps::Maps;

/// Longest an unmount or an unmap may take before the call answers UNAVAILABLE (it goes on
/// meanwhile; asked again, the CO finds it done): an unstage never hangs on a backend.
const SETTLE: Duration = Duration::from_secs(10);

/// Where the node service runs and how it starts `trireme map`.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// This node's name in the CO; the writers it starts record it as their host.
    pub node_id: String,
    pub zone: Option<String>,
    /// The trireme binary, and the environment that names the cluster to it.
    pub exe: PathBuf,
    pub env: Vec<(String, String)>,
    /// The device records (`trireme_kernel::mapped::DIR`).
    pub devices: PathBuf,
    /// Where each `map`'s log goes.
    pub logs: PathBuf,
    /// Which kind of device `map` gives (`--device`: auto, ublk, nbd, loop).
    pub device: String,
}

#[derive(Clone)]
pub struct NodeService {
    cfg: Arc<NodeConfig>,
    maps: Maps,
    connect: Connect,
    busy: Busy,
}

impl std::fmt::Debug for NodeService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeService")
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

fn io_status(what: &str, e: std::io::Error) -> Status {
    Status::internal(format!("{what}: {e}"))
}

/// A path argument: required, absolute.
fn path_arg(p: &str, name: &str) -> Result<PathBuf, Status> {
    match p {
        "" => Err(invalid(format!("{name} is required"))),
        p if !p.starts_with('/') => Err(invalid(format!("{name} {p:?} is not absolute"))),
        p => Ok(PathBuf::from(p)),
    }
}

/// Runs a program to its end; its error output on failure.
async fn run(program: &str, args: &[&str]) -> Result<(), Status> {
    let o = tokio::process::Command::new(program)
        .args(args)
        .output()
        .await
        .map_err(|e| {
            Status::internal(format!(
                "running {program}: {e} (is it installed on the node?)"
            ))
        })?;
    match o.status.success() {
        true => Ok(()),
        false => Err(Status::internal(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        ))),
    }
}

/// Runs a blocking call for at most [`SETTLE`].
async fn settle<T: Send + 'static>(
    what: &str,
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> Result<std::io::Result<T>, Status> {
    match tokio::time::timeout(SETTLE, tokio::task::spawn_blocking(f)).await {
        Ok(Ok(r)) => Ok(r),
        Ok(Err(e)) => Err(Status::internal(format!("{what}: {e}"))),
        Err(_) => Err(Status::unavailable(format!(
            "{what} has not ended within {SETTLE:?} (the volume's backend is slow or away); it goes on"
        ))),
    }
}

impl NodeService {
    /// The service; devices this host mapped whose server is gone are served again.
    pub fn new(cfg: NodeConfig, connect: Connect) -> NodeService {
        let cfg = Arc::new(cfg);
        let maps = Maps::new(cfg.clone());
        maps.adopt();
        NodeService {
            cfg,
            maps,
            connect,
            busy: Busy::default(),
        }
    }

    /// NOT_FOUND unless the cluster has `vol`.
    async fn exists(&self, vol: &str) -> Result<(), Status> {
        let mut c = (self.connect)().await.map_err(status)?;
        match c
            .call::<serde_json::Value>(&Ctl::VolumeInfo { name: vol.into() })
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if not_found(&e) => {
                Err(Status::not_found(format!("volume {vol} does not exist")))
            }
            Err(e) => Err(status(e)),
        }
    }

    /// Mounts `dev` at `staging` with `m`'s filesystem, made first if the device has none.
    async fn stage_mount(
        &self,
        dev: &Path,
        staging: &Path,
        m: &pb::volume_capability::MountVolume,
    ) -> Result<(), Status> {
        let fs = match m.fs_type.as_str() {
            "" => "ext4",
            f => f,
        };
        if let Some(cur) = mounts::at(staging).map_err(|e| io_status("mountinfo", e))? {
            return match Path::new(&cur.source) == dev {
                true => Ok(()),
                false => Err(Status::already_exists(format!(
                    "{} holds {} already",
                    staging.display(),
                    cur.source
                ))),
            };
        }
        std::fs::create_dir_all(staging).map_err(|e| io_status("the staging path", e))?;
        let d = dev.to_path_buf();
        let found = settle("reading the device", move || mounts::filesystem_on(&d)).await?;
        match found.map_err(|e| io_status("reading the device", e))? {
            None => self.mkfs(fs, dev).await?,
            Some(f) if f == fs => {}
            Some("unknown") => {
                return Err(Status::failed_precondition(format!(
                    "{} holds data that is neither ext4 nor xfs: it is not formatted over",
                    dev.display()
                )))
            }
            Some(f) => {
                return Err(Status::failed_precondition(format!(
                    "{} holds {f}, not the {fs} asked",
                    dev.display()
                )))
            }
        }
        let (flags, data) = mounts::flags(&m.mount_flags, false);
        mounts::mount_dev(dev, staging, fs, flags, &data)
            .map_err(|e| io_status(&format!("mounting {}", dev.display()), e))
    }

    async fn mkfs(&self, fs: &str, dev: &Path) -> Result<(), Status> {
        let d = dev.to_string_lossy();
        tracing::info!(device = %d, fs, "no filesystem on it: making one");
        match fs {
            // A new volume is thin and zero: no discard pass over it.
            "ext4" => run("mkfs.ext4", &["-q", "-F", "-E", "nodiscard", &d]).await,
            "xfs" => run("mkfs.xfs", &["-q", "-K", &d]).await,
            f => Err(invalid(format!("filesystem {f:?}: ext4 or xfs"))),
        }
    }

    /// The device of a staged volume.
    fn device(&self, vol: &str) -> Result<PathBuf, Status> {
        match self.maps.record(vol)? {
            Some(m) => Ok(m.path()),
            None => Err(Status::failed_precondition(format!(
                "volume {vol} is not staged on this node"
            ))),
        }
    }
}

/// The capability asked, checked.
fn capability(
    c: Option<pb::VolumeCapability>,
) -> Result<(pb::VolumeCapability, AccessType), Status> {
    let c = c.ok_or_else(|| invalid("volume_capability is required"))?;
    check_caps(std::slice::from_ref(&c))?;
    let t = c.access_type.clone().expect("checked");
    Ok((c, t))
}

#[tonic::async_trait]
impl Node for NodeService {
    async fn node_stage_volume(
        &self,
        r: Request<pb::NodeStageVolumeRequest>,
    ) -> Answer<pb::NodeStageVolumeResponse> {
        let r = r.into_inner();
        let vol = ids::volume_id(&r.volume_id)?;
        let staging = path_arg(&r.staging_target_path, "staging_target_path")?;
        let (_, access) = capability(r.volume_capability)?;
        let _h = self.busy.hold(vol)?;
        if self.maps.record(vol)?.is_none() {
            self.exists(vol).await?;
        }
        let dev = self.maps.ensure(vol).await?;
        if let AccessType::Mount(m) = &access {
            self.stage_mount(&dev, &staging, m).await?;
        }
        tracing::info!(volume = vol, device = %dev.display(), staging = %staging.display(), "staged");
        ok(pb::NodeStageVolumeResponse {})
    }

    async fn node_unstage_volume(
        &self,
        r: Request<pb::NodeUnstageVolumeRequest>,
    ) -> Answer<pb::NodeUnstageVolumeResponse> {
        let r = r.into_inner();
        let vol = ids::volume_id(&r.volume_id)?.to_string();
        let staging = path_arg(&r.staging_target_path, "staging_target_path")?;
        let _h = self.busy.hold(&vol)?;
        if mounts::at(&staging)
            .map_err(|e| io_status("mountinfo", e))?
            .is_some()
        {
            let s = staging.clone();
            match settle("unmounting the staging path", move || {
                mounts::unmount(&s, false)
            })
            .await?
            {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    return Err(Status::failed_precondition(format!(
                        "{} is in use (still published?)",
                        staging.display()
                    )))
                }
                Err(e) => return Err(io_status("unmounting the staging path", e)),
            }
        }
        match tokio::time::timeout(SETTLE * 3, self.maps.unmap(&vol, false)).await {
            Ok(r) => r?,
            Err(_) => {
                return Err(Status::unavailable(format!(
                    "unmapping {vol} has not ended within {:?}; it goes on",
                    SETTLE * 3
                )))
            }
        }
        tracing::info!(volume = vol, "unstaged");
        ok(pb::NodeUnstageVolumeResponse {})
    }

    async fn node_publish_volume(
        &self,
        r: Request<pb::NodePublishVolumeRequest>,
    ) -> Answer<pb::NodePublishVolumeResponse> {
        let r = r.into_inner();
        let vol = ids::volume_id(&r.volume_id)?;
        let staging = path_arg(&r.staging_target_path, "staging_target_path")?;
        let target = path_arg(&r.target_path, "target_path")?;
        let (_, access) = capability(r.volume_capability)?;
        let _h = self.busy.hold(&format!("{vol} {}", target.display()))?;
        let src = match access {
            AccessType::Block(_) => self.device(vol)?,
            AccessType::Mount(_) => {
                let m = mounts::at(&staging).map_err(|e| io_status("mountinfo", e))?;
                if m.is_none() {
                    return Err(Status::failed_precondition(format!(
                        "volume {vol} is not staged at {}",
                        staging.display()
                    )));
                }
                staging.clone()
            }
        };
        if let Some(cur) = mounts::at(&target).map_err(|e| io_status("mountinfo", e))? {
            return match same_source(&src, &target) {
                true => ok(pb::NodePublishVolumeResponse {}),
                false => Err(Status::already_exists(format!(
                    "{} holds {} already",
                    target.display(),
                    cur.source
                ))),
            };
        }
        if src.starts_with("/dev/") {
            if let Some(d) = target.parent() {
                std::fs::create_dir_all(d).map_err(|e| io_status("the target's directory", e))?;
            }
            std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&target)
                .map_err(|e| io_status("the target file", e))?;
        } else {
            std::fs::create_dir_all(&target).map_err(|e| io_status("the target path", e))?;
        }
        mounts::bind(&src, &target, r.readonly).map_err(|e| io_status("bind-mounting", e))?;
        tracing::info!(volume = vol, target = %target.display(), readonly = r.readonly, "published");
        ok(pb::NodePublishVolumeResponse {})
    }

    async fn node_unpublish_volume(
        &self,
        r: Request<pb::NodeUnpublishVolumeRequest>,
    ) -> Answer<pb::NodeUnpublishVolumeResponse> {
        let r = r.into_inner();
        let vol = ids::volume_id(&r.volume_id)?;
        let target = path_arg(&r.target_path, "target_path")?;
        let _h = self.busy.hold(&format!("{vol} {}", target.display()))?;
        if mounts::at(&target)
            .map_err(|e| io_status("mountinfo", e))?
            .is_some()
        {
            let t = target.clone();
            settle("unmounting the target", move || mounts::unmount(&t, false))
                .await?
                .map_err(|e| io_status("unmounting the target", e))?;
        }
        let gone = match std::fs::symlink_metadata(&target) {
            Ok(m) if m.is_dir() => std::fs::remove_dir(&target),
            Ok(_) => std::fs::remove_file(&target),
            Err(e) => Err(e),
        };
        match gone {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(io_status("removing the target", e))
            }
            _ => ok(pb::NodeUnpublishVolumeResponse {}),
        }
    }

    async fn node_get_volume_stats(
        &self,
        r: Request<pb::NodeGetVolumeStatsRequest>,
    ) -> Answer<pb::NodeGetVolumeStatsResponse> {
        let r = r.into_inner();
        let vol = ids::volume_id(&r.volume_id)?;
        let path = path_arg(&r.volume_path, "volume_path")?;
        let meta = std::fs::metadata(&path)
            .map_err(|_| Status::not_found(format!("{} does not exist", path.display())))?;
        use pb::volume_usage::Unit;
        let usage = if meta.is_dir() {
            let st = statvfs(&path).map_err(|e| io_status("statvfs", e))?;
            let f = st.f_frsize as i64;
            vec![
                pb::VolumeUsage {
                    total: st.f_blocks as i64 * f,
                    available: st.f_bavail as i64 * f,
                    used: (st.f_blocks - st.f_bfree) as i64 * f,
                    unit: Unit::Bytes as i32,
                },
                pb::VolumeUsage {
                    total: st.f_files as i64,
                    available: st.f_favail as i64,
                    used: (st.f_files - st.f_ffree) as i64,
                    unit: Unit::Inodes as i32,
                },
            ]
        } else {
            let size = mounts::device_size(&path).map_err(|e| io_status("the device's size", e))?;
            vec![pb::VolumeUsage {
                total: size as i64,
                unit: Unit::Bytes as i32,
                ..Default::default()
            }]
        };
        let condition = match self.maps.record(vol)? {
            Some(m) if m.serving() => pb::VolumeCondition {
                abnormal: false,
                message: format!("{} served by pid {}", m.path().display(), m.pid),
            },
            Some(m) => pb::VolumeCondition {
                abnormal: true,
                message: format!(
                    "{} has no server now: it is being started again",
                    m.path().display()
                ),
            },
            None => pb::VolumeCondition {
                abnormal: true,
                message: "not mapped on this node".into(),
            },
        };
        ok(pb::NodeGetVolumeStatsResponse {
            usage,
            volume_condition: Some(condition),
        })
    }

    async fn node_expand_volume(
        &self,
        r: Request<pb::NodeExpandVolumeRequest>,
    ) -> Answer<pb::NodeExpandVolumeResponse> {
        let r = r.into_inner();
        let vol = ids::volume_id(&r.volume_id)?;
        let path = path_arg(&r.volume_path, "volume_path")?;
        let _h = self.busy.hold(vol)?;
        let dev = self.device(vol)?;
        let size = mounts::device_size(&dev).map_err(|e| io_status("the device's size", e))?;
        let want = r
            .capacity_range
            .as_ref()
            .map_or(0, |c| c.required_bytes.max(0) as u64);
        if want > size {
            return Err(Status::failed_precondition(format!(
                "{} is {size} bytes, not the {want} asked: the device has not grown while mapped (ublk before Linux 6.16, a loop device); it has the new size when the volume is next staged",
                dev.display()
            )));
        }
        let block = matches!(
            r.volume_capability
                .as_ref()
                .and_then(|c| c.access_type.as_ref()),
            Some(AccessType::Block(_))
        );
        if !block {
            let m = mounts::at(&path)
                .map_err(|e| io_status("mountinfo", e))?
                .ok_or_else(|| {
                    Status::not_found(format!("nothing is mounted at {}", path.display()))
                })?;
            match m.fstype.as_str() {
                "xfs" => run("xfs_growfs", &[&path.to_string_lossy()]).await?,
                _ => run("resize2fs", &[&dev.to_string_lossy()]).await?,
            }
        }
        ok(pb::NodeExpandVolumeResponse {
            capacity_bytes: size as i64,
        })
    }

    async fn node_get_capabilities(
        &self,
        _: Request<pb::NodeGetCapabilitiesRequest>,
    ) -> Answer<pb::NodeGetCapabilitiesResponse> {
        use pb::node_service_capability::{rpc::Type as T, Rpc, Type};
        let capabilities = [
            T::StageUnstageVolume,
            T::GetVolumeStats,
            T::ExpandVolume,
            T::VolumeCondition,
        ]
        .into_iter()
        .map(|t| pb::NodeServiceCapability {
            r#type: Some(Type::Rpc(Rpc { r#type: t as i32 })),
        })
        .collect();
        ok(pb::NodeGetCapabilitiesResponse { capabilities })
    }

    async fn node_get_info(
        &self,
        _: Request<pb::NodeGetInfoRequest>,
    ) -> Answer<pb::NodeGetInfoResponse> {
        // Without ublk, as many volumes as the kernel has NBD devices (nbds_max), when it
        // says; ublk and loop devices have no such limit.
        let max = match self.cfg.device.as_str() {
            "loop" | "ublk" => 0,
            _ if trireme_kernel::ublk::available() => 0,
            _ => std::fs::read_to_string("/sys/module/nbd/parameters/nbds_max")
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(0),
        };
        ok(pb::NodeGetInfoResponse {
            node_id: self.cfg.node_id.clone(),
            max_volumes_per_node: max,
            accessible_topology: self.cfg.zone.as_ref().map(|z| pb::Topology {
                segments: HashMap::from([(TOPOLOGY_ZONE.to_string(), z.clone())]),
            }),
        })
    }
}

/// Whether `target` (a mount) shows what `src` is: the same device node, or the same
/// directory of the same filesystem.
fn same_source(src: &Path, target: &Path) -> bool {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    match (std::fs::metadata(src), std::fs::metadata(target)) {
        (Ok(a), Ok(b)) if a.file_type().is_block_device() => {
            b.file_type().is_block_device() && a.rdev() == b.rdev()
        }
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// The topology key of a node's zone.
pub const TOPOLOGY_ZONE: &str = "topology.csi.trireme.io/zone";

fn statvfs(p: &Path) -> std::io::Result<libc::statvfs> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(p.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: a plain C struct of integers, for which all zeroes is a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid C string; statvfs fills `st`.
    match unsafe { libc::statvfs(c.as_ptr(), &mut st) } {
        0 => Ok(st),
        _ => Err(std::io::Error::last_os_error()),
    }
}
