#!/usr/bin/env bash
# What an O_DIRECT random write of BS bytes (default 4k) costs into a written file, a sparse
# one and one reserved with `fallocate` (issue 67: overlay writes land where an encode
# punched holes; a first write into a hole's grain writes it whole, BS=64k). fio,
# io_uring, 10 jobs x QD4, SECS seconds (default 15) each, SIZE (default 1G) files in DIR
# (default a temporary directory under /var/tmp: the disk the nodes' stores use, not tmpfs).
# Prints, twice in turn, each file kind's IOPS and the machine's CPU time per write
# (/proc/stat, all CPUs: the file system's work at a write's end runs in kernel threads, not
# in fio). With SIZE large against what a run writes (SIZE=8G SECS=5), nearly every write
# into the reserved file is its block's first, and converts an unwritten extent.
set -euo pipefail
secs="${SECS:-15}"
bs="${BS:-4k}"
size="${SIZE:-1G}"
dir="${DIR:-$(mktemp -d /var/tmp/fio-holes.XXXXXX)}"
trap 'rm -rf "$dir"' EXIT
busy() { awk '$1 == "cpu" { t = 0; for (i = 2; i <= NF; i++) t += $i; print t - $5 - $6 }' /proc/stat; }
run() {
  local b0 b1 out
  b0=$(busy)
  out=$(fio --name="$1" --filename="$dir/$1" --rw=randwrite --bs="$bs" --direct=1 \
    --ioengine=io_uring --iodepth=4 --numjobs=10 --size="$size" --runtime="$secs" \
    --time_based --group_reporting --output-format=json)
  b1=$(busy)
  python3 -c 'import json, sys
w = json.loads(sys.argv[1])["jobs"][0]["write"]
print("%.0f IOPS, %.1f us of CPU a write" % (w["iops"], 1e6 * int(sys.argv[2]) / int(sys.argv[3]) / w["total_ios"]))' \
    "$out" $((b1 - b0)) "$(getconf CLK_TCK)"
}
dd if=/dev/zero of="$dir/written" bs=1M count=$(($(numfmt --from=iec "$size") >> 20)) oflag=direct status=none
truncate -s "$size" "$dir/sparse"
fallocate -l "$size" "$dir/reserved"
sync
# Twice in turn: this host's disk varies from one run to the next.
for round in 1 2; do
  for kind in written sparse reserved; do
    echo "$kind ($round): $(run "$kind")"
  done
done
