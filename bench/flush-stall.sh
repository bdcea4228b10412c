#!/usr/bin/env bash
# What a flush costs the other writes of this host's disk (issue 67): 4K random O_DIRECT
# writes at QD32 on a filled 1 GiB file for 15 s, alone, then beside 4 a second of 256 KiB
# O_DIRECT writes with an fdatasync after each, into a new file (allocating) and into a
# filled one (overwrites). Prints IOPS, p99.99 and the syncs' mean. DIR (default a scratch
# directory under /tmp) names the file system to measure.
set -euo pipefail
dir=${DIR:-$(mktemp -d)}
trap 'rm -f "$dir/fg" "$dir/bg"' EXIT
fg=(--name=fg --filename="$dir/fg" --size=1g --rw=randwrite --bs=4k --direct=1
  --ioengine=libaio --iodepth=32 --runtime=15 --time_based=1)
bg=(--name=bg --filename="$dir/bg" --size=1g --rw=randwrite --bs=256k --direct=1
  --ioengine=psync --fdatasync=1 --rate_iops=4 --runtime=15 --time_based=1)
fill() { fio --name=fill --filename="$1" --size=1g --rw=write --bs=1M --direct=1 --output-format=terse >/dev/null; }
show() {
  sed -n "/^{/,\$p" |
  python3 -c '
import json, sys
for j in json.load(sys.stdin)["jobs"]:
    w = j["write"]
    name, iops, tail = j["jobname"], w["iops"], w["clat_ns"]["percentile"]["99.990000"] / 1e6
    sync = j.get("sync", {}).get("lat_ns", {}).get("mean", 0) / 1e6
    line = f"  {name}: {iops:.0f} IOPS, p99.99 {tail:.1f} ms"
    print(line + (f", fdatasync mean {sync:.0f} ms" if sync else ""))'
}
fill "$dir/fg"
echo "alone:"
fio "${fg[@]}" --output-format=json | show
echo "beside syncs into a new file:"
fio "${fg[@]}" "${bg[@]}" --output-format=json | show
rm -f "$dir/bg"; fill "$dir/bg"
echo "beside syncs into a filled file:"
fio "${fg[@]}" "${bg[@]}" --output-format=json | show
