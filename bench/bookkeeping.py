#!/usr/bin/env python3
"""What keeping the activity log and dirty records on disk costs the write path (issue 17).

Two local clusters run at once, each 3 nodes on the file store (O_DIRECT files) with a 3-way
volume: one as `trireme up` starts by default (bookkeeping on disk) and one started with
`--volatile-bookkeeping` (in memory only, as before). Rounds alternate between them and the
medians are compared:

1. s2d (4K, 70:30 read/write, random, 10 threads x 4) through the native client;
2. 4K random writes at queue depth 1 (`-b4K -w100 -r -t1 -o1`).

The volume is 1 GiB: 256 activity-log extents of 4 MiB, all written within a second by these
workloads, so this measures a warm log (which writes no log page) plus the once-a-second sync
(a flush and a records save when extents were cleared). A workload that keeps reaching cold
extents pays one page write and fdatasync per extent reached, as DRBD's does per AL miss.

    python3 bench/bookkeeping.py [ROUNDS] [SECONDS]      (defaults: 3 rounds of 8 s)

Needs a release build (cargo build --release).
"""

import os
import statistics
import sys

from localcluster import Cluster, cpu

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
T = os.environ.get("TRIREME_BIN", os.path.join(ROOT, "target/release/trireme"))
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 3
SECS = int(sys.argv[2]) if len(sys.argv) > 2 else 8

WORKLOADS = [
    ("s2d", ["--profile", "s2d"]),
    ("QD1 4K write", ["-b4K", "-w100", "-r", "-t1", "-o1", "-W1"]),
]


def main():
    clusters = []
    try:
        # vol0 (the export's) stays small; the benchmark's own volume is 1 GiB.
        clusters = [Cluster("disk", T, ["--insecure"], size="64M", store="file"),
                    Cluster("memory", T, ["--insecure", "--volatile-bookkeeping"], size="64M",
                            store="file")]
        for c in clusters:
            c.cli("volume", "create", "b", "--size", "1G", "--replicas", "3")
        results = {(w, c.name): [] for w, _ in WORKLOADS for c in clusters}
        for r in range(ROUNDS):
            for w, args in WORKLOADS:
                for c in clusters:
                    j = c.bench(*args, f"-d{SECS}", "volume:b")
                    results[(w, c.name)].append(j)
                    print(f"  round {r + 1} {w:13} {c.name:6}: {j['iops']:8.0f} IOPS, "
                          f"{cpu(j):6.1f} CPU us/IO, p90 write "
                          f"{j['write']['latency_us']['p90']:7.0f} us", flush=True)
        print()
        print(f"{'3-way, file store, native client':34} {'on disk':>10} {'in memory':>10} "
              f"{'disk/memory':>12}")
        for w, _ in WORKLOADS:
            def med(name, f):
                return statistics.median(f(j) for j in results[(w, name)])
            for label, f in [("IOPS", lambda j: j["iops"]),
                             ("CPU us per IO", cpu),
                             ("p90 write (us)", lambda j: j["write"]["latency_us"]["p90"])]:
                a, b = med("disk", f), med("memory", f)
                print(f"{w + ' ' + label:34} {a:10.1f} {b:10.1f} {a / b:12.3f}")
    finally:
        for c in clusters:
            c.stop()


if __name__ == "__main__":
    main()
