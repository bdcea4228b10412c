#!/usr/bin/env bash
# What clones cost: a 3-way file-store volume of GOLD (default 4G) on `up`, written whole
# (random bytes) and snapshotted, then
#   1. COUNT clones of the snapshot (default 100), one `volume clone` after another: the time
#      of all of them (the CLI's process start and its control-socket round trip included);
#   2. 4K random reads, QD 4 x 4 threads, 10 s each, side by side, ROUNDS times (default 2):
#      the parent's export, then a clone never read before (every read a first read, through
#      its parent's snapshot), then the same clone again; and the S2D mix (70:30) on a fresh
#      clone (its first writes copy up) next to the parent.
# Links are unix sockets between processes (UCX over shared memory where it loads); this host
# has no RDMA device.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-2}"
gold="${GOLD:-4G}"
count="${COUNT:-100}"
. bench/lib.sh
# A clone is a thin volume of its parent's size: it counts against each node's over-commit
# limit as any other (the default 1 fits about four of 4 GiB beside the parent here; 100 is the most).
start_up --store file --size "$gold" --overcommit 100
echo "writing a $gold golden image (3 copies)..."
head -c "$gold" /dev/urandom >"$dir/gold.img"
qemu-img convert -n -f raw -O raw "$dir/gold.img" "$uri"
rm -f "$dir/gold.img"
"$T" --data-dir "$dir/c" volume snapshot create vol0 gold >/dev/null
t0=$(date +%s.%N)
for i in $(seq "$count"); do
  "$T" --data-dir "$dir/c" volume clone vol0@gold "vm$i" >/dev/null
done
t1=$(date +%s.%N)
echo "$count clones of a $gold golden image: $(python3 -c "print(f'{$t1-$t0:.2f}')") s"
"$T" --data-dir "$dir/c" volume list | awk 'NR>1' | wc -l | sed 's/^/volumes listed: /'

# bench NAME URI ARGS...: one run's summary and percentiles, labelled.
bench() {
  local name=$1 target=$2
  shift 2
  local out
  out=$("$T" --data-dir "$dir/c" bench "$@" -d10 -W1 "$target" 2>&1)
  echo "  $name: $(grep Summary <<<"$out")"
  grep -E '^ *(50th|99th) ' <<<"$out" | sed 's/^/      /'
}

reads=(-b4K -r -w0 -t4 -o4)
for round in $(seq "$rounds"); do
  echo "round $round: 4K random reads"
  bench "parent        " "$uri" "${reads[@]}"
  serve "vm$round"
  bench "clone, first  " "$curi" "${reads[@]}"
  bench "clone, again  " "$curi" "${reads[@]}"
  kill "$cpid"; wait "$cpid" || true
  echo "round $round: s2d (4K, 70:30 random, 10 x QD4)"
  bench "parent        " "$uri" --profile s2d
  serve "vm$((round + rounds))"
  bench "fresh clone   " "$curi" --profile s2d
  kill "$cpid"; wait "$cpid" || true
done
stop_up
