//! NVMe/TCP: any bytes a host sends to a target queue (handshake, capsules, data, in any
//! order and length) must never panic the target, allocate past its bounds, or hang it: the
//! queue answers, refuses or closes.
#![no_main]
use std::sync::Arc;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use trireme_blockdev::mem::MemDevice;
use trireme_nvmf::{Ana, Port, Subsystem};

fuzz_target!(|data: &[u8]| {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        let sub = Arc::new(Subsystem {
            nqn: "nqn.2026-12.io.trireme:fuzz:vol".into(),
            serial: "fuzz".into(),
            nguid: [7; 16],
            dev: Arc::new(MemDevice::new(1 << 20)),
            ana: Ana::new(trireme_nvmf::ident::ana::OPTIMIZED),
            allow: Arc::new(|_: &str| true),
        });
        let addr = "127.0.0.1:4420".parse().unwrap();
        let port = Arc::new(Port::new(1, addr, vec![sub]));
        let (mut host, target) = tokio::io::duplex(1 << 20);
        let served = tokio::spawn(trireme_nvmf::serve_queue(port.clone(), target, addr));
        let _ = host.write_all(data).await;
        let _ = host.shutdown().await;
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(60), host.read_to_end(&mut out)).await;
        served.abort();
        port.shut();
    });
});
