#!/bin/sh
# NVMe/TCP against NBD on a unix socket, on the same volume in one run: 4 KiB random reads
# and writes at queue depth 1 and 128, IOPS and p99 through trireme's own clients (the
# in-tree NVMe/TCP host for one, the NBD client for the other), and NVMe/TCP's ratio to NBD.
# The jobs alternate (NBD, then NVMe/TCP, for each job, RUNS times) so both see the same
# machine: these hosts are shared and noisy.
#
#   bench/nvmf.sh [SECONDS] [RUNS]        # builds nothing: TRIREME=path/to/trireme
#
# It starts its own `trireme up --nvmf 127.0.0.1:PORT` (3 node processes, file store, 3-way,
# unix sockets between the processes) in a temporary directory and stops it at the end.
#
# The kernel's initiator (`nvme connect`, fio on /dev/nvmeXnY) is not measured here: this
# host's kernel has no nvme-tcp module. On a host with it, connect to the same port and run
# fio's io_uring engine on the device beside fio's nbd engine on the socket.
set -eu
secs="${1:-10}"
runs="${2:-3}"
T="${TRIREME:-$(dirname "$0")/../target/release/trireme}"
dir=$(mktemp -d)
up=""
trap '[ -n "$up" ] && kill "$up" 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"' EXIT
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
nbdport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$T" --data-dir "$dir/d" up --nodes 3 --replicas 3 --size 2G --store file --port "$nbdport" \
  --nvmf "127.0.0.1:$port" --node-capacity 8G >"$dir/up.out" 2>"$dir/up.log" &
up=$!
i=0
until grep -q "nvme/tcp" "$dir/up.out" 2>/dev/null; do
  i=$((i+1)); [ $i -gt 600 ] && { cat "$dir/up.log"; exit 1; }; sleep 0.1
done
"$T" --data-dir "$dir/d" volume access vol0 --allow nqn.2026-12.io.trireme:bench >/dev/null
nbd="nbd+unix:///vol0?socket=$dir/d/nbd.sock"
nvme="nvme+tcp://127.0.0.1:$port/nqn.2026-12.io.trireme:local:vol0"

# IOPS and p99 (µs) of one job: TARGET WRITE% THREADS DEPTH.
job() {
  "$T" --data-dir "$dir/d" --output json bench -b4K -r -w"$2" -t"$3" -o"$4" -d"$secs" -W1 "$1" \
    >"$dir/job.json" 2>"$dir/job.err" || { cat "$dir/job.err" >&2; exit 1; }
  python3 - "$dir/job.json" "$2" <<'PY'
import json, sys
v = json.load(open(sys.argv[1]))
op = "write" if sys.argv[2] == "100" else "read"
print(f'{v["iops"]:.0f} {v[op]["latency_us"]["p99"]:.0f}')
PY
}

echo "# bench/nvmf.sh $secs s x $runs runs, $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) CPUs"
echo "# up: 3 node processes, file store, 3-way; NVMe/TCP and NBD served by up's one writer"
printf '%-12s %-6s %10s %10s %10s %10s %8s\n' job run nbd_iops nbd_p99us nvme_iops nvme_p99us ratio
for spec in "randread 0 1 1" "randread 0 2 64" "randwrite 100 1 1" "randwrite 100 2 64"; do
  set -- $spec
  name="$1-qd$(( $3 * $4 ))"
  for r in $(seq 1 "$runs"); do
    a=$(job "$nbd" "$2" "$3" "$4")
    b=$(job "$nvme" "$2" "$3" "$4")
    set -- $spec
    echo "$name $r $a $b" | awk '{ printf "%-12s %-6s %10s %10s %10s %10s %8.2f\n", $1, $2, $3, $4, $5, $6, $5/$3 }'
  done
done
