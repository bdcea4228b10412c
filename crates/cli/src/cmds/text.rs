//! How results read on a terminal: tables and reports.

#[allow(unused_imports)]
use super::*;

pub(crate) fn nodes_of(v: &VolumeRecord) -> Vec<u32> {
    v.replicas.iter().map(|r| r.node).collect()
}

/// "node 1" or "nodes 1, 2, 3": where the volume's copies are.
pub(crate) fn on_nodes(v: &VolumeRecord) -> String {
    let n = nodes_of(v);
    let list: Vec<String> = n.iter().map(u32::to_string).collect();
    format!(
        "node{} {}",
        if n.len() == 1 { "" } else { "s" },
        list.join(", ")
    )
}

/// Rows under a head, each column as wide as its widest cell, two spaces apart (fixed widths
/// lost their alignment on a long name or address); the last column is not padded.
pub(crate) fn table(head: &[&str], rows: &[Vec<String>]) -> String {
    let mut width: Vec<usize> = head.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let last = cells.len().saturating_sub(1);
        let mut l = String::new();
        for (k, c) in cells.into_iter().enumerate() {
            l += c;
            if k < last {
                l += &" ".repeat(width[k] - c.chars().count() + 2);
            }
        }
        l.trim_end().to_string() + "\n"
    };
    let mut s = line(head.to_vec());
    for r in rows {
        s += &line(r.iter().map(String::as_str).collect());
    }
    s
}

pub(crate) fn nodes_table(nodes: &[NodeStatus]) -> String {
    let mut rows = Vec::new();
    let mut tiers = Vec::new();
    for n in nodes {
        let ping = n.ping_us.map_or("-".into(), |p| format!("{p} us"));
        let state = match (n.up, n.state) {
            (_, trireme_meta::NodeState::Removed) => "removed".to_string(),
            // Nothing left on it: the drain is over.
            (up, trireme_meta::NodeState::Draining) => format!(
                "{}/{}",
                if up { "up" } else { "down" },
                if n.replicas == 0 {
                    "drained"
                } else {
                    "draining"
                }
            ),
            (true, _) => "up".to_string(),
            (false, _) => "down".to_string(),
        };
        rows.push(vec![
            n.id.to_string(),
            n.addr.clone(),
            n.zone.clone().unwrap_or_else(|| "-".into()),
            n.store.clone(),
            state,
            n.transport.clone(),
            ping,
            n.replicas.to_string(),
            reserved_text(n),
        ]);
        if let Some(t) = &n.tiers {
            tiers.push(format!("node {}: {}\n", n.id, node_tiers_text(t)));
        }
    }
    let head = [
        "NODE",
        "ADDRESS",
        "ZONE",
        "STORE",
        "STATE",
        "TRANSPORT",
        "PING",
        "REPLICAS",
        "RESERVED/CAPACITY",
    ];
    table(&head, &rows) + &tiers.concat()
}

/// The IOPS its volumes reserve on the node against what it can serve: `1,600/1,000 (over)`,
/// `1,600/?` when no capacity is declared, `-` for neither.
fn reserved_text(n: &NodeStatus) -> String {
    use trireme_control::reserves::grouped;
    match (n.reserved_iops, n.iops_capacity) {
        (0, None) => "-".into(),
        (r, None) => format!("{}/?", grouped(r)),
        (r, Some(c)) if r > c => format!("{}/{} (over)", grouped(r), grouped(c)),
        (r, Some(c)) => format!("{}/{}", grouped(r), grouped(c)),
    }
}

/// A node's tiers in one line.
pub(crate) fn node_tiers_text(t: &trireme_control::NodeTierStatus) -> String {
    format!(
        "tiers: fast {} of {} used, slow {} used {}; {} extents; migrating {}/s (up to {}/s), {} moved",
        human(t.fast_used),
        human(t.fast_capacity),
        human(t.slow_used),
        t.disk_model
            .as_deref()
            .map_or("on a real disk".to_string(), |m| format!("behind a {m}")),
        human(t.extent),
        human(t.migrating_per_s),
        human(t.migrate_rate),
        human(t.migrated_bytes)
    )
}

