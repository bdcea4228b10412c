#!/usr/bin/python3
"""Block status that scales (issue 63): how long NBD clients wait on a fragmented volume.

Each build given gets its own `trireme up` (file store, 3 copies) with two volumes, both
snapshotted first so that writes after it are 4 KiB extents of the versions' maps:
  * vol0, 1 GiB: 37,000 random 4 KiB writes (seeded), about 72,000 extents, as a 10 s
    random-write bench leaves it; a sparse local image gets the same writes.
  * big, 4 GiB: every other 4 KiB block written, 1,048,576 extents.
Then, per build:
  * one BLOCK_STATUS request on `big` (python3-libnbd): with REQ_ONE, and without (the
    whole 4 GiB - 4 KiB asked), the mean of several at random offsets;
  * `qemu-img map --output=json` of vol0;
  * `qemu-img compare` of vol0 with the local image (it must say identical);
  * both again with the servers' processes and qemu-img on CPU 0 (`taskset`), where no
    wakeup crosses CPUs (a QD1 walk is mostly wakeups; across a VM's CPUs each costs tens of
    microseconds).
The same map and compare of nbdkit's file plugin serving the local image is the reference,
side by side in the same run. The issue's goal: map and compare under 2 s each.

    bench/block_status.py [--old PATH_TO_AN_OLDER_trireme] [--bin target/release/trireme]
"""

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

import nbd

sys.path.insert(0, os.path.dirname(__file__))
from localcluster import Cluster  # noqa: E402

BLOCK = 4096
GIB = 1 << 30


def fill(uri, blocks, depth=64):
    """Writes one 4 KiB block at each of `blocks` (block numbers), `depth` in flight."""
    h = nbd.NBD()
    h.connect_uri(uri)
    buf = nbd.Buffer.from_bytearray(bytearray(b"\x5a" * BLOCK))
    for b in blocks:
        while h.aio_in_flight() >= depth:
            h.poll(-1)
        h.aio_pwrite(buf, b * BLOCK)
    while h.aio_in_flight() > 0:
        h.poll(-1)
    h.flush()
    h.shutdown()


