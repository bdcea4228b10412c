//! A CSI driver process for tests (`trireme csi`) and gRPC clients of its socket.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use trireme_csi::pb;

use super::{Server, BIN};

pub type Controller = pb::controller_client::ControllerClient<tonic::transport::Channel>;
pub type Identity = pb::identity_client::IdentityClient<tonic::transport::Channel>;

/// `trireme GLOBAL csi --endpoint unix://SOCK ARGS`, once its socket is there.
pub fn start(global: &[&str], sock: &Path, args: &[&str], env: &[(&str, &str)]) -> Server {
    let log = sock.with_extension("log");
    let mut child = Command::new(BIN)
        .args(global)
        .arg("csi")
        .arg("--endpoint")
        .arg(format!("unix://{}", sock.display()))
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::create(log.with_extension("err")).unwrap())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while !sock.exists() {
        if let Some(st) = child.try_wait().unwrap() {
            panic!(
                "trireme csi exited ({st}): {}",
                std::fs::read_to_string(log.with_extension("err")).unwrap_or_default()
            );
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "no CSI socket");
        std::thread::sleep(Duration::from_millis(20));
    }
    Server(child)
}

/// A gRPC channel over the driver's unix socket.
pub async fn channel(sock: &Path) -> tonic::transport::Channel {
    let sock: PathBuf = sock.to_path_buf();
    tonic::transport::Endpoint::try_from("http://[::1]:1")
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let s = sock.clone();
            async move {
                let u = tokio::net::UnixStream::connect(s).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(u))
            }
        }))
        .await
        .unwrap()
}

/// A capability: a filesystem (`fs`), or a raw block device (`None`), on one node.
pub fn cap(fs: Option<&str>) -> pb::VolumeCapability {
    use pb::volume_capability::{
        access_mode::Mode, AccessMode, AccessType, BlockVolume, MountVolume,
    };
    pb::VolumeCapability {
        access_type: Some(match fs {
            Some(f) => AccessType::Mount(MountVolume {
                fs_type: f.into(),
                ..Default::default()
            }),
            None => AccessType::Block(BlockVolume {}),
        }),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    }
}

/// A map from pairs.
pub fn kv(pairs: &[(&str, &str)]) -> std::collections::HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A CreateVolume of `name`, `size` bytes, with `params`.
pub fn create_req(name: &str, size: i64, params: &[(&str, &str)]) -> pb::CreateVolumeRequest {
    pb::CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(pb::CapacityRange {
            required_bytes: size,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![cap(Some("ext4"))],
        parameters: kv(params),
        ..Default::default()
    }
}

/// The gRPC code of a call that must fail.
pub fn code<T: std::fmt::Debug>(r: Result<tonic::Response<T>, tonic::Status>) -> tonic::Code {
    match r {
        Ok(t) => panic!("succeeded: {t:?}"),
        Err(s) => s.code(),
    }
}
