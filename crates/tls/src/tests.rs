use std::os::unix::fs::PermissionsExt;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

#[test]
fn roles_round_trip_through_their_uri() {
    for r in [
        Role::Node(3),
        Role::Client("vm-host.1".into()),
        Role::Server,
    ] {
        assert_eq!(Role::from_uri(&r.uri()), Some(r));
    }
    for bad in [
        "urn:trireme:node:0",
        "urn:trireme:node:x",
        "urn:trireme:client:",
        "urn:trireme:client:a/b",
        "urn:other:node:1",
        "",
    ] {
        assert_eq!(Role::from_uri(bad), None, "{bad:?}");
    }
}

#[test]
fn a_ca_issues_certificates_that_name_their_role_and_keeps_keys_private() {
    let d = tempfile::tempdir().unwrap();
    let ca_dir = d.path().join("ca");
    let ca = Ca::init(&ca_dir).unwrap();
    assert_eq!(mode(&ca_dir.join(CA_KEY)), 0o600);
    assert!(
        Ca::init(&ca_dir).is_err(),
        "an existing CA is never replaced"
    );
    let ca = {
        drop(ca);
        Ca::open(&ca_dir).unwrap()
    };
    let out = d.path().join("client");
    ca.issue(&Role::Client("alice".into()), &[])
        .unwrap()
        .write(&out)
        .unwrap();
    assert_eq!(mode(&out.join("client-key.pem")), 0o600);
    assert_eq!(mode(&out), 0o700);
    let id = Identity::load(&out, "client").unwrap();
    assert_eq!(id.role, Role::Client("alice".into()));
    assert!(Identity::load(&out, "server").is_err(), "no such files");
    // A key that does not parse is reported with its path.
    std::fs::write(out.join("client-key.pem"), "garbage").unwrap();
    let e = Identity::load(&out, "client").unwrap_err().to_string();
    assert!(e.contains("client-key.pem"), "{e}");
}

#[test]
fn names_parse_as_ip_or_dns() {
    assert_eq!(
        "127.0.0.1".parse::<San>().unwrap(),
        San::Ip("127.0.0.1".parse().unwrap())
    );
    assert_eq!(
        "node-1.example".parse::<San>().unwrap(),
        San::Dns("node-1.example".into())
    );
    assert!("bad name!".parse::<San>().is_err());
    assert!("".parse::<San>().is_err());
}

/// Runs one handshake over an in-memory pipe; returns what the server saw of the client, or
/// why it failed.
async fn handshake(server: &Identity, client: Arc<rustls::ClientConfig>) -> Result<Role, String> {
    let (a, b) = tokio::io::duplex(64 << 10);
    let acceptor = tokio_rustls::TlsAcceptor::from(server.server_config().unwrap());
    let connector = tokio_rustls::TlsConnector::from(client);
    let srv = tokio::spawn(async move {
        let mut s = acceptor.accept(a).await.map_err(|e| e.to_string())?;
        let role = peer_role(s.get_ref().1).ok_or("no role")?;
        // Both ends prefer the cheaper of TLS 1.3's AES suites.
        let suite = s.get_ref().1.negotiated_cipher_suite().map(|c| c.suite());
        if suite != Some(rustls::CipherSuite::TLS13_AES_128_GCM_SHA256) {
            return Err(format!("negotiated {suite:?}"));
        }
        let mut buf = [0u8; 5];
        s.read_exact(&mut buf).await.map_err(|e| e.to_string())?;
        s.write_all(&buf).await.map_err(|e| e.to_string())?;
        s.flush().await.map_err(|e| e.to_string())?;
        Ok::<Role, String>(role)
    });
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let cli = async {
        let mut c = connector
            .connect(name, b)
            .await
            .map_err(|e| e.to_string())?;
        c.write_all(b"hello").await.map_err(|e| e.to_string())?;
        c.flush().await.map_err(|e| e.to_string())?;
        let mut buf = [0u8; 5];
        c.read_exact(&mut buf).await.map_err(|e| e.to_string())?;
        Ok::<(), String>(())
    };
    let c = cli.await;
    let s = srv.await.unwrap();
    c?;
    s
}

