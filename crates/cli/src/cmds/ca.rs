//! `trireme ca`: the cluster's certificate authority.

#[allow(unused_imports)]
use super::*;

/// `trireme ca init | issue`.
pub(crate) fn ca(cli: &Cli, c: &crate::CaCmd) -> Result<(), CliError> {
    use trireme_tls::{Ca, Role, San};
    let default_ca = cli.data_dir.join("tls").join("ca");
    let usage = |e: trireme_tls::TlsError| match e {
        trireme_tls::TlsError::Usage(m) => CliError::Usage(m),
        e => CliError::Runtime(e.to_string()),
    };
    #[derive(Serialize)]
    struct Written {
        role: Option<String>,
        dir: String,
        files: Vec<String>,
    }
    let (w, what) = match c {
        crate::CaCmd::Revoke { cert, ca } => {
            return revoke(
                cli,
                cert,
                ca.as_deref().unwrap_or(&default_ca),
                ca.is_some(),
            )
        }
        crate::CaCmd::Revoked => return revoked(cli),
        crate::CaCmd::Crl { ca } => {
            let dir = ca.clone().unwrap_or(default_ca);
            let path = open_ca(&dir)?.write_crl().map_err(usage)?;
            let w = Written {
                role: None,
                dir: dir.display().to_string(),
                files: vec![path.display().to_string()],
            };
            print(cli.output, &w, |w| {
                format!(
                    "the CA's revocation list: {} (copy it to each etcd member's --client-crl-file)\n",
                    w.files[0]
                )
            });
            return Ok(());
        }
        crate::CaCmd::Init { dir } => {
            let dir = dir.clone().unwrap_or(default_ca);
            Ca::init(&dir).map_err(usage)?;
            let w = Written {
                role: None,
                dir: dir.display().to_string(),
                files: vec![trireme_tls::CA_CERT.into(), trireme_tls::CA_KEY.into()],
            };
            (w, "a new cluster CA".to_string())
        }
        crate::CaCmd::Issue(a) => {
            let role = match &a.role {
                crate::CaRole::Node { id } => Role::Node(*id),
                crate::CaRole::Client { name } => {
                    trireme_tls::check_client_name(name).map_err(usage)?;
                    Role::Client(name.clone())
                }
                crate::CaRole::Server => Role::Server,
                crate::CaRole::Admin => Role::Admin,
            };
            let sans: Vec<San> = a
                .sans
                .iter()
                .map(|s| s.parse())
                .collect::<Result<_, _>>()
                .map_err(usage)?;
            if matches!(role, Role::Server) && sans.is_empty() {
                return Err(CliError::Usage(
                    "a server certificate needs the names clients reach it by: --san HOST (repeat for several)".into(),
                ));
            }
            let out = a.out.clone().ok_or_else(|| {
                CliError::Usage("--out DIR: where to write the certificate and key".into())
            })?;
            let ca = open_ca(&a.ca.clone().unwrap_or(default_ca))?;
            ca.issue_for(&role, &sans, a.days)
                .and_then(|i| i.write(&out))
                .map_err(usage)?;
            let stem = role.stem();
            let w = Written {
                role: Some(role.to_string()),
                dir: out.display().to_string(),
                files: vec![
                    trireme_tls::CA_CERT.into(),
                    format!("{stem}-cert.pem"),
                    format!("{stem}-key.pem"),
                ],
            };
            (w, format!("a certificate for {role}"))
        }
    };
    print(cli.output, &w, |w| {
        format!("{what} in {}: {}\n", w.dir, w.files.join(", "))
    });
    Ok(())
}

fn open_ca(dir: &Path) -> Result<trireme_tls::Ca, CliError> {
    trireme_tls::Ca::open(dir).map_err(|e| {
        CliError::Usage(format!(
            "no usable CA in {} ({e}); create one with `trireme ca init`",
            dir.display()
        ))
    })
}

/// What `ca revoke` did.
#[derive(Serialize)]
struct Revoked {
    #[serde(flatten)]
    rec: trireme_meta::RevokedCert,
    /// The CA's revocation list, rewritten with the certificate on it.
    crl: Option<String>,
}

/// `trireme ca revoke CERT`: the certificate goes on the cluster's deny list, on the CA's
/// revocation list for etcd (with the CA at hand), and a node's loses its etcd user.
fn revoke(cli: &Cli, cert: &Path, ca_dir: &Path, ca_named: bool) -> Result<(), CliError> {
    let bad = |e: trireme_tls::TlsError| match e {
        trireme_tls::TlsError::Io { .. }
        | trireme_tls::TlsError::Bad { .. }
        | trireme_tls::TlsError::Usage(_) => CliError::Usage(e.to_string()),
        e => CliError::Runtime(e.to_string()),
    };
    let der = trireme_tls::load_first_cert(cert).map_err(bad)?;
    let (fingerprint, role) = (
        trireme_tls::revoke::fingerprint(&der),
        trireme_tls::role_of(&der),
    );
    // The CA is opened and checked before anything changes: a wrong --ca changes nothing.
    let ca = if ca_named || ca_dir.join(trireme_tls::CA_KEY).exists() {
        let ca = open_ca(ca_dir)?;
        ca.check_issued(&der).map_err(bad)?;
        Some(ca)
    } else {
        None
    };
    let node = matches!(role, Some(trireme_tls::Role::Node(_)));
    let role = role.map_or_else(|| "no trireme role".to_string(), |r| r.to_string());
    let rt = runtime(1)?;
    let rec: trireme_meta::RevokedCert = rt.block_on(async {
        control_client(cli)
            .await?
            .call(&Request::CaRevoke {
                fingerprint: fingerprint.clone(),
                role: role.clone(),
            })
            .await
            .map_err(usage_if_remote)
    })?;
    let crl = match &ca {
        Some(ca) => Some(ca.revoke(&der).map_err(bad)?.display().to_string()),
        None => None,
    };
    if node {
        rt.block_on(super::etcd::rbac_follow(cli));
    }
    print(cli.output, &Revoked { rec, crl }, |r| {
        let mut s = format!(
            "revoked the certificate of {} (sha256 {}): refused at every handshake from now on\n",
            r.rec.role, r.rec.fingerprint
        );
        s += &match &r.crl {
            Some(p) => format!(
                "on the CA's revocation list too: copy {p} to each etcd member's --client-crl-file\n"
            ),
            None => format!(
                "no CA in {}: etcd's revocation list not written (--ca DIR)\n",
                ca_dir.display()
            ),
        };
        s
    });
    Ok(())
}

/// `trireme ca revoked`: the deny list.
fn revoked(cli: &Cli) -> Result<(), CliError> {
    let list: Vec<trireme_meta::RevokedCert> = runtime(1)?.block_on(async {
        Ok::<_, CliError>(control_client(cli).await?.call(&Request::CaRevoked).await?)
    })?;
    print(cli.output, &list, |l| {
        if l.is_empty() {
            return "no certificate is revoked\n".to_string();
        }
        l.iter()
            .map(|r| format!("{}  {}\n", r.fingerprint, r.role))
            .collect()
    });
    Ok(())
}
