//! Least privilege inside etcd. etcd knows nothing of trireme's roles: with client
//! certificates alone, any certificate of the cluster's CA may write every key (a client host
//! could put itself on another volume's access list, or write a restart order to a node).
//! etcd's own access control (users and roles, a user being a certificate's common name)
//! closes that, and this module says what it should hold:
//!
//! | etcd user (certificate CN) | etcd role | may |
//! |---|---|---|
//! | `trireme node N`, one per member node that may hold the manager role | `trireme-node` | read and write every trireme key (the manager writes the cluster's records). Removed when node N is removed or a certificate of node N is revoked, so a node that left writes nothing |
//! | `trireme node N`, a member node that may not (`etcd rbac --managers`) | `trireme-node-N` | read trireme's keys; write its liveness key `alive/N` and its own record `nodes/N`, nothing else: not the `manager` key, other nodes' records, `revoked/`, `restarts/`, `settings/` or any volume's |
//! | `trireme admin` | `root` | everything, etcd's users and roles included |
//! | `trireme client NAME` | `trireme-clients`, `trireme-client-NAME` (empty) | read trireme's keys, write none. Everything a writer records (its attach record, replica states, answers to the manager's requests, its report) goes through the manager's control API, which checks that the caller is the writer of record and bounds what it writes. The empty role is kept so that [`apply`] takes back what older releases granted in it |
//! | `root` (no password, no certificate names it) | `root` | nothing: etcd requires it to exist before it turns access control on |
//!
//! [`plan`] computes that from the volumes (their access lists), the member nodes and any
//! client names given, and names the node users to delete (nodes removed, or whose certificate
//! was revoked); [`apply`] makes etcd hold it (adding what is missing, taking back what is no
//! longer planned for trireme's own roles, never touching other users and roles) and turns
//! access control on. Run by an operator (`trireme etcd rbac`) once, and again by the CLI each
//! time an operator changes an access list. [`open_to_all`] is the check a node daemon makes
//! at start: whether its own identity can write outside trireme's keys.

use std::collections::{BTreeMap, BTreeSet};

use etcd_client::{Permission, PermissionType, UserAddOptions};

use crate::cluster::PREFIX;
use crate::{MetaError, VolumeRecord, ANY_CLIENT};

/// The role of every node daemon that may hold the manager role.
pub const NODE_ROLE: &str = "trireme-node";
/// The setting (`settings/managers`) naming the nodes that may hold the manager role, as
/// [`format_managers`] writes it; absent or `all`: every member node.
pub const MANAGERS_SETTING: &str = "managers";
/// The role of every client: reading trireme's keys, writing those of volumes open to all.
pub const CLIENTS_ROLE: &str = "trireme-clients";
/// etcd's built-in role of its administrators.
pub const ROOT_ROLE: &str = "root";
/// The user etcd requires before it turns access control on.
pub const ROOT_USER: &str = "root";
/// The one etcd user all node certificates shared before each node had its own: any
/// certificate of a node, removed or revoked included, wrote as it. Never planned; deleted on
/// request once every node has a certificate of its own (`etcd rbac --drop-shared-node-user`).
pub const SHARED_NODE_USER: &str = "trireme node";
/// The etcd user of operator certificates.
pub const ADMIN_USER: &str = "trireme admin";

/// The etcd user of client `name`'s certificates (their common name).
pub fn client_user(name: &str) -> String {
    format!("trireme client {name}")
}

/// The etcd user of node `id`'s certificates (their common name).
pub fn node_user(id: u32) -> String {
    format!("trireme node {id}")
}

/// Node `id`'s own role when it may not hold the manager role: its liveness key and its own
/// record, nothing else.
pub fn member_role(id: u32) -> String {
    format!("trireme-node-{id}")
}

