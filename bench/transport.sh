#!/usr/bin/env bash
# UCX against TCP on this host, as issue 4 asks: the seeds' table (s2d profile, 3-way memory
# volume, native client, interleaved rounds, medians; tcp is TCP through the kernel's network
# stack over loopback, unix the same-host sockets trireme uses without UCX), then QD1 4K write
# latency through the native client (3-way and 1-way volumes) next to the ucx_perftest
# round-trip floor, all in one run on one cluster.
#
#   bench/transport.sh [ROUNDS] [SECONDS]      (defaults: 3 rounds of 10 s)
#
# Needs a release build (cargo build --release) and ucx_perftest (ucx-utils). Without an RDMA
# device UCX runs over shared memory here, and the output says so.
set -euo pipefail
rounds=${1:-3}
secs=${2:-10}
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${TRIREME_BIN:-$root/target/release/trireme}
dir=$(mktemp -d /tmp/trireme-transport.XXXXXX)
up_pid=
perf_pid=
cleanup() {
    [ -n "$perf_pid" ] && kill "$perf_pid" 2>/dev/null || true
    [ -n "$up_pid" ] && kill -INT "$up_pid" 2>/dev/null && wait "$up_pid" 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT

echo "\$ trireme up --store memory --size 1G   # 3 nodes, 3-way"
"$bin" --data-dir "$dir" up --port 0 --store memory --size 1G >"$dir/up.log" 2>&1 &
up_pid=$!
for _ in $(seq 100); do [ -e "$dir/exports" ] && break; sleep 0.1; done
[ -e "$dir/exports" ] || { cat "$dir/up.log"; exit 1; }

# The memory store allocates a page at its first write: fill the volume once, so that the
# first round (always tcp) does not pay those page faults for every transport after it.
echo "\$ trireme bench -s -b1M -w100 -t1 -o4 -W0 -d8 volume:vol0   # fill the volume once"
"$bin" --data-dir "$dir" bench -s -b1M -w100 -t1 -o4 -W0 -d8 volume:vol0 2>&1 |
    awk '/^Summary/ { print "  " $0 }'

echo "\$ trireme bench --compare transport=tcp,unix,ucx --profile s2d --rounds $rounds -d$secs volume:vol0"
"$bin" --data-dir "$dir" bench --compare transport=tcp,unix,ucx --profile s2d \
    --rounds "$rounds" -d"$secs" volume:vol0 2>&1 | grep -v " INFO "

# QD1 4K writes: on the 3-way volume (three nodes answer each write), then on a 1-way one, whose
# write is one round trip between two processes, as ucx_perftest's is.
qd1() {
    for t in ucx tcp unix ucx tcp unix; do
        out=$("$bin" --data-dir "$dir" bench -b4K -w100 -t1 -o1 -d5 -W1 "volume:$1?transport=$t" 2>&1)
        p() { echo "$out" | awk -v k="$1" '$1 == k { print $5 }'; }
        printf '  %-4s %s / %s / %s\n' "$t" "$(p 50th)" "$(p 90th)" "$(p 99th)"
    done
}
echo
echo "QD1 4K writes through the native client, 3-way volume, alternating (p50 / p90 / p99, ms):"
qd1 vol0
"$bin" --data-dir "$dir" volume create --size 256M --replicas 1 vol1 >/dev/null 2>&1
"$bin" --data-dir "$dir" bench -s -b1M -w100 -t1 -o4 -W0 -d3 volume:vol1 >/dev/null 2>&1
echo "QD1 4K writes through the native client, 1-way volume (one round trip), alternating:"
qd1 vol1

echo
echo "Transport floor: ucx_perftest -t tag_lat -s 4096 -n 20000 (server and client on this host)"
ucx_perftest -t tag_lat -s 4096 -n 20000 -p 13337 >/dev/null 2>&1 &
perf_pid=$!
sleep 1
floor=$(ucx_perftest 127.0.0.1 -p 13337 -t tag_lat -s 4096 -n 20000 2>&1 | awk '/Final:/ { print $3 }')
wait "$perf_pid" 2>/dev/null || true
perf_pid=
echo "  one-way latency p50: ${floor:-?} us; round trip floor: $(awk -v f="${floor:-0}" 'BEGIN { printf "%.2f", 2 * f }') us"
echo "  (ucx_perftest busy-polls; trireme sleeps on the worker's event fd between messages)"
