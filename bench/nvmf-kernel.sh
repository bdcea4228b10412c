#!/bin/sh
# Linux's own NVMe/TCP initiator against trireme's other ways in, on one volume, side by side:
# 4 KiB random reads and writes at queue depth 1 and 128, IOPS, and the NVMe device's ratio to
# each (issue 66's goals: within 10% of the direct client at QD1, ahead of NBD at QD128).
#
#   bench/nvmf-kernel.sh VOLUME [SECONDS]     # root; the volume exists; nobody writes it
#
# Run it on a host of a cluster on etcd (TRIREME_ETCD, and TRIREME_TLS_IDENTITY where the
# cluster uses TLS, as for `trireme attach`) whose kernel has nvme-tcp (`modprobe nvme-tcp`).
# The volume's access list must name the host's NQN (HOSTNQN, else /etc/nvme/hostnqn; its
# id: HOSTID, else /etc/nvme/hostid):
# `trireme volume access VOLUME --allow NQN`. In turn, each holding the volume's writer:
#
#   direct   `trireme bench volume:VOLUME` (the native client in the benchmark's process,
#            the volume's writer for the run)
#   nbd      `trireme attach VOLUME --socket S`, fio's nbd engine on the socket
#   nvme     `trireme nvmf serve VOLUME --listen LISTEN` (127.0.0.1:4420), the kernel
#            connected to it (/dev/nvme-fabrics), fio's io_uring engine on /dev/nvmeXnY
#
# The target runs on this host, so the one TCP hop is loopback; put LISTEN on a server's
# address and run `nvmf serve` there to measure the network too. It writes the volume's
# first GiB (SIZE=... for another span).
#
# Not run for numbers on the project's own host: its kernel has no nvme-tcp, and the guest
# kernel the tests boot runs under software emulation (TCG), which is for function, not time
# (tests/kernel_devices/nvme.rs runs this script there, one second a job, to keep it working).
set -eu
vol="${1:?usage: bench/nvmf-kernel.sh VOLUME [SECONDS]}"
secs="${2:-20}"
T="${TRIREME:-trireme}"
size="${SIZE:-1G}"
listen="${LISTEN:-127.0.0.1:4420}"
hostnqn="${HOSTNQN:-$(cat /etc/nvme/hostnqn 2>/dev/null || true)}"
[ -n "$hostnqn" ] || { echo "no host NQN: set HOSTNQN or write /etc/nvme/hostnqn" >&2; exit 2; }
# The kernel refuses a host id it knows under another NQN: nvme-cli's, else a new one.
hostid="${HOSTID:-$(cat /etc/nvme/hostid 2>/dev/null || cat /proc/sys/kernel/random/uuid)}"
[ -w /dev/nvme-fabrics ] || { echo "no /dev/nvme-fabrics: modprobe nvme-tcp (as root)" >&2; exit 2; }
dir=$(mktemp -d)
served=""
nqn=""
# The controllers of subsystem $nqn on this host.
ctrls() { for c in /sys/class/nvme/nvme*; do [ -e "$c/subsysnqn" ] && [ "$(cat "$c/subsysnqn")" = "$nqn" ] && echo "$c"; done; return 0; }
cleanup() {
  [ -n "$nqn" ] && for c in $(ctrls); do echo 1 > "$c/delete_controller" 2>/dev/null || true; done
  [ -n "$served" ] && { kill "$served" 2>/dev/null; wait "$served" 2>/dev/null || true; }
  rm -rf "$dir"
}
trap cleanup EXIT

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

# The same job through the native client: trireme bench's IOPS.
direct() {
  w=0; [ "$1" = randwrite ] && w=100
  $T --output json bench -b4K -r -w"$w" -t1 -o"$2" -d"$secs" -W0 --span "$size" "volume:$vol" \
    >"$dir/b.json" 2>"$dir/b.err" || { echo "# direct $1 $2 failed: $(tail -3 "$dir/b.err")" >&2; exit 1; }
  sed -n 's/.*"iops": *\([0-9.]*\).*/\1/p' "$dir/b.json" | head -1 | cut -d. -f1
}

