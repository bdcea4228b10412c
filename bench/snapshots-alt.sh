#!/usr/bin/env bash
# What snapshots cost under S2D, measured on one cluster in alternating short runs, so that the
# host's drift (minutes long here) falls on both sides of each ratio alike.
#
# One `up` cluster (file store, 3 nodes); two 3-way volumes of SIZE (default 1G), `plain` and
# `snapped`, each filled once and served by a `trireme nbd` of its own (the same path for both).
# `snapped` first gets ten snapshots, each after 1 s of the workload (so each holds blocks of
# its own). Then, ROUNDS times (default 8): one more snapshot of `snapped`, and the S2D
# workload (4K, 70:30 random, 10 x QD4) for SECS seconds (default 10, after 2 s of warm-up)
# on each volume, the order swapped every round. So every measured run of `snapped` has at
# least eleven snapshots in its chain and starts just after its newest: nearly every write is
# a block's first overwrite after a snapshot, the harder of the issue's two cases (ten
# snapshots; first overwrites) at once.
# With CHAIN=1, the other case alone: after its ten snapshots `snapped` is written whole once
# more (every block moved off the blocks the chain holds) and no round takes a snapshot, so no
# measured write is a first overwrite: what is left is the cost of ten snapshots in the chain
# (a map lookup per block, the head's blocks in the pool).
# With QD1=1 the measured runs are the same mix at queue depth 1 (one thread, one I/O at a
# time): their IOPS ratio is the inverse of the ratio of mean latencies.
# Prints each run's summary, then per round the IOPS and storage CPU per I/O of `snapped` as a
# ratio to `plain`, their median and mean; and the nodes' voluntary context switches per I/O
# (their threads' blocking, counted from /proc, warm-up included). Storage CPU counts `up`, its nodes and the volume's
# `trireme nbd`. Links are unix sockets (UCX over shared memory where it loads); no RDMA here.
# TRIREME_TRANSPORT=tcp runs the cluster on the stream transport instead of UCX (every `trireme`
# the script starts takes it from the environment).
# Usage: bench/snapshots-alt.sh [ROUNDS]; CHAIN=1 and QD1=1 as above; T=path/to/trireme to bench a given build; KEEP=DIR
# keeps every process's log there at the end; PERF=DIR
# records node 1's profile of each measured run there (perf record -g), as MODE-rROUND.data.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-8}"
size="${SIZE:-1G}"
secs="${SECS:-10}"
. bench/lib.sh
declare -A nbd=()
cleanup() {
  for p in "${nbd[@]}" $up; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [ -n "${KEEP:-}" ] && mkdir -p "$KEEP" && cp "$dir"/*.log "$dir"/c/*.log "$KEEP"/ 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
t() { "$T" --data-dir "$dir/c" "$@"; }

start_up --store file --size 64M
vols="plain snapped"
for v in $vols; do t volume create "$v" --size "$size" >/dev/null; done

# serve V: bench/lib.sh's, its pid kept per volume; the script ends if it did not start.
serve_v() {
  serve "$1"
  nbd[$1]=$cpid
  [ -s "$dir/$1.uri" ] || { echo "trireme nbd $1 did not start:" >&2; cat "$dir/$1.log" >&2; exit 1; }
}
# unserve V: stops it (it detaches, so the manager takes the snapshot itself).
unserve() { kill "${nbd[$1]}"; wait "${nbd[$1]}" || true; unset "nbd[$1]"; }
uri() { head -1 "$dir/$1.uri"; }
# bench V ARGS...: the S2D workload on V, its CPU and the cluster's counted as storage.
bench() {
  local v=$1; shift
  local pids=()
  while read -r _ pid _; do pids+=(--storage-pid "$pid"); done <"$dir/c/pids"
  t bench --profile s2d "$@" "${pids[@]}" --storage-pid "${nbd[$v]}" "$(uri "$v")" 2>&1
}

# roles V: NAME=PID of each storage process of V's runs; ticks PID: its CPU ticks so far, in
# user mode and in the kernel.
roles() {
  while read -r name pid _; do echo "$name=$pid"; done <"$dir/c/pids"
  echo "writer=${nbd[$1]}"
}
ticks() { awk '{print $14, $15}' "/proc/$1/stat"; }
# switches: voluntary context switches so far of every thread of the cluster's nodes.
switches() {
  local n=0 pid
  for pid in $(awk '$1 ~ /^node-/ {print $2}' "$dir/c/pids"); do
    n=$((n + $(cat /proc/"$pid"/task/*/status 2>/dev/null |
      awk '/^voluntary_ctxt_switches/ {s += $2} END {print s + 0}')))
  done
  echo "$n"
}

head -c "$size" /dev/urandom >"$dir/fill.img"
for v in $vols; do
  serve_v "$v"
  qemu-img convert -n -f raw -O raw "$dir/fill.img" "$(uri "$v")"
