#!/usr/bin/env python3
"""Numbers for a cluster on etcd (issue 15), printed as tables.

    python3 bench/multiserver.py [--only datapath,attach,failover,recreate,scale] [--rounds 2]

Everything runs on this host, on 127.0.0.1, with an etcd member started here (Debian's
etcd-server) and `target/release/trireme` (run `make build` first):

* datapath: the same workloads through NBD on a volume of `trireme up` (embedded metadata) and
  on a volume of three `node run` daemons attached with `trireme attach` (etcd), in interleaved
  rounds: s2d (4K, 70:30 random, 10 x QD4) IOPS and QD1 4K write latency. Both clusters run on
  one host, so their links use UCX over shared memory (no RDMA here); the metadata backend is the
  only difference.
* attach: time from starting `trireme attach` to the NBD export serving (p50/p99 of N runs).
* failover: the longest write stall of a QD1 writer when a node daemon is killed (SIGKILL); the
  time until `status` names a new manager after the manager's daemon is killed.
* recreate: the time from a node's loss to its replicas fully re-created on the others (a
  1 GiB volume written full and left attached, so its writer on the client host makes the copy;
  `--down-out-interval 1s`, four daemons).
* scale: 16 node daemons on memory stores and 1000 volumes: time to create them through the
  manager's API, `status` latency, and etcd requests per second at idle (from etcd's metrics).
"""
import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
T = os.environ.get("TRIREME_BIN", os.path.join(ROOT, "target/release/trireme"))


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Etcd:
    def __init__(self, d):
        c, p = free_port(), free_port()
        self.url = f"127.0.0.1:{c}"
        self.proc = subprocess.Popen(
            ["etcd", "--name=b", f"--data-dir={d}/etcd",
             f"--listen-client-urls=http://{self.url}", f"--advertise-client-urls=http://{self.url}",
             f"--listen-peer-urls=http://127.0.0.1:{p}", f"--initial-advertise-peer-urls=http://127.0.0.1:{p}",
             f"--initial-cluster=b=http://127.0.0.1:{p}", "--log-level=error"],
            stdout=subprocess.DEVNULL, stderr=open(f"{d}/etcd.log", "w"))
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://{self.url}/health", timeout=1)
                return
            except Exception:
                time.sleep(0.1)
        raise SystemExit("etcd did not start")

    def grpc_requests(self):
        text = urllib.request.urlopen(f"http://{self.url}/metrics", timeout=5).read().decode()
        # Messages, not RPCs: a lease keep-alive is one message on a long-lived stream.
        return sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines()
                   if l.startswith("grpc_server_msg_received_total{"))

    def stop(self):
        self.proc.kill()
        self.proc.wait()


class EtcdCluster:
    """etcd, N node daemons, helpers; everything under one temp dir."""

    def __init__(self, d, n, store="file", extra=()):
        self.d, self.etcd = d, Etcd(d)
        self.env = dict(os.environ, TRIREME_ETCD=self.etcd.url, TRIREME_LOG="warn")
        self.nodes, self.store, self.extra = {}, store, list(extra)
        for i in range(1, n + 1):
            self.start_node(i)
        self.wait(lambda: len([x for x in self.status()["nodes"] if x["up"]]) == n, 30)

    def start_node(self, i):
        self.nodes[i] = subprocess.Popen(
            [T, "node", "run", "--id", str(i), "--insecure", "--listen", "127.0.0.1:0", "--dir", f"{self.d}/n{i}",
             "--store", self.store, "--lease-ttl", "3s", *self.extra],
            env=self.env, stdout=subprocess.DEVNULL, stderr=open(f"{self.d}/n{i}.log", "a"))

    def cli(self, *args):
        return subprocess.run([T, *args], env=self.env, capture_output=True, text=True, check=True).stdout

    def status(self):
        try:
            return json.loads(self.cli("--output", "json", "status"))
        except subprocess.CalledProcessError:
            return {"nodes": [], "volumes": []}

    def wait(self, cond, secs):
        t0 = time.time()
        while not cond():
            if time.time() - t0 > secs:
                raise SystemExit(f"timed out; logs in {self.d}")
            time.sleep(0.2)

    def attach(self, vol, sock):
        if os.path.exists(sock):
            os.unlink(sock)
        p = subprocess.Popen([T, "attach", vol, "--socket", sock, "--lease-ttl", "3s", *TIMEOUT], env=self.env,
                             stdout=subprocess.PIPE, stderr=open(f"{self.d}/attach.log", "a"), text=True)
        p.stdout.readline()
        return p

    def stop(self):
        for p in self.nodes.values():
            p.kill()
            p.wait()
        self.etcd.stop()


def detach(p):
    p.send_signal(signal.SIGTERM)
    p.wait()


def bench(uri, *flags):
    out = subprocess.run([T, "--output", "json", "bench", *flags, uri], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"trireme bench {' '.join(flags)} {uri}: {out.stderr.strip()}")
    return json.loads(out.stdout)


