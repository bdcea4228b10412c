#!/usr/bin/env bash
# A lost server's rebuild beside client I/O (issue 67): a 4+2 volume on `trireme up --nodes 7`
# (the seventh node holds none of it), 1 GiB filled with random bytes and encoded to its
# share. DISKSPD's S2D mix (4K, 70:30 random, 10 x QD4, -rdpct90/10) runs through `up`'s NBD
# export for SECS seconds (default 40), twice: alone, then with `node drain N` of one of the
# volume's nodes 5 s in. The drain takes N's copy out and rebuilds a whole copy on node 7 in
# its place (every region N mirrored, its chunk of every stripe), at the volume's resync rate
# (none set: as fast as it goes). Prints the client's IOPS, p50, p99 and longest I/O of both
# runs, and the rebuild's bytes, time and rate. File stores in a temporary directory, unix
# sockets between processes (this host has no RDMA device).
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${SECS:-40}"
. bench/lib.sh
# The cluster stopped (and waited for) before its directory goes.
trap '[ -n "$up" ] && kill "$up" 2>/dev/null && wait "$up"; rm -rf "$dir"' EXIT
start_up --nodes 7 --parity 4+2 --size 1G --store file --node-capacity 4G
head -c 1G /dev/urandom >"$dir/img"
qemu-img convert -n -f raw -O raw "$dir/img" "$uri"
rm -f "$dir/img"
in_parity() {
  "$T" --data-dir "$dir/c" --output json status | python3 -c '
import json, sys
v = [v for v in json.load(sys.stdin)["volumes"] if v["name"] == "vol0"][0]
r = v["resiliency"]["regions"]
print(100 * r["parity"] // r["regions"])'
}
for _ in $(seq 120); do [ "$(in_parity)" -ge 75 ] && break; sleep 1; done
echo "vol0: $(in_parity)% of its regions in parity"
nodes=$("$T" --data-dir "$dir/c" --output json volume info vol0 |
  python3 -c 'import json, sys; print(" ".join(str(r["node"]) for r in json.load(sys.stdin)["replicas"]))')
drained=$(echo "$nodes" | awk '{ print $2 }')
echo "vol0 on nodes $nodes; draining node $drained"

mix() {
  "$T" --data-dir "$dir/c" --output json bench --profile s2d -rdpct90/10 -d"$secs" -W0 "$uri" >"$dir/$1.json"
}
mix alone
mix drained &
bench=$!
sleep 5
t0=$(date +%s.%N)
"$T" --data-dir "$dir/c" node drain "$drained" >"$dir/drain.out"
t1=$(date +%s.%N)
wait "$bench"
python3 - "$dir" "$t0" "$t1" <<'EOF'
import json, re, sys
d, t0, t1 = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
print("| S2D mix on 4+2, 10 x QD4 | IOPS | p50 us | p99 us | longest ms |")
print("|---|---|---|---|---|")
for name, what in [("alone", "alone"), ("drained", "a drain 5 s in (whole rebuild)")]:
    r = json.load(open(f"{d}/{name}.json"))
    l = r["total"]["latency_us"]
    print(f"| {what} | {r['iops']:.0f} | {l['p50']:.0f} | {l['p99']:.0f} | {l['max']/1000:.0f} |")
done = [l for l in open(f"{d}/up.log") if "parity resync done" in l]
m = re.search(r"copied_bytes=(\d+) ms=(\d+)", done[-1]) if done else None
if m:
    b, ms = int(m.group(1)), int(m.group(2))
    print(f"\nrebuild: {b / 2**20:.0f} MiB copied in {ms / 1000:.1f} s ({b / 2**20 / (ms / 1000):.0f} MiB/s); "
          f"the drain took {t1 - t0:.1f} s from command to done")
EOF
cat "$dir/drain.out"
