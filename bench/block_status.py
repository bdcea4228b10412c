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
  * `qemu-img compare` of vol0 with the local image (it must say identical).
The issue's goal: map and compare under 2 s each.

    bench/block_status.py [--old PATH_TO_AN_OLDER_trireme] [--bin target/release/trireme]
"""

import argparse
import os
import random
import subprocess
import sys
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
        r["map_s"], out = timed(["qemu-img", "map", "--output=json", "-f", "raw", c.unix])
        if out.returncode != 0:
            raise SystemExit(f"{name}: qemu-img map failed: {out.stderr}")
        r["map_lines"] = out.stdout.count("\n")
        r["compare_s"], out = timed(["qemu-img", "compare", "-f", "raw", "-F", "raw", image,
                                     c.unix])
        r["compare_says"] = out.stdout.strip() or out.stderr.strip()
        return r
    finally:
        c.stop()


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
    res = {name: run_build(name, b, writes, image) for name, b in builds}
    os.remove(image)
    print("file store, 3 copies, one host; vol0 1 GiB of ~72k extents, big 4 GiB of 1,048,576")
    print(f"{'':38}" + "".join(f"{n:>14}" for n, _ in builds))
    rows = [
        ("one request, REQ_ONE (ms)", "one_req_one_ms", "{:.2f}"),
        ("  extents in its answer", "extents_one", "{}"),
        ("one request, 4 GiB asked (ms)", "one_full_ms", "{:.2f}"),
        ("  extents in its answer", "extents_full", "{}"),
        ("qemu-img map of vol0 (s)", "map_s", "{:.2f}"),
        ("  lines it printed", "map_lines", "{}"),
        ("qemu-img compare of vol0 (s)", "compare_s", "{:.2f}"),
    ]
    for label, k, fmt in rows:
        print(f"{label:38}" + "".join(f"{fmt.format(res[n][k]):>14}" for n, _ in builds))
    for n, _ in builds:
        print(f"{n}: qemu-img compare says: {res[n]['compare_says']}")
    if a.old:
        for label, k, _ in rows:
            if k.endswith(("_ms", "_s")):
                print(f"{label}: new/old = {res['new'][k] / res['old'][k]:.4f}")


if __name__ == "__main__":
    main()