#[tokio::test]
async fn only_clients_of_the_same_ca_get_in() {
    let d = tempfile::tempdir().unwrap();
    let ca = Ca::init(&d.path().join("ca")).unwrap();
    let ip: San = "127.0.0.1".parse().unwrap();
    ca.issue(&Role::Server, &[ip])
        .unwrap()
        .write(&d.path().join("srv"))
        .unwrap();
    ca.issue(&Role::Client("alice".into()), &[])
        .unwrap()
        .write(&d.path().join("alice"))
        .unwrap();
    let server = Identity::load(&d.path().join("srv"), "server").unwrap();
    let alice = Identity::load(&d.path().join("alice"), "client").unwrap();
    assert_eq!(
        handshake(&server, alice.client_config().unwrap()).await,
        Ok(Role::Client("alice".into()))
    );

    // A client of another CA.
    let other = Ca::init(&d.path().join("other-ca")).unwrap();
    other
        .issue(&Role::Client("mallory".into()), &[])
        .unwrap()
        .write(&d.path().join("mallory"))
        .unwrap();
    let mallory = Identity::load(&d.path().join("mallory"), "client").unwrap();
    // Mallory trusts our CA (she copied its certificate), but her own is not from it.
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(load_certs(&d.path().join("ca").join(CA_CERT)).unwrap()[0].clone())
        .unwrap();
    let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots.clone())
    .with_client_auth_cert(mallory.certs.clone(), mallory.key.clone_key())
    .unwrap();
    assert!(handshake(&server, Arc::new(cfg)).await.is_err());

    // No client certificate at all.
    let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    assert!(handshake(&server, Arc::new(cfg)).await.is_err());

    // A client that trusts another CA refuses our server.
    assert!(handshake(&server, mallory.client_config().unwrap())
        .await
        .is_err());
}

/// A revoked certificate is refused at the handshake, on either side: a client's at a server,
/// a server's at a client; off the list, it passes again. (The only test that sets the
/// process's deny list.)
#[tokio::test]
async fn revoked_certificates_are_refused_both_ways() {
    let d = tempfile::tempdir().unwrap();
    let ca = Ca::init(&d.path().join("ca")).unwrap();
    let ip: San = "127.0.0.1".parse().unwrap();
    ca.issue(&Role::Node(1), &[ip])
        .unwrap()
        .write(&d.path().join("node"))
        .unwrap();
    ca.issue(&Role::Client("alice".into()), &[])
        .unwrap()
        .write(&d.path().join("alice"))
        .unwrap();
    let node = Identity::load(&d.path().join("node"), "node").unwrap();
    let alice = Identity::load(&d.path().join("alice"), "client").unwrap();
    let (a, n) = (alice.fingerprint(), node.fingerprint());
    assert_eq!(a.len(), 64);
    assert_eq!(
        cert_file(&d.path().join("alice/client-cert.pem"))
            .unwrap()
            .0,
        a
    );
    revoke::set_revoked([a.clone()]);
    let e = handshake(&node, alice.client_config().unwrap())
        .await
        .unwrap_err();
    assert!(e.to_lowercase().contains("revoked"), "{e}");
    revoke::set_revoked([n]);
    let e = handshake(&node, alice.client_config().unwrap())
        .await
        .unwrap_err();
    assert!(e.to_lowercase().contains("revoked"), "{e}");
    revoke::set_revoked([]);
    assert!(handshake(&node, alice.client_config().unwrap())
        .await
        .is_ok());
}

/// A certificate re-issued over the files of a running process is what its next handshake
/// presents; a file of another role put there is not taken (the old one stays).
#[tokio::test]
async fn a_certificate_reissued_in_place_is_picked_up() {
    let d = tempfile::tempdir().unwrap();
    let ca = Ca::init(&d.path().join("ca")).unwrap();
    let ip: San = "127.0.0.1".parse().unwrap();
    let dir = d.path().join("node");
    ca.issue(&Role::Node(1), std::slice::from_ref(&ip))
        .unwrap()
        .write(&dir)
        .unwrap();
    let node = Identity::load(&dir, "node").unwrap();
    let resolver = node.resolver(&provider()).unwrap();
    let first = resolver.current().cert[0].clone();
    std::thread::sleep(std::time::Duration::from_millis(20));
    ca.issue_for(&Role::Node(1), std::slice::from_ref(&ip), 30)
        .unwrap()
        .write(&dir)
        .unwrap();
    let second = resolver.current().cert[0].clone();
    assert_ne!(first, second, "the re-issued certificate was not picked up");
    // Another role's certificate in its place: refused, the last good one stays.
    std::thread::sleep(std::time::Duration::from_millis(20));
    let wrong = ca.issue(&Role::Node(2), &[ip]).unwrap();
    std::fs::write(dir.join("node-cert.pem"), &wrong.cert_pem).unwrap();
    std::fs::write(dir.join("node-key.pem"), &wrong.key_pem).unwrap();
    assert_eq!(resolver.current().cert[0], second);
    // And a handshake with the configuration built before the re-issue presents it.
    let alice_dir = d.path().join("alice");
    ca.issue(&Role::Client("alice".into()), &[])
        .unwrap()
        .write(&alice_dir)
        .unwrap();
    let alice = Identity::load(&alice_dir, "client").unwrap();
    assert!(handshake(&node, alice.client_config().unwrap())
        .await
        .is_ok());
}
