#!/usr/bin/env bash
# Parity against a 3-way mirror on one `trireme up --nodes 6` cluster (issue 67): vol0 is
# 4+2 with a 20% mirrored share, m3 a 3-way mirror, each served by a `trireme nbd` process,
# both 1 GiB, both filled with random bytes and vol0 encoded to its share first. Then, taking
# turns over ROUNDS rounds (default 2; 0: only the rebuild below), `trireme bench` through
# each one's NBD socket:
#   hot writes   4K random writes, DISKSPD's -rdpct90/10, at QD1 and 10 x QD4
#   cold writes  4K random writes over the whole volume (80% of it in stripes), QD1, 10 x QD4
#   s2d          DISKSPD's S2D mix (4K, 70:30 random, 10 x QD4) with the same hot zone
# and last, a rebuild under load: node 6 killed (kill -9) while the s2d mix runs on vol0,
# `up` restarts it, its resync's time and bytes, and the mix's p99 before and during.
# ENCODE_RATE (e.g. 0) is vol0's writer's `--encode-rate` (default 64M); MIN_PARITY and M3_FILL as in
# bench/parity-lib.sh. Prints a Markdown
# table with parity/mirror ratios. File stores under a temporary directory,
# unix sockets between processes (this host has no RDMA device).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-2}"
secs="${SECS:-10}"
. bench/lib.sh
. bench/parity-lib.sh
parity_volumes

# run NAME URI ARGS...: one bench, its JSON kept as "$dir/NAME.json" (appended per round).
run() {
  local name=$1 target=$2
  shift 2
  "$T" --data-dir "$dir/c" --output json bench "$@" -d"$secs" -W2 "$target" |
    python3 -c 'import json, sys; print(json.dumps(json.load(sys.stdin)))' >>"$dir/$name.jsonl"
}
for round in $(seq "$rounds"); do
  for vol in m3 vol0; do
    target=$curi
    [ "$vol" = vol0 ] && target=$uri
    run "$vol-hot-qd1" "$target" -b4K -w100 -r -rdpct90/10 -t1 -o1
    run "$vol-hot-10x4" "$target" -b4K -w100 -r -rdpct90/10 -t10 -o4
    run "$vol-cold-qd1" "$target" -b4K -w100 -r -t1 -o1
    run "$vol-cold-10x4" "$target" -b4K -w100 -r -t10 -o4
    run "$vol-s2d" "$target" --profile s2d -rdpct90/10
  done
  echo "round $round done"
done

# A rebuild under load: the s2d mix on vol0, node 6 killed 5 s in; `up` restarts it.
"$T" --data-dir "$dir/c" --output json bench --profile s2d -rdpct90/10 -d40 -W0 "$uri" \
  >"$dir/under-load.json" &
bench=$!
sleep 5
kill -9 "$(awk '$1 == "node-6" { print $2 }' "$dir/c/pids")"
wait "$bench"
echo
python3 - "$dir" <<'EOF'
import json, sys, glob, os
d = sys.argv[1]
def load(name):
    runs = [json.loads(l) for l in open(f"{d}/{name}.jsonl")]
    iops = sum(r["iops"] for r in runs) / len(runs)
    p50 = sum(r["total"]["latency_us"]["p50"] for r in runs) / len(runs)
    p99 = sum(r["total"]["latency_us"]["p99"] for r in runs) / len(runs)
    return iops, p50, p99
# No rounds (ROUNDS 0): the rebuild under load alone.
rows = [("hot writes (-rdpct90/10), QD1", "hot-qd1"),
        ("hot writes (-rdpct90/10), 10 x QD4", "hot-10x4"),
        ("cold writes (uniform), QD1", "cold-qd1"),
        ("cold writes (uniform), 10 x QD4", "cold-10x4"),
        ("S2D mix 70:30 (-rdpct90/10), 10 x QD4", "s2d")] if glob.glob(f"{d}/*.jsonl") else []
if rows:
    print("| 4K, 1 GiB volumes, `up --nodes 6` | 3-way IOPS | 4+2 IOPS | 4+2 / 3-way | 3-way p50 us | 4+2 p50 us | 3-way p99 us | 4+2 p99 us |")
    print("|---|---|---|---|---|---|---|---|")
for what, name in rows:
    m, p = load(f"m3-{name}"), load(f"vol0-{name}")
    print(f"| {what} | {m[0]:.0f} | {p[0]:.0f} | {p[0]/m[0]:.2f}x | {m[1]:.0f} | {p[1]:.0f} | {m[2]:.0f} | {p[2]:.0f} |")
u = json.load(open(f"{d}/under-load.json"))
print()
print(f"under load (S2D mix on vol0, node 6 killed 5 s in, 40 s): {u['iops']:.0f} IOPS, "
      f"p50 {u['total']['latency_us']['p50']:.0f} us, p99 {u['total']['latency_us']['p99']:.0f} us, "
      f"max {u['total']['latency_us']['max']/1000:.0f} ms")
EOF
grep -E "parity resync (started|done)" "$dir/vol0.log" | sed -e 's/^.*Z  *INFO //' || true
echo "vol0: $(in_parity)% of its regions in parity at the end, $(overlay)% of the volume overlay"
