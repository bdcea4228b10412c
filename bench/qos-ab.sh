#!/usr/bin/env bash
# Two builds of the writer side by side under a limit (issue 68): one `trireme up --store
# memory` cluster (3 node processes, 3-way vol1), then vol1 served by a `trireme nbd` from
# build A, then from build B, taking turns, each run under each of LIMITS (IOPS in 8 KiB
# units, or none; default "none 30000 40000"), the S2D mix (4K random, 70:30, 10 x QD4) for
# SECS (default 8) seconds, over ROUNDS rounds (default 3). Prints "round R limit L | A IOPS
# P99_US | B IOPS P99_US". A and B name the two binaries (B defaults to the release build; the
# cluster and the bench run on B). Unix sockets between processes (this host has no RDMA device).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -n "${A:-}" ] || { echo "usage: A=/path/to/trireme [B=...] bench/qos-ab.sh" >&2; exit 2; }
T=${B:-}
secs="${SECS:-8}"
. bench/lib.sh
B=$T
cpid=
trap '[ -n "$cpid" ] && kill $cpid 2>/dev/null; [ -n "$up" ] && kill "$up" 2>/dev/null && wait "$up"; rm -rf "$dir"' EXIT
start_up --store memory --size 1G
"$T" --data-dir "$dir/c" volume create vol1 --size 1G >/dev/null

# run BINARY LIMIT: "IOPS P99_US" of one run with vol1's writer from BINARY.
run() {
  local bin=$1 limit=$2 u r
  "$bin" --data-dir "$dir/c" nbd vol1 --socket "$dir/v.sock" >"$dir/v.uri" 2>>"$dir/v.log" &
  cpid=$!
  for _ in $(seq 100); do [ -s "$dir/v.uri" ] && break; sleep 0.1; done
  u=$(head -1 "$dir/v.uri")
  "$T" --data-dir "$dir/c" volume set vol1 --iops-limit "$limit" >/dev/null
  sleep 1.5
  r=$("$T" --data-dir "$dir/c" --output json bench -b4K -w30 -r -t10 -o4 -d"$secs" -W1 "$u" |
    python3 -c 'import json, sys; j = json.load(sys.stdin); print(round(j["iops"]), round(j["total"]["latency_us"]["p99"]))')
  kill "$cpid"; wait "$cpid" 2>/dev/null || true
  cpid=
  rm -f "$dir/v.uri" "$dir/v.sock"
  echo "$r"
}
for round in $(seq "${ROUNDS:-3}"); do
  for limit in ${LIMITS:-none 30000 40000}; do
    a=$(run "$A" "$limit")
    b=$(run "$B" "$limit")
    echo "round $round limit $limit | A $a | B $b"
  done
done
