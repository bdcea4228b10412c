#!/usr/bin/python3
"""One block-status round trip at queue depth 1, as qemu-img map walks a volume (issue 63):
trireme up against nbdkit's memory plugin, side by side in one run, with a 4 KiB read beside.

Both exports get the same writes (every other 4 KiB block of the first 64 MiB, after a
snapshot on trireme, so each is an extent of its own). Then, on one connection each
(python3-libnbd, unix socket):
  * walk: `block_status` with REQ_ONE from offset 0, each request where the last extent
    ended (qemu's walk), N requests;
  * read: N 4 KiB reads at those offsets.
Printed: microseconds per request, the ratio trireme/nbdkit, and what a walk of 60,093
requests (qemu-img map of bench/block_status.py's vol0) costs at each rate.

    bench/block_status_qd1.py [--bin target/release/trireme] [--n 8000]
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

import nbd

sys.path.insert(0, os.path.dirname(__file__))
from block_status import BLOCK, fill  # noqa: E402
from localcluster import Cluster  # noqa: E402

MAP_REQUESTS = 60093


def measure(uri, n):
    """Microseconds per REQ_ONE block status (a walk) and per 4 KiB read, at QD1."""
    h = nbd.NBD()
    h.add_meta_context("base:allocation")
    h.connect_uri(uri)
    size = h.get_size()
    ends = []

    def cb(ctx, off, entries, err):
        ends.append(off + entries[0])
        return 0

    off, offsets = 0, []
    t0 = time.perf_counter()
    for _ in range(n):
        offsets.append(off)
        h.block_status(min(size - off, 1 << 30), off, cb, nbd.CMD_FLAG_REQ_ONE)
        off = ends[-1] if ends[-1] < size else 0
    walk = (time.perf_counter() - t0) / n * 1e6
    t0 = time.perf_counter()
    for o in offsets:
        h.pread(BLOCK, o)
    read = (time.perf_counter() - t0) / n * 1e6
    h.shutdown()
    return walk, read


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/trireme")
    ap.add_argument("--n", type=int, default=8000)
    a = ap.parse_args()
    blocks = range(0, (64 << 20) // BLOCK, 2)
    c = Cluster("qd1", a.bin, size="1G", store="file")
    d = tempfile.mkdtemp(prefix="nbdkit-qd1-")
    sock = os.path.join(d, "nbdkit.sock")
    kit = subprocess.Popen(["nbdkit", "--foreground", "--unix", sock, "memory", "1G"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        c.cli("volume", "snapshot", "create", "vol0", "empty")
        for _ in range(100):
            if os.path.exists(sock):
                break
            time.sleep(0.1)
        kit_uri = f"nbd+unix:///?socket={sock}"
        fill(c.unix, blocks)
        fill(kit_uri, blocks)
        r = {"trireme up": measure(c.unix, a.n), "nbdkit memory": measure(kit_uri, a.n)}
    finally:
        kit.kill()
        kit.wait()
        c.stop()
        subprocess.run(["rm", "-rf", d])
    print(f"QD1, {a.n} requests each, one connection, unix socket (python3-libnbd)")
    print(f"{'server':<16} {'block status us':>16} {'4K read us':>11} {'walk of 60,093 s':>17}")
    for k, (walk, read) in r.items():
        print(f"{k:<16} {walk:>16.1f} {read:>11.1f} {walk * MAP_REQUESTS / 1e6:>17.2f}")
    t, k = r["trireme up"][0], r["nbdkit memory"][0]
    print(f"block status, trireme up / nbdkit: {t / k:.2f}")


if __name__ == "__main__":
    main()