# A job that fails ends the script (its exit status is the command substitution's).
for rw in randread randwrite; do
  for qd in 1 128; do v=$(direct "$rw" "$qd") || exit 1; echo "direct $rw $qd $v"; done
done >"$dir/results"

# Waits for a line of $1 that matches $2 while process $served lives.
ready() {
  i=0
  until grep -q "$2" "$1" 2>/dev/null; do
    kill -0 "$served" 2>/dev/null || { echo "# $(tail -3 "$1.log")" >&2; exit 1; }
    i=$((i+1)); [ $i -gt 1200 ] && { echo "# timed out: $(tail -3 "$1.log")" >&2; exit 1; }; sleep 0.1
  done
}

$T attach "$vol" --socket "$dir/s.sock" >"$dir/attach" 2>"$dir/attach.log" &
served=$!
ready "$dir/attach" nbd
for rw in randread randwrite; do
  for qd in 1 128; do
    v=$(job "nbd-$rw-$qd" "$rw" "$qd" --ioengine=nbd --uri="nbd+unix:///$vol?socket=$dir/s.sock") || exit 1
    echo "nbd $rw $qd $v"
  done
done >>"$dir/results"
kill "$served"; wait "$served" 2>/dev/null || true; served=""

$T nvmf serve "$vol" --listen "$listen" --port-id 1 >"$dir/nvmf" 2>"$dir/nvmf.log" &
served=$!
ready "$dir/nvmf" "^nvme/tcp"
ready "$dir/nvmf.log" "ANA optimized"
nqn=$(awk '{ print $3 }' "$dir/nvmf")
echo "transport=tcp,traddr=${listen%:*},trsvcid=${listen##*:},nqn=$nqn,hostnqn=$hostnqn,hostid=$hostid" >/dev/nvme-fabrics
# The namespace's block device: the multipath head (native multipath) or the controller's own.
dev=""
i=0
while [ -z "$dev" ]; do
  for s in /sys/class/nvme-subsystem/nvme-subsys* $(ctrls); do
    [ -e "$s/subsysnqn" ] && [ "$(cat "$s/subsysnqn")" = "$nqn" ] || continue
    for n in "$s"/nvme*n*; do [ -e "/dev/${n##*/}" ] && dev="/dev/${n##*/}" && break 2; done
  done
  i=$((i+1)); [ $i -gt 100 ] && { echo "# no block device for $nqn" >&2; exit 1; }; sleep 0.1
done
for rw in randread randwrite; do
  for qd in 1 128; do
    v=$(job "nvme-$rw-$qd" "$rw" "$qd" --ioengine=io_uring --direct=1 --filename="$dev") || exit 1
    echo "nvme $rw $qd $v"
  done
done >>"$dir/results"

# The table: IOPS, and NVMe/TCP's ratio to the direct client and to NBD, job by job.
echo "# bench/nvmf-kernel.sh $vol $secs s a job, $(date -u +%Y-%m-%dT%H:%MZ), $(uname -r), $(nproc) CPUs; nvme: $dev via $listen"
awk '
  { iops[$1 " " $2 " " $3] = $4; if ($1 == "direct") jobs[++n] = $2 " " $3 }
  END {
    printf "%-10s %4s %10s %10s %10s %12s %9s\n", "job", "qd", "direct", "nbd", "nvme", "nvme/direct", "nvme/nbd"
    for (i = 1; i <= n; i++) {
      split(jobs[i], f, " ")
      d = iops["direct " jobs[i]]; b = iops["nbd " jobs[i]]; v = iops["nvme " jobs[i]]
      printf "%-10s %4s %10d %10d %10d %12s %9s\n", f[1], f[2], d, b, v,
        (d > 0 ? sprintf("%.2f", v / d) : "-"), (b > 0 ? sprintf("%.2f", v / b) : "-")
    }
  }' "$dir/results"
