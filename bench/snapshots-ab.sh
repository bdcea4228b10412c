#!/usr/bin/env bash
# Two or more builds side by side on what snapshots cost: for each round, each mode (none,
# chain10, first: as in bench/snapshots.sh) and each build given, a fresh `up` cluster of that
# build (3-way volume, SIZE default 1G, filled first), then the S2D workload for 15 s; one
# summary line per run, and at the end each build's ratios to its own "none" (IOPS, and the
# storage processes' CPU per I/O), and each build's "none" against the first build's. Builds
# are interleaved within each mode so that the machine's drift falls on all of them alike.
# Usage: bench/snapshots-ab.sh ROUNDS BUILD... (paths to trireme binaries, e.g. copies of
# target/release/trireme made at two commits). STORE (default file) picks the nodes' store:
# `memory` leaves the file system out (its pool's fresh pages then cost what ext4 did);
# `tiered` takes UP_ARGS too (e.g. UP_ARGS="--slow-disk real": a plain file for the slow tier
# instead of the disk model, whose 8 ms per I/O would hide the rest). MODES (default
# "none chain10 first") picks the modes, e.g. MODES=none to compare builds that cannot all
# take snapshots.
# Each line counts the requests nodes left past the replica timeout in that run; LOGS=DIR keeps
# each run's `up` log there as MODE-BUILD-rROUND.log.
set -euo pipefail
rounds=$1; shift
size="${SIZE:-1G}"
store="${STORE:-file}"
modes="${MODES:-none chain10 first}"
read -r -a up_args <<<"${UP_ARGS:-}"
dir=$(mktemp -d); up=
trap '[ -n "$up" ] && kill $up 2>/dev/null; rm -rf "$dir"' EXIT
head -c "$size" /dev/urandom >"$dir/fill.img"
for round in $(seq "$rounds"); do
 for mode in $modes; do
  for T in "$@"; do
    rm -rf "$dir/c" && mkdir "$dir/c"
    "$T" --data-dir "$dir/c" up --store "$store" --size "$size" --port 0 "${up_args[@]}" >"$dir/up.log" 2>&1 &
    up=$!
    for _ in $(seq 150); do [ -f "$dir/c/exports" ] && break; sleep 0.2; done
    uri=$(head -1 "$dir/c/exports")
    qemu-img convert -n -f raw -O raw "$dir/fill.img" "$uri"
    snap() { "$T" --data-dir "$dir/c" volume snapshot create vol0 "$1" >/dev/null; }
    case $mode in
      chain10) for k in $(seq 10); do snap "s$k"; "$T" --data-dir "$dir/c" bench --profile s2d -d1 -W0 "$uri" >/dev/null 2>&1; done ;;
      first) snap s1 ;;
    esac
    line=$("$T" --data-dir "$dir/c" bench --profile s2d -d15 -W2 "$uri" 2>&1 | grep Summary)
    kill "$up"; wait "$up" || true; up=
    # Requests a node left unanswered past the replica timeout (the copy goes out and
    # resyncs, and the run's numbers with it), anywhere in the run, the fill included.
    timeouts=$(grep -c "did not answer" "$dir/up.log" || true)
    echo "$mode $(basename "$T") r$round: $line; replica timeouts $timeouts" | tee -a "$dir/lines"
    if [ -n "${LOGS:-}" ]; then
      mkdir -p "$LOGS" && cp "$dir/up.log" "$LOGS/$mode-$(basename "$T")-r$round.log"
    fi
  done
 done
done
# Each snapshot run as a ratio to its own build's "none" in the same round, per build: every
# round, the median, the mean; for IOPS, and for the storage processes' CPU per I/O. Builds
# that differ in "none" too (a change to the I/O path) are compared there first, each against
# the first build given.
python3 - "$dir/lines" "$@" <<'PY'
import collections, os, re, statistics, sys
rows = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    m = re.match(r'(\w+) (\S+) r(\d+): Summary: (\d+) IOPS.*storage ([\d.]+)', line)
    if m:
        rows[int(m.group(3))][(m.group(1), m.group(2))] = (int(m.group(4)), float(m.group(5)))
builds = [os.path.basename(b) for b in sys.argv[2:]]
def show(label, rs):
    if rs:
        print(f"{label}: {' '.join(f'{x:.2f}' for x in rs)}"
              f"  median {statistics.median(rs):.2f}  mean {statistics.mean(rs):.3f}")
for k, what in [(0, 'IOPS'), (1, 'storage CPU/IO')]:
    for b in builds[1:]:
        show(f"none     {b:16} {what} vs {builds[0]}",
             [r[('none', b)][k] / r[('none', builds[0])][k] for _, r in sorted(rows.items())
              if ('none', b) in r and ('none', builds[0]) in r])
    for mode in ['chain10', 'first']:
        for b in builds:
            show(f"{mode:8} {b:16} {what} vs none",
                 [r[(mode, b)][k] / r[('none', b)][k] for _, r in sorted(rows.items())
                  if (mode, b) in r and ('none', b) in r])
PY
