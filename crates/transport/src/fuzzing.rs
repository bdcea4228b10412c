//! Entry points of the fuzz targets in `fuzz/` that need the crate's insides: not an API.

use std::sync::{Arc, OnceLock};

/// One runtime and one pair of TLS configurations (a client and a node of one new CA, set up
/// as the data path sets them) for the whole fuzzing process.
fn setup() -> &'static (
    tokio::runtime::Runtime,
    Arc<rustls::ClientConfig>,
    Arc<rustls::ServerConfig>,
) {
    static S: OnceLock<(
        tokio::runtime::Runtime,
        Arc<rustls::ClientConfig>,
        Arc<rustls::ServerConfig>,
    )> = OnceLock::new();
    S.get_or_init(|| {
        use trireme_tls::{Ca, Identity, Role, San};
        let d = std::env::temp_dir().join(format!("trireme-fuzz-tls-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let ca = Ca::init(&d.join("ca")).unwrap();
        let ip = San::Ip("127.0.0.1".parse().unwrap());
        ca.issue(&Role::Node(1), &[ip])
            .unwrap()
            .write(&d.join("node"))
            .unwrap();
        ca.issue(&Role::Admin, &[])
            .unwrap()
            .write(&d.join("admin"))
            .unwrap();
        let node = Identity::load(&d.join("node"), "node").unwrap();
        let admin = Identity::load(&d.join("admin"), "admin").unwrap();
        let mut s = (*node.server_config().unwrap()).clone();
        s.enable_secret_extraction = true;
        s.send_tls13_tickets = 0;
        let mut c = (*admin.client_config().unwrap()).clone();
        c.enable_secret_extraction = true;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        (rt, Arc::new(c), Arc::new(s))
    })
}

/// The TLS record layer against what a peer with the link's keys may send (see
/// `records::fuzz_exchange`).
pub fn tls_records(data: &[u8]) {
    let (rt, c, s) = setup();
    rt.block_on(crate::records::fuzz_exchange(data, c.clone(), s.clone()));
}
