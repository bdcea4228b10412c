#!/bin/bash
# Where the storage CPU goes at QD1 through NBD: one `trireme up` (3 nodes, 3-way memory
# volume), fio's nbd engine at 4K random 70:30, 1 job x QD1, 3 s warm-up then 8 s measured; prints
# each trireme process's CPU ticks (10 ms each, from /proc/<pid>/stat) over the 8 s, then IOPS
# and read p50. Links: UCX over shared memory on one host (no RDMA here).
#   bench/qd1_cpu_by_process.sh [path/to/trireme]
set -euo pipefail
bin=${1:-target/release/trireme}
d=$(mktemp -d /tmp/trireme-qd1.XXXXXX)
"$bin" --data-dir "$d/c" --log warn up --store memory --size 512M --nodes 3 --replicas 3 --port 0 \
  > "$d/log" 2>&1 &
up=$!
trap 'kill $up 2>/dev/null || true; sleep 1; rm -rf "$d"' EXIT
for _ in $(seq 100); do [ -f "$d/c/exports" ] && break; sleep 0.1; done
uri=$(grep -o 'nbd+unix[^ ]*' "$d/c/exports" | head -1)
[ -n "$uri" ] || { echo "trireme up did not start; see $d/log" >&2; exit 1; }
pids="$up $(pgrep -P $up | tr '\n' ' ')"
job=(--name=b --ioengine=nbd "--uri=$uri" --rw=randrw --rwmixread=70 --bs=4k --numjobs=1
     --iodepth=1 --size=512M --time_based)
fio "${job[@]}" --runtime=3 --output-format=terse > /dev/null 2>&1
ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }
declare -A t0
for p in $pids; do t0[$p]=$(ticks "$p"); done
fio "${job[@]}" --runtime=8 --output-format=json > "$d/fio.json" 2> "$d/fio.err"
for p in $pids; do
  echo "pid $p $(tr '\0' ' ' < "/proc/$p/cmdline" | cut -c1-60) cpu_ticks $(( $(ticks "$p") - ${t0[$p]} ))"
done
python3 - "$d/fio.json" <<'PY'
import json, sys
s = open(sys.argv[1]).read()
j = json.loads(s[s.index('{'):])['jobs'][0]
print('iops', round(j['read']['iops'] + j['write']['iops']),
      'read p50 us', j['read']['clat_ns']['percentile']['50.000000'] / 1000)
PY
