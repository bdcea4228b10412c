#!/usr/bin/env python3
"""What failures cost: the I/O stall when a replica dies, resync after an outage, rebuild rate.

Every workload goes through the NBD export of `trireme up` (the writer lives in `up`, which also
restarts dead nodes), measured by `trireme bench`. Links between processes are unix sockets on
this host; there is no RDMA device here.

1. Stall: `--profile s2d` for --stall-secs; a node is SIGKILLed (and, in a second run, SIGSTOPped
   for 5 s) in the middle. Reported: errors (the run fails on any), max latency, p99.99.
2. Outage: file store; s2d runs, `trireme node stop 2`, s2d runs for --outage-secs (its write
   bytes are the bytes written during the outage), `trireme node start 2`, s2d keeps running
   until the replica is in sync. Reported: bytes resynced vs bytes written meanwhile, time from
   `node start` to in-sync.
3. Rebuild: memory store, a --rebuild-size volume filled with sequential 1 MiB writes; a node is
   SIGKILLed, comes back empty and is rebuilt by a full compare resync. Reported: GiB/s of the
   rebuild, next to the native client's 1 MiB sequential read and write bandwidth measured on a
   second volume of the same cluster just before (the transport floor).

4. Drain: memory store, 4 nodes, a --rebuild-size volume filled as above; `trireme node drain`
   of a node holding a replica, timed. Reported: GiB/s of the copy to the new node and of the
   whole command, next to the same floor measured on that cluster.

Usage: python3 bench/failover.py [--stall-secs 20] [--outage-secs 30] [--rebuild-size 4G]
       [--only stall,outage,rebuild,drain] [--json out.json]
"""

import argparse
import datetime
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", "release", "trireme")


class Cluster:
    def __init__(self, args):
        self.dir = tempfile.mkdtemp(prefix="trireme-failover-")
        self.log = open(os.path.join(self.dir, "up.log"), "w")
        self.proc = subprocess.Popen(
            [BIN, "--data-dir", self.dir, "up", "--port", "0", *args],
            stdout=self.log, stderr=self.log, stdin=subprocess.DEVNULL)
        t0 = time.time()
        while not os.path.exists(os.path.join(self.dir, "exports")):
            if self.proc.poll() is not None or time.time() - t0 > 120:
                sys.exit(f"trireme up did not start:\n{self.text()}")
            time.sleep(0.05)
        self.uri = open(os.path.join(self.dir, "exports")).readline().strip()

    def text(self):
        with open(os.path.join(self.dir, "up.log")) as f:
            return f.read()

    def cli(self, *args, check=True):
        p = subprocess.run([BIN, "--data-dir", self.dir, *args], capture_output=True, text=True)
        if check and p.returncode != 0:
            sys.exit(f"trireme {' '.join(args)} failed: {p.stderr}")
        return p.stdout

    def pid(self, node):
        for line in open(os.path.join(self.dir, "pids")):
            name, pid = line.split()
            if name == f"node-{node}":
                return int(pid)
        sys.exit(f"node {node} has no pid")

    def states(self):
        s = json.loads(self.cli("--output", "json", "status"))
        return [r["state"] for v in s["volumes"] for r in v["replicas"]]

    def wait_in_sync(self, limit=600):
        t0 = time.time()
        while any(s != "in-sync" for s in self.states()):
            if time.time() - t0 > limit:
                sys.exit(f"not in sync after {limit}s: {self.states()}")
            time.sleep(0.05)
        return time.time()

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        subprocess.run(["rm", "-rf", self.dir])


def bench(target, *args, data_dir=None):
    """Starts `trireme bench --output json`; returns the process."""
    cmd = [BIN]
    if data_dir:
        cmd += ["--data-dir", data_dir]
    cmd += ["--output", "json", "bench", *args, target]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def result(p):
    out, err = p.communicate()
    if p.returncode != 0:
        sys.exit(f"bench failed ({p.returncode}): {err}")
    return json.loads(out)


def resyncs(text):
    """(timestamp, full, copied_bytes, ms) of each finished resync in a log."""
    out = []
    for line in text.splitlines():
        if "resync done" not in line:
            continue
        ts = datetime.datetime.fromisoformat(line.split()[0].rstrip("Z")).timestamp()
        f = dict(re.findall(r"(\w+)=(\S+)", line))
        out.append((ts, f["full"] == "true", int(f["copied_bytes"]), int(f["ms"])))
    return out


