#!/usr/bin/env python3
"""How long a host's I/O stalls when a server fails: NVMe/TCP with ANA multipath against NBD.

    python3 bench/nvmf_failover.py [--secs 16] [--fault-at 5] [--json out.json]

Everything runs on this host, on 127.0.0.1: an etcd member, three `node run` daemons (file
store), one 3-way volume, and `target/release/trireme` (run `make build` first). The host's
workload is `trireme bench`, 4 KiB random writes at QD1 (`-t1 -o1 -w100`): its longest write
is the stall. Each row runs NBD and NVMe/TCP one after the other, so both see the same
machine:

* NBD: the writer is `trireme attach VOL --socket S` and the host reads and writes through
  that one socket. NBD has one server per connection: when the process that serves it dies or
  stops, the host's I/O fails (there is no second path to take).
* NVMe/TCP: `trireme nvmf serve VOL` on two "servers" (two processes, ports 1 and 2), the
  host connected to both through trireme's own initiator with multipath (`nvme+tcp://A,B/NQN`,
  which queues I/O while no path is usable, as Linux's native multipath does).

Faults, each at --fault-at seconds into the run:

1. a replica node killed -9 (the writer drops the copy and goes on; it is resynced after);
2. the writer's process killed -9: NVMe/TCP's standby takes the writer when the dead one's
   lease expires (`--lease-ttl`, run at 5 s, the default, and at 2 s, the shortest);
3. the writer's process stopped with SIGTERM (a drain): NVMe/TCP hands the writer over at once.

Reported per run: errors (the host saw an I/O fail), the longest write (ms) and p99.99.
Links between processes are TCP on 127.0.0.1 or UCX over shared memory; there is no RDMA here.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import multiserver  # noqa: E402  (etcd and node daemons on this host)
from multiserver import T, EtcdCluster, free_port  # noqa: E402

HOSTNQN = "nqn.2026-12.io.trireme:bench"
NQN = "nqn.2026-12.io.trireme:trireme:v"


class Run:
    """`trireme bench` in the background: 4 KiB random writes at QD1."""

    def __init__(self, uri, secs):
        self.t0 = time.time()
        self.p = subprocess.Popen(
            [T, "--output", "json", "bench", "-b4K", "-r", "-w100", "-t1", "-o1", f"-d{secs}", "-W0", uri],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def result(self):
        out, err = self.p.communicate(timeout=300)
        if self.p.returncode != 0:
            last = (err.strip().splitlines() or ["?"])[-1]
            return {"errors": 1, "error": last[:160], "after_s": round(time.time() - self.t0, 1)}
        lat = json.loads(out)["write"]["latency_us"]
        return {"errors": 0, "max_ms": lat["max"] / 1e3, "p9999_ms": lat["p9999"] / 1e3}


class Nvmf:
    """`nvmf serve v` with port id `pid`, its log beside the cluster's."""

    def __init__(self, c, pid, ttl):
        self.addr = f"127.0.0.1:{free_port()}"
        self.pid_id = pid
        self.p = subprocess.Popen(
            [T, "nvmf", "serve", "v", "--listen", self.addr, "--port-id", str(pid), "--lease-ttl", ttl,
             *multiserver.TIMEOUT],
            env=c.env, stdout=subprocess.PIPE, stderr=open(f"{c.d}/nvmf-{pid}.log", "a"), text=True)
        line = self.p.stdout.readline().strip()
        if not line.startswith("nvme/tcp"):
            sys.exit(f"nvmf serve {pid} did not start; logs in {c.d}")

    def stop(self, sig=signal.SIGKILL):
        if self.p.poll() is None:
            self.p.send_signal(sig)
        self.p.wait()


def ana(c):
    """ANA state by port id, as status shows it."""
    return {e["port_id"]: e["ana"] for v in c.status()["volumes"] for e in v.get("nvmf", [])}


def in_sync(c):
    return all(r["state"] == "in-sync" for v in c.status()["volumes"] for r in v["replicas"])


def settle(c):
    c.wait(lambda: in_sync(c), 300)
    c.wait(lambda: not any(v.get("writer") for v in c.status()["volumes"]), 60)


