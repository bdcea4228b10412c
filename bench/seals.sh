#!/usr/bin/env bash
# What block checksums cost: the S2D workload (4K, 70:30 random, 10 x QD4, native client) on a
# 3-way memory volume, with nodes sealing blocks and without (--no-block-checksums), interleaved
# ROUNDS times (default 2) on this host. Prints one summary line per run.
# Links are unix sockets between processes; this host has no RDMA device.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-2}"
cargo build --release --locked -q -p trireme
T=$PWD/target/release/trireme
dir=$(mktemp -d)
trap 'kill $up 2>/dev/null || true; rm -rf "$dir"' EXIT
for round in $(seq "$rounds"); do
  for mode in sealed unsealed; do
    rm -rf "$dir/c" && mkdir "$dir/c"
    extra=()
    [ "$mode" = unsealed ] && extra=(--no-block-checksums)
    "$T" --data-dir "$dir/c" up --store memory --size 1G --port 0 "${extra[@]}" >"$dir/up.log" 2>&1 &
    up=$!
    for _ in $(seq 100); do [ -f "$dir/c/exports" ] && break; sleep 0.2; done
    line=$("$T" --data-dir "$dir/c" bench --profile s2d -d10 -W2 volume:vol0 2>&1 | grep Summary)
    echo "$mode round $round: $line"
    kill "$up"; wait "$up" || true
  done
done