def gib(b):
    return b / (1 << 30)


def stall(secs):
    rows = []
    for fault in ["SIGKILL", "SIGSTOP 5s"]:
        c = Cluster(["--store", "memory", "--size", "1G"])
        try:
            p = bench(c.uri, "--profile", "s2d", f"-d{secs}", "-W0")
            time.sleep(secs / 2)
            pid = c.pid(2)
            if fault == "SIGKILL":
                os.kill(pid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGSTOP)
                time.sleep(5)
                os.kill(pid, signal.SIGCONT)
            r = result(p)
            lat = r["total"]["latency_us"]
            rows.append({"fault": fault, "errors": 0, "iops": r["iops"],
                         "max_ms": lat["max"] / 1000, "p9999_ms": lat["p9999"] / 1000,
                         "p99_ms": lat["p99"] / 1000})
            c.wait_in_sync()
        finally:
            c.stop()
    print("\n## 1. I/O stall when a replica node fails under s2d load (NBD, 3-way memory volume)")
    print(f"{'fault on node 2':<16} {'errors':>6} {'IOPS':>9} {'p99 ms':>8} {'p99.99 ms':>10} {'max ms':>8}")
    for r in rows:
        print(f"{r['fault']:<16} {r['errors']:>6} {r['iops']:>9,.0f} {r['p99_ms']:>8.2f} "
              f"{r['p9999_ms']:>10.2f} {r['max_ms']:>8.1f}")
    print("(replica timeout 1s: a frozen node costs one timeout; a killed one is seen at once)")
    return rows


def outage(secs):
    c = Cluster(["--store", "file", "--size", "4G"])
    try:
        result(bench(c.uri, "--profile", "s2d", "-d5", "-W0"))
        c.cli("node", "stop", "2")
        during = result(bench(c.uri, "--profile", "s2d", f"-d{secs}", "-W0"))
        p = bench(c.uri, "--profile", "s2d", "-d60", "-W0")
        time.sleep(1)
        c.cli("node", "start", "2")
        started = time.time()
        synced = c.wait_in_sync()
        p.send_signal(signal.SIGINT)
        p.communicate()
        done = [r for r in resyncs(c.text()) if r[0] >= started - 1]
        if not done:
            sys.exit("no resync logged")
        _, full, copied, ms = done[-1]
        written = during["write"]["bytes"]
        row = {"outage_s": secs, "written_bytes": written, "resynced_bytes": copied,
               "full": full, "resync_ms": ms, "start_to_in_sync_s": synced - started,
               "outage_write_iops": during["write"]["iops"]}
    finally:
        c.stop()
    print(f"\n## 2. Resync after a {secs}s outage of one replica under s2d (NBD, 3-way file volume, 4 GiB)")
    print(f"bytes written during the outage: {written:>14,} ({gib(written):.2f} GiB, "
          f"{row['outage_write_iops']:,.0f} write IOPS)")
    print(f"bytes resynced:                  {copied:>14,} ({gib(copied):.2f} GiB, "
          f"{copied / max(written, 1):.2f}x of written; {'full' if full else 'incremental'})")
    print(f"resync time: {ms / 1000:.1f}s; node start -> in sync: {row['start_to_in_sync_s']:.1f}s "
          "(with the s2d load still running)")
    return row


def floor_and_fill(c, size_b):
    """The transport floor (native client, 1 MiB QD16 reads and writes on a second volume of the
    cluster), then every byte of the exported volume written once."""
    c.cli("volume", "create", "floor", "--size", "1G")
    floor = {}
    for name, w in [("read", "-w0"), ("write", "-w100")]:
        r = result(bench("volume:floor", "-b1M", "-s", "-t1", "-o16", "-d5", "-W1", w,
                         data_dir=c.dir))
        floor[name] = r["mib_per_s"] / 1024
    c.cli("volume", "delete", "floor")
    # Sequential 1 MiB writes wrap around the volume.
    fill = result(bench(c.uri, "-b1M", "-s", "-w100", "-t1", "-o16",
                        f"-d{max(10, size_b // (100 << 20))}", "-W0"))
    if fill["write"]["bytes"] < size_b:
        sys.exit(f"fill wrote only {fill['write']['bytes']} of {size_b} bytes")
    return floor


