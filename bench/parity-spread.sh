#!/usr/bin/env bash
# Is 4+2's hot-write gap against 3-way (issue 67) parity's own, or the spread of its writes over
# six node processes on this machine? One `trireme up --nodes 6` (file stores) holds vol0, 4+2
# with a 20% mirrored share, encoded to MIN_PARITY percent (default 75) and then served with
# its encoder off (`--encode-rate 0`: no encode or fold-back runs beside the writes), and two
# 3-way volumes, m3a and m3b, 1 GiB each, filled alike. Placement puts m3a and m3b on three
# nodes each (checked: the script stops if they share one). Each round runs 4K random writes,
# with -rdpct90/10 (PROFILE=hot, the default, as bench/parity-cpu.sh's) or over the whole
# volume (PROFILE=cold: into vol0's stripes, through its overlay), SECS seconds (default 10)
# after WARMUP (default 5):
#   one     m3a alone, 10 x QD4: three node processes busy (the goal's 3-way side)
#   split   m3a and m3b at once, 5 x QD4 each: the same load over six node processes, no parity
#   parity  vol0, 10 x QD4: a hot set over six node processes, mirrored on M+1 = 3 of them
# ROUNDS rounds (default 2), the second in reverse order. Prints IOPS, p99 and each run's
# ratio to `one` of its round. `split` has two writer processes where the others have one.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${SECS:-10}"
warmup="${WARMUP:-5}"
. bench/lib.sh
. bench/parity-lib.sh

# nodes_of VOLUME: the node ids holding VOLUME's copies, sorted, on one line.
nodes_of() {
  "$T" --data-dir "$dir/c" --output json volume info "$1" | python3 -c '
import json, sys
v = json.load(sys.stdin)
print(" ".join(sorted(str(r["node"]) for r in v["replicas"])))'
}

ENCODE_RATE=0 parity_volumes
writers=$cpid vol0uri=$uri m3auri=$curi
# parity_volumes made m3 (3-way) and filled it: it is m3a here.
"$T" --data-dir "$dir/c" volume create m3b --size 1G --replicas 3 >/dev/null
serve m3b
cpid="$writers $cpid"
m3buri=$curi
head -c 1G /dev/urandom >"$dir/img"
qemu-img convert -n -f raw -O raw "$dir/img" "$m3buri"
rm -f "$dir/img"
a=$(nodes_of m3) b=$(nodes_of m3b)
echo "m3a on nodes $a; m3b on nodes $b; vol0 (4+2) on all six"
for n in $a; do
  if [[ " $b " == *" $n "* ]]; then
    echo "m3a and m3b share node $n: the split run would not spread over six nodes" >&2
    exit 1
  fi
done

hot=(-b4K -w100 -r -o4 -d"$secs" -W"$warmup")
case ${PROFILE:-hot} in
  hot) hot+=(-rdpct90/10) ;;
  cold) ;;
  *) echo "PROFILE is hot or cold" >&2; exit 2 ;;
esac
bench() { "$T" --data-dir "$dir/c" --output json bench "$@"; }
# iops_p99 JSON...: summed IOPS and the largest p99 (us) of the bench reports given.
iops_p99() {
  python3 -c '
import json, sys
rs = [json.loads(a) for a in sys.argv[1:]]
iops = sum(r["iops"] for r in rs)
p99 = max(r["total"]["latency_us"]["p99"] for r in rs)
print(f"{iops:.0f} {p99:.0f}")' "$@"
}

run() {
  case $1 in
    one) iops_p99 "$(bench "${hot[@]}" -t10 "$m3auri")" ;;
    split)
      bench "${hot[@]}" -t5 "$m3auri" >"$dir/a.json" &
      local p=$!
      bench "${hot[@]}" -t5 "$m3buri" >"$dir/b.json"
      wait "$p"
      iops_p99 "$(cat "$dir/a.json")" "$(cat "$dir/b.json")"
      ;;
    parity) iops_p99 "$(bench "${hot[@]}" -t10 "$vol0uri")" ;;
  esac
}

echo "vol0's overlay before the runs: $(overlay)% of the volume"
echo "| round | run | IOPS | p99 us | against one |"
echo "|---|---|---|---|---|"
for round in $(seq "${ROUNDS:-2}"); do
  order="one split parity"
  [ $((round % 2)) = 0 ] && order="parity split one"
  declare -A got=()
  for r in $order; do got[$r]=$(run "$r"); done
  base=${got[one]%% *}
  for r in one split parity; do
    read -r iops p99 <<<"${got[$r]}"
    echo "| $round | $r | $iops | $p99 | $(python3 -c "print(f'{$iops / $base:.2f}x')") |"
  done
done
echo "vol0's overlay after the runs: $(overlay)% of the volume; regions encoded by its writer: $(grep -c 'region encoded' "$dir/vol0.log" || true)"