def run_with_fault(c, a, uri, fault, writer):
    """`trireme bench` on `uri` with `fault` at --fault-at: node 2 killed -9 (and, after the
    run, started again and resynced while the writer is still there), or the process
    `writer` signalled (SIGKILL or SIGTERM). Returns the run's result."""
    r = Run(uri, a.secs)
    time.sleep(a.fault_at)
    if fault == "node":
        c.nodes[2].kill()
        c.nodes[2].wait()
    else:
        writer.send_signal(signal.SIGKILL if fault == "kill" else signal.SIGTERM)
    out = r.result()
    if fault == "node":
        c.start_node(2)
        c.wait(lambda: in_sync(c), 300)
    return out


def nbd_run(c, a, fault):
    """One NBD run with `fault` (node, kill, term) at --fault-at."""
    sock = f"{c.d}/a.sock"
    w = c.attach("v", sock)
    out = run_with_fault(c, a, f"nbd+unix:///v?socket={sock}", fault, w)
    if w.poll() is None:
        multiserver.detach(w)
    w.wait()
    settle(c)
    return out


def nvmf_run(c, a, fault, ttl):
    """One NVMe/TCP run: two servers, the host on both paths, `fault` at --fault-at."""
    s1 = Nvmf(c, 1, ttl)
    c.wait(lambda: ana(c).get(1) == "optimized", 60)
    s2 = Nvmf(c, 2, ttl)
    c.wait(lambda: ana(c).get(2) == "inaccessible", 30)
    uri = f"nvme+tcp://{s1.addr},{s2.addr}/{NQN}?hostnqn={HOSTNQN}"
    out = run_with_fault(c, a, uri, fault, s1.p)
    if fault != "node" and out["errors"] == 0:
        out["taken_by_standby"] = ana(c).get(2) == "optimized"
    for s in (s1, s2):
        s.stop(signal.SIGTERM)
    settle(c)
    return out


def cell(r):
    if r is None:
        return "-"
    if r["errors"]:
        return f"I/O error after {r['after_s']} s"
    return f"0 errors, max {r['max_ms']:.0f} ms, p99.99 {r['p9999_ms']:.1f} ms"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--secs", type=int, default=16, help="each run's length (s)")
    ap.add_argument("--fault-at", type=float, default=5, help="when the fault comes (s into a run)")
    ap.add_argument("--json", help="write the results here too")
    a = ap.parse_args()
    if a.fault_at >= a.secs:
        sys.exit("--fault-at must come before the run's end (--secs)")
    if not os.path.exists(T):
        sys.exit(f"{T} is missing: run `make build` first")
    rows = []
    with tempfile.TemporaryDirectory(prefix="trireme-nvmf-failover-") as d:
        c = EtcdCluster(d, 3)
        try:
            c.cli("volume", "create", "v", "--size", "1G", "--replicas", "3")
            c.cli("volume", "access", "v", "--allow", HOSTNQN)
            for name, fault, ttl in (
                ("a replica node killed -9", "node", "5s"),
                ("the writer's process killed -9, lease 5 s", "kill", "5s"),
                ("the writer's process killed -9, lease 2 s", "kill", "2s"),
                ("the writer's process stopped (SIGTERM)", "term", "5s"),
            ):
                nbd = nbd_run(c, a, fault) if ttl == "5s" else None
                nvme = nvmf_run(c, a, fault, ttl)
                rows.append({"fault": name, "nbd": nbd, "nvmf": nvme})
                print(f"# {name}: NBD {cell(nbd)}; NVMe/TCP {cell(nvme)}", file=sys.stderr)
        finally:
            c.stop()
    print(f"# bench/nvmf_failover.py, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs, "
          f"{a.secs} s runs, fault at {a.fault_at} s")
    print("# 3 node daemons on etcd (file store, 3-way), everything on 127.0.0.1; the host: "
          "4 KiB random writes at QD1 through trireme's own NBD and NVMe/TCP clients\n")
    print("| fault | NBD (one socket, the writer on the host) | NVMe/TCP (two servers, ANA multipath) |")
    print("|---|---|---|")
    for r in rows:
        print(f"| {r['fault']} | {cell(r['nbd'])} | {cell(r['nvmf'])} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
