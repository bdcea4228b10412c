#!/bin/sh
# Runs the seeded simulator over a range of seeds in release mode (fast: virtual time).
#   scripts/sim.sh 0 100000          # seeds 0..100000 (the parity volume: every eighth)
#   TRIREME_SIM_TRACE=1 scripts/sim.sh 4711 4712   # replay one seed with the full event log
#   PARITY=1 scripts/sim.sh 0 8000   # only the parity volume through its writer
set -e
from=${1:-0}
to=${2:-10000}
cd "$(dirname "$0")/.."
if [ -n "$PARITY" ]; then
    TRIREME_SIM_SEEDS="$from..$to" exec cargo test --release -p trireme-sim --test seeds \
        through_its_writer -- --nocapture
fi
TRIREME_SIM_SEEDS="$from..$to" exec cargo test --release -p trireme-sim --test seeds -- --nocapture