done
for k in $(seq 10); do
  unserve snapped
  t volume snapshot create snapped "chain$k" >/dev/null
  serve_v snapped
  bench snapped -d1 -W0 >/dev/null
done

if [ -n "${CHAIN:-}" ]; then
  qemu-img convert -n -f raw -O raw "$dir/fill.img" "$(uri snapped)"
fi

for round in $(seq "$rounds"); do
  if [ -z "${CHAIN:-}" ]; then
    unserve snapped
    # Refused while a copy is still out (this host sometimes stalls every node past the
    # replica timeout at once): the round goes on with the snapshot before it.
    t volume snapshot create snapped "round$round" >/dev/null ||
      echo "r$round: the snapshot was refused; this round runs after the last one"
    serve_v snapped
  fi
  order=$vols
  [ $((round % 2)) -eq 0 ] && order="snapped plain"
  for v in $order; do
    declare -A u0=() s0=()
    for p in $(roles "$v"); do read -r u0[$p] s0[$p] < <(ticks "${p#*=}"); done
    if [ -n "${PERF:-}" ]; then
      mkdir -p "$PERF"
      ( sleep 2; perf record -q -g -p "$(awk '$1 == "node-1" {print $2}' "$dir/c/pids")" \
          -o "$PERF/$v-r$round.data" -- sleep "$secs" >/dev/null 2>&1 ) &
      perf_pid=$!
    fi
    sw0=$(switches)
    line=$(bench "$v" -d"$secs" -W2 ${QD1:+-t1 -o1} | grep Summary) || line="no summary (the run failed)"
    sw=$(($(switches) - sw0))
    [ -n "${PERF:-}" ] && wait "$perf_pid"
    shares=
    for p in $(roles "$v"); do
      read -r u1 s1 < <(ticks "${p#*=}")
      shares+=" ${p%=*} $((u1 - ${u0[$p]})) $((s1 - ${s0[$p]}))"
    done
    echo "$v r$round: $line; switches $sw; ticks$shares" | tee -a "$dir/lines"
  done
done
timeouts=$(cat "$dir"/*.log | grep -c "did not answer" || true)
echo "requests left past the replica timeout, whole run: $timeouts"

python3 - "$dir/lines" "$secs" <<'PY'
import collections, re, statistics, sys
rows = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    m = re.match(r'(\w+) r(\d+): Summary: (\d+) IOPS.*storage ([\d.]+)', line)
    if m:
        rows[int(m.group(2))][m.group(1)] = (int(m.group(3)), float(m.group(4)))
for k, what in [(0, 'IOPS'), (1, 'storage CPU/IO')]:
    rs = [r['snapped'][k] / r['plain'][k] for _, r in sorted(rows.items()) if len(r) == 2]
    if rs:
        print(f"snapped vs plain, {what}: {' '.join(f'{x:.2f}' for x in rs)}"
              f"  median {statistics.median(rs):.2f}  mean {statistics.mean(rs):.3f}")
# Where the storage CPU per I/O goes: each process's share of the storage ticks around the
# run (its warm-up included), user and kernel apart, applied to the run's storage CPU per
# I/O; medians over rounds. Nodes are summed.
per = collections.defaultdict(lambda: collections.defaultdict(list))
for line in open(sys.argv[1]):
    m = re.match(r'(\w+) r\d+: .*storage ([\d.]+);.*ticks (.*)$', line)
    if m:
        f = m.group(3).split()
        t = collections.defaultdict(int)
        for i in range(0, len(f), 3):
            role = f[i].rsplit('-', 1)[0]
            t[role + ' user'] += int(f[i + 1])
            t[role + ' kernel'] += int(f[i + 2])
        total = sum(t.values()) or 1
        for role, n in t.items():
            per[m.group(1)][role].append(float(m.group(2)) * n / total)
# The nodes' voluntary context switches (threads that blocked) per I/O, warm-up included.
secs = float(sys.argv[2]) + 2
sw = collections.defaultdict(list)
for line in open(sys.argv[1]):
    m = re.match(r'(\w+) r\d+: Summary: (\d+) IOPS.*; switches (\d+);', line)
    if m:
        sw[m.group(1)].append(int(m.group(3)) / (int(m.group(2)) * secs))
for v in ['plain', 'snapped']:
    if sw[v]:
        print(f"{v:8} node voluntary switches per I/O: "
              f"{' '.join(f'{x:.2f}' for x in sw[v])}  median {statistics.median(sw[v]):.2f}")
for v in ['plain', 'snapped']:
    print(f"{v:8} storage CPU us per I/O by process (median): " + ", ".join(
        f"{role} {statistics.median(xs):.1f}" for role, xs in sorted(per[v].items())
        if not role.startswith('up ')))
PY
