//! `trireme nvmf serve`: a volume over NVMe/TCP from this server, a standby until it holds
//! the volume's writer (`trireme_daemon::nvmf`).

use super::*;
use crate::NvmfServeArgs;

pub(crate) async fn serve(cli: &Cli, a: &NvmfServeArgs) -> Result<(), CliError> {
    let stop = Stop::catch()?;
    trireme_meta::check_name(&a.volume).map_err(|e| CliError::Usage(e.to_string()))?;
    if cli.etcd.is_none() {
        return Err(CliError::Usage(
            "nvmf serve runs on a cluster on etcd (TRIREME_ETCD or --etcd); on `trireme up`, \
             use `up --nvmf ADDR:PORT`"
                .into(),
        ));
    }
    let meta = etcd_meta(cli).await?;
    // Hosts connect only if their NQN is on the volume's access list.
    let (access, follow) = trireme_daemon::access::followed(meta.clone());
    let cfg = trireme_daemon::nvmf::NvmfConfig {
        attach: trireme_daemon::attach::AttachConfig {
            volume: a.volume.clone(),
            force: false,
            lease_ttl: a.lease_ttl,
            opts: a.failure.volume_options(a.streams, cli.transport.kind()),
        },
        listen: a.listen,
        port_id: a.port_id as u16,
        cluster: a.cluster.clone(),
    };
    let (ex, listener) = trireme_daemon::nvmf::export(&meta, &cfg, access)
        .await
        .map_err(daemon_err)?;
    // Refused here, before any host connects, if another server holds this port id of the
    // volume or presents it under another NQN.
    let rec = trireme_daemon::recorder::Recorder::for_process(meta.clone());
    let said = trireme_daemon::nvmf::announce(rec, &ex, &a.volume, a.lease_ttl)
        .await
        .map_err(daemon_err)?;
    println!("nvme/tcp {} {}", ex.port.addr, ex.nqn);
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let server = tokio::spawn(ex.port.clone().serve(listener));
    let r = trireme_daemon::nvmf::run(meta, cfg, ex, stop.wait()).await;
    server.abort();
    follow.abort();
    said.end().await;
    r.map_err(daemon_err)
}
