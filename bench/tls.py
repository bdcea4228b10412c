#!/usr/bin/env python3
"""What TLS costs, side by side in one run (issue 16).

Two local clusters run at once, each 3 nodes with a 3-way memory volume: one as `trireme up`
starts by default (mutual TLS on the node links, NBD over TLS on TCP) and one started with
`--insecure` (plain text). Rounds alternate between them and the medians are compared:

1. s2d (the seeds' profile) through the native client over TCP (`volume:vol0?transport=tcp`:
   TCP through the kernel, not the same-host sockets), so every request crosses a TLS link in
   the first cluster: IOPS, CPU us per IO (generator + storage processes), p90 read and write.
2. NBD over TCP, TLS against plain: the whole volume read with 4K requests at QD1 and QD40
   (`nbdcopy --request-size=4096 --requests=QD --connections=1 --no-extents URI null:`;
   nbdcopy speaks NBD over TLS, qemu-img bench cannot take TLS credentials).

UCX is not involved (TCP only); this host has no RDMA, so UCX's per-message secret (not built
yet) is not measured here.

    python3 bench/tls.py [ROUNDS] [SECONDS]      (defaults: 3 rounds of 8 s)
    python3 bench/tls.py --before OLD/trireme [ROUNDS] [SECONDS]

With --before, both clusters run TLS, one on this build and one on OLD: what a change costs
on the TLS links (issue 34: connection caps, deadlines, authorization on the header, the
payload budget and keepalives, against the build before them).

Needs a release build (cargo build --release) and libnbd-bin (nbdcopy).
"""

import os
import statistics
import subprocess
import sys
import time

from localcluster import Cluster, cpu

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
T = os.environ.get("TRIREME_BIN", os.path.join(ROOT, "target/release/trireme"))
ARGS = sys.argv[1:]
BEFORE = None
if ARGS[:1] == ["--before"]:
    BEFORE, ARGS = ARGS[1], ARGS[2:]
ROUNDS = int(ARGS[0]) if len(ARGS) > 0 else 3
SECS = int(ARGS[1]) if len(ARGS) > 1 else 8
# The two sides: (name, binary, extra args of `up`).
SIDES = ([("new", T, []), ("before", BEFORE, [])] if BEFORE
         else [("tls", T, []), ("plain", T, ["--insecure"])])


def nbd_read(c, depth):
    """IOPS of reading the whole volume in 4K requests at queue depth `depth`."""
    t0 = time.monotonic()
    out = subprocess.run(["nbdcopy", "--request-size=4096", f"--requests={depth}",
                          "--connections=1", "--no-extents", c.tcp, "null:"],
                         capture_output=True, text=True)
    secs = time.monotonic() - t0
    if out.returncode != 0:
        raise SystemExit(f"{c.name}: nbdcopy failed:\n{out.stderr}")
    return (256 << 20) / 4096 / secs


def main():
    clusters = []
    try:
        clusters = [Cluster(name, binary, extra) for name, binary, extra in SIDES]
        assert clusters[0].tls and clusters[1].tls == (BEFORE is not None)
        a_name, b_name = SIDES[0][0], SIDES[1][0]
        for c in clusters:
            # s2d runs on its own volume: its native client takes a new epoch, which would
            # fence the NBD export's writer of vol0.
            c.cli("volume", "create", "s2d", "--size", "256M", "--replicas", "3")
            # The memory store allocates at a page's first write: fill once, untimed.
            c.bench("-s", "-b1M", "-w100", "-t1", "-o4", "-W0", "-d6", "volume:s2d")
            c.bench("-s", "-b1M", "-w100", "-t1", "-o4", "-W0", "-d6", c.unix)
        print(f"$ trireme bench --profile s2d -d{SECS} 'volume:s2d?transport=tcp'   "
              f"# {ROUNDS} rounds, alternating: {a_name} cluster, {b_name} cluster")
        s2d = {c.name: [] for c in clusters}
        for r in range(ROUNDS):
            for c in clusters:
                j = c.bench("--profile", "s2d", f"-d{SECS}", "volume:s2d?transport=tcp")
                s2d[c.name].append(j)
                print(f"  round {r + 1} {c.name:5}: {j['iops']:8.0f} IOPS, {cpu(j):6.1f} CPU us/IO")

        def med(name, f):
            return statistics.median(f(j) for j in s2d[name])
        rows = [
            ("IOPS", lambda j: j["iops"]),
            ("CPU us per IO", cpu),
            ("p90 read (us)", lambda j: j["read"]["latency_us"]["p90"]),
            ("p90 write (us)", lambda j: j["write"]["latency_us"]["p90"]),
        ]
        print()
        print(f"{'s2d, 3-way, native client over TCP':38} {a_name:>10} {b_name:>10} {'ratio':>10}")
        for label, f in rows:
            a, b = med(a_name, f), med(b_name, f)
            print(f"{label:38} {a:10.1f} {b:10.1f} {a / b:10.3f}")

        print()
        print("$ nbdcopy --request-size=4096 --requests=QD --connections=1 --no-extents URI null:"
              "   # 256 MiB, alternating")
        nbd = {(c.name, d): [] for c in clusters for d in (1, 40)}
        for r in range(ROUNDS):
            for d in (1, 40):
                for c in clusters:
                    nbd[(c.name, d)].append(nbd_read(c, d))
        print(f"{'NBD 4K reads, IOPS':38} {a_name:>10} {b_name:>10} {'ratio':>10}")
        for d in (1, 40):
            a = statistics.median(nbd[(a_name, d)])
            b = statistics.median(nbd[(b_name, d)])
            print(f"{'QD' + str(d):38} {a:10.0f} {b:10.0f} {a / b:10.3f}")
    finally:
        for c in clusters:
            c.stop()


if __name__ == "__main__":
    main()
