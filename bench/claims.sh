#!/usr/bin/env bash
# Reserves, weights and the recovery share (issue 68): what the nodes' I/O threads give each
# volume when requests wait for the disk. `trireme up` (3 node processes, 3-way volumes);
# vol0 through `up`'s export, vol1 through a `trireme nbd` writer of its own.
#   STORE=file (default)  O_DIRECT files on this host's disk, IO_THREADS (default 4) a node
#   STORE=tiered          every extent pinned to the slow tier, behind the 7200 rpm model
#                         (8 ms a random I/O, 2 in flight): a node whose disk is the
#                         bottleneck; run it with IO_THREADS=2 (the model's heads), so that
#                         requests wait in the node's queue and not in the model's
# Prints Markdown:
#   reserve   vol0's 4K random reads (1 x QD8) alone; beside vol1's 4K random reads
#             (4 x QD32) with equal weights; with vol1 --weight 9; and with vol0
#             --iops-reserve RESERVE (default 5000) on top; SECS (default 10) a run
#   recovery  vol0's 4K random reads (4 x QD16) before and while node 3 is resynced after it
#             missed WRITE_SECS (default 8) of vol1's 1M writes (SIGSTOP, then SIGCONT), with
#             each node's --recovery-share at 20 (the default) and at 99 (recovery first),
#             ROUNDS rounds (default 2); vol0 measured in 2 s runs until vol1 is in sync
# SECTIONS (default "reserve recovery") picks them. UCX over shared memory between processes
# (this host has no RDMA device); the disk is this host's, shared with whatever else runs.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-2}"
secs="${SECS:-10}"
reserve="${RESERVE:-5000}"
threads="${IO_THREADS:-4}"
store="${STORE:-file}"
WRITE_SECS="${WRITE_SECS:-8}"
size=1G
tier=
if [ "$store" = tiered ]; then
  # The slow tier behind the 7200 rpm model; every extent pinned to it.
  size=1G
  tier="--tier slow"
fi
. bench/lib.sh
cpid=
trap '[ -n "$cpid" ] && kill $cpid 2>/dev/null; [ -n "$up" ] && kill "$up" 2>/dev/null && wait "$up"; rm -rf "$dir"' EXIT

bench() {
  local name=$1 target=$2
  shift 2
  "$T" --data-dir "$dir/c" --output json bench "$@" "$target" >"$dir/$name.json"
}
field() {
  python3 -c "import json; j = json.load(open('$dir/$1.json')); print($2)"
}
vset() {
  "$T" --data-dir "$dir/c" volume set "$@" >/dev/null
  sleep 1
}
cluster() {
  [ -n "$cpid" ] && { kill "$cpid" 2>/dev/null || true; wait "$cpid" 2>/dev/null || true; cpid=; }
  [ -n "$up" ] && stop_up
  start_up --store "$store" --size "$size" --io-threads "$threads" "$@"
  "$T" --data-dir "$dir/c" volume create vol1 --size "$size" $tier >/dev/null
  [ -n "$tier" ] && "$T" --data-dir "$dir/c" volume set vol0 $tier >/dev/null
  serve vol1
  uri0=$uri
  uri1=$curi
  # Every block written once: reads go to the disk, not to holes.
  bench fill0 "$uri0" -b1M -w100 -t1 -o4 -d5 -W0
  bench fill1 "$uri1" -b1M -w100 -t1 -o4 -d5 -W0
}

sections="${SECTIONS:-reserve recovery}"
if [[ $sections == *reserve* ]]; then
cluster
echo "## A reserve under contention (vol0 4K random reads 1 x QD8; vol1 4 x QD32; $secs s a run)"
echo
echo "| case | vol0 IOPS | vol0 p99 us | vol1 IOPS | vol0 share of the two |"
echo "|---|---|---|---|---|"
row() {
  local a b
  a=$(field q "round(j['iops'])")
  b=${2:--}
  local share=-
  [ "$b" != - ] && share=$(python3 -c "print(f'{$a / ($a + $b):.2f}')")
  echo "| $1 | $a | $(field q "j['read']['latency_us']['p99']") | $b | $share |"
}
bench q "$uri0" -b4K -w0 -r -t1 -o8 -d"$secs" -W1
row "vol0 alone"
for case in "none" "vol1 --weight 9" "vol1 weight 9, vol0 --iops-reserve $reserve"; do
  case $case in
  none) ;;
  "vol1 --weight 9") vset vol1 --weight 9 ;;
  *) vset vol0 --iops-reserve "$reserve" ;;
  esac
  bench l "$uri1" -b4K -w0 -r -t4 -o32 -d"$((secs + 2))" -W0 &
  lpid=$!
  sleep 1
  bench q "$uri0" -b4K -w0 -r -t1 -o8 -d"$secs" -W0
  wait $lpid
  row "beside vol1: $case" "$(field l "round(j['iops'])")"
done

fi

[[ $sections == *recovery* ]] || exit 0
echo
echo "## Recovery's share (vol0 4K random reads 4 x QD16 while node 3 resyncs vol1)"
echo
echo "| round | recovery share | MiB written while node 3 was out | resync s | MiB/s | vol0 IOPS before | vol0 IOPS during | vol0 p99 ms before | vol0 p99 ms during (worst 2 s) |"
echo "|---|---|---|---|---|---|---|---|---|"
in_sync() {
  "$T" --data-dir "$dir/c" --output json volume info vol1 |
    python3 -c "import json,sys; v = json.load(sys.stdin); print(all(r['state'] == 'in-sync' for r in v['replicas']))"
}
for r in $(seq "$rounds"); do
  for share in 20 99; do
    cluster --recovery-share "$share"
    node3=$(pgrep -f -- "--dir $dir/c/node-3" | head -1)
    bench before "$uri0" -b4K -w0 -r -t4 -o16 -d4 -W1
    kill -STOP "$node3"
    bench w "$uri1" -b1M -w100 -t1 -o8 -d"$WRITE_SECS" -W0
    kill -CONT "$node3"
    rm -f "$dir/done" "$dir"/q*.json
    t0=$(date +%s.%N)
    (until [ "$(in_sync)" = True ]; do sleep 0.2; done; date +%s.%N >"$dir/done") &
    i=0
    while [ ! -f "$dir/done" ]; do
      bench "q$i" "$uri0" -b4K -w0 -r -t4 -o16 -d2 -W0
      i=$((i + 1))
    done
    t1=$(cat "$dir/done")
    during=$(python3 -c "
import json, glob
runs = [json.load(open(f)) for f in glob.glob('$dir/q*.json')]
print(round(sum(j['iops'] for j in runs) / len(runs)), round(max(j['read']['latency_us']['p99'] for j in runs) / 1000))")
    read -r iops p99 <<<"$during"
    mib=$(field w "round(j['write']['bytes'] / 1048576)")
    secs_=$(python3 -c "print(f'{$t1 - $t0:.1f}')")
    echo "| $r | $share% | $mib | $secs_ | $(python3 -c "print(round($mib / ($t1 - $t0)))") | $(field before "round(j['iops'])") | $iops | $(field before "round(j['read']['latency_us']['p99'] / 1000)") | $p99 |"
  done
done
