#!/usr/bin/env bash
# CPU per I/O of a parity volume against a 3-way one (issue 67), by process: the setup of
# bench/parity.sh (vol0 4+2 with a 20% mirrored share, m3 3-way, 1 GiB each on one
# `trireme up --nodes 6`, vol0 encoded to its share), then for each profile in PROFILES
# (default "hot hot-qd1"), m3 then vol0, a `trireme bench` of SECS seconds (default 10) after
# WARMUP seconds (default 2), and the CPU time each process took over both (/proc/PID/stat:
# user + system) per I/O, counting the warm-up's I/O at the measured rate.
#   hot      4K random writes, -rdpct90/10, 10 x QD4     hot-qd1   the same at QD1
#   hot-zone every write in hot's zone (-rdpct100/10), 10 x QD4: none of the cold tail
#   hot-zone-qd1  the same at QD1
#   cold     4K random writes over the whole volume, 10 x QD4
#   region / region-qd1  4K random writes over the volume's first MiB only (10 x QD4 / QD1):
#            one region of vol0, so the same three nodes take every write, as m3's do
# ENCODE_RATE, ENCODE_HEADROOM, MIN_PARITY, M3_FILL as in bench/parity-lib.sh; UP_ARGS are
# added to `up` (e.g. --volatile-bookkeeping). Prints a Markdown table, with the machine's
# idle share over each run (/proc/stat): CPU that no process used while the run waited, the
# regions vol0's encoder encoded or folded back during the run (warm-up included), and its
# overlay right after (percent of the volume; its share is 20%). On two cores the
# whole cluster shares the machine: CPU per I/O says where the time goes, IOPS alone cannot.
# Before each run it waits for the cluster to settle (vol0's encoder idle).
# SYSCALLS=1 also counts the nodes' fdatasync, fsync and fallocate calls by file (perf's
# syscall tracepoints), and the activity-log syncs in each second of each run. It slowed
# some runs several times over (3-way at 3.1-3.8k IOPS against 21-24k): count with it,
# never time. PERF=1 records a flat profile of the nodes over each run (`perf record -F 499`)
# and prints its top functions; it slows the runs too.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${SECS:-10}"
warmup="${WARMUP:-2}"
. bench/lib.sh
. bench/parity-lib.sh
# shellcheck disable=SC2086 # UP_ARGS is a list of words
parity_volumes ${UP_ARGS:-}
read -r vol0_writer m3_writer <<<"$cpid"

# ticks PID: CPU time the process has taken, in clock ticks.
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
# encoded: the regions vol0's writer encoded or folded back so far (its log's lines).
encoded() { grep -c "region encoded" "$dir/vol0.log" || true; }
# cpu_times: the machine's idle (with I/O wait) and total clock ticks so far.
cpu_times() { awk '$1 == "cpu" { t = 0; for (i = 2; i <= NF; i++) t += $i; print $5 + $6, t }' /proc/stat; }
hz=$(getconf CLK_TCK)
nodes=$(awk '$1 ~ /^node-/ { print $2 }' "$dir/c/pids")

# settle: waits (at most 2 min) until the nodes and vol0's writer took under 5% of a core
# for three seconds in a row. A volume left idle has its encoder work at its full rate (a
# hot run's overlay folded back), and it ran on the nodes under the next run, the other
# volume's: 2,710 data-file syncs of vol0 during a 25 s 3-way run.
settle() {
  local quiet=0 before after p
  for _ in $(seq 120); do
    before=$(ticks "$vol0_writer")
    for p in $nodes; do before=$((before + $(ticks "$p"))); done
    sleep 1
    after=$(ticks "$vol0_writer")
    for p in $nodes; do after=$((after + $(ticks "$p"))); done
    if [ $((20 * (after - before))) -lt "$hz" ]; then
      quiet=$((quiet + 1))
      [ $quiet -ge 3 ] && return
    else
      quiet=0
    fi
  done
  echo "vol0's encoder did not settle in 2 minutes" >&2
}

