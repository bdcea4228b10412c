#!/bin/sh
# A volume as a kernel block device against the same volume over NBD on a unix socket, side
# by side: fio 4 KiB random reads and writes at queue depth 1 and 128 on each, IOPS and the
# device's ratio to the socket (Vitastor measured ublk at 1.13x NBD at QD1, 1.64x at QD128).
#
#   bench/kernel-devices.sh VOLUME [SECONDS]     # root; the volume exists; nobody writes it
#
# Run it on a client host of a cluster (TRIREME_ETCD and TRIREME_TLS_IDENTITY set as for
# `trireme attach`) whose kernel has the NBD client (`modprobe nbd`) and, for ublk, ublk_drv.
# Each device: `trireme map VOLUME --device KIND`, fio's io_uring engine on it, `unmap`.
# The socket: `trireme attach VOLUME --socket S`, fio's nbd engine on it. It writes the
# volume's first GiB (SIZE=... for another span).
#
# Not run on the project's own host: its kernel has neither module, and the guest kernel the
# tests boot runs under software emulation (TCG), which is for function, not time
# (tests/kernel_devices/ runs this script there, one second a job, to keep it working).
set -eu
vol="${1:?usage: bench/kernel-devices.sh VOLUME [SECONDS]}"
secs="${2:-20}"
T="${TRIREME:-trireme}"
dir=$(mktemp -d)
trap 'kill $served 2>/dev/null || true; $T unmap "$vol" >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
served=""
size="${SIZE:-1G}"

# fio's IOPS for job NAME (rw, depth) on its target arguments; a job that fails says why.
job() {
  name=$1 rw=$2 qd=$3; shift 3
  if ! fio --name="$name" --rw="$rw" --bs=4k --iodepth="$qd" --size="$size" --time_based \
      --runtime="$secs" --norandommap --randrepeat=0 --group_reporting \
      --output-format=terse --terse-version=3 "$@" >"$dir/fio.out" 2>"$dir/fio.err"; then
    echo "# $name failed: $(tail -3 "$dir/fio.err")" >&2
    exit 1
  fi
  # Terse lines only: fio's nbd engine says "connected" on standard output too.
  awk -F';' -v rw="$rw" '$1 == 3 { print (rw ~ /read/) ? $8 : $49 }' "$dir/fio.out"
}

# The four jobs on one target: a line per job.
jobs() {
  target=$1; shift
  for rw in randread randwrite; do
    for qd in 1 128; do
      echo "$target $rw $qd $(job "$target-$rw-$qd" "$rw" "$qd" "$@")"
    done
  done
}

# The socket first: it sets the baseline.
$T attach "$vol" --socket "$dir/s.sock" >"$dir/attach.out" 2>"$dir/attach.log" &
served=$!
i=0; until [ -S "$dir/s.sock" ]; do i=$((i+1)); [ $i -gt 600 ] && { cat "$dir/attach.log"; exit 1; }; sleep 0.1; done
jobs nbd-socket --ioengine=nbd --uri="nbd+unix:///$vol?socket=$dir/s.sock" >"$dir/results"
kill "$served"; wait "$served" 2>/dev/null || true; served=""

for kind in nbd ublk; do
  $T map "$vol" --device "$kind" >"$dir/map.out" 2>"$dir/map.log" &
  served=$!
  i=0
  until grep -q /dev/ "$dir/map.out" 2>/dev/null; do
    if ! kill -0 "$served" 2>/dev/null; then
      echo "# $kind: not measured: $(tail -1 "$dir/map.log")" >&2
      served=""; break
    fi
    i=$((i+1)); [ $i -gt 600 ] && { cat "$dir/map.log"; exit 1; }; sleep 0.1
  done
  [ -n "$served" ] || continue
  dev=$(cat "$dir/map.out")
  jobs "$kind-device" --ioengine=io_uring --direct=1 --filename="$dev" >>"$dir/results"
  $T unmap "$vol" >/dev/null
  wait "$served" 2>/dev/null || true; served=""
done

# The table: each device's IOPS and its ratio to the socket's, job by job.
awk '
  $1 == "nbd-socket" { base[$2 " " $3] = $4 }
  { rows[NR] = $0 }
  END {
    printf "%-12s %-10s %4s %10s %8s\n", "target", "job", "qd", "IOPS", "x socket"
    for (i = 1; i <= NR; i++) {
      split(rows[i], f, " ")
      b = base[f[2] " " f[3]]
      printf "%-12s %-10s %4s %10d %8s\n", f[1], f[2], f[3], f[4], (b > 0 ? sprintf("%.2f", f[4] / b) : "-")
    }
  }' "$dir/results"