def make_source(d, size):
    """The fill's source, written and synced before any cluster starts (its writeback would
    otherwise stall the nodes' disk writes)."""
    src = f"{d}/fill.img"
    if not os.path.exists(src):
        with open(src, "wb") as f:
            f.write(os.urandom(size))
        subprocess.run(["sync"], check=True)
    return src


def fill(d, uri, size):
    """Writes the whole volume with random bytes, two 256 KiB requests in flight: deeper queues
    of large writes outlast the 1 s replica timeout on this machine's shared disk."""
    src = make_source(d, size)
    subprocess.run(["nbdcopy", "--requests=2", "--request-size=262144", src, uri], check=True)


# Both writers alike: a large fill on this machine's shared disk can stall every node past the
# default 1 s, and with no copy left a write fails (what issue 17's minimum copies is about).
TIMEOUT = ("--replica-timeout", "5s")
S2D = ("--profile", "s2d", "-d10", "-W2")
QD1 = ("-b4K", "-r", "-w100", "-t1", "-o1", "-d5", "-W1")


def datapath(rounds):
    rows = []
    with tempfile.TemporaryDirectory() as d:
        make_source(d, 1 << 30)
        # --insecure: the node daemons here serve plain TCP, so the embedded cluster does too.
        up = subprocess.Popen([T, "--data-dir", f"{d}/up", "up", "--size", "1G", "--port", "0", "--insecure",
                               *TIMEOUT],
                              stdout=subprocess.DEVNULL, stderr=open(f"{d}/up.log", "w"))
        for _ in range(200):
            if os.path.exists(f"{d}/up/exports"):
                break
            time.sleep(0.1)
        up_uri = open(f"{d}/up/exports").read().split()[0]
        c = EtcdCluster(d, 3)
        c.cli("volume", "create", "vol0", "--size", "1G", "--replicas", "3")
        a = c.attach("vol0", f"{d}/e.sock")
        et_uri = f"nbd+unix:///vol0?socket={d}/e.sock"
        # Fill both, so reads hit data.
        for u in (up_uri, et_uri):
            fill(d, u, 1 << 30)
        links = [json.loads(subprocess.run([T, "--data-dir", f"{d}/up", "--output", "json", "status"],
                                           capture_output=True, text=True).stdout)["volumes"][0]["client_links"]]
        print("links of up's writer: " + ", ".join(f"node {l['node']} {l['transport']}" for l in links[0]))
        for r in range(rounds):
            for name, uri in (("embedded (up)", up_uri), ("etcd (node run + attach)", et_uri)):
                s = bench(uri, *S2D)
                q = bench(uri, *QD1)
                rows.append((r, name, s["iops"], q["write"]["latency_us"]["p50"], q["write"]["latency_us"]["p99"]))
        detach(a)
        c.stop()
        up.send_signal(signal.SIGINT)
        up.wait()
    print("\n## Data path: embedded metadata vs etcd (NBD, 3-way, UCX over shared memory, interleaved)\n")
    print("| round | metadata | s2d IOPS | QD1 4K write p50 us | p99 us |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]:.0f} | {r[3]:.1f} | {r[4]:.1f} |")
    emb = [r for r in rows if r[1].startswith("embedded")]
    etc = [r for r in rows if r[1].startswith("etcd")]
    ratio = statistics.median(x[2] for x in etc) / statistics.median(x[2] for x in emb)
    lat = statistics.median(x[3] for x in etc) / statistics.median(x[3] for x in emb)
    print(f"\netcd / embedded, medians: s2d IOPS {ratio:.3f}x, QD1 write p50 {lat:.3f}x")


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def attach_times(n):
    with tempfile.TemporaryDirectory() as d:
        c = EtcdCluster(d, 3)
        c.cli("volume", "create", "v", "--size", "64M", "--replicas", "3")
        ts = []
        for _ in range(n):
            t0 = time.time()
            a = c.attach("v", f"{d}/a.sock")
            ts.append((time.time() - t0) * 1000)
            detach(a)
        c.stop()
    print(f"\n## Attach ({n} attaches of a 3-way volume; process start to NBD serving)\n")
    print(f"p50 {pct(ts, 50):.0f} ms, p99 {pct(ts, 99):.0f} ms, max {max(ts):.0f} ms")
    print("each: " + " ".join(f"{t:.0f}" for t in ts))