/// The nodes that may hold the manager role, from [`MANAGERS_SETTING`]: `None` is every member.
pub fn parse_managers(s: &str) -> Result<Option<BTreeSet<u32>>, MetaError> {
    let s = s.trim();
    if s == "all" {
        return Ok(None);
    }
    let ids = s
        .split(',')
        .map(|t| t.trim().parse::<u32>())
        .collect::<Result<BTreeSet<u32>, _>>()
        .map_err(|_| {
            MetaError::Refused(format!(
                "{s:?} is not a list of node ids (1,2,3) or \"all\""
            ))
        })?;
    Ok(Some(ids))
}

/// [`MANAGERS_SETTING`]'s value for `managers`.
pub fn format_managers(managers: Option<&BTreeSet<u32>>) -> String {
    match managers {
        None => "all".into(),
        Some(ids) => ids.iter().map(u32::to_string).collect::<Vec<_>>().join(","),
    }
}

/// Client `name`'s own role, which grants nothing now. A client wrote all eight of a volume's
/// writer keys once (attach record, layout, requests), so any client on the access list could
/// rewrite the writer's records; then its own report alone, which it could rewrite in a loop,
/// as large as etcd takes, until etcd was full. Both go through the manager now; the role
/// stays, empty, so that [`apply`] takes back what older releases granted in it.
pub fn client_role(name: &str) -> String {
    format!("trireme-client-{name}")
}

/// The end of the key range of everything that starts with `prefix`.
fn prefix_end(prefix: &str) -> String {
    let mut b = prefix.as_bytes().to_vec();
    if let Some(last) = b.last_mut() {
        *last += 1;
    }
    String::from_utf8(b).expect("trireme's prefix is ASCII")
}

/// One permission of a role: a key, or a range of keys `[key, range_end)`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Grant {
    pub key: String,
    pub range_end: Option<String>,
    pub write: bool,
}

impl Grant {
    fn key(key: String, write: bool) -> Grant {
        Grant {
            key,
            range_end: None,
            write,
        }
    }

    fn prefix(prefix: &str, write: bool) -> Grant {
        Grant {
            key: prefix.to_string(),
            range_end: Some(prefix_end(prefix)),
            write,
        }
    }
}

/// What etcd should hold: roles with their permissions, users with their roles, and users
/// that must be gone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub roles: BTreeMap<String, BTreeSet<Grant>>,
    pub users: BTreeMap<String, BTreeSet<String>>,
    pub delete: BTreeSet<String>,
}

/// Which node ids get an etcd user: the member nodes (`records`, not removed) and those named
/// (`named`, nodes whose records do not exist yet, or a node given a new certificate after a
/// revocation), less nodes removed or revoked and not named. Returns (members, retired).
pub fn node_ids(
    records: &[crate::NodeRecord],
    revoked: &[crate::RevokedCert],
    named: &[u32],
) -> (Vec<u32>, Vec<u32>) {
    let named: BTreeSet<u32> = named.iter().copied().collect();
    let revoked: BTreeSet<u32> = revoked
        .iter()
        .filter_map(|r| r.role.strip_prefix("node ")?.parse().ok())
        .collect();
    let removed = records
        .iter()
        .filter(|n| n.state == crate::NodeState::Removed)
        .map(|n| n.id);
    let retired: BTreeSet<u32> = removed
        .chain(revoked.iter().copied())
        .filter(|id| !named.contains(id))
        .collect();
    let members: BTreeSet<u32> = records
        .iter()
        .map(|n| n.id)
        .chain(named.iter().copied())
        .filter(|id| !retired.contains(id))
        .collect();
    (members.into_iter().collect(), retired.into_iter().collect())
}

/// Who among the nodes gets what.
#[derive(Debug, Clone, Default)]
pub struct Nodes<'a> {
    /// The member nodes: one etcd user each.
    pub members: &'a [u32],
    /// Nodes whose users go (removed or revoked).
    pub retired: &'a [u32],
    /// The members that may hold the manager role (`None`: all of them).
    pub managers: Option<&'a BTreeSet<u32>>,
}