/// A replica's tiers in one line.
pub(crate) fn replica_tier_text(t: &trireme_control::ReplicaTierStatus) -> String {
    format!(
        "tier on node {}: {} extents fast, {} slow (pin {}); reads {} fast, {} slow, hit ratio {}; {} promoted, {} demoted",
        t.node,
        t.fast_extents,
        t.slow_extents,
        t.pin.as_str(),
        t.reads_fast,
        t.reads_slow,
        t.hit_ratio.map_or("-".to_string(), |h| format!("{h:.3}")),
        t.promotions,
        t.demotions
    )
}

/// An access list as `status` and `volume info` print it.
pub(crate) fn access_text(a: &[String]) -> String {
    if a.is_empty() {
        "nodes and operators only".to_string()
    } else if a.iter().any(|c| c == trireme_meta::ANY_CLIENT) {
        "every client".to_string()
    } else {
        a.join(", ")
    }
}

pub(crate) fn volumes_table(vs: &[VolumeRecord]) -> String {
    let rows: Vec<Vec<String>> = vs
        .iter()
        .map(|v| {
            let reps: Vec<String> = v
                .replicas
                .iter()
                .map(|r| format!("{}: {}", r.node, r.state))
                .collect();
            vec![
                v.name.clone(),
                v.id.to_string(),
                human(v.size),
                v.epoch.to_string(),
                reps.join(", "),
                access_text(&v.access),
            ]
        })
        .collect();
    let head = [
        "VOLUME",
        "ID",
        "SIZE",
        "EPOCH",
        "REPLICAS (node: state)",
        "ACCESS",
    ];
    table(&head, &rows)
}

/// A time in seconds since the Unix epoch, as UTC to the minute.
pub(crate) fn utc_time(secs: u64) -> String {
    utc(
        secs,
        time::macros::format_description!("[year]-[month]-[day] [hour]:[minute] UTC"),
    )
    .unwrap_or_else(|| format!("{secs} s after 1970"))
}

/// A time in seconds since the Unix epoch as a UTC stamp for names: `20261126-152849`.
pub(crate) fn utc_stamp(secs: u64) -> String {
    utc(
        secs,
        time::macros::format_description!("[year][month][day]-[hour][minute][second]"),
    )
    .unwrap_or_else(|| secs.to_string())
}

/// A time in milliseconds since the Unix epoch, as UTC to the second.
pub(crate) fn utc_time_ms(ms: u64) -> String {
    utc(
        ms / 1000,
        time::macros::format_description!("[year]-[month]-[day] [hour]:[minute]:[second]"),
    )
    .unwrap_or_else(|| format!("{ms} ms after 1970"))
}