def failover():
    try:
        import nbd  # python3-libnbd
    except ImportError:  # a Python of its own (pyenv) does not see Debian's packages
        sys.path.append("/usr/lib/python3/dist-packages")
        import nbd
    with tempfile.TemporaryDirectory() as d:
        c = EtcdCluster(d, 3)
        c.cli("volume", "create", "v", "--size", "256M", "--replicas", "3")
        a = c.attach("v", f"{d}/a.sock")
        h = nbd.NBD()
        h.connect_uri(f"nbd+unix:///v?socket={d}/a.sock")
        manager = c.status()["manager"]["node"]
        victim = next(i for i in c.nodes if i != manager)
        buf = b"x" * 4096
        worst, t_end, killed, off = 0.0, time.time() + 8, False, 0
        t_start = time.time()
        while time.time() < t_end:
            if not killed and time.time() - t_start > 2:
                c.nodes[victim].kill()
                killed = True
                t_kill = time.time()
            t0 = time.time()
            h.pwrite(buf, off)
            dt = time.time() - t0
            if killed:
                worst = max(worst, dt)
            off = (off + 4096 * 37) % (256 << 20)
        h.shutdown()
        # Manager takeover.
        t0 = time.time()
        c.nodes[manager].kill()
        c.wait(lambda: c.status().get("manager", {}).get("node") not in (None, manager), 30)
        takeover = time.time() - t0
        detach(a)
        c.stop()
    print("\n## Failover (3-way volume, lease TTL 3 s, --replica-timeout 5 s: a killed daemon's connections close, so its take-out waits for no timeout)\n")
    print(f"node daemon SIGKILLed under a QD1 4K writer: longest write {worst * 1000:.0f} ms (writes flowing again after it)")
    print(f"manager daemon SIGKILLed: status names a new manager after {takeover:.2f} s")


def recreate():
    with tempfile.TemporaryDirectory() as d:
        make_source(d, 1 << 30)
        c = EtcdCluster(d, 4, extra=("--down-out-interval", "1s"))
        c.cli("volume", "create", "v", "--size", "1G", "--replicas", "3")
        a = c.attach("v", f"{d}/a.sock")
        fill(d, f"nbd+unix:///v?socket={d}/a.sock", 1 << 30)
        # The volume stays attached: the copy is made by its writer on the client host.
        manager = c.status()["manager"]["node"]
        vol = c.status()["volumes"][0]
        victim = next(r["node"] for r in vol["replicas"] if r["node"] != manager)
        t0 = time.time()
        c.nodes[victim].kill()

        def done():
            v = c.status()["volumes"][0]
            reps = v["replicas"]
            return len(reps) == 3 and all(r["state"] == "in-sync" and r["node"] != victim for r in reps)
        c.wait(done, 600)
        took = time.time() - t0
        detach(a)
        c.stop()
    print("\n## Re-creating a lost node's replicas (1 GiB volume written full and attached, down-out after 1 s)\n")
    print(f"node killed -> all 3 copies in sync on other nodes: {took:.1f} s ({1024 / took:.0f} MiB/s over the whole)")


def scale(nodes, volumes):
    with tempfile.TemporaryDirectory() as d:
        c = EtcdCluster(d, nodes, store="memory")
        ctl = c.status()["manager"]["control"]
        host, port = ctl.rsplit(":", 1)
        s = socket.create_connection((host, int(port)))
        f = s.makefile("rw")
        t0 = time.time()
        for i in range(volumes):
            f.write(json.dumps({"cmd": "volume_create", "name": f"v{i}", "size": 4 << 20, "replicas": 3}) + "\n")
            f.flush()
            r = json.loads(f.readline())
            if "ok" not in r:
                raise SystemExit(f"create v{i}: {r}")
        create = time.time() - t0
        st = []
        for _ in range(3):
            t1 = time.time()
            c.cli("status")
            st.append(time.time() - t1)
        t1 = time.time()
        c.cli("volume", "list")
        vl = time.time() - t1
        r0 = c.etcd.grpc_requests()
        time.sleep(10)
        idle = (c.etcd.grpc_requests() - r0) / 10
        c.stop()
    print(f"\n## Metadata scale ({nodes} node daemons on memory stores, {volumes} 3-way volumes, one etcd member)\n")
    print(f"create {volumes} volumes through the manager's API: {create:.1f} s ({volumes / create:.0f}/s)")
    print(f"`trireme status`: {statistics.median(st):.2f} s (median of 3; it asks every replica for its state)")
    print(f"`trireme volume list`: {vl:.2f} s")
    print(f"etcd requests (gRPC messages received) per second at idle: {idle:.1f} (lease refreshes every TTL/3 by {nodes} daemons, the manager's liveness read every 2 s)")


def main():
    # A section that fails leaves no process behind: this process group is ended on exit.
    os.setpgrp()
    try:
        run()
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.killpg(0, signal.SIGTERM)


def run():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="datapath,attach,failover,recreate,scale")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--attaches", type=int, default=20)
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--volumes", type=int, default=1000)
    a = ap.parse_args()
    if not os.path.exists(T) or not shutil.which("etcd"):
        raise SystemExit("needs target/release/trireme (make build) and etcd (scripts/setup.sh)")
    print("# trireme on etcd: all processes on one host (127.0.0.1); UCX over shared memory, no RDMA")
    only = a.only.split(",")
    if "datapath" in only:
        datapath(a.rounds)
    if "attach" in only:
        attach_times(a.attaches)
    if "failover" in only:
        failover()
    if "recreate" in only:
        recreate()
    if "scale" in only:
        scale(a.nodes, a.volumes)


if __name__ == "__main__":
    sys.exit(main())
