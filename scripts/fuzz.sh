#!/usr/bin/env bash
# Runs every fuzz target in fuzz/fuzz_targets for SECONDS each (default 60), one after the
# other, with the hand-made seeds where a target has them; installs cargo-fuzz if missing.
# Prints one line per target (runs, coverage) and exits non-zero if any target found a crash
# (its input is kept in fuzz/artifacts/TARGET/).
#   scripts/fuzz.sh 60            # every target, 60 s each
#   scripts/fuzz.sh 30 rbd_diff   # the targets named, 30 s each
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
secs="${1:-60}"
shift || true
command -v cargo-fuzz >/dev/null || cargo install --locked cargo-fuzz
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for f in fuzz_targets/*.rs; do targets+=("$(basename "$f" .rs)"); done
fi
# cargo-fuzz needs nightly features; RUSTC_BOOTSTRAP lets the stable toolchain build them.
export RUSTC_BOOTSTRAP=1
RUSTC_BOOTSTRAP=1 cargo fuzz build >/dev/null
failed=()
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t"
  dirs=("corpus/$t")
  [ -d "seeds/$t" ] && dirs+=("seeds/$t")
  log="$(mktemp)"
  if cargo fuzz run "$t" "${dirs[@]}" -- -max_total_time="$secs" >"$log" 2>&1; then
    echo "$t: $(grep -Eo '#[0-9]+.*cov: [0-9]+' "$log" | tail -1)"
  else
    echo "$t: FAILED (log: $log)"
    failed+=("$t")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "crashes in: ${failed[*]}"
  exit 1
fi
echo "all ${#targets[@]} targets ran ${secs}s each without a crash"
