#!/usr/bin/env python3
"""Patch Tuesday under load (issue 17): `trireme maintenance rolling` restarts every node of a
3-node file-store cluster in turn while s2d (4K, 70:30, random, 10 threads x 4) runs through
the cluster's NBD export, and prints what it cost: the workload's longest I/O (the stall a
guest would see), each node's downtime and time back to in sync, and the bytes each resync
copied against the bytes written while that node was away.

    python3 bench/rolling.py [SECONDS] [SIZE]      (defaults: 40 s of s2d, a 1G volume)

Needs a release build (cargo build --release).
"""

import json
import os
import subprocess
import sys
import time

from localcluster import Cluster

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
T = os.environ.get("TRIREME_BIN", os.path.join(ROOT, "target/release/trireme"))
SECS = int(sys.argv[1]) if len(sys.argv) > 1 else 40
SIZE = sys.argv[2] if len(sys.argv) > 2 else "1G"


def main():
    c = Cluster("rolling", T, ["--insecure"], size=SIZE, store="file")
    try:
        load = subprocess.Popen(
            [T, "--data-dir", c.dir, "--output", "json", "bench", "--profile", "s2d",
             f"-d{SECS}", "-W0", c.unix],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(5)
        t0 = time.monotonic()
        out = subprocess.run([T, "--data-dir", c.dir, "--output", "json", "maintenance",
                              "rolling"], capture_output=True, text=True)
        rolled = time.monotonic() - t0
        if out.returncode != 0:
            raise SystemExit(f"maintenance rolling failed:\n{out.stderr}")
        r = json.loads(out.stdout)
        stdout, stderr = load.communicate()
        if load.returncode != 0:
            raise SystemExit(f"the workload failed:\n{stderr}")
        j = json.loads(stdout)
        secs = j.get("duration_s") or SECS
        write_rate = j["write"]["bytes"] / secs
        print(f"$ trireme bench --profile s2d -d{SECS} -W0 NBD-export   # while, from 5 s in:")
        print("$ trireme maintenance rolling")
        print(f"3 nodes, file store, {SIZE} 3-way volume; UCX not used (TCP/unix sockets, one host)")
        print()
        print(f"{'node':>4} {'down (s)':>9} {'in sync (s)':>12} {'resynced':>12} "
              f"{'written away':>13} {'ratio':>6}")
        for n in r["nodes"]:
            away = write_rate * n["total_ms"] / 1000
            print(f"{n['node']:>4} {n['down_ms'] / 1000:9.2f} {n['total_ms'] / 1000:12.2f} "
                  f"{n['resynced_bytes'] / 2**20:10.1f}Mi {away / 2**20:11.1f}Mi "
                  f"{n['resynced_bytes'] / max(away, 1):6.2f}"
                  + ("  (full compare)" if n["full"] else ""))
        print()
        print(f"rolling restart: {r['total_ms'] / 1000:.1f} s ({rolled:.1f} s wall)")
        print(f"workload: {j['iops']:.0f} IOPS over {secs} s, errors: none; "
              f"max latency {j['total']['latency_us']['max'] / 1000:.1f} ms "
              f"(p99 {j['total']['latency_us'].get('p99', 0) / 1000:.2f} ms)")
    finally:
        c.stop()


if __name__ == "__main__":
    main()
