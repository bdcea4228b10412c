#!/usr/bin/env python3
"""What recording a take-out costs when a client's writer records through the manager
(issue 64), side by side with a writer that records in etcd itself, in one run.

One etcd on 127.0.0.1 with client-certificate authentication and trireme's roles on, three
node daemons (`node run`, file stores, mutual TLS), and two volumes attached at once
on this host:
  * `direct`, attached with the operator's certificate: its writer writes etcd itself, as
    every writer did before;
  * `managed`, attached with a client's certificate: its writer asks the manager (control
    port, mutual TLS), which checks it is the writer of record and writes etcd.
Each volume has three copies, one per node. Each round kills node 3's daemon (-9), writes 4 KiB
to each volume (qemu-io), which takes the copy on node 3 out, restarts the daemon and waits until both volumes are in sync again. The
writers log `replica taken out ... recorded_ms=N`: the time from asking to record the copy out
to the record being durable, while the write that failed waits. Printed: the median and max
of each, and their ratio. Everything runs on this host (no RDMA; the data path is TCP with
mutual TLS); the manager is one of the node daemons, on this host too.

    python3 bench/takeout_cost.py [ROUNDS]      (default 10; needs target/release/trireme,
                                                 etcd-server, qemu-utils)
"""

import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from multiserver import T, free_port  # noqa: E402


def run(args, **kw):
    r = subprocess.run(args, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"{' '.join(args)}: {r.stderr}")
    return r.stdout


def wait_for(what, f, within=60):
    t0 = time.time()
    while not f():
        if time.time() - t0 > within:
            sys.exit(f"timed out: {what}")
        time.sleep(0.2)


class World:
    def __init__(self, d):
        self.d = d
        self.procs = []
        ca = f"{d}/ca"
        run([T, "ca", "init", "--dir", ca])
        issue = lambda what, out: run([T, "ca", "issue", *what, "--ca", ca, "--out", f"{d}/{out}"])
        issue(["server", "--san", "127.0.0.1"], "etcd")
        for n in (1, 2, 3):
            issue(["node", str(n), "--san", "127.0.0.1"], f"node-{n}")
        issue(["admin"], "admin")
        issue(["client", "alice"], "alice")
        c, p = free_port(), free_port()
        self.etcd = f"https://127.0.0.1:{c}"
        self.spawn("etcd", ["etcd", "--name=m0", f"--data-dir={d}/etcd-data",
                            f"--listen-client-urls={self.etcd}", f"--advertise-client-urls={self.etcd}",
                            f"--listen-peer-urls=http://127.0.0.1:{p}",
                            f"--initial-advertise-peer-urls=http://127.0.0.1:{p}",
                            f"--initial-cluster=m0=http://127.0.0.1:{p}",
                            f"--cert-file={d}/etcd/server-cert.pem", f"--key-file={d}/etcd/server-key.pem",
                            f"--trusted-ca-file={d}/etcd/ca-cert.pem", "--client-cert-auth",
                            "--log-level=warn"])
        wait_for("etcd", lambda: self.cli("admin", ["etcd", "rbac", "--client", "alice", "--node", "1,2,3"], check=False).returncode == 0)
        self.nodes = {}
        for n in (1, 2, 3):
            self.start_node(n)
        wait_for("three nodes up", lambda: self.nodes_up() == 3)

    def spawn(self, name, args):
        p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=open(f"{self.d}/{name}.log", "a"),
                             start_new_session=True)
        self.procs.append(p)
        return p

    def cli(self, who, args, check=True):
        r = subprocess.run([T, "--etcd", self.etcd, "--tls-identity", f"{self.d}/{who}", *args],
                           capture_output=True, text=True)
        if check and r.returncode != 0:
            sys.exit(f"trireme {args} as {who}: {r.stderr}")
        return r

    def start_node(self, n):
        self.nodes[n] = self.spawn(f"node-{n}", [
            T, "--etcd", self.etcd, "node", "run", "--id", str(n), "--listen", "127.0.0.1:0",
            "--store", "file", "--lease-ttl", "2s", "--dir", f"{self.d}/n{n}",
            "--tls-dir", f"{self.d}/node-{n}"])

    def nodes_up(self):
        r = self.cli("admin", ["--output", "json", "status"], check=False)
        if r.returncode != 0:
            return 0
        return sum(1 for n in json.loads(r.stdout)["nodes"] if n["up"])

    def attach(self, who, vol):
        sock = f"{self.d}/{vol}.sock"
        p = subprocess.Popen([T, "--etcd", self.etcd, "--tls-identity", f"{self.d}/{who}",
                              "--data-dir", f"{self.d}/attach-{vol}", "attach", vol,
                              "--lease-ttl", "2s", "--socket", sock],
                             stdout=subprocess.PIPE, stderr=open(f"{self.d}/attach-{vol}.log", "w"),
                             start_new_session=True)
        self.procs.append(p)
        p.stdout.readline()
        wait_for(f"{vol} served", lambda: os.path.exists(sock))
        return f"nbd+unix:///{vol}?socket={sock}"

    def in_sync(self, vol):
        r = self.cli("admin", ["--output", "json", "volume", "info", vol], check=False)
        return r.returncode == 0 and all(x["state"] == "in-sync" for x in json.loads(r.stdout)["replicas"])

    def stop(self):
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def recorded(log):
    return [int(m) for m in re.findall(r"replica taken out.*?recorded_ms=(\d+)", open(log).read())]


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    d = tempfile.mkdtemp(prefix="takeout-")
    w = World(d)
    try:
        # Three copies each, one on every node: node 3 holds a copy of both.
        for v, allow in (("direct", []), ("managed", ["--allow", "alice"])):
            w.cli("admin", ["volume", "create", v, "--size", "64M", "--replicas", "3", *allow])
        uris = {"direct": w.attach("admin", "direct"), "managed": w.attach("alice", "managed")}
        for r in range(rounds):
            os.killpg(w.nodes[3].pid, signal.SIGKILL)
            w.nodes[3].wait()
            for v, uri in uris.items():
                run(["qemu-io", "-f", "raw", "-c", f"write -P {r % 250 + 1} {r * 4096} 4k", uri])
            w.start_node(3)
            wait_for("both volumes in sync", lambda: all(w.in_sync(v) for v in uris), within=120)
        out = {v: recorded(f"{d}/attach-{v}.log") for v in uris}
    finally:
        w.stop()
    print(f"take-outs recorded over {rounds} rounds (node 3 killed -9 under a 4 KiB write; "
          "127.0.0.1, mutual TLS everywhere, file stores):")
    print(f"{'writer':<38} {'n':>3} {'median ms':>10} {'max ms':>8}")
    names = {"direct": "operator's certificate (etcd itself)",
             "managed": "client's certificate (the manager)"}
    med = {}
    for v, xs in out.items():
        if not xs:
            sys.exit(f"{v}: no take-out logged (see {d}/attach-{v}.log)")
        med[v] = statistics.median(xs)
        print(f"{names[v]:<38} {len(xs):>3} {med[v]:>10.1f} {max(xs):>8}")
    print(f"through the manager / straight to etcd (medians): {med['managed'] / max(med['direct'], 0.5):.2f}")
    shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
