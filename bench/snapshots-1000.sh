#!/usr/bin/env bash
# A thousand snapshots on one volume (Longhorn caps a volume at 250): a 3-way file-store volume
# of SIZE (default 1G) on `up`, written whole, then COUNT snapshots (default 1000), each after
# 8 random 4 KiB writes (so each holds blocks of its own): how long creating them takes (each
# `volume snapshot create` a CLI process), how long `snapshot list` takes, and 4K random reads
# at QD1 (10 s each), side by side with a volume of the same bytes and no snapshot on the same
# cluster, before and after, ROUNDS times (default 2); then COUNT/50 deletes from the middle of
# the chain with reads going on, and reads of the oldest and the newest snapshot through their
# read-only exports. Links are unix sockets between processes (UCX over
# shared memory where it loads); this host has no RDMA device. vol0's writer runs in `up` (a
# snapshot goes through it; a `trireme nbd` beside `up` takes no snapshot request), vol1's in
# a `trireme nbd` of its own: the "storage" CPU per I/O counts `up`'s processes, so vol0's
# includes its writer and vol1's does not. Compare each volume's CPU with itself before and
# after.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-2}"
size="${SIZE:-1G}"
count="${COUNT:-1000}"
. bench/lib.sh
start_up --store file --size "$size"
echo "writing $size of random bytes to vol0 and to vol1 (3 copies each)..."
head -c "$size" /dev/urandom >"$dir/fill.img"
qemu-img convert -n -f raw -O raw "$dir/fill.img" "$uri"
"$T" --data-dir "$dir/c" volume create vol1 --size "$size" >/dev/null

serve vol1
plain_uri=$curi
plain_pid=$cpid
qemu-img convert -n -f raw -O raw "$dir/fill.img" "$plain_uri"
rm -f "$dir/fill.img"

# bench NAME URI: 4K random reads at QD1 for 10 s; its summary and median and p99.
bench() {
  local out
  out=$("$T" --data-dir "$dir/c" bench -b4K -r -w0 -t1 -o1 -d10 -W1 "$2" 2>&1)
  echo "  $1: $(grep Summary <<<"$out")"
  grep -E '^ *(50th|99th|max) ' <<<"$out" | sed 's/^/      /'
}

for round in $(seq "$rounds"); do
  echo "before, round $round: 4K random reads, QD1"
  bench "no snapshot (vol1)   " "$plain_uri"
  bench "vol0, none yet       " "$uri"
done

echo "taking $count snapshots of vol0, each after 8 random 4 KiB writes..."
/usr/bin/python3 - "$uri" "$T" "$dir/c" "$count" <<'PY'
import os, random, subprocess, sys, time
import nbd
uri, t, data, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
h = nbd.NBD()
h.connect_uri(uri)
size = h.get_size()
rng = random.Random(7)
took = []
t0 = time.monotonic()
for k in range(1, count + 1):
    for _ in range(8):
        h.pwrite(os.urandom(4096), rng.randrange(size // 4096) * 4096)
    h.flush()
    s = time.monotonic()
    subprocess.run([t, "--data-dir", data, "volume", "snapshot", "create", "vol0", f"s{k}"],
                   check=True, stdout=subprocess.DEVNULL)
    took.append(time.monotonic() - s)
total = time.monotonic() - t0
def p(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))] * 1000
print(f"{count} snapshots in {total:.1f} s (writes included); one `snapshot create`: "
      f"p50 {p(took, 0.5):.1f} ms, p99 {p(took, 0.99):.1f} ms, max {max(took)*1000:.1f} ms; "
      f"p50 of the first 100 {p(took[:100], 0.5):.1f} ms, of the last 100 {p(took[-100:], 0.5):.1f} ms")
PY
t0=$(date +%s.%N)
n=$("$T" --data-dir "$dir/c" volume snapshot list vol0 | awk 'NR>1' | wc -l)
t1=$(date +%s.%N)
echo "snapshot list: $n snapshots listed in $(python3 -c "print(f'{($t1-$t0)*1000:.0f}')") ms"

for round in $(seq "$rounds"); do
  echo "after, round $round: 4K random reads, QD1"
  bench "no snapshot (vol1)   " "$plain_uri"
  bench "vol0, $count snapshots" "$uri"
done
# Deleting snapshots from the middle of the chain, one CLI process each, while QD1 reads run:
# how long each takes, and the reads' tail next to the rounds above.
half=$((count / 2))
ndel=$((count / 50 > 0 ? count / 50 : 1))
echo "deleting $ndel snapshots from the middle (s$((half + 1))..s$((half + ndel))) while 4K random reads run at QD1"
( sleep 2
  /usr/bin/python3 - "$T" "$dir/c" "$((half + 1))" "$ndel" <<'PY'
import subprocess, sys, time
t, data, first, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
took = []
for k in range(first, first + n):
    s = time.monotonic()
    subprocess.run([t, "--data-dir", data, "volume", "snapshot", "delete", "vol0", f"s{k}"],
                   check=True, stdout=subprocess.DEVNULL)
    took.append(time.monotonic() - s)
took.sort()
print(f"  {n} deletes: p50 {took[len(took)//2]*1000:.1f} ms, max {took[-1]*1000:.1f} ms each")
PY
) &
deleter=$!
bench "vol0, deleting      " "$uri"
wait "$deleter"
for s in s1 "s$count"; do
  serve "vol0@$s"
  bench "snapshot $s (export) " "$curi"
  kill "$cpid"; wait "$cpid" || true
done
kill "$plain_pid"; wait "$plain_pid" || true
stop_up
