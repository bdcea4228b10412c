#!/usr/bin/env bash
# Issue 67's codec choice: reed-solomon-simd against ISA-L (trireme-erasure's codec, Debian's
# libisal), encode and rebuild of K+M stripes, interleaved. Not part of CI.
# Usage: bench/erasure.sh [ROUNDS] [K+M ...]   e.g. bench/erasure.sh 7 4+2
set -euo pipefail
cd "$(dirname "$0")/erasure"
need=()
for p in libisal-dev libclang-dev pkg-config; do
    dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if ((${#need[@]})); then
    apt-get install -y "${need[@]}" >/dev/null
fi
lscpu | sed -n 's/^Model name: *//p'
grep -o -w 'avx2\|avx512f\|gfni' /proc/cpuinfo | sort -u | tr '\n' ' '
echo
CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}" cargo run --release --quiet -- "$@"
