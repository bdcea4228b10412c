#!/usr/bin/env python3
"""trireme (3-way mirrored, memory store) against nbdkit memory (one copy), through fio's nbd engine.

Both targets get the same fio job, run interleaved (A B A B ...) for several rounds; the table
shows medians and trireme/nbdkit ratios. CPU per IO is measured from /proc/<pid>/stat of the
storage processes (trireme: `up` + every node; nbdkit: its one process) and from the rusage of
fio itself (the load generator). Links between trireme's processes: UCX over shared memory (the
default when UCX starts; unix sockets otherwise); no RDMA here.

With --before BIN, a second trireme cluster runs that binary (the code before a change) in the
same interleaved rounds, and the table gains its column and the after/before ratio.

Usage: python3 bench/nbd_vs_nbdkit.py [--runtime 10] [--rounds 3] [--size 512M] [--json out.json]
                                      [--before path/to/old/trireme]
"""

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TICK = os.sysconf("SC_CLK_TCK")

PROFILES = [
    # name, numjobs, iodepth, target check
    ("QD1 (1 job x 1)", 1, 1),
    ("QD40 (10 jobs x 4)", 10, 4),
]


def cpu_ticks(pids):
    """user+system ticks of processes (all their threads)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        except FileNotFoundError:
            pass
    return total


def run_fio(uri, numjobs, iodepth, runtime, size, extra=()):
    cmd = [
        "fio", "--name=bench", "--ioengine=nbd", f"--uri={uri}", "--rw=randrw", "--rwmixread=70",
        "--bs=4k", f"--numjobs={numjobs}", f"--iodepth={iodepth}", f"--size={size}",
        "--time_based", f"--runtime={runtime}", "--ramp_time=2", "--group_reporting",
        "--unified_rw_reporting=both", "--lat_percentiles=1", "--percentile_list=50:90:99:99.9",
        "--output-format=json", *extra,
    ]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = p.communicate()
    if p.returncode != 0:
        sys.exit(f"fio failed on {uri}: {err.decode()}")
    return json.loads(out[out.index(b"{"):])


def measure(uri, pids, numjobs, iodepth, runtime, size):
    before_storage = cpu_ticks(pids)
    before_children = os.times()
    t0 = time.monotonic()
    res = run_fio(uri, numjobs, iodepth, runtime, size)
    wall = time.monotonic() - t0
    after_children = os.times()
    storage_s = (cpu_ticks(pids) - before_storage) / TICK
    gen_s = (after_children.children_user - before_children.children_user) + (
        after_children.children_system - before_children.children_system)
    job = res["jobs"][0]
    mixed = job["mixed"] if "mixed" in job else job["read"]
    iops = job["read"]["iops"] + job["write"]["iops"]
    ios = job["read"]["total_ios"] + job["write"]["total_ios"]
    pct = mixed["lat_ns"]["percentile"]
    # CPU is measured over the whole fio run (ramp included), so divide by every IO issued.
    total_ios = ios * (wall / max(runtime, 1e-9))
    return {
        "iops": iops,
        "read_iops": job["read"]["iops"],
        "write_iops": job["write"]["iops"],
        "p50_us": pct["50.000000"] / 1000,
        "p90_us": pct["90.000000"] / 1000,
        "p99_us": pct["99.000000"] / 1000,
        "read_p50_us": job["read"]["lat_ns"]["percentile"]["50.000000"] / 1000,
        "write_p50_us": job["write"]["lat_ns"]["percentile"]["50.000000"] / 1000,
        "storage_cpu_us_per_io": storage_s * 1e6 / total_ios,
        "generator_cpu_us_per_io": gen_s * 1e6 / total_ios,
        "errors": job["error"],
    }


def start_trireme(tmp, size, extra=(), exe=None, name="trireme"):
    exe = exe or os.environ.get("TRIREME_BIN", os.path.join(ROOT, "target", "release", "trireme"))
    if not os.path.exists(exe):
        sys.exit(f"{exe} not found: cargo build --release (make bench does)")
    d = os.path.join(tmp, name)
    log = open(os.path.join(tmp, f"{name}.log"), "w")
    p = subprocess.Popen([exe, "--data-dir", d, "--log", "warn", "up", "--store", "memory", "--size", size,
                          "--nodes", "3", "--replicas", "3", "--port", "0", *extra], stdout=log, stderr=log)
    for _ in range(600):
        if os.path.exists(os.path.join(d, "exports")):
            break
        if p.poll() is not None:
            sys.exit("trireme up failed; see " + log.name)
        time.sleep(0.05)
    uri = open(os.path.join(d, "exports")).readline().strip()
    pids = [int(l.split()[1]) for l in open(os.path.join(d, "pids"))]
    return p, uri, pids


def start_nbdkit(tmp, size):
    sock = os.path.join(tmp, "nbdkit.sock")
    p = subprocess.Popen(["nbdkit", "--foreground", "--exit-with-parent", "--unix", sock, "memory", size],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        if os.path.exists(sock):
            break
        time.sleep(0.05)
    return p, f"nbd+unix:///?socket={sock}", [p.pid]


def prefill(uri, size):
    subprocess.run(["fio", "--name=fill", "--ioengine=nbd", f"--uri={uri}", "--rw=write", "--bs=1M",
                    f"--size={size}", "--iodepth=4", "--output=/dev/null"], check=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runtime", type=int, default=10, help="seconds per measured run")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds per profile (median)")
    ap.add_argument("--size", default="512M", help="volume size and fio working set")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--trireme-args", default="", help="extra `trireme up` flags, e.g. '--threads 2'")
    ap.add_argument("--before", help="a trireme binary of the code before a change, run side by side")
    a = ap.parse_args()
    for tool in ("fio", "nbdkit"):
        if not shutil.which(tool):
            sys.exit(f"{tool} not installed: run scripts/setup.sh")

    tmp = tempfile.mkdtemp(prefix="trireme-bench-")
    procs = []
    try:
        tp, turi, tpids = start_trireme(tmp, a.size, a.trireme_args.split())
        procs.append(tp)
        kp, kuri, kpids = start_nbdkit(tmp, a.size)
        procs.append(kp)
        targets = {"trireme": (turi, tpids), "nbdkit": (kuri, kpids)}
        if a.before:
            bp, buri, bpids = start_trireme(tmp, a.size, a.trireme_args.split(), a.before, "before")
            procs.append(bp)
            targets["before"] = (buri, bpids)
        for uri, _ in targets.values():
            prefill(uri, a.size)

        fio_version = subprocess.run(["fio", "--version"], capture_output=True, text=True).stdout.strip()
        print(f"# trireme vs nbdkit memory — {time.strftime('%Y-%m-%d %H:%M')}, {platform.node()}, "
              f"{os.cpu_count()} CPUs, kernel {platform.release()}, {fio_version}")
        print("# trireme: 3 node processes, 3-way mirror, memory store, volume client + NBD in `trireme up`;"
              " nbdkit: memory plugin, one copy.")
        print("# Both over nbd+unix. trireme's node links: UCX over shared memory between processes on this"
              " host (unix sockets if UCX cannot start); no RDMA device on this machine.")
        if a.before:
            print(f"# before: the same cluster running {a.before} (the code before the change).")
        print(f"# 4K random 70:30 read/write, fio nbd engine, {a.runtime}s runs + 2s ramp, "
              f"{a.rounds} interleaved rounds, medians.\n")

        results = {}
        for name, jobs, depth in PROFILES:
            runs = {t: [] for t in targets}
            for r in range(a.rounds):
                for t, (uri, pids) in targets.items():
                    m = measure(uri, pids, jobs, depth, a.runtime, a.size)
                    if m["errors"]:
                        sys.exit(f"fio reported errors on {t}")
                    runs[t].append(m)
                    print(f"  {name} round {r + 1} {t:8s} {m['iops']:>9.0f} IOPS  p50 {m['p50_us']:7.1f} us  "
                          f"storage {m['storage_cpu_us_per_io']:6.1f} us/IO", flush=True)
            med = {t: {k: statistics.median(x[k] for x in v) for k in v[0]} for t, v in runs.items()}
            results[name] = med
        print()
        extra = f" {'before':>10} {'t/before':>8}" if a.before else ""
        print(f"{'profile':<20} {'metric':<30} {'trireme':>10} {'nbdkit':>10} {'ratio':>7}{extra}  target (issue 18)")
        for name, jobs, depth in PROFILES:
            med = results[name]
            t, k = med["trireme"], med["nbdkit"]
            rows = [
                ("IOPS", "iops", ">= 0.9x" if jobs * depth > 1 else ""),
                ("p50 latency (us)", "p50_us", "<= 1.5x" if jobs * depth == 1 else ""),
                ("p99 latency (us)", "p99_us", ""),
                ("read p50 (us)", "read_p50_us", ""),
                ("write p50 (us)", "write_p50_us", ""),
                ("storage CPU us per IO", "storage_cpu_us_per_io", "<= 1.5x" if jobs * depth > 1 else ""),
                ("fio CPU us per IO", "generator_cpu_us_per_io", ""),
            ]
            for label, key, target in rows:
                ratio = t[key] / k[key] if k[key] else float("nan")
                verdict = ""
                if target.startswith(">="):
                    verdict = "met" if ratio >= float(target[3:-1]) else "NOT met"
                elif target.startswith("<="):
                    verdict = "met" if ratio <= float(target[3:-1]) else "NOT met"
                cols = ""
                if a.before:
                    b = med["before"][key]
                    cols = f" {b:>10.1f} {(t[key] / b if b else float('nan')):>7.2f}x"
                print(f"{name:<20} {label:<30} {t[key]:>10.1f} {k[key]:>10.1f} {ratio:>6.2f}x{cols}  {target} {verdict}")
        if a.json:
            with open(a.json, "w") as f:
                json.dump(results, f, indent=2)
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
