#!/usr/bin/env python3
"""What observing the cluster costs (issue 20), side by side in one run.

1. The writer's metrics on the I/O path: s2d through the native client, the same volume
   attached with its metrics on (`volume:s2d`, the default) and off (`volume:s2d?metrics=off`),
   rounds interleaved, medians compared: IOPS, CPU us per IO, p90 read and write.
2. The dashboard's own CPU: the CPU time of the `trireme up` process (manager, writer of the
   NBD export, HTTP endpoint) over a window, idle and under load (4K random 70:30 through the
   NBD export at QD8), each with no browser and with one headless Chromium showing the
   dashboard (driven over WebDriver by chromedriver). The difference is the dashboard's cost.

    python3 bench/observe.py [ROUNDS] [SECONDS] [metrics|dashboard]
                                  (defaults: 5 rounds of 8 s, both parts)

The s2d rounds on this shared 2-core host swing between two levels (about 135K and 175K IOPS)
whatever the setting, so give the metrics part many rounds; it prints medians and the best
round of each side. `cargo run --release -p trireme-metrics --example record_cost` times the
counting itself (ns per request).

Needs a release build (cargo build --release), chromium and chromium-driver. UCX runs over
shared memory on one host here (no RDMA device).
"""

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

from localcluster import Cluster, cpu
from multiserver import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
T = os.environ.get("TRIREME_BIN", os.path.join(ROOT, "target/release/trireme"))
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 5
SECS = int(sys.argv[2]) if len(sys.argv) > 2 else 8
PART = sys.argv[3] if len(sys.argv) > 3 else "both"
TICK = os.sysconf("SC_CLK_TCK")


def proc_cpu(pid):
    """User + system CPU seconds of a process."""
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / TICK


def up_pid(c):
    for line in open(os.path.join(c.dir, "pids")):
        k, v = line.split()
        if k == "up":
            return int(v)
    raise SystemExit("no up pid")


class Browser:
    """Headless Chromium over WebDriver."""

    def __init__(self):
        self.port = free_port()
        self.driver = subprocess.Popen(["chromedriver", f"--port={self.port}"],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.profile = tempfile.mkdtemp(prefix="trireme-chromium-")
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", self.port)).close()
                break
            except OSError:
                time.sleep(0.05)
        caps = {"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": {
            "binary": "/usr/bin/chromium",
            "args": ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                     "--disable-background-networking", "--disable-component-update",
                     "--disable-sync", f"--user-data-dir={self.profile}"]}}}}
        self.session = self.call("POST", "/session", caps)["sessionId"]

    def call(self, method, path, body=None):
        data = json.dumps(body if body is not None else {}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data,
                                     method=method,
                                     headers={"Content-Type": "application/json"})
        return json.load(urllib.request.urlopen(req, timeout=60))["value"]

    def open(self, url):
        self.call("POST", f"/session/{self.session}/url", {"url": url})

    def samples(self):
        return self.call("POST", f"/session/{self.session}/execute/sync",
                         {"script": "return Number(document.body.dataset.samples || 0)",
                          "args": []})

    def close(self):
        try:
            self.call("DELETE", f"/session/{self.session}")
        finally:
            self.driver.kill()
            self.driver.wait()
            subprocess.run(["rm", "-rf", self.profile])


def window_cpu(pid, secs):
    a = proc_cpu(pid)
    time.sleep(secs)
    return (proc_cpu(pid) - a) / secs * 100  # % of one core


