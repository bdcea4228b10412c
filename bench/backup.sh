#!/usr/bin/env bash
# What an incremental backup reads and how long a chain takes, on `up` (a 3-way file-store
# volume of SIZE, default 1G, filled with random bytes):
#   full       `volume backup` of the filled volume: bytes read, file size, time
#   inc PCT    after PCT% of the volume's 4 KiB blocks were overwritten at random (fio through
#              the NBD socket, one write per block, so the changed bytes are known exactly),
#              an incremental backup: changed bytes, bytes read (the issue's bound is 1.05x the
#              changed bytes), file size, time, rate
#   restore    the whole chain into a new volume, then qemu-img compare against the volume
# Links are unix sockets between processes (UCX over shared memory where it loads); this host
# has no RDMA device. The backup directory is on the same disk as the replicas.
set -euo pipefail
cd "$(dirname "$0")/.."
size="${SIZE:-1G}"
. bench/lib.sh
start_up --store file --size "$size"
sock="$dir/c/nbd.sock"
head -c "$size" /dev/urandom >"$dir/fill.img"
qemu-img convert -n -f raw -O raw "$dir/fill.img" "$uri"
t() { "$T" --data-dir "$dir/c" "$@"; }
backup() {
  local t0 t1 j
  t0=$(date +%s.%N)
  j=$(t --output json volume backup vol0 --to "$dir/b")
  t1=$(date +%s.%N)
  python3 - "$1" "$t0" "$t1" "$j" <<'PY'
import json, sys
what, t0, t1, j = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), json.loads(sys.argv[4])
s = j["stats"]
secs = t1 - t0
ratio = s["read_bytes"] / s["changed_bytes"] if s["changed_bytes"] else 0
print(f"{what:>10}: changed {s['changed_bytes']/2**20:8.1f} MiB, read {s['read_bytes']/2**20:8.1f} MiB "
      f"({ratio:.3f}x changed), file {s['file_bytes']/2**20:8.1f} MiB, {secs:6.2f} s, "
      f"{s['read_bytes']/2**20/secs:7.1f} MiB/s read")
PY
}
backup full
blocks=$(( $(numfmt --from=iec "$size") / 4096 ))
for pct in 1 5; do
  n=$(( blocks * pct / 100 ))
  # randrepeat=0 with a random map: every block at most once, n of them.
  fio --name=touch --ioengine=nbd --uri="nbd+unix:///vol0?socket=$sock" --rw=randwrite \
      --bs=4k --number_ios="$n" --norandommap=0 --randrepeat=0 --iodepth=16 \
      --size="$size" >/dev/null
  echo "  overwrote $n blocks ($(( n * 4096 / 1048576 )) MiB) at random"
  backup "inc $pct%"
done
t0=$(date +%s.%N)
t volume restore "$dir/b" copy >/dev/null
t1=$(date +%s.%N)
echo "   restore: the chain of 3 into a new volume in $(python3 -c "print(f'{$t1-$t0:.2f}')") s"
"$T" --data-dir "$dir/c" nbd copy --socket "$dir/copy.sock" >/dev/null 2>&1 &
exp=$!
for _ in $(seq 50); do [ -S "$dir/copy.sock" ] && break; sleep 0.2; done
qemu-img compare -f raw -F raw "$uri" "nbd+unix:///copy?socket=$dir/copy.sock"
kill "$exp"; wait "$exp" || true
stop_up