/// The plan for `volumes`, `nodes` and clients `clients` (besides those the access lists
/// name).
pub fn plan(volumes: &[VolumeRecord], nodes: &Nodes<'_>, clients: &[String]) -> Plan {
    let mut p = Plan::default();
    let role = |p: &mut Plan, r: &str| {
        p.roles.entry(r.to_string()).or_default();
    };
    p.roles.insert(
        NODE_ROLE.into(),
        BTreeSet::from([Grant::prefix(PREFIX, true)]),
    );
    p.roles.insert(
        CLIENTS_ROLE.into(),
        BTreeSet::from([Grant::prefix(PREFIX, false)]),
    );
    let user = |p: &mut Plan, u: String, r: &str| {
        p.users.entry(u).or_default().insert(r.to_string());
    };
    for &id in nodes.members {
        if nodes.managers.is_none_or(|m| m.contains(&id)) {
            user(&mut p, node_user(id), NODE_ROLE);
            continue;
        }
        let own = |k: &str| Grant::key(format!("{PREFIX}{k}/{id}"), true);
        p.roles.insert(
            member_role(id),
            BTreeSet::from([Grant::prefix(PREFIX, false), own("alive"), own("nodes")]),
        );
        user(&mut p, node_user(id), &member_role(id));
    }
    p.delete = nodes.retired.iter().map(|&id| node_user(id)).collect();
    user(&mut p, ADMIN_USER.into(), ROOT_ROLE);
    user(&mut p, ROOT_USER.into(), ROOT_ROLE);
    let mut names: BTreeSet<String> = clients.iter().cloned().collect();
    for v in volumes {
        names.extend(
            v.access
                .iter()
                .filter(|a| *a != ANY_CLIENT && !crate::is_host_nqn(a))
                .cloned(),
        );
    }
    for name in names {
        let r = client_role(&name);
        role(&mut p, &r);
        user(&mut p, client_user(&name), CLIENTS_ROLE);
        user(&mut p, client_user(&name), &r);
    }
    p
}

/// What [`apply`] changed.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Applied {
    pub users_added: Vec<String>,
    pub users_deleted: Vec<String>,
    /// The shared node user of older certificates is still there (see [`SHARED_NODE_USER`]).
    pub shared_node_user: bool,
    pub roles_added: Vec<String>,
    pub granted: usize,
    pub revoked: usize,
    /// Access control was off and has been turned on.
    pub enabled: bool,
    /// The nodes that may hold the manager role (`None`: every member).
    pub managers: Option<Vec<u32>>,
    /// The node that held the manager role and may no longer: its role was taken back.
    pub manager_deposed: Option<u32>,
}

/// Whether `role` is one of trireme's own (whose permissions [`apply`] may take back).
fn ours(role: &str) -> bool {
    role == NODE_ROLE
        || role == CLIENTS_ROLE
        || role.starts_with("trireme-client-")
        || role.starts_with("trireme-node-")
}

/// etcd's refusal of this identity (its access control), or an outage to wait out.
fn denied(e: etcd_client::Error) -> MetaError {
    match e {
        etcd_client::Error::GRpcStatus(s)
            if matches!(
                s.code(),
                tonic::Code::PermissionDenied
                    | tonic::Code::Unauthenticated
                    | tonic::Code::InvalidArgument
                    | tonic::Code::FailedPrecondition
            ) =>
        {
            MetaError::Denied(s.message().to_string())
        }
        e => MetaError::Unavailable(e.to_string()),
    }
}

fn exists(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(s) if s.message().contains("already exists"))
}

fn not_found(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(s) if s.message().contains("not found"))
}

fn to_grant(p: &Permission) -> Option<Grant> {
    Some(Grant {
        key: p.key_str().ok()?.to_string(),
        range_end: Some(p.range_end_str().ok()?.to_string()).filter(|e| !e.is_empty()),
        write: p.get_type() != PermissionType::Read as i32,
    })
}

fn to_permission(g: &Grant) -> Permission {
    let p = if g.write {
        Permission::read_write(g.key.clone())
    } else {
        Permission::read(g.key.clone())
    };
    match &g.range_end {
        Some(e) => p.with_range_end(e.clone()),
        None => p,
    }
}

