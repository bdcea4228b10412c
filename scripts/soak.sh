#!/usr/bin/env bash
# Runs the random-fault soak: N faults (default 200) under a verifying workload, on nodes in
# network namespaces (needs root). TRIREME_SOAK_SEED=S replays a run; the seed is printed.
set -euo pipefail
cd "$(dirname "$0")/.."
n="${1:-200}"
TRIREME_SOAK_FAULTS="$n" exec cargo test --release --locked -p trireme --test failures_between_hosts \
  soak_random_faults_under_load -- --nocapture
