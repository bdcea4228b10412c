"""A `trireme up` cluster for benchmark programs: started in a temporary data dir, its NBD
URIs read back, `trireme bench` run against it, stopped and removed."""

import json
import os
import signal
import subprocess
import tempfile
import time


class Cluster:
    def __init__(self, name, binary, extra=(), size="256M", store="memory"):
        self.name, self.bin = name, binary
        self.dir = tempfile.mkdtemp(prefix=f"trireme-{name}-")
        self.log = open(os.path.join(self.dir, "up.log"), "w")
        self.proc = subprocess.Popen(
            [binary, "--data-dir", self.dir, "--log", "warn", "up", "--port", "0",
             "--store", store, "--size", size, *extra],
            stdout=self.log, stderr=self.log)
        exports = os.path.join(self.dir, "exports")
        for _ in range(300):
            if os.path.exists(exports):
                break
            if self.proc.poll() is not None:
                raise SystemExit(f"{name}: trireme up exited; see {self.dir}/up.log")
            time.sleep(0.1)
        lines = open(exports).read().split()
        self.unix, self.tcp = lines[0], lines[1]
        self.tls = self.tcp.startswith("nbds://")

    def cli(self, *args):
        subprocess.run([self.bin, "--data-dir", self.dir, *args], check=True,
                       capture_output=True)

    def bench(self, *args):
        out = subprocess.run([self.bin, "--data-dir", self.dir, "--output", "json", "bench",
                              *args], capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit(f"{self.name}: bench {args} failed:\n{out.stderr}")
        return json.loads(out.stdout)

    def stop(self):
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        subprocess.run(["rm", "-rf", self.dir])


def cpu(j):
    """CPU us per IO: the generator's and the storage processes' (the `up` process and nodes)."""
    c = j["cpu_us_per_io"]
    return c["generator"] + c["storage"]
