#!/usr/bin/env bash
# What costs parity its writes (issue 67): bench/parity.sh's two volumes (vol0 4+2 with a
# fifth mirrored, m3 3-way, 1 GiB each on `up --nodes 6`), then QD1 4 KiB writes taking
# turns, 10 s each: hot (-rdpct90/10) three times each, cold (uniform) twice. Prints
# "NAME IOPS P50_US P99_US" per run. UP_ARGS adds to `up` (e.g. "--encode-rate 0": every
# region stays mirrored); MIN_PARITY (default 75) is the share of regions in parity waited
# for; ENCODE_RATE is vol0's writer's, as in bench/parity.sh. DEPTH (default "-t1 -o1") is
# each run's threads and depth; HOT and COLD (default 3 and 2) its rounds of each.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${SECS:-10}"
. bench/lib.sh
cpid=
trap '[ -n "$cpid" ] && kill $cpid 2>/dev/null; [ -n "$up" ] && kill "$up" 2>/dev/null && wait "$up"; rm -rf "$dir"' EXIT
start_up --nodes 6 --parity 4+2 --size 1G --store file --node-capacity 4G ${UP_ARGS:-}
"$T" --data-dir "$dir/c" volume create m3 --size 1G --replicas 3 >/dev/null
serve m3
m3=$cpid
head -c 1G /dev/urandom >"$dir/img"
# M3_FILL=0 leaves m3 unwritten, so its writes allocate as those into vol0's trimmed blocks do.
[ "${M3_FILL:-1}" = 0 ] || qemu-img convert -n -f raw -O raw "$dir/img" "$curi"
# vol0 filled and encoded to its share by `up`'s writer.
qemu-img convert -n -f raw -O raw "$dir/img" "$uri"
rm -f "$dir/img"

# in_parity: vol0's regions in parity, in percent.
in_parity() {
  "$T" --data-dir "$dir/c" --output json status | python3 -c '
import json, sys
s = json.load(sys.stdin)
v = [v for v in s["volumes"] if v["name"] == "vol0"][0]
r = v["resiliency"]["regions"]
print(100 * r["parity"] // r["regions"])'
}
for _ in $(seq 120); do [ "$(in_parity)" -ge "${MIN_PARITY:-75}" ] && break; sleep 1; done
echo "vol0: $(in_parity)% of its regions in parity before the runs"
# Then served by a `trireme nbd` process as m3 is (it fences `up`'s writer).
m3uri=$curi
"$T" --data-dir "$dir/c" nbd vol0 --socket "$dir/vol0.sock" ${ENCODE_RATE:+--encode-rate "$ENCODE_RATE"} \
  >"$dir/vol0.uri" 2>>"$dir/vol0.log" &
cpid="$! $m3"
for _ in $(seq 100); do [ -s "$dir/vol0.uri" ] && break; sleep 0.1; done
uri=$(head -1 "$dir/vol0.uri")
curi=$m3uri

run() {
  local name=$1 target=$2
  shift 2
  "$T" --data-dir "$dir/c" --output json bench "$@" -d"$secs" -W2 "$target" |
    python3 -c 'import json, sys; r=json.load(sys.stdin); print(sys.argv[1], round(r["iops"]), round(r["total"]["latency_us"]["p50"]), round(r["total"]["latency_us"]["p99"]))' "$name"
}
depth=(${DEPTH:--t1 -o1})
tag=$(echo "${DEPTH:--t1 -o1}" | tr -d ' -' | sed 's/^t1o/qd/')
for _ in $(seq "${HOT:-3}"); do
  run "m3-hot-$tag" "$curi" -b4K -w100 -r -rdpct90/10 "${depth[@]}"
  run "vol0-hot-$tag" "$uri" -b4K -w100 -r -rdpct90/10 "${depth[@]}"
done
for _ in $(seq "${COLD:-2}"); do
  run "m3-cold-$tag" "$curi" -b4K -w100 -r "${depth[@]}"
  run "vol0-cold-$tag" "$uri" -b4K -w100 -r "${depth[@]}"
done
