#!/usr/bin/env python3
"""Cross-check `trireme bench` against fio: same targets, same profile, side by side.

Targets: nbdkit memory over nbd+unix (fio's nbd engine vs trireme's NBD client) and a local
file with O_DIRECT (fio's psync engine with direct=1 vs trireme's file target). Profile: 4K
random 70:30, threads x outstanding as given. IOPS and p50 latency should agree within 15% on a
quiet machine; runs alternate (fio, trireme, fio, trireme, ...) and medians are compared.

Usage: python3 bench/crosscheck_fio.py [--runtime 5] [--rounds 3] [--threads 2] [--qd 4]
"""

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fio(target, kind, threads, qd, runtime, size):
    args = ["fio", "--name=x", "--rw=randrw", "--rwmixread=70", "--bs=4k", f"--numjobs={threads}",
            f"--runtime={runtime}", "--time_based", "--group_reporting", "--output-format=json",
            "--lat_percentiles=1", "--percentile_list=50:99", f"--size={size}"]
    if kind == "nbd":
        args += ["--ioengine=nbd", f"--uri={target}", f"--iodepth={qd}"]
    else:
        # psync has no queue: qd loops per thread become qd jobs, like trireme's qd loops.
        args = [a if not a.startswith("--numjobs") else f"--numjobs={threads * qd}" for a in args]
        args += ["--ioengine=psync", "--direct=1", f"--filename={target}"]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    j = json.loads(out[out.index("{"):])["jobs"][0]
    ios = j["read"]["total_ios"] + j["write"]["total_ios"]
    # fio reports read and write percentiles separately; weight p50 by I/O count.
    p50 = (j["read"]["lat_ns"]["percentile"]["50.000000"] * j["read"]["total_ios"]
           + j["write"]["lat_ns"]["percentile"]["50.000000"] * j["write"]["total_ios"]) / max(ios, 1)
    return j["read"]["iops"] + j["write"]["iops"], p50 / 1000


def trireme(target, threads, qd, runtime):
    exe = os.path.join(ROOT, "target", "release", "trireme")
    out = subprocess.run([exe, "--output", "json", "bench", "-b4K", "-r", "-w30", f"-t{threads}", f"-o{qd}",
                          f"-d{runtime}", target], capture_output=True, text=True, check=True).stdout
    j = json.loads(out)
    ios = j["read"]["ios"] + j["write"]["ios"]
    p50 = (j["read"]["latency_us"]["p50"] * j["read"]["ios"] + j["write"]["latency_us"]["p50"] * j["write"]["ios"]) / max(ios, 1)
    return j["iops"], p50


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runtime", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--qd", type=int, default=4)
    a = ap.parse_args()
    if not os.path.exists(os.path.join(ROOT, "target", "release", "trireme")):
        sys.exit("build first: cargo build --release")
    tmp = tempfile.mkdtemp(prefix="trireme-xcheck-")
    sock = os.path.join(tmp, "nbdkit.sock")
    kit = subprocess.Popen(["nbdkit", "--foreground", "--exit-with-parent", "--unix", sock, "memory", "256M"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            if os.path.exists(sock):
                break
            time.sleep(0.05)
        img = os.path.join(tmp, "file.img")
        with open(img, "wb") as f:
            f.truncate(256 << 20)
        subprocess.run(["fio", "--name=fill", "--rw=write", "--bs=1M", "--size=256M", f"--filename={img}",
                        "--direct=1", "--output=/dev/null"], check=True)
        uri = f"nbd+unix:///?socket={sock}"
        subprocess.run(["fio", "--name=fill", "--ioengine=nbd", f"--uri={uri}", "--rw=write", "--bs=1M",
                        "--size=256M", "--output=/dev/null"], check=True)
        print(f"# trireme bench vs fio, 4K random 70:30, {a.threads} threads x {a.qd}, {a.runtime}s x {a.rounds} "
              f"rounds alternating, medians; {os.cpu_count()} CPUs")
        print(f"{'target':<26} {'tool':<8} {'IOPS':>10} {'p50 us':>9}")
        for name, target, kind in [("nbdkit memory (nbd+unix)", uri, "nbd"), ("file, O_DIRECT", img, "file")]:
            res = {"fio": [], "trireme": []}
            for _ in range(a.rounds):
                res["fio"].append(fio(target, kind, a.threads, a.qd, a.runtime, "256M"))
                res["trireme"].append(trireme(target, a.threads, a.qd, a.runtime))
            med = {k: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v)) for k, v in res.items()}
            for tool in ("fio", "trireme"):
                print(f"{name:<26} {tool:<8} {med[tool][0]:>10.0f} {med[tool][1]:>9.1f}")
            di = med["trireme"][0] / med["fio"][0] - 1
            dl = med["trireme"][1] / med["fio"][1] - 1
            ok = abs(di) <= 0.15 and abs(dl) <= 0.15
            print(f"{'':<26} {'delta':<8} {di:>+10.1%} {dl:>+9.1%}   {'agree within 15%' if ok else 'DIFFER by more than 15%'}")
    finally:
        kit.send_signal(signal.SIGTERM)
        kit.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
