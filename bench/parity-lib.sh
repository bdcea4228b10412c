# Sourced by bench/parity.sh and bench/parity-turns.sh, after bench/lib.sh: their two volumes
# on one `trireme up --nodes 6` (file stores): vol0 4+2 with a 20% mirrored share, m3 3-way,
# 1 GiB each, filled with the same random bytes.
# shellcheck shell=bash

# Stops the writers `serve` started ($cpid) and waits for `up` before the directory goes.
cpid=
trap '[ -n "$cpid" ] && kill $cpid 2>/dev/null; [ -n "$up" ] && kill "$up" 2>/dev/null && wait "$up"; rm -rf "$dir"' EXIT

# in_parity: vol0's regions in parity, in percent.
in_parity() {
  "$T" --data-dir "$dir/c" --output json status | python3 -c '
import json, sys
s = json.load(sys.stdin)
v = [v for v in s["volumes"] if v["name"] == "vol0"][0]
r = v["resiliency"]["regions"]
print(100 * r["parity"] // r["regions"])'
}

# overlay: vol0's overlay as its writer says, in percent of the volume.
overlay() {
  "$T" --data-dir "$dir/c" --output json status | python3 -c '
import json, sys
s = json.load(sys.stdin)
v = [v for v in s["volumes"] if v["name"] == "vol0"][0]
print(v["resiliency"]["regions"].get("overlay_percent", "?"))'
}

# parity_volumes [UP_ARGS...]: starts `up` (UP_ARGS added), makes and fills both volumes,
# waits until MIN_PARITY percent (default 75) of vol0's regions are in parity, then serves
# vol0 from a `trireme nbd` of its own (it fences `up`'s writer; ENCODE_RATE and
# ENCODE_HEADROOM are its `--encode-rate` and `--encode-headroom`; its log in
# "$dir/vol0.log" has a line for each region encoded) as m3 is. Sets $uri (vol0), $curi
# (m3) and $cpid (both writers' pids).
# M3_FILL=0 leaves m3 unwritten, so its writes allocate as those into vol0's trimmed blocks do.
# HOT_FIRST=1: `up`'s writer fills vol0 with its encoder off (sequential, the fill leaves the
# first regions coldest: they were encoded first), and the measured writer encodes it while
# the hot profiles' zone (-rdpct90/10: the volume's first tenth) is written in 1 s bursts, a
# second apart. The encoder takes the coldest regions first and leaves the zone mirrored: a
# working set hot before the rest cooled, as mirror-accelerated parity expects. Without it the
# zone ends in parity and the hot runs write it through the overlay. Needs the encoder on.
# LAYOUT (default 4+2) is vol0's parity, on NODES nodes (default 6): 2+1 on 3 puts both
# volumes on the same three nodes, so the spread of writes over more nodes drops out.
parity_volumes() {
  local m3 m3uri hot_first=()
  [ -z "${HOT_FIRST:-}" ] || hot_first=(--encode-rate 0)
  start_up --nodes "${NODES:-6}" --parity "${LAYOUT:-4+2}" --size 1G --store file --node-capacity 4G \
    "${hot_first[@]}" "$@"
  "$T" --data-dir "$dir/c" volume create m3 --size 1G --replicas 3 >/dev/null
  serve m3
  m3=$cpid
  head -c 1G /dev/urandom >"$dir/img"
  [ "${M3_FILL:-1}" = 0 ] || qemu-img convert -n -f raw -O raw "$dir/img" "$curi"
  # vol0 filled and (without HOT_FIRST) encoded to its share by `up`'s writer.
  qemu-img convert -n -f raw -O raw "$dir/img" "$uri"
  rm -f "$dir/img"
  [ -n "${HOT_FIRST:-}" ] || wait_parity
  m3uri=$curi
  "$T" --data-dir "$dir/c" --log info,trireme_client::encoder=debug \
    nbd vol0 --socket "$dir/vol0.sock" ${ENCODE_RATE:+--encode-rate "$ENCODE_RATE"} \
    ${ENCODE_HEADROOM:+--encode-headroom "$ENCODE_HEADROOM"} \
    >"$dir/vol0.uri" 2>>"$dir/vol0.log" &
  cpid="$! $m3"
  for _ in $(seq 600); do [ -s "$dir/vol0.uri" ] && break; sleep 0.1; done
  [ -s "$dir/vol0.uri" ] || { echo "vol0's writer did not start in 60 s:" >&2; cat "$dir/vol0.log" >&2; exit 1; }
  uri=$(head -1 "$dir/vol0.uri")
  curi=$m3uri
  [ -z "${HOT_FIRST:-}" ] || wait_parity
}

# wait_parity: waits (at most about 2 min) until MIN_PARITY percent (default 75) of vol0's
# regions are in parity; with HOT_FIRST, writing the hot zone in bursts meanwhile.
wait_parity() {
  for _ in $(seq 120); do
    [ "$(in_parity)" -ge "${MIN_PARITY:-75}" ] && break
    [ -z "${HOT_FIRST:-}" ] || "$T" --data-dir "$dir/c" bench -b4K -w100 -r -rdpct90/10 -t4 -o4 \
      -d1 -W0 "$uri" >/dev/null || true
    sleep 1
  done
  echo "vol0: $(in_parity)% of its regions in parity before the runs${HOT_FIRST:+ (its hot zone written while it was encoded)}"
}
