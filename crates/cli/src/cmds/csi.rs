//! `trireme csi`: the CSI driver's process (`trireme_csi`), its controller a client of the
//! cluster this command line names (`--etcd`, or `up`'s `--data-dir`).

use super::*;
use crate::CsiArgs;

/// How the controller reaches the manager: as every other command does, again for each call
/// (the manager may have moved since the last one).
fn connector(cli: Arc<Cli>) -> trireme_csi::Connect {
    Arc::new(move || {
        let cli = cli.clone();
        Box::pin(async move {
            if cli.etcd.is_none() {
                return ControlClient::connect(&control_path(&cli.data_dir)).await;
            }
            // Not reaching etcd or its manager: the CO asks again later.
            control_client(&cli).await.map_err(|e| {
                let (CliError::Usage(m) | CliError::Runtime(m)) = e;
                trireme_control::ControlError::Elsewhere(m)
            })
        })
    })
}

pub(crate) async fn csi(cli: Arc<Cli>) -> Result<(), CliError> {
    let Cmd::Csi(a) = &cli.cmd else {
        unreachable!("csi() runs `trireme csi`")
    };
    let a: &CsiArgs = a;
    if !a.controller && !a.node {
        return Err(CliError::Usage(
            "csi: give --controller, --node, or both".into(),
        ));
    }
    let endpoint: trireme_csi::Endpoint = a
        .endpoint
        .parse()
        .map_err(|e: trireme_csi::CsiError| CliError::Usage(e.to_string()))?;
    let controller = a.controller.then(|| {
        trireme_csi::ControllerService::new(
            connector(cli.clone()),
            a.trash_keep.map(|d| d.as_secs()),
        )
    });
    let stop = Stop::catch()?;
    tracing::info!(
        endpoint = a.endpoint,
        controller = a.controller,
        node = a.node,
        "CSI driver {} serving",
        trireme_csi::DRIVER_NAME
    );
    trireme_csi::serve(&endpoint, controller, stop.wait())
        .await
        .map_err(|e| CliError::Runtime(e.to_string()))
}
