#!/usr/bin/env bash
# What snapshots cost: the S2D workload (4K, 70:30 random, 10 x QD4) through `up`'s NBD export
# of a 3-way file-store volume, filled first, in four modes interleaved ROUNDS times (default 2),
# each on a fresh cluster:
#   none     no snapshot
#   chain10  ten snapshots, each after 1 s of the workload (so each holds blocks of its own),
#            then measured
#   first    one snapshot just before the runs: every block's first write after it moves it
#   pause    a snapshot every second during the run; prints how long each paused I/O (the
#            writer's log) next to the run's latency percentiles
# In the first three modes a QD1 run (the same mix, one thread, one I/O at a time, 5 s) comes
# first and prints its IOPS and latency percentiles; then the S2D run.
# Prints one summary line per run. Links are unix sockets between processes (UCX over shared
# memory where it loads); this host has no RDMA device. SIZE (default 1G) sizes the volume.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-2}"
size="${SIZE:-1G}"
. bench/lib.sh
head -c "$size" /dev/urandom >"$dir/fill.img"
for round in $(seq "$rounds"); do
  for mode in none chain10 first pause; do
    start_up --store file --size "$size"
    qemu-img convert -n -f raw -O raw "$dir/fill.img" "$uri"
    snap() { "$T" --data-dir "$dir/c" volume snapshot create vol0 "$1" >/dev/null; }
    case $mode in
      chain10)
        for k in $(seq 10); do
          snap "s$k"
          "$T" --data-dir "$dir/c" bench --profile s2d -d1 -W0 "$uri" >/dev/null 2>&1
        done ;;
      first) snap s1 ;;
    esac
    if [ "$mode" = pause ]; then
      ( sleep 3; for k in $(seq 10); do snap "p$k"; sleep 1; done ) &
      snapper=$!
    fi
    if [ "$mode" != pause ]; then
      out=$("$T" --data-dir "$dir/c" bench --profile s2d -t1 -o1 -d5 -W1 "$uri" 2>&1)
      iops=$(grep Summary <<<"$out" | awk '{print $2}')
      p50=$(grep -E '^ +50th' <<<"$out" | awk '{print $NF}')
      p99=$(grep -E '^ +99th' <<<"$out" | awk '{print $NF}')
      echo "$mode round $round: QD1 $iops IOPS, p50 $p50 ms, p99 $p99 ms"
    fi
    line=$("$T" --data-dir "$dir/c" bench --profile s2d -d15 -W2 "$uri" 2>&1 | grep Summary)
    echo "$mode round $round: $line"
    if [ "$mode" = pause ]; then
      wait "$snapper"
      echo "  I/O paused per snapshot (ms): $(grep -o 'paused_ms=[0-9]*' "$dir/up.log" | cut -d= -f2 | tr '\n' ' ')"
    fi
    stop_up
  done
done
