#!/usr/bin/env bash
# Two or more builds side by side on what snapshots cost: for each round, each mode (none,
# chain10, first: as in bench/snapshots.sh) and each build given, a fresh `up` cluster of that
# build (3-way file-store volume, SIZE default 1G, filled first), then the S2D workload for
# 15 s; one summary line per run, and at the end each build's ratios to "none" (IOPS, and the
# storage processes' CPU per I/O). Builds are interleaved within each mode so that the
# machine's drift falls on all of them alike; "none" runs the same code in every build (a
# volume never snapshotted passes straight through), so its spread is the noise floor.
# Usage: bench/snapshots-ab.sh ROUNDS BUILD... (paths to trireme binaries, e.g. copies of
# target/release/trireme made at two commits).
set -euo pipefail
rounds=$1; shift
size="${SIZE:-1G}"
dir=$(mktemp -d); up=
trap '[ -n "$up" ] && kill $up 2>/dev/null; rm -rf "$dir"' EXIT
head -c "$size" /dev/urandom >"$dir/fill.img"
for round in $(seq "$rounds"); do
 for mode in none chain10 first; do
  for T in "$@"; do
    rm -rf "$dir/c" && mkdir "$dir/c"
    "$T" --data-dir "$dir/c" up --store file --size "$size" --port 0 >"$dir/up.log" 2>&1 &
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
    echo "$mode $(basename "$T") r$round: $line" | tee -a "$dir/lines"
    kill "$up"; wait "$up" || true; up=
  done
 done
done
# Each snapshot run as a ratio to the mean of its round's "none" runs (the same code in every
# build, so the spread of "none" is the noise), per build: every round, the median, the mean;
# for IOPS, and for the storage processes' CPU per I/O.
python3 - "$dir/lines" <<'PY'
import collections, re, statistics, sys
rows = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    m = re.match(r'(\w+) (\S+) r(\d+): Summary: (\d+) IOPS.*storage ([\d.]+)', line)
    if m:
        rows[int(m.group(3))][(m.group(1), m.group(2))] = (int(m.group(4)), float(m.group(5)))
builds = sorted({b for r in rows.values() for (_, b) in r})
for k, what in [(0, 'IOPS'), (1, 'storage CPU/IO')]:
    for mode in ['chain10', 'first']:
        for b in builds:
            rs = [r[(mode, b)][k] / statistics.mean(v[k] for (m, _), v in r.items() if m == 'none')
                  for _, r in sorted(rows.items()) if (mode, b) in r and ('none', b) in r]
            if rs:
                print(f"{mode:8} {b:16} {what} vs none: {' '.join(f'{x:.2f}' for x in rs)}"
                      f"  median {statistics.median(rs):.2f}  mean {statistics.mean(rs):.3f}")
PY
