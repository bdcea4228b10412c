#!/bin/bash
# Two trireme builds side by side through the native client: one 3-node memory cluster per build,
# both up at once, `trireme bench` runs interleaved (A, B, A, B ...): s2d (4K 70:30 random, 10 x
# QD4) and the same at QD1. Storage CPU = the three node processes; client = the bench process.
# Links: UCX over shared memory on one host (no RDMA here).
#   bench/native_ab.sh NEW/trireme OLD/trireme [rounds]
set -euo pipefail
a=${1:?new trireme binary}; b=${2:?old trireme binary}; rounds=${3:-3}
tmp=$(mktemp -d /tmp/trireme-ab.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; sleep 2; rm -rf "$tmp"; }
trap cleanup EXIT
start() {
  "$1" --data-dir "$tmp/$2" --log warn up --store memory --size 512M --nodes 3 --replicas 3 --port 0 \
    > "$tmp/$2.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 200); do [ -f "$tmp/$2/exports" ] && return; sleep 0.1; done
  echo "trireme up ($1) did not start; see $tmp/$2.log" >&2; exit 1
}
start "$a" new; start "$b" old
echo "# new = $a, old = $b; $(nproc) CPUs; $rounds interleaved rounds, -d8 -W2"
for r in $(seq "$rounds"); do
  for prof in "s2d:--profile s2d" "qd1:--profile s2d -t1 -o1"; do
    for side in new old; do
      bin=$a; [ "$side" = old ] && bin=$b
      name=${prof%%:*}
      # shellcheck disable=SC2086
      "$bin" --data-dir "$tmp/$side" --log warn --output json bench ${prof#*:} -d8 -W2 volume:vol0 > "$tmp/out.json"
      python3 - "$r" "$side" "$name" "$tmp/out.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[4])); c = j["cpu_us_per_io"]
print(f"round {sys.argv[1]} {sys.argv[2]:3s} {sys.argv[3]}: {j['iops']:9.0f} IOPS  "
      f"read p50 {j['read']['latency_us']['p50']:6.1f} us  write p50 {j['write']['latency_us']['p50']:6.1f} us  "
      f"CPU us/IO storage {c['storage']:5.1f} client {c['generator']:5.1f}", flush=True)
PY
    done
  done
done