fn utc(secs: u64, fmt: &[time::format_description::BorrowedFormatItem<'_>]) -> Option<String> {
    i64::try_from(secs)
        .ok()
        .and_then(|s| time::OffsetDateTime::from_unix_timestamp(s).ok())
        .and_then(|t| t.format(&fmt).ok())
}

/// `volume info`'s scrub lines: the last scrub's outcome and the next one's time.
pub(crate) fn scrub_text(r: Option<&trireme_meta::ScrubRecord>, next: Option<u64>) -> String {
    let mut s = match r.and_then(|r| r.last.as_ref()) {
        None => "last scrub: never\n".to_string(),
        Some(o) => {
            let what = match &o.error {
                Some(e) => format!("failed: {e}"),
                None if o.mismatched_regions == 0 => {
                    format!("{} compared, the copies agree", human(o.bytes_compared))
                }
                None => format!(
                    "{} compared, {} regions differed: {} repaired, {} with no majority",
                    human(o.bytes_compared),
                    o.mismatched_regions,
                    o.repaired_regions,
                    o.unresolved_regions
                ),
            };
            format!(
                "last scrub: {} ({}, {:.1} s): {what}\n",
                utc_time(o.at),
                o.by,
                o.took_ms as f64 / 1000.0
            )
        }
    };
    if let Some(n) = next {
        s += &format!("next scheduled scrub: {}\n", utc_time(n));
    }
    s
}

pub(crate) fn events_text(l: &[trireme_meta::ClusterEvent]) -> String {
    if l.is_empty() {
        return "no events recorded\n".into();
    }
    let mut s = String::new();
    for e in l {
        s += &format!("{}  {:<11}  {}\n", utc_time_ms(e.time_ms), e.kind, e.text);
    }
    s
}

pub(crate) fn snapshots_table(volume: &str, l: &[trireme_control::SnapshotInfo]) -> String {
    if l.is_empty() {
        return format!("volume {volume} has no snapshot\n");
    }
    let rows: Vec<Vec<String>> = l
        .iter()
        .map(|t| {
            let list = |n: &[u32]| n.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
            let mut nodes = list(&t.nodes);
            if !t.lost.is_empty() {
                nodes += &format!(
                    " (lost on {}: that copy went away or lacks it)",
                    list(&t.lost)
                );
            }
            vec![
                t.name.clone(),
                t.id.to_string(),
                utc_time(t.created),
                t.state.clone(),
                human(t.size),
                t.exclusive_bytes.map_or("-".into(), human),
                nodes,
            ]
        })
        .collect();
    let head = [
        "SNAPSHOT",
        "ID",
        "TAKEN",
        "STATE",
        "SIZE",
        "OWN BYTES",
        "NODES",
    ];
    table(&head, &rows)
}

pub(crate) fn trash_table(l: &[trireme_meta::TrashRecord]) -> String {
    if l.is_empty() {
        return "the trash is empty\n".to_string();
    }
    let mut s = format!(
        "{:<16} {:<6} {:<10} {:<20} {:<20} {}\n",
        "VOLUME", "ID", "SIZE", "DELETED", "PURGED AFTER", "BY"
    );
    for t in l {
        s += &format!(
            "{:<16} {:<6} {:<10} {:<20} {:<20} {}\n",
            t.volume.name,
            t.volume.id,
            human(t.volume.size),
            utc_time(t.deleted_at),
            utc_time(t.purge_at),
            t.deleted_by
        );
    }
    s
}

/// The cluster name `nvmf serve` puts in NQNs when not told another (`TRIREME_CLUSTER`).
pub(crate) fn nvmf_cluster() -> String {
    std::env::var("TRIREME_CLUSTER").unwrap_or_else(|_| crate::args::DEFAULT_CLUSTER.into())
}

/// A volume's NVMe/TCP exports, a line per server under a line naming the subsystem (two
/// NQNs, a misconfiguration `nvmf serve` refuses, would show as two), each line led by
/// `indent`.
pub(crate) fn nvmf_text(indent: &str, exports: &[trireme_meta::NvmfExportRecord]) -> String {
    let mut out = String::new();
    let mut nqn = "";
    for e in exports {
        if e.nqn != nqn {
            nqn = &e.nqn;
            out += &format!("{indent}nvme/tcp {nqn}\n");
        }
        let hosts = match (e.hosts.len(), e.more_hosts) {
            (0, _) => "no host connected".to_string(),
            (_, 0) => format!("hosts {}", e.hosts.join(", ")),
            (_, more) => format!("hosts {} and {more} more", e.hosts.join(", ")),
        };
        out += &format!(
            "{indent}  port {} {} {} (pid {} on {}), {hosts}\n",
            e.port_id, e.addr, e.ana, e.pid, e.host
        );
    }
    out
}

pub(crate) fn status_text(s: &StatusReport) -> String {
    let up = s.nodes.iter().filter(|n| n.up).count();
    let mut out = String::new();
    if let Some(h) = &s.health {
        out += &format!("health: {}\n", h.verdict.as_str().to_uppercase());
        for r in &h.reasons {
            out += &format!("  {r}\n");
        }
        for w in &s.warnings {
            out += &format!("  warning: {w}\n");
        }
        out += "\n";
    }
    out += &format!("nodes: {up} of {} up\n", s.nodes.len());
    out += &nodes_table(&s.nodes);
    out += &trireme_control::pool::PoolReport::from_status(s).summary();
    out += " (trireme pool)\n";
    for m in &s.moves {
        out += &move_text(m);
    }
    if let Some(m) = &s.manager {
        out += &format!(
            "\nmanager: node {} (pid {} on {}), control API at {}\n",
            m.node, m.pid, m.host, m.control
        );
    }
    out += &format!("\nvolumes: {}\n", s.volumes.len());
    out += &format!(
        "{:<16} {:<10} {:<6} {}\n",
        "VOLUME", "SIZE", "EPOCH", "REPLICAS"
    );
    for v in &s.volumes {
        let reps: Vec<String> = v
            .replicas
            .iter()
            .map(|r| match r.allocated_bytes {
                Some(a) => format!(
                    "node {} {} ({} allocated, epoch {})",
                    r.node,
                    r.state,
                    human(a),
                    r.epoch.unwrap_or(0)
                ),
                None => format!("node {} {}", r.node, r.state),
            })
            .collect();
        out += &format!(
            "{:<16} {:<10} {:<6} {}\n",
            v.name,
            human(v.size),
            v.epoch,
            reps.join("; ")
        );
        if let Some(h) = &v.health {
            let why = if h.reasons.is_empty() {
                String::new()
            } else {
                format!(": {}", h.reasons.join("; "))
            };
            out += &format!("{:<16} health: {}{why}\n", "", h.verdict);
        }
        match &v.writer {
            Some(w) if w.fenced.is_some() => out += &format!("{:<16} writer {}\n", "", w.text),
            Some(w) => out += &format!("{:<16} attached by {}\n", "", w.text),
            None => {}
        }
        if let Some(io) = &v.io {
            let ms = |s: Option<f64>| s.map_or("-".to_string(), |s| format!("{:.2} ms", s * 1e3));
            out += &format!(
                "{:<16} I/O: {:.0} reads/s {}/s (p99 {}), {:.0} writes/s {}/s (p99 {}){}\n",
                "",
                io.read_iops,
                human(io.read_bytes_per_s as u64),
                ms(io.read_p99_s),
                io.write_iops,
                human(io.write_bytes_per_s as u64),
                ms(io.write_p99_s),
                if io.errors > 0 {
                    format!(", {} errors", io.errors)
                } else {
                    String::new()
                }
            );
        }
        if let Some(l) = &v.resiliency {
            out += &format!("{:<16} layout: {}\n", "", l.summary);
            if let Some(r) = &l.regions {
                out += &format!("{:<16} regions: {}\n", "", r.line());
            }
        }
        out += &format!("{:<16} access: {}\n", "", access_text(&v.access));
        if !v.limits.is_default() {
            let waited = v.throttled_seconds.map_or(String::new(), |s| {
                format!(" (requests waited {s:.1} s for them)")
            });
            let policy = v
                .qos_policy
                .as_ref()
                .map_or(String::new(), |p| format!(" under QoS policy {p}"));
            out += &format!("{:<16} limits: {}{policy}{waited}\n", "", v.limits);
        }
        out += &nvmf_text(&" ".repeat(17), &v.nvmf);
        if !v.tier.is_auto() {
            out += &format!("{:<16} pinned to the {} tier\n", "", v.tier.as_str());
        }
        for t in v.replicas.iter().filter_map(|r| r.tier.as_ref()) {
            out += &format!("{:<16} {}\n", "", replica_tier_text(t));
        }
        if v.writes_suspended {
            let in_sync = v
                .replicas
                .iter()
                .filter(|r| r.state == trireme_control::ReplicaStatusState::InSync)
                .count();
            out += &format!(
                "{:<16} WRITES SUSPENDED: {in_sync} in-sync copies, minimum {} (they resume when a copy is back, or with `trireme volume set {} --min-copies N`)\n",
                "", v.min_copies, v.name
            );
        }
        // Why UCX is not used is said once, under the links it holds for: it is the same
        // 250 characters for every link to another host without RDMA.
        let mut why_not: Vec<&str> = Vec::new();
        for l in &v.client_links {
            let how = match (&l.lanes, &l.fallback) {
                (Some(lanes), _) => format!(" over {lanes}"),
                (None, Some(why)) => {
                    let k = why_not.iter().position(|w| w == why).unwrap_or_else(|| {
                        why_not.push(why);
                        why_not.len() - 1
                    });
                    format!(" (UCX not used: reason {})", k + 1)
                }
                (None, None) => String::new(),
            };
            out += &format!(
                "{:<16} writer link to node {}: {} {} ({} streams){how}\n",
                "", l.node, l.transport, l.peer, l.streams
            );
        }
        for (k, why) in why_not.iter().enumerate() {
            out += &format!("{:<16} UCX not used, reason {}: {why}\n", "", k + 1);
        }
        for r in &v.replicas {
            if let Some(p) = &r.resync {
                let pct = p.done_bytes as f64 * 100.0 / p.total_bytes.max(1) as f64;
                out += &format!(
                    "{:<16} resync to node {}: {} {:.1}% ({} of {}, {} copied, {}/s, ETA {})\n",
                    "",
                    r.node,
                    if p.full {
                        "full compare"
                    } else {
                        "incremental"
                    },
                    pct,
                    human(p.done_bytes),
                    human(p.total_bytes),
                    human(p.copied_bytes),
                    human(p.rate()),
                    p.eta_secs().map_or("-".to_string(), |s| format!("{s}s")),
                );
            }
        }
    }
    out
}

/// What `maintenance rolling` did.
#[derive(Debug, serde::Serialize)]
pub(crate) struct RollingReport {
    pub(crate) nodes: Vec<NodeRestartReport>,
    pub(crate) total_ms: u64,
}

pub(crate) fn restart_text(r: &NodeRestartReport) -> String {
    format!(
        "node {} restarted: down {:.1} s, back in sync after {:.1} s, {} resynced{} ({} volumes)",
        r.node,
        r.down_ms as f64 / 1000.0,
        r.total_ms as f64 / 1000.0,
        human(r.resynced_bytes),
        if r.full { ", full compare" } else { "" },
        r.volumes.len()
    )
}

/// `node lost`: each volume accepted (or that would be) and each left, with why.
pub(crate) fn lost_text(r: &NodeLostReport) -> String {
    let mut s = match (r.applied, r.accepted.is_empty() && r.left.is_empty()) {
        (_, true) => format!(
            "node {}: no volume has a copy in sync there; nothing waits for it\n",
            r.node
        ),
        (true, false) => format!("node {} recorded lost:\n", r.node),
        (false, false) => format!(
            "node {} lost, a dry run (nothing changed; `--force` does it):\n",
            r.node
        ),
    };
    let word = if r.applied {
        "accepted"
    } else {
        "would accept"
    };
    for a in &r.accepted {
        s += &format!("  {word}  {}: {}\n", a.volume, a.why);
    }
    for l in &r.left {
        s += &format!("  left  {}: {}\n", l.volume, l.why);
    }
    if r.applied && !r.accepted.is_empty() {
        s += &format!(
            "what only node {} held of them is gone; `trireme node remove {}` re-creates their copies elsewhere\n",
            r.node, r.node
        );
    }
    s
}

pub(crate) fn move_text(m: &MoveStatus) -> String {
    let mut s = format!(
        "node {} {}: {} ({} of {} volumes moved",
        m.node, m.kind, m.state, m.volumes_done, m.volumes_total
    );
    if let Some(r) = m.rate {
        s += &format!(", rate limit {}/s", human(r));
    }
    s += ")";
    if let (Some(v), Some(to)) = (&m.volume, m.to) {
        s += &format!("; {v} -> node {to}");
        if let Some(p) = &m.progress {
            s += &format!(
                ": {} of {} ({:.1}%), {}/s, ETA {}",
                human(p.done_bytes),
                human(p.total_bytes),
                p.done_bytes as f64 * 100.0 / p.total_bytes.max(1) as f64,
                human(p.rate()),
                p.eta_secs().map_or("-".to_string(), |s| format!("{s}s"))
            );
        }
    }
    if let Some(e) = &m.error {
        s += &format!(": {e}");
    }
    s + "\n"
}
