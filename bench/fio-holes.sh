#!/usr/bin/env bash
# What an O_DIRECT 4K random write costs into a written file, a sparse one and one reserved
# with `fallocate` (issue 67: overlay writes land where an encode punched holes). fio,
# io_uring, 10 jobs x QD4, SECS seconds (default 15) each, SIZE (default 1G) files in DIR
# (default a temporary directory under /var/tmp: the disk the nodes' stores use, not tmpfs).
# Prints one IOPS figure a file kind.
set -euo pipefail
secs="${SECS:-15}"
size="${SIZE:-1G}"
dir="${DIR:-$(mktemp -d /var/tmp/fio-holes.XXXXXX)}"
trap 'rm -rf "$dir"' EXIT
run() {
  fio --name="$1" --filename="$dir/$1" --rw=randwrite --bs=4k --direct=1 \
    --ioengine=io_uring --iodepth=4 --numjobs=10 --size="$size" --runtime="$secs" \
    --time_based --group_reporting --output-format=json |
    python3 -c 'import json,sys; print(round(json.load(sys.stdin)["jobs"][0]["write"]["iops"]))'
}
head -c "$size" /dev/zero >"$dir/written"
truncate -s "$size" "$dir/sparse"
fallocate -l "$size" "$dir/reserved"
sync
for kind in written sparse reserved; do
  echo "$kind: $(run "$kind") IOPS"
done
