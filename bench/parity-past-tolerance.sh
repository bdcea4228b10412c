#!/usr/bin/env bash
# One more node than a parity volume tolerates dies under client I/O (issue 67): `trireme up
# --nodes W --parity K+M` (LAYOUT, default 2+1; 4+2 runs on six nodes), `bench --verify`
# (4K, 70:30 random, 2 x QD4) through its NBD export for SECS seconds (default 20), and M+1 of
# the volume's node processes killed at once (SIGKILL) 5 s in; `up` restarts them. The writer
# keeps K copies in sync rather than take out one that could never be rebuilt, so requests
# wait for the nodes and go on. Prints the run's IOPS, p50, p99 and longest I/O, the oracle's
# verdict (lost, stale, corrupt), and how long the nodes took to come back. File stores in a
# temporary directory, unix sockets between processes (this host has no RDMA device).
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${SECS:-20}"
layout="${LAYOUT:-2+1}"
k=${layout%+*}
m=${layout#*+}
width=$((k + m))
. bench/lib.sh
trap '[ -n "$up" ] && kill "$up" 2>/dev/null && wait "$up"; rm -rf "$dir"' EXIT
start_up --nodes "$width" --parity "$layout" --size 256M --store file
"$T" --data-dir "$dir/c" --output json bench --verify -b4K -w30 -r -t2 -o4 -d"$secs" -W0 \
  "$uri" >"$dir/run.json" &
bench=$!
sleep 5
victims=$(seq 1 $((m + 1)))
pids=""
for n in $victims; do
  pids="$pids $(awk -v n="node-$n" '$1 == n { print $2 }' "$dir/c/pids")"
done
t0=$(date +%s.%N)
# shellcheck disable=SC2086
kill -9 $pids
back=""
for n in $victims; do
  for _ in $(seq 400); do
    now=$(awk -v n="node-$n" '$1 == n { print $2 }' "$dir/c/pids")
    [ -n "$now" ] && ! echo " $pids " | grep -q " $now " && break
    sleep 0.05
  done
  back="$back $(python3 -c "import time; print(f'{time.time() - $t0:.1f}')")"
done
wait "$bench"
python3 - "$dir" "$layout" "$(echo $victims)" "$back" <<'EOF'
import json, sys
d, layout, victims, back = sys.argv[1:5]
r = json.load(open(f"{d}/run.json"))
l = r["total"]["latency_us"]
v = r.get("verify", {})
print(f"| {layout}, nodes {victims} killed at once 5 s in | IOPS | p50 us | p99 us | longest ms | lost | stale | corrupt |")
print("|---|---|---|---|---|---|---|---|")
print(f"| bench --verify, 2 x QD4 | {r['iops']:.0f} | {l['p50']:.0f} | {l['p99']:.0f} | {l['max']/1000:.0f} "
      f"| {v.get('lost')} | {v.get('stale')} | {v.get('corrupt')} |")
print(f"\nthe nodes' processes back (restarted by up) after {back.strip()} s")
EOF