/// Makes etcd hold `plan` (see the module docs) and, with `enable`, turns its access control
/// on. Needs an identity with etcd's root role (or etcd's access control still off).
pub async fn apply(
    client: &mut etcd_client::Client,
    plan: &Plan,
    enable: bool,
) -> Result<Applied, MetaError> {
    let mut done = Applied::default();
    for (role, grants) in &plan.roles {
        match client.role_add(role.clone()).await {
            Ok(_) => done.roles_added.push(role.clone()),
            Err(e) if exists(&e) => {}
            Err(e) => return Err(denied(e)),
        }
        let have: BTreeSet<Grant> = client
            .role_get(role.clone())
            .await
            .map_err(denied)?
            .permissions()
            .iter()
            .filter_map(to_grant)
            .collect();
        for g in grants.difference(&have) {
            client
                .role_grant_permission(role.clone(), to_permission(g))
                .await
                .map_err(denied)?;
            done.granted += 1;
        }
        if ours(role) {
            for g in have.difference(grants) {
                client
                    .role_revoke_permission(
                        role.clone(),
                        g.key.clone(),
                        g.range_end.clone().map(|e| {
                            etcd_client::RoleRevokePermissionOptions::new().with_range_end(e)
                        }),
                    )
                    .await
                    .map_err(denied)?;
                done.revoked += 1;
            }
        }
    }
    for (user, roles) in &plan.users {
        match client
            .user_add(user.clone(), "", Some(UserAddOptions::new().with_no_pwd()))
            .await
        {
            Ok(_) => done.users_added.push(user.clone()),
            Err(e) if exists(&e) => {}
            Err(e) => return Err(denied(e)),
        }
        let have: BTreeSet<String> = match client.user_get(user.clone()).await {
            Ok(r) => r.roles().iter().cloned().collect(),
            Err(e) if not_found(&e) => BTreeSet::new(),
            Err(e) => return Err(denied(e)),
        };
        for r in roles.difference(&have) {
            client
                .user_grant_role(user.clone(), r.clone())
                .await
                .map_err(denied)?;
        }
        for r in have.difference(roles).filter(|r| ours(r)) {
            client
                .user_revoke_role(user.clone(), r.clone())
                .await
                .map_err(denied)?;
        }
    }
    for user in &plan.delete {
        match client.user_delete(user.clone()).await {
            Ok(_) => done.users_deleted.push(user.clone()),
            Err(e) if not_found(&e) => {}
            Err(e) => return Err(denied(e)),
        }
    }
    done.shared_node_user = match client.user_get(SHARED_NODE_USER).await {
        Ok(_) => true,
        Err(e) if not_found(&e) => false,
        Err(e) => return Err(denied(e)),
    };
    if enable {
        match client.auth_enable().await {
            Ok(_) => done.enabled = true,
            Err(e) if e.to_string().contains("already enabled") => {}
            Err(e) => return Err(denied(e)),
        }
    }
    Ok(done)
}