def size_bytes(size):
    return int(size[:-1]) << {"G": 30, "M": 20}[size[-1]]


def rebuild(size):
    size_b = size_bytes(size)
    c = Cluster(["--store", "memory", "--size", size, "--nodes", "3"])
    try:
        floor = floor_and_fill(c, size_b)
        t_kill = time.time()
        os.kill(c.pid(3), signal.SIGKILL)
        c.wait_in_sync(limit=1200)
        done = [r for r in resyncs(c.text()) if r[0] >= t_kill]
        _, full, copied, ms = done[-1]
        row = {"size": size_b, "copied_bytes": copied, "full": full, "ms": ms,
               "gib_per_s": gib(copied) / (ms / 1000), "floor_read_gib_s": floor["read"],
               "floor_write_gib_s": floor["write"]}
    finally:
        c.stop()
    print(f"\n## 3. Rebuild of a lost replica, {size} memory volume (full compare resync)")
    print(f"rebuilt {gib(copied):.2f} GiB in {ms / 1000:.1f}s = {row['gib_per_s']:.2f} GiB/s")
    print(f"transport floor, native client 1 MiB QD16 on the same cluster: read "
          f"{floor['read']:.2f} GiB/s, write {floor['write']:.2f} GiB/s (3-way)")
    return row


def drain(size):
    """`trireme node drain` of a node holding a filled volume's replica, on a 4-node cluster:
    the copy goes to the fourth node while the volume stays attached."""
    size_b = size_bytes(size)
    c = Cluster(["--store", "memory", "--size", size, "--nodes", "4"])
    try:
        floor = floor_and_fill(c, size_b)
        src = next(r["node"] for v in json.loads(c.cli("--output", "json", "status"))["volumes"]
                   for r in v["replicas"])
        t0 = time.time()
        c.cli("node", "drain", str(src))
        wall = time.time() - t0
        done = [r for r in resyncs(c.text()) if r[0] >= t0]
        if not done:
            sys.exit("no resync logged for the drain")
        _, full, copied, ms = done[-1]
        row = {"size": size_b, "node": src, "copied_bytes": copied, "resync_ms": ms,
               "drain_wall_s": wall, "gib_per_s": gib(copied) / (ms / 1000),
               "wall_gib_per_s": gib(size_b) / wall, "floor_read_gib_s": floor["read"],
               "floor_write_gib_s": floor["write"]}
    finally:
        c.stop()
    print(f"\n## 4. Drain of node {src}: its replica of a {size} memory volume moves to node 4")
    print(f"copy: {gib(copied):.2f} GiB in {ms / 1000:.1f}s = {row['gib_per_s']:.2f} GiB/s; "
          f"whole `node drain` command: {wall:.1f}s = {row['wall_gib_per_s']:.2f} GiB/s of volume")
    print(f"transport floor, native client 1 MiB QD16 on the same cluster: read "
          f"{floor['read']:.2f} GiB/s, write {floor['write']:.2f} GiB/s (3-way)")
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stall-secs", type=int, default=20)
    ap.add_argument("--outage-secs", type=int, default=30)
    ap.add_argument("--rebuild-size", default="4G")
    ap.add_argument("--only", default="stall,outage,rebuild,drain")
    ap.add_argument("--json")
    a = ap.parse_args()
    if not os.path.exists(BIN):
        sys.exit(f"{BIN} is missing: run `cargo build --release` (make build)")
    print(f"# trireme failover benchmark, {platform.node()}, {os.cpu_count()} CPUs, "
          f"{datetime.date.today()}; links: unix sockets between processes (no RDMA device)")
    out = {}
    only = a.only.split(",")
    if "stall" in only:
        out["stall"] = stall(a.stall_secs)
    if "outage" in only:
        out["outage"] = outage(a.outage_secs)
    if "rebuild" in only:
        out["rebuild"] = rebuild(a.rebuild_size)
    if "drain" in only:
        out["drain"] = drain(a.rebuild_size)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