# start_syscalls RUN: records the nodes' sync and fallocate calls until stop_syscalls, which
# appends RUN's counts by file (names from /proc/PID/fd) to "$dir/syscalls.txt".
start_syscalls() {
  run=$1
  for p in $nodes; do
    find "/proc/$p/fd" -mindepth 1 -printf "$p %f %l\n"
  done >"$dir/fds"
  perf record -q -o "$dir/perf.data" -p "$(echo "$nodes" | paste -sd,)" \
    -e syscalls:sys_enter_fdatasync,syscalls:sys_enter_fsync,syscalls:sys_enter_fallocate 2>/dev/null &
  perf_pid=$!
}
# start_profile RUN / stop_profile: the nodes' flat profile over RUN, its top functions
# appended to "$dir/profile.txt".
start_profile() {
  run=$1
  perf record -q -F 499 -o "$dir/profile.data" -p "$(echo "$nodes" | paste -sd,)" 2>/dev/null &
  prof_pid=$!
}
stop_profile() {
  kill -INT "$prof_pid" && wait "$prof_pid" || true
  { echo "### nodes' profile: $run"
    perf report -i "$dir/profile.data" --no-children --sort dso,sym --stdio 2>/dev/null |
      grep -v -e '^#' -e '^$' | head -15 || true; } >>"$dir/profile.txt"
}
stop_syscalls() {
  kill -INT "$perf_pid" && wait "$perf_pid" || true
  perf script -i "$dir/perf.data" -F pid,time,event,trace 2>/dev/null |
    python3 bench/syscall_counts.py "$run" "$dir/fds" >>"$dir/syscalls.txt"
}

echo "| profile | volume | IOPS | p99 us | CPU us/IO: writer | nodes | all (no bench) | idle % | regions encoded | overlay % after |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for profile in ${PROFILES:-hot hot-qd1}; do
  case $profile in
    hot) args=(-b4K -w100 -r -rdpct90/10 -t10 -o4) ;;
    hot-qd1) args=(-b4K -w100 -r -rdpct90/10 -t1 -o1) ;;
    hot-zone) args=(-b4K -w100 -r -rdpct100/10 -t10 -o4) ;;
    hot-zone-qd1) args=(-b4K -w100 -r -rdpct100/10 -t1 -o1) ;;
    cold) args=(-b4K -w100 -r -t10 -o4) ;;
    region) args=(-b4K -w100 -r -t10 -o4 --span 1M) ;;
    region-qd1) args=(-b4K -w100 -r -t1 -o1 --span 1M) ;;
    *) echo "unknown profile $profile (hot, hot-qd1, hot-zone, hot-zone-qd1, cold, region, region-qd1)" >&2; exit 2 ;;
  esac
  for vol in m3 vol0; do
    settle
    target=$curi writer=$m3_writer
    [ "$vol" = vol0 ] && target=$uri writer=$vol0_writer
    w0=$(ticks "$writer") n0=0
    for p in $nodes; do n0=$((n0 + $(ticks "$p"))); done
    read -r i0 t0 < <(cpu_times)
    e0=$(encoded)
    [ -z "${SYSCALLS:-}" ] || start_syscalls "$profile $vol"
    [ -z "${PERF:-}" ] || start_profile "$profile $vol"
    out=$("$T" --data-dir "$dir/c" --output json bench "${args[@]}" -d"$secs" -W"$warmup" "$target")
    w1=$(ticks "$writer") n1=0
    for p in $nodes; do n1=$((n1 + $(ticks "$p"))); done
    read -r i1 t1 < <(cpu_times)
    [ -z "${SYSCALLS:-}" ] || stop_syscalls
    [ -z "${PERF:-}" ] || stop_profile
    after=- encodes=-
    [ "$vol" = vol0 ] && encodes=$(($(encoded) - e0)) && after=$(overlay)
    python3 - "$profile" "$vol" "$secs" "$warmup" "$hz" $((w1 - w0)) $((n1 - n0)) "$out" \
      $((100 * (i1 - i0) / (t1 - t0))) "$encodes" "$after" <<'EOF'
import json, sys
profile, vol, secs, warmup, hz, w, n, out, idle, encodes, after = sys.argv[1:]
r = json.loads(out)
ios = r["iops"] * (float(secs) + float(warmup))
us = lambda t: 1e6 * int(t) / int(hz) / ios
print(f"| {profile} | {vol} | {r['iops']:.0f} | {r['total']['latency_us']['p99']:.0f} | "
      f"{us(w):.1f} | {us(n):.1f} | {us(int(w) + int(n)):.1f} | {idle} | {encodes} | {after} |")
EOF
  done
done
[ -z "${SYSCALLS:-}" ] || cat "$dir/syscalls.txt"
[ -z "${PERF:-}" ] || cat "$dir/profile.txt"
