"""Counts `perf script -F pid,time,event,trace` lines of syscall tracepoints (standard input)
by call and file, for bench/parity-cpu.sh's SYSCALLS=1.

    syscall_counts.py RUN FDS    FDS: lines "PID FD TARGET" taken from /proc/PID/fd

A replica's files are named by volume and kind (`1.data`, `1.al`), so the nodes' add up; a
file opened after FDS was taken counts as "(opened since)". Prints the counts, most first,
and the activity-log (`.al`) syncs in each second from the first call recorded.
"""
import collections
import os
import re
import sys

run, fds_path = sys.argv[1], sys.argv[2]
fds = {}
for line in open(fds_path):
    pid, fd, target = line.split(maxsplit=2)
    name = re.sub(r"^replica-0*", "", os.path.basename(target.strip()))
    fds[(pid, int(fd))] = name
calls, al, t0 = collections.Counter(), collections.Counter(), None
pattern = re.compile(r"\s*(\d+)\s+([\d.]+):\s+syscalls:sys_enter_(\w+): fd: (0x[0-9a-f]+)")
for line in sys.stdin:
    m = pattern.match(line)
    if not m:
        continue
    pid, t, call, fd = m.group(1), float(m.group(2)), m.group(3), int(m.group(4), 16)
    t0 = t if t0 is None else t0
    name = fds.get((pid, fd), "(opened since)")
    calls[(call, name)] += 1
    if name.endswith(".al"):
        al[int(t - t0)] += 1
print(f"{run}: " + ", ".join(f"{c} {call} {name}" for (call, name), c in calls.most_common()))
seconds = [al[s] for s in range(max(al, default=-1) + 1)]
print(f"{run}: activity-log syncs in each second: {seconds}")