/// Whether this process's etcd identity may write outside trireme's keys: true when etcd's
/// access control is off (then every certificate of its CA may write every key) or this
/// identity holds etcd's root role. A node daemon refuses to start then, unless `--insecure`.
pub async fn open_to_all(client: &mut etcd_client::Client) -> Result<bool, MetaError> {
    let probe = format!(
        "/trireme-access-probe/{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    );
    let put = tokio::time::timeout(
        crate::etcd::CALL_TIMEOUT,
        client.put(probe.clone(), "", None),
    );
    match put.await {
        Err(_) => Err(MetaError::Unavailable("etcd did not answer".into())),
        Ok(Ok(_)) => {
            let _ = client.delete(probe, None).await;
            Ok(true)
        }
        Ok(Err(etcd_client::Error::GRpcStatus(s)))
            if s.code() == tonic::Code::PermissionDenied
                || s.message().contains("permission denied") =>
        {
            Ok(false)
        }
        Ok(Err(e)) => Err(denied(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vol(name: &str, access: &[&str]) -> VolumeRecord {
        VolumeRecord {
            id: 1,
            name: name.into(),
            size: 4096,
            preallocate: false,
            replicas: vec![],
            epoch: 0,
            writer_open: false,
            access: access.iter().map(|s| s.to_string()).collect(),
            min_copies: 0,
            tier: Default::default(),
            parent: None,
            layout: Default::default(),
            limits: Default::default(),
            qos: None,
        }
    }

    #[test]
    fn clients_write_no_key() {
        let p = plan(
            &[vol("db1", &["alice"]), vol("web", &["*"]), vol("ops", &[])],
            &Nodes {
                members: &[1, 2],
                retired: &[3],
                managers: None,
            },
            &["carol".into()],
        );
        // A client's role grants nothing: it writes no key (its report too goes through the
        // manager); the role stays, empty, so that what older releases granted is taken back.
        for c in ["alice", "carol"] {
            assert!(p.roles[&client_role(c)].is_empty(), "{c}");
            assert_eq!(
                p.users[&client_user(c)],
                BTreeSet::from([CLIENTS_ROLE.to_string(), client_role(c)])
            );
        }
        assert_eq!(
            p.roles[CLIENTS_ROLE],
            BTreeSet::from([Grant::prefix(PREFIX, false)])
        );
        // No client writes an attach record, a layout or a request.
        for d in [
            "attach",
            "layouts",
            "moves",
            "takeouts",
            "scrubs",
            "resizes",
            "snapshot-asks",
        ] {
            assert!(p
                .roles
                .iter()
                .filter(|(r, _)| r.as_str() != NODE_ROLE)
                .flat_map(|(_, g)| g)
                .all(|g| !g.write || !g.key.contains(&format!("/{d}/"))));
        }
        // Nodes: one user each, none shared; a retired node's user goes; operators are root.
        for u in [node_user(1), node_user(2)] {
            assert_eq!(p.users[&u], BTreeSet::from([NODE_ROLE.to_string()]));
        }
        assert!(!p.users.contains_key(SHARED_NODE_USER));
        assert!(!p.users.contains_key(&node_user(3)));
        assert_eq!(p.delete, BTreeSet::from([node_user(3)]));
        assert_eq!(p.users[ADMIN_USER], BTreeSet::from([ROOT_ROLE.to_string()]));
        assert_eq!(
            p.roles[NODE_ROLE],
            BTreeSet::from([Grant {
                key: PREFIX.into(),
                range_end: Some("/trireme/v10".into()),
                write: true
            }])
        );
    }

    #[test]
    fn a_node_that_may_not_manage_writes_only_its_own_records() {
        let managers = BTreeSet::from([1, 2]);
        let p = plan(
            &[vol("db1", &["alice"])],
            &Nodes {
                members: &[1, 2, 3],
                retired: &[],
                managers: Some(&managers),
            },
            &[],
        );
        for u in [node_user(1), node_user(2)] {
            assert_eq!(p.users[&u], BTreeSet::from([NODE_ROLE.to_string()]));
        }
        assert_eq!(
            p.users[&node_user(3)],
            BTreeSet::from([member_role(3)]),
            "node 3 holds the manager's role"
        );
        let exact = |k: &str| Grant::key(format!("/trireme/v1/{k}"), true);
        assert_eq!(
            p.roles[&member_role(3)],
            BTreeSet::from([
                Grant::prefix(PREFIX, false),
                exact("alive/3"),
                exact("nodes/3"),
            ])
        );
        // Exact keys, not prefixes: `nodes/3` must not reach `nodes/30`.
        assert!(p.roles[&member_role(3)]
            .iter()
            .all(|g| !g.write || g.range_end.is_none()));
    }

    #[test]
    fn the_managers_setting_reads_back_and_refuses_typos() {
        let ids = BTreeSet::from([1, 3]);
        let s = format_managers(Some(&ids));
        assert_eq!(s, "1,3");
        assert_eq!(parse_managers(&s).unwrap(), Some(ids));
        assert_eq!(parse_managers("all").unwrap(), None);
        assert_eq!(format_managers(None), "all");
        for bad in ["", "1,,2", "one", "1;2", "-1"] {
            assert!(parse_managers(bad).is_err(), "{bad:?}");
        }
    }
}
