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
. bench/parity-lib.sh
# shellcheck disable=SC2086 # UP_ARGS: several arguments
parity_volumes ${UP_ARGS:-}

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
