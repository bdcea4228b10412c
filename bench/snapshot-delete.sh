#!/usr/bin/env bash
# What deleting a big snapshot costs the I/O beside it: a 3-way file-store volume of SIZE
# (default 1G) on `up`, filled, snapshotted, then overwritten whole, so the snapshot alone
# holds SIZE of blocks. The S2D workload (4K, 70:30 random, 10 x QD4) runs 15 s through the NBD
# export, in two modes interleaved ROUNDS times (default 2), each on a fresh cluster:
#   none     nothing else
#   delete   `volume snapshot delete` 5 s into the run: how long it took, and the run's
#            latency percentiles next to those of `none`
# Links are unix sockets between processes (UCX over shared memory where it loads); this host
# has no RDMA device.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-2}"
size="${SIZE:-1G}"
. bench/lib.sh
head -c "$size" /dev/urandom >"$dir/fill.img"
for round in $(seq "$rounds"); do
  for mode in none delete; do
    start_up --store file --size "$size"
    qemu-img convert -n -f raw -O raw "$dir/fill.img" "$uri"
    "$T" --data-dir "$dir/c" volume snapshot create vol0 big >/dev/null
    qemu-img convert -n -f raw -O raw "$dir/fill.img" "$uri"
    deleter=
    if [ "$mode" = delete ]; then
      ( sleep 5; t0=$(date +%s.%N)
        "$T" --data-dir "$dir/c" volume snapshot delete vol0 big >/dev/null
        echo "  delete of a snapshot holding $size of its own: $(python3 -c "print(f'{$(date +%s.%N)-$t0:.2f}')") s" ) &
      deleter=$!
    fi
    out=$("$T" --data-dir "$dir/c" bench --profile s2d -d15 -W2 "$uri" 2>&1)
    [ -n "$deleter" ] && wait "$deleter"
    echo "$mode round $round: $(grep Summary <<<"$out")"
    grep -E '^ *(50th|99th|3-nines|max) ' <<<"$out" | sed 's/^/    /'
    stop_up
  done
done
