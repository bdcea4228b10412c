#!/usr/bin/env python3
"""Patch Tuesday under load (issue 17): `trireme maintenance rolling` restarts every node of a
3-node file-store cluster in turn while s2d (4K, 70:30, random, 10 threads x 4) runs through
the cluster's NBD export, and prints what it cost: the workload's longest I/O (the stall a
guest would see), each node's downtime and time back to in sync, and the bytes each resync
copied against the bytes written while that node was away.

    python3 bench/rolling.py [SECONDS] [SIZE]      (defaults: 40 s of s2d, a 1G volume)
    sudo python3 bench/rolling.py SECONDS --etcd   (servers on etcd, below)

With --etcd it runs on `scripts/netns-cluster.sh up 3` instead: three `trireme node run`
daemons in network namespaces on etcd, every link on TLS, vol0 (1G) attached by a writer in a
client namespace; each daemon starts itself again in place, the manager's after handing its
role over. Needs root and a release build (cargo build --release).
"""

import json
import os
import subprocess
import sys
import time

from localcluster import Cluster

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
T = os.environ.get("TRIREME_BIN", os.path.join(ROOT, "target/release/trireme"))
ETCD = "--etcd" in sys.argv
ARGS = [a for a in sys.argv[1:] if a != "--etcd"]
SECS = int(ARGS[0]) if ARGS else 40
SIZE = ARGS[1] if len(ARGS) > 1 and not ETCD else "1G"
NETNS_DIR = "/tmp/trireme-netns"


class NetnsCluster:
    """scripts/netns-cluster.sh: servers on etcd, each in its own network namespace."""

    def __init__(self):
        env = dict(os.environ, TRIREME_BIN=T, TRIREME_NETNS_DIR=NETNS_DIR)
        subprocess.run(["bash", os.path.join(ROOT, "scripts/netns-cluster.sh"), "up", "3"],
                       check=True, env=env, stdout=subprocess.DEVNULL)
        self.load = ["ip", "netns", "exec", "trireme-c", T]
        self.unix = f"nbd+unix:///vol0?socket={NETNS_DIR}/vol0.sock"
        self.admin = [T, "--etcd", "https://10.77.0.2:2379", "--tls-identity",
                      f"{NETNS_DIR}/tls-admin"]
        self.what = ("3 servers on etcd (network namespaces, TLS on every link), file store, "
                     "1G 3-way volume; UCX not used (TCP)")

    def stop(self):
        subprocess.run(["bash", os.path.join(ROOT, "scripts/netns-cluster.sh"), "down"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


class UpCluster:
    def __init__(self):
        self.c = Cluster("rolling", T, ["--insecure"], size=SIZE, store="file")
        self.load = [T, "--data-dir", self.c.dir]
        self.unix = self.c.unix
        self.admin = [T, "--data-dir", self.c.dir]
        self.what = (f"3 nodes, file store, {SIZE} 3-way volume; UCX not used "
                     "(TCP/unix sockets, one host)")

    def stop(self):
        self.c.stop()


def main():
    c = NetnsCluster() if ETCD else UpCluster()
    try:
        load = subprocess.Popen(
            c.load + ["--output", "json", "bench", "--profile", "s2d",
                      f"-d{SECS}", "-W0", c.unix],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(5)
        t0 = time.monotonic()
        out = subprocess.run(c.admin + ["--output", "json", "maintenance", "rolling"],
                             capture_output=True, text=True)
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
        print("$ trireme maintenance rolling" + (" --etcd ..." if ETCD else ""))
        print(c.what)
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
