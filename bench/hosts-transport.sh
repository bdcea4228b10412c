#!/usr/bin/env bash
# The data path between hosts without RDMA, as trireme takes it by default (its own TCP, mutual
# TLS) against UCX's tcp lanes (TRIREME_UCX_TLS=tcp, which the default leaves out: plain text,
# and crash-prone in UCX 1.13; docs/ucx.md). Each run builds scripts/netns-cluster.sh's
# cluster (etcd, 3 servers and a client host, each in a network namespace of this host, over
# veth), attaches vol0 (3-way, 1 GiB) in the client namespace, runs the S2D workload (4K,
# 70:30 random, 10 x QD4) for SECS seconds after 2 s of warm-up, and takes the cluster down;
# the two modes alternate, the order swapped every round. Prints each run's summary, then per
# round the IOPS and storage CPU per I/O of the UCX tcp lanes as a ratio to the default.
# Storage CPU counts the three servers and the client host's writer. Needs root.
# Usage: bench/hosts-transport.sh [ROUNDS]; T=path/to/trireme; SECS (default 15).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-3}"
secs="${SECS:-15}"
if [ -z "${T:-}" ]; then
  cargo build --release --locked -q -p trireme
  T=$PWD/target/release/trireme
fi
export TRIREME_BIN=$T
D=$(mktemp -d)
export TRIREME_NETNS_DIR=$D
lines=$D/lines
trap 'bash scripts/netns-cluster.sh down >/dev/null 2>&1 || true; rm -rf "$D"' EXIT
uri="nbd+unix:///vol0?socket=$D/vol0.sock"
for round in $(seq "$rounds"); do
  order="default ucx-tcp"
  [ $((round % 2)) -eq 0 ] && order="ucx-tcp default"
  for mode in $order; do
    if [ "$mode" = ucx-tcp ]; then export TRIREME_UCX_TLS=tcp; else unset TRIREME_UCX_TLS; fi
    bash scripts/netns-cluster.sh up 3 >"$D/up.log" 2>&1 ||
      { echo "the cluster did not start:" >&2; cat "$D/up.log" >&2; exit 1; }
    pids=()
    for p in "$D"/server-*.pid "$D/attach.pid"; do pids+=(--storage-pid "$(cat "$p")"); done
    ip netns exec trireme-c "$T" bench --profile s2d -d"$secs" -W2 "${pids[@]}" "$uri" 2>&1 |
      grep Summary | sed "s/^/$mode r$round: /" | tee -a "$lines"
    bash scripts/netns-cluster.sh down >/dev/null 2>&1
  done
done
unset TRIREME_UCX_TLS
python3 - "$lines" <<'PY'
import collections, re, statistics, sys
rows = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    m = re.match(r'([\w-]+) r(\d+): Summary: (\d+) IOPS.*storage ([\d.]+)', line)
    if m:
        rows[int(m.group(2))][m.group(1)] = (int(m.group(3)), float(m.group(4)))
for k, what in [(0, 'IOPS'), (1, 'storage CPU/IO')]:
    rs = [r['ucx-tcp'][k] / r['default'][k] for _, r in sorted(rows.items()) if len(r) == 2]
    if rs:
        print(f"ucx-tcp vs default (TCP with TLS), {what}: {' '.join(f'{x:.2f}' for x in rs)}"
              f"  median {statistics.median(rs):.2f}")
PY