def metrics_cost(c):
    print(f"$ trireme bench --profile s2d -d{SECS} volume:s2d[?metrics=off]   "
          f"# {ROUNDS} rounds, alternating on, off")
    runs = {"on": [], "off": []}
    for r in range(ROUNDS):
        for name, spec in (("on", "volume:s2d"), ("off", "volume:s2d?metrics=off")):
            j = c.bench("--profile", "s2d", f"-d{SECS}", spec)
            runs[name].append(j)
            print(f"  round {r + 1} metrics {name:3}: {j['iops']:8.0f} IOPS, "
                  f"{cpu(j):6.1f} CPU us/IO")
    rows = [("IOPS", lambda j: j["iops"]), ("CPU us per IO", cpu),
            ("p90 read (us)", lambda j: j["read"]["latency_us"]["p90"]),
            ("p90 write (us)", lambda j: j["write"]["latency_us"]["p90"])]
    print()
    print(f"{'s2d, 3-way memory volume, native client':42} {'on':>10} {'off':>10} {'on/off':>8}")
    out = {}
    for label, f in rows:
        on = statistics.median(f(j) for j in runs["on"])
        off = statistics.median(f(j) for j in runs["off"])
        out[label] = (on, off)
        print(f"{'median ' + label:42} {on:10.1f} {off:10.1f} {on / off:8.3f}")
    for label, f, best in (("IOPS", rows[0][1], max), ("CPU us per IO", cpu, min)):
        on = best(f(j) for j in runs["on"])
        off = best(f(j) for j in runs["off"])
        print(f"{'best round ' + label:42} {on:10.1f} {off:10.1f} {on / off:8.3f}")
    return out


def dashboard_cpu(c):
    pid = up_pid(c)
    http = open(os.path.join(c.dir, "http")).read().strip()
    token = open(os.path.join(c.dir, "http-token")).read().strip()
    url = f"http://{http}/?token={token}"
    win = SECS
    print()
    print(f"CPU of the `trireme up` process (% of one core) over {win} s windows, rounds alternating")
    res = {k: [] for k in ("idle", "idle+browser", "load", "load+browser")}
    for r in range(ROUNDS):
        # Idle.
        res["idle"].append(window_cpu(pid, win))
        b = Browser()
        try:
            b.open(url)
            time.sleep(2)
            s0 = b.samples()
            res["idle+browser"].append(window_cpu(pid, win))
            assert b.samples() > s0, "the page got no new samples"
        finally:
            b.close()
        # Under load: 4K random 70:30 through the NBD export at QD8.
        for with_browser in (False, True):
            load = subprocess.Popen(
                [T, "--data-dir", c.dir, "--output", "json", "bench", "-b4K", "-w30", "-r",
                 "-t1", "-o8", "-W1", f"-d{win + 3}", c.unix],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            b = Browser() if with_browser else None
            try:
                if b:
                    b.open(url)
                time.sleep(2)
                res["load+browser" if b else "load"].append(window_cpu(pid, win))
            finally:
                if b:
                    b.close()
                load.wait()
        print("  round {}: ".format(r + 1) +
              ", ".join(f"{k} {v[-1]:.1f}%" for k, v in res.items()))
    # The mean, not the median: /proc counts CPU in clock ticks (10 ms, 0.17% of a core over
    # 6 s), so an idle window reads 0 or 1 tick; the mean over the rounds resolves finer.
    med = {k: statistics.mean(v) for k, v in res.items()}
    print()
    print(f"{'up process CPU, % of a core (mean)':42} {'no page':>10} {'one page':>10} {'page cost':>10}")
    for state in ("idle", "load"):
        a, b = med[state], med[state + "+browser"]
        print(f"{state:42} {a:10.1f} {b:10.1f} {b - a:10.1f}")
    return med


def main():
    c = Cluster("observe", T)
    try:
        c.cli("volume", "create", "s2d", "--size", "256M", "--replicas", "3")
        # The memory store allocates at a page's first write: fill once, untimed.
        c.bench("-s", "-b1M", "-w100", "-t1", "-o4", "-W0", "-d6", "volume:s2d")
        c.bench("-s", "-b1M", "-w100", "-t1", "-o4", "-W0", "-d6", c.unix)
        if PART in ("both", "metrics"):
            metrics_cost(c)
        if PART in ("both", "dashboard"):
            dashboard_cpu(c)
        print("\n(one host, 2 cores; UCX over shared memory, no RDMA device)")
    finally:
        c.stop()


if __name__ == "__main__":
    main()
