#!/usr/bin/env bash
# Raw space of a parity volume against a 3-way mirror on one `trireme up --nodes 3` (issue 67):
# vol0 2+1 with a 20% mirrored share, m3 a 3-way mirror, both SIZE (default 512M), filled with
# the same random bytes, vol0 encoded to its share. Then ROUNDS rounds (default 3) of uniform
# 4K random writes (SECS seconds, 4 x QD4, each volume in turn), and after each an idle pause
# (IDLE seconds, default 45) for the encoder. Prints, after each phase, what each volume's
# data files take on disk (`du`, all three nodes) and its ratio to the volume's size: a 3-way
# mirror takes 3.0x once written; 2+1 with a fifth mirrored 1.6x once encoded. File stores under
# a temporary directory (this host has no RDMA device; the transport plays no part).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-3}"
size="${SIZE:-512M}"
. bench/lib.sh
. bench/parity-lib.sh
start_up --nodes 3 --parity 2+1 --size "$size" --store file --node-capacity 8G
"$T" --data-dir "$dir/c" volume create m3 --size "$size" --replicas 3 >/dev/null
serve m3
m3uri=$curi
# raw NAME: MiB the data files of volume NAME take on disk.
raw() {
  local id
  id=$("$T" --data-dir "$dir/c" --output json status |
    python3 -c 'import json, sys; print("%016x" % [v for v in json.load(sys.stdin)["volumes"] if v["name"] == sys.argv[1]][0]["id"])' "$1")
  # The data file, and the pool file past it (where a copy that keeps its trims' blocks grows).
  find "$dir/c" \( -name "replica-$id.data" -o -name "replica-$id.pool" \) -exec du -k {} + |
    awk '{s += $1} END {printf "%.0f", s / 1024}'
}
mib=$(numfmt --from=iec "$size" | awk '{print $1 / 1048576}')
row() {
  local p m
  p=$(raw vol0)
  m=$(raw m3)
  awk -v w="$1" -v m="$m" -v p="$p" -v s="$mib" -v i="$(in_parity)" -v o="$(overlay)" \
    'BEGIN { printf "| %s | %d | %.2fx | %d | %.2fx | %s%% | %s%% |\n", w, m, m / s, p, p / s, i, o }'
}
head -c "$size" /dev/urandom >"$dir/img"
qemu-img convert -n -f raw -O raw "$dir/img" "$m3uri"
qemu-img convert -n -f raw -O raw "$dir/img" "$uri"
rm -f "$dir/img"
for _ in $(seq 200); do [ "$(in_parity)" -ge 79 ] && break; sleep 1; done
echo "| $size volumes, \`up --nodes 3\` | 3-way MiB on disk | 3-way / size | 2+1 MiB on disk | 2+1 / size | 2+1 regions in parity | 2+1 overlay |"
echo "|---|---|---|---|---|---|---|"
row "filled, encoded to the share"
for r in $(seq "$rounds"); do
  for target in "$m3uri" "$uri"; do
    "$T" --data-dir "$dir/c" bench -b4K -w100 -r -t4 -o4 -d"${SECS:-20}" -W0 "$target" >/dev/null
  done
  row "round $r: after ${SECS:-20} s of uniform 4K writes"
  sleep "${IDLE:-45}"
  row "round $r: after ${IDLE:-45} s idle"
done