def one_request(uri, size, flags, n):
    """Mean seconds of `n` block-status requests at random offsets of a `size`-byte export,
    and the extents the last answered."""
    h = nbd.NBD()
    h.add_meta_context("base:allocation")
    h.connect_uri(uri)
    got = []

    def cb(ctx, off, entries, err):
        got.append(len(entries) // 2)
        return 0

    rng = random.Random(7)
    t0 = time.perf_counter()
    for _ in range(n):
        off = rng.randrange(0, size // 2 // BLOCK) * BLOCK
        h.block_status(min(size - off, (1 << 32) - BLOCK), off, cb, flags)
    took = (time.perf_counter() - t0) / n
    h.shutdown()
    return took, got[-1]


def timed(cmd):
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True)
    took = time.perf_counter() - t0
    return took, out


def pin(pids, cpus):
    """Every thread of `pids` on `cpus` (a taskset list such as "0" or "0,1")."""
    for p in pids:
        subprocess.run(["taskset", "-a", "-p", "-c", cpus, str(p)], check=True,
                       capture_output=True)


def qemu_walks(name, uri, image, pids):
    """`qemu-img map` and `compare` of `uri`: first as the scheduler places them, then with
    the server's processes and qemu-img on CPU 0, where no wakeup crosses CPUs."""
    r = {}
    for cpus, tag in (("0,1", ""), ("0", "_one_cpu")):
        pin(pids, cpus)
        pre = ["taskset", "-c", cpus]
        r["map_s" + tag], out = timed(pre + ["qemu-img", "map", "--output=json", "-f", "raw",
                                             uri])
        if out.returncode != 0:
            raise SystemExit(f"{name}: qemu-img map failed: {out.stderr}")
        r["map_lines"] = out.stdout.count("\n")
        r["compare_s" + tag], out = timed(pre + ["qemu-img", "compare", "-f", "raw", "-F",
                                                 "raw", image, uri])
        says = out.stdout.strip() or out.stderr.strip()
        if out.returncode != 0:
            raise SystemExit(f"{name}: qemu-img compare says: {says}")
        r["compare_says"] = says
    pin(pids, ",".join(str(c) for c in sorted(os.sched_getaffinity(0))))
    return r


def cluster_pids(c):
    """`up` and its nodes."""
    out = subprocess.run(["pgrep", "-f", c.dir], capture_output=True, text=True)
    return [c.proc.pid] + [int(p) for p in out.stdout.split() if int(p) != c.proc.pid]


def run_build(name, binary, writes, image):
    c = Cluster(name, binary, size="1G", store="file")
    try:
        c.cli("volume", "create", "big", "--size", "4G")
        for v in ("vol0", "big"):
            c.cli("volume", "snapshot", "create", v, "empty")
        sock = os.path.join(c.dir, "big.sock")
        big = subprocess.Popen([binary, "--data-dir", c.dir, "--log", "warn", "nbd", "big",
                                "--socket", sock], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
        for _ in range(100):
            if os.path.exists(sock):
                break
            time.sleep(0.1)
        big_uri = f"nbd+unix:///big?socket={sock}"
        t0 = time.perf_counter()
        fill(c.unix, writes)
        fill(big_uri, range(0, 4 * GIB // BLOCK, 2))
        print(f"{name}: filled in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        r = {}
        r["one_req_one_ms"], n1 = one_request(big_uri, 4 * GIB, nbd.CMD_FLAG_REQ_ONE, 200)
        r["one_full_ms"], n2 = one_request(big_uri, 4 * GIB, 0, 20)
        r["one_req_one_ms"] *= 1e3
        r["one_full_ms"] *= 1e3
        r["extents_one"], r["extents_full"] = n1, n2
        big.terminate()
        big.wait()
        r.update(qemu_walks(name, c.unix, image, cluster_pids(c)))
        return r
    finally:
        c.stop()


def run_nbdkit(image):
    """The reference: nbdkit's file plugin serving the local image itself (holes found with
    SEEK_DATA, reads from the page cache), the leanest server of the same walk."""
    d = tempfile.mkdtemp(prefix="nbdkit-bs-")
    sock = os.path.join(d, "nbdkit.sock")
    kit = subprocess.Popen(["nbdkit", "--foreground", "--unix", sock, "--readonly", "file",
                            image], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if os.path.exists(sock):
                break
            time.sleep(0.1)
        r = {k: "-" for k in ("one_req_one_ms", "one_full_ms", "extents_one",
                              "extents_full")}
        r.update(qemu_walks("nbdkit", f"nbd+unix:///?socket={sock}", image, [kit.pid]))
        return r
    finally:
        kit.kill()
        kit.wait()
        subprocess.run(["rm", "-rf", d])


def disk_read_us():
    """Mean microseconds of one 4 KiB O_DIRECT read at queue depth 1 from this file system
    (fio, 3 s): what each of compare's reads costs a store that reads past the page cache."""
    d = tempfile.mkdtemp(prefix="fio-bs-", dir=os.environ.get("TMPDIR", "/tmp"))
    try:
        out = subprocess.run(["fio", "--name=qd1", f"--filename={d}/f", "--size=256M",
                              "--rw=randread", "--bs=4k", "--direct=1", "--iodepth=1",
                              "--ioengine=psync", "--runtime=3", "--time_based",
                              "--output-format=json"], capture_output=True, text=True,
                             check=True)
        return json.loads(out.stdout)["jobs"][0]["read"]["clat_ns"]["mean"] / 1e3
    finally:
        subprocess.run(["rm", "-rf", d])


def cell(fmt, v):
    return v if isinstance(v, str) else fmt.format(v)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/trireme")
    ap.add_argument("--old", help="an older build, measured beside it")
    a = ap.parse_args()
    rng = random.Random(63)
    writes = [rng.randrange(0, GIB // BLOCK) for _ in range(37000)]
    image = os.path.join(os.environ.get("TMPDIR", "/tmp"), "trireme-block-status.img")
    with open(image, "wb") as f:
        f.truncate(GIB)
        for b in writes:
            f.seek(b * BLOCK)
            f.write(b"\x5a" * BLOCK)
    builds = [("new", a.bin)] + ([("old", a.old)] if a.old else [])
    try:
        res = {name: run_build(name, b, writes, image) for name, b in builds}
        res["nbdkit file"] = run_nbdkit(image)
        disk_us = disk_read_us()
    finally:
        os.remove(image)
    cols = [n for n, _ in builds] + ["nbdkit file"]
    print("vol0 1 GiB of ~72k extents, big 4 GiB of 1,048,576; trireme: file store, 3 copies,"
          " one host; unix sockets")
    print(f"{'':38}" + "".join(f"{n:>14}" for n in cols))
    rows = [
        ("one request, REQ_ONE (ms)", "one_req_one_ms", "{:.2f}"),
        ("  extents in its answer", "extents_one", "{}"),
        ("one request, 4 GiB asked (ms)", "one_full_ms", "{:.2f}"),
        ("  extents in its answer", "extents_full", "{}"),
        ("qemu-img map of vol0 (s)", "map_s", "{:.2f}"),
        ("  lines it printed", "map_lines", "{}"),
        ("qemu-img compare of vol0 (s)", "compare_s", "{:.2f}"),
        ("map, all on one CPU (s)", "map_s_one_cpu", "{:.2f}"),
        ("compare, all on one CPU (s)", "compare_s_one_cpu", "{:.2f}"),
    ]
    for label, k, fmt in rows:
        print(f"{label:38}" + "".join(f"{cell(fmt, res[n][k]):>14}" for n in cols))
    for n in cols:
        print(f"{n}: qemu-img compare says: {res[n]['compare_says']}")
    data = len(set(writes))
    print(f"disk floor of compare's reads: {data} x {disk_us:.1f} us (fio, 4 KiB O_DIRECT, QD1)"
          f" = {data * disk_us / 1e6:.2f} s")
    for label, k, _ in rows:
        if k.startswith(("map_s", "compare_s")):
            print(f"{label}: new/nbdkit file = {res['new'][k] / res['nbdkit file'][k]:.2f}")
    if a.old:
        for label, k, _ in rows:
            if k.endswith(("_ms", "_s", "_cpu")):
                print(f"{label}: new/old = {res['new'][k] / res['old'][k]:.4f}")


if __name__ == "__main__":
    main()
