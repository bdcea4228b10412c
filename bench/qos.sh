#!/usr/bin/env bash
# Per-volume limits (issue 68) on one `trireme up --store memory` cluster (3 node processes,
# 3-way volumes): vol0 through `up`'s export, vol1 through a `trireme nbd` writer of its own,
# `trireme bench` through their NBD sockets. Prints Markdown tables:
#   accuracy   vol1 limited to 1K, 10K and 50K IOPS (8 KiB units): the S2D mix (4K random,
#              70:30, 10 x QD4), and 64 KiB requests (8 units each) for 50K; measured / limit
#   cost       the S2D mix on vol1 with no limit, then with limits far above what it does
#              (every request through the limiter, never held), taking turns over ROUNDS
#              rounds (default 5) after one run to warm up; the median ratio
#   neighbour  vol0's 4K random reads at QD1 (p50, p99) alone, beside vol1 running 4K
#              random writes at 2 x QD32 unlimited, and beside vol1 limited to LOUD IOPS
#              (default 2000)
# SECS (default 10) is each run's length. Memory stores, so the disks are not what is
# measured; unix sockets between processes (this host has no RDMA device).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-5}"
secs="${SECS:-10}"
loud="${LOUD:-2000}"
. bench/lib.sh
cpid=
trap '[ -n "$cpid" ] && kill $cpid 2>/dev/null; [ -n "$up" ] && kill "$up" 2>/dev/null && wait "$up"; rm -rf "$dir"' EXIT
start_up --store memory --size 1G
"$T" --data-dir "$dir/c" volume create vol1 --size 1G >/dev/null
serve vol1
uri0=$uri
uri1=$curi

# bench NAME URI ARGS...: one run, its JSON as "$dir/NAME.json".
bench() {
  local name=$1 target=$2
  shift 2
  "$T" --data-dir "$dir/c" --output json bench "$@" -d"$secs" -W1 "$target" >"$dir/$name.json"
}
# field NAME EXPR: a Python expression over the run's JSON `j`.
field() {
  python3 -c "import json; j = json.load(open('$dir/$1.json')); print($2)"
}
set_limit() {
  "$T" --data-dir "$dir/c" volume set vol1 "$@" >/dev/null
  sleep 1
}

echo "## Accuracy (vol1, $secs s a run)"
echo
echo "| limit (8 KiB units/s) | requests | measured units/s | measured / limit | p99 ms |"
echo "|---|---|---|---|---|"
for case in "1000 4K" "10000 4K" "50000 4K" "50000 64K"; do
  read -r limit bs <<<"$case"
  set_limit --iops-limit "$limit"
  bench acc "$uri1" -b"$bs" -w30 -r -t10 -o4
  units=$(field acc "j['iops'] * (8 if '$bs' == '64K' else 1)")
  echo "| $limit | $bs, 10 x QD4 | $(printf %.0f "$units") | $(python3 -c "print(f'{$units / $limit:.3f}')") | $(field acc "f\"{j['total']['latency_us']['p99'] / 1000:.2f}\"" 2>/dev/null || echo -) |"
done
set_limit --iops-limit none

echo
echo "## The limiter's cost (vol1, S2D mix 4K 70:30 10 x QD4; $rounds rounds, taking turns)"
echo
echo "| round | no limit IOPS | limits set, never reached IOPS | ratio |"
echo "|---|---|---|---|"
bench warm "$uri1" -b4K -w30 -r -t10 -o4
ratios=()
for r in $(seq "$rounds"); do
  set_limit --iops-limit none --bps-limit none
  bench free "$uri1" -b4K -w30 -r -t10 -o4
  set_limit --iops-limit 10M --bps-limit 100G
  bench set "$uri1" -b4K -w30 -r -t10 -o4
  a=$(field free "j['iops']")
  b=$(field set "j['iops']")
  ratio=$(python3 -c "print(f'{$b / $a:.3f}')")
  ratios+=("$ratio")
  echo "| $r | $(printf %.0f "$a") | $(printf %.0f "$b") | $ratio |"
done
echo "| median | | | $(printf '%s\n' "${ratios[@]}" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}') |"
set_limit --iops-limit none --bps-limit none

echo
echo "## The noisy neighbour (vol0 4K random reads QD1; vol1 4K random writes 2 x QD32)"
echo
echo "| vol1 | vol0 IOPS | vol0 p50 us | vol0 p99 us | p99 / alone | vol1 IOPS |"
echo "|---|---|---|---|---|---|"
p99() { field "$1" "j['read']['latency_us']['p99']"; }
bench alone "$uri0" -b4K -w0 -r -t1 -o1
alone=$(p99 alone)
echo "| idle | $(field alone "round(j['iops'])") | $(field alone "j['read']['latency_us']['p50']") | $alone | 1.00 | - |"
for mode in unlimited "limited to $loud"; do
  case $mode in
  unlimited) set_limit --iops-limit none ;;
  *) set_limit --iops-limit "$loud" ;;
  esac
  bench loud "$uri1" -b4K -w100 -r -t2 -o32 &
  lpid=$!
  sleep 1
  bench quiet "$uri0" -b4K -w0 -r -t1 -o1
  wait $lpid
  q=$(p99 quiet)
  echo "| $mode | $(field quiet "round(j['iops'])") | $(field quiet "j['read']['latency_us']['p50']") | $q | $(python3 -c "print(f'{$q / $alone:.2f}')") | $(field loud "round(j['iops'])") |"
done
