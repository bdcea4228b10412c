#!/usr/bin/env python3
"""Storage tiers: hit ratio, IOPS against the slow tier alone, scans, a moving hot zone, failover.

One `trireme up --store tiered` cluster (3 nodes, 3-way volumes), the fast tier at --fast-pct
of the volume, the slow tier behind the disk model (8 ms per random I/O, 150 MB/s, 2 in
flight: this host has no spinning disk, so every number here is the model's). Two volumes of
the same size on the same nodes: `vol0` (tier auto) and `slowonly` (pinned to the slow tier),
both filled, both driven through NBD by `trireme bench` (4K random reads, QD1, DISKSPD's
`-rdpct90/10` hot zone). Reads rotate over the three copies, so each copy sees a third of them.

1. Warm-up: vol0 from cold for --warm-secs; the hit ratio and IOPS every --tick seconds (from
   the nodes' reads-by-tier counters).
2. Side by side: interleaved rounds of vol0 and slowonly, --round-secs each; QD1 IOPS ratio and
   vol0's hit ratio, against the best possible for 1 MiB extents.
3. Scan: a full sequential read of vol0 in 64K requests; promotions it caused over extents.
4. Hot-zone move: the zone jumps to 50-60% of the volume (`-rdpct0/50:90/10`); time until the
   hit ratio of a tick is back to 90% of step 2's, against fast size / migration rate.
5. Failover: node 1 is SIGKILLed while the hot zone runs; the hit ratio over the next 10 s.

Writes a chart of hit ratio and IOPS over time (steps 1 and 4), SVG and PNG, next to --json.

Usage: python3 bench/tiers.py [--size 1G] [--fast-pct 15] [--warm-secs 60] [--round-secs 15]
       [--rounds 2] [--json bench/results/tiers.json]
"""

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from localcluster import Cluster  # noqa: E402

MIB = 1 << 20


def parse_size(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * units[s[-1]] if s[-1] in units else int(s)


class Tiers:
    """Polls `volume info` for a volume's reads by tier, summed over its replicas."""

    def __init__(self, c, volume):
        self.c, self.volume = c, volume

    def read(self):
        out = subprocess.run([self.c.bin, "--data-dir", self.c.dir, "--output", "json", "volume",
                              "info", self.volume], capture_output=True, text=True)
        if out.returncode != 0:
            return None
        t = json.loads(out.stdout).get("tiers", [])
        return {
            "fast": sum(x["reads_fast"] for x in t),
            "slow": sum(x["reads_slow"] for x in t),
            "promotions": sum(x["promotions"] for x in t),
            "fast_extents": [x["fast_extents"] for x in t],
            "nodes": [x["node"] for x in t],
        }


def timeline(tiers, secs, tick, t_offset, out, stop=None):
    """Appends (t, hit ratio, reads/s) every tick for secs seconds."""
    prev, t0 = tiers.read(), time.time()
    while time.time() - t0 < secs and not (stop and stop.is_set()):
        time.sleep(tick)
        now = tiers.read()
        if now is None or prev is None:
            prev = now
            continue
        # A restarted node counts from zero again: count its reads from there.
        df, ds = now["fast"] - prev["fast"], now["slow"] - prev["slow"]
        if df < 0 or ds < 0:
            prev = now
            continue
        n = df + ds
        out.append((round(t_offset + time.time() - t0, 1), df / n if n else None, n / tick))
        prev = now


def run_bench(c, target, secs, rdpct="90/10", extra=()):
    return c.bench(target, "-b4K", f"-rdpct{rdpct}", "-w0", "-t1", "-o1", f"-d{secs}", "-W0",
                   *extra)


def svg(points, marks, path, title):
    """A two-axis line chart: hit ratio (left, 0..1) and IOPS (right) over time."""
    w, h, l, r, t, b = 860, 420, 60, 70, 40, 60
    pw, ph = w - l - r, h - t - b
    tmax = max(p[0] for p in points) or 1
    imax = -(-max((p[2] for p in points), default=1) * 1.1 // 250) * 250 or 250
    x = lambda s: l + pw * s / tmax  # noqa: E731
    yh = lambda v: t + ph * (1 - v)  # noqa: E731
    yi = lambda v: t + ph * (1 - v / imax)  # noqa: E731
    hit = " ".join(f"{x(p[0]):.1f},{yh(p[1]):.1f}" for p in points if p[1] is not None)
    iops = " ".join(f"{x(p[0]):.1f},{yi(p[2]):.1f}" for p in points)
    s = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
         f'font-family="sans-serif" font-size="12">',
         f'<rect width="{w}" height="{h}" fill="white"/>',
         f'<text x="{w / 2}" y="22" text-anchor="middle" font-size="15">{title}</text>',
         f'<rect x="{l}" y="{t}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>']
    for i in range(6):
        v = i / 5
        s.append(f'<text x="{l - 6}" y="{yh(v) + 4:.1f}" text-anchor="end">{v:.1f}</text>')
        s.append(f'<text x="{w - r + 6}" y="{yi(imax * v) + 4:.1f}">{imax * v:.0f}</text>')
        s.append(f'<line x1="{l}" x2="{l + pw}" y1="{yh(v):.1f}" y2="{yh(v):.1f}" '
                 f'stroke="#eee"/>')
    for i in range(11):
        s.append(f'<text x="{x(tmax * i / 10):.1f}" y="{t + ph + 16}" '
                 f'text-anchor="middle">{tmax * i / 10:.0f}</text>')
    for at, label in marks:
        s.append(f'<line x1="{x(at):.1f}" x2="{x(at):.1f}" y1="{t}" y2="{t + ph}" '
                 f'stroke="#c00" stroke-dasharray="4 3"/>')
        s.append(f'<text x="{x(at) + 4:.1f}" y="{t + 14}" fill="#c00">{label}</text>')
    s.append(f'<polyline points="{iops}" fill="none" stroke="#2a6fdb" stroke-width="1.5"/>')
    s.append(f'<polyline points="{hit}" fill="none" stroke="#1a9a3a" stroke-width="2"/>')
    s.append(f'<text x="{l}" y="{h - 30}" fill="#1a9a3a">hit ratio (left axis)</text>')
    s.append(f'<text x="{l + 170}" y="{h - 30}" fill="#2a6fdb">reads/s summed over the '
             f'copies (right axis)</text>')
    s.append(f'<text x="{w / 2}" y="{h - 12}" text-anchor="middle">seconds; slow tier: disk '
             f'model (8 ms per random I/O, 150 MB/s, 2 in flight); 4K random reads, QD1, '
             f'through NBD</text>')
    s.append("</svg>")
    open(path, "w").write("\n".join(s))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "trireme"))
    ap.add_argument("--size", default="1G")
    ap.add_argument("--fast-pct", type=int, default=15)
    ap.add_argument("--migrate-rate", default="32M")
    ap.add_argument("--warm-secs", type=int, default=60)
    ap.add_argument("--round-secs", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--move-secs", type=int, default=40)
    ap.add_argument("--tick", type=float, default=1.0)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    size = parse_size(a.size)
    fast = size * a.fast_pct // 100 // MIB * MIB
    rate = parse_size(a.migrate_rate)
    extents = size // MIB
    c = Cluster("tiers", a.bin, ["--fast-size", str(fast), "--migrate-rate", a.migrate_rate],
                size=a.size, store="tiered")
    res = {"when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "size": size, "fast_size_per_volume": fast, "migrate_rate": rate,
           "slow_tier": "disk model: 8 ms per random I/O, 150 MB/s streaming, 2 in flight",
           "workload": "4K random reads, QD1 (-t1 -o1), -rdpct90/10, through NBD"}
    nbd = None
    try:
        # The slow-only volume takes no fast room; vol0 gets the fast tier's --fast-pct.
        c.cli("volume", "create", "slowonly", "--size", a.size, "--tier", "slow")
        sock = os.path.join(c.dir, "slowonly.sock")
        nbd = subprocess.Popen([a.bin, "--data-dir", c.dir, "nbd", "slowonly", "--socket", sock],
                               stdout=subprocess.PIPE, text=True)
        slow_uri = nbd.stdout.readline().strip()
        print("filling both volumes (sequential 1 MiB writes)...", flush=True)
        for uri in (c.unix, slow_uri):
            c.bench(uri, "-b1M", "-s", "-w100", "-t1", "-o4", f"-d{max(4, size // (100 * MIB))}")
        vol0 = Tiers(c, "vol0")
        points, marks = [], []

        # 1. Warm-up from cold.
        print(f"1. warm-up, {a.warm_secs} s", flush=True)
        th = threading.Thread(target=timeline, args=(vol0, a.warm_secs, a.tick, 0, points))
        th.start()
        w = run_bench(c, c.unix, a.warm_secs)
        th.join()
        res["warmup"] = {"iops": w["iops"], "hit_ratio": w["tier"]["hit_ratio"],
                         "timeline": points[:]}

        # 2. Side by side, interleaved.
        best = 0.9 + 0.1 * max(0, fast // MIB - extents // 10) / (extents - extents // 10)
        rounds = []
        for i in range(a.rounds):
            print(f"2. round {i + 1}: vol0 then slowonly, {a.round_secs} s each", flush=True)
            t = run_bench(c, c.unix, a.round_secs)
            s = run_bench(c, slow_uri, a.round_secs)
            rounds.append({"tiered_iops": t["iops"], "hit_ratio": t["tier"]["hit_ratio"],
                           "slow_iops": s["iops"], "tiered_p50_us":
                           t["read"]["latency_us"]["p50"], "slow_p50_us":
                           s["read"]["latency_us"]["p50"]})
        med = lambda k: sorted(r[k] for r in rounds)[len(rounds) // 2]  # noqa: E731
        steady = med("hit_ratio")
        res["side_by_side"] = {"rounds": rounds, "tiered_iops": med("tiered_iops"),
                               "slow_iops": med("slow_iops"),
                               "ratio": med("tiered_iops") / med("slow_iops"),
                               "hit_ratio": steady, "best_hit_ratio": best,
                               "of_best": steady / best}

        # 3. A full sequential read.
        print("3. full sequential read in 64K requests", flush=True)
        before = vol0.read()
        c.bench(c.unix, "-b64K", "-s", "-w0", "-t1", "-o1",
                f"-d{max(5, int(size / (120 * MIB)) + 2)}")
        after = vol0.read()
        promoted = after["promotions"] - before["promotions"]
        res["scan"] = {"promotions_summed_over_copies": promoted,
                       "per_copy_pct_of_extents": 100 * promoted / 3 / extents}

        # 4. The hot zone moves.
        print(f"4. hot zone moves to 50-60%, {a.move_secs} s", flush=True)
        t_move = points[-1][0] + a.tick if points else 0
        marks.append((t_move, "hot zone moves"))
        moved = []
        th = threading.Thread(target=timeline, args=(vol0, a.move_secs, a.tick, t_move, moved))
        th.start()
        run_bench(c, c.unix, a.move_secs, rdpct="0/50:90/10")
        th.join()
        points += moved
        back = next((p[0] - t_move for p in moved if p[1] is not None and p[1] >= 0.9 * steady),
                    None)
        res["hot_zone_move"] = {"reconverge_s": back, "goal_s": 1.5 * fast / rate,
                                "timeline": moved}

        # 5. Failover under the moved zone.
        print("5. node 1 killed under load", flush=True)
        pids = open(os.path.join(c.dir, "pids")).read().split("\n")
        p1 = int(next(l.split()[1] for l in pids if l.startswith("node-1 ")))
        after_kill = []
        th = threading.Thread(target=timeline, args=(vol0, 10, 2.0, 0, after_kill))

        def kill():
            time.sleep(3)
            os.kill(p1, signal.SIGKILL)
            th.start()
        k = threading.Thread(target=kill)
        k.start()
        run_bench(c, c.unix, 16, rdpct="0/50:90/10")
        k.join()
        th.join()
        hits = [p[1] for p in after_kill if p[1] is not None]
        res["failover"] = {"hit_ratio_10s": (sum(hits) / len(hits)) if hits else None,
                           "timeline": after_kill}
    finally:
        if nbd:
            nbd.terminate()
        c.stop()

    out = a.json or os.path.join(ROOT, "bench", "results", "tiers.json")
    json.dump(res, open(out, "w"), indent=1)
    chart = os.path.splitext(out)[0] + ".svg"
    if points:
        svg(points, marks, chart, "trireme tiers: warm-up, then the hot zone moves")
        # PNG as the sweep charts make it (Debian's librsvg2-bin), when it is there.
        png = os.path.splitext(chart)[0] + ".png"
        try:
            subprocess.run(["rsvg-convert", "-o", png, chart], check=True)
        except (OSError, subprocess.CalledProcessError) as e:
            print(f"no PNG ({e})")
    sb = res["side_by_side"]
    print(f"""
hit ratio after warm-up: {sb['hit_ratio']:.3f} (best possible for 1 MiB extents {best:.3f}; {sb['of_best']:.2f} of it; goal 0.9)
QD1 random read IOPS: tiered {sb['tiered_iops']:.0f}, slow tier only {sb['slow_iops']:.0f}: {sb['ratio']:.1f}x (goal 5x)
full sequential read: {res['scan']['per_copy_pct_of_extents']:.2f}% of extents promoted per copy (goal under 1%)
hot zone move: back to 90% of the hit ratio after {res['hot_zone_move']['reconverge_s']} s (goal {res['hot_zone_move']['goal_s']:.1f} s = 1.5 x fast size / rate)
after node 1 was killed: hit ratio over the next 10 s {res['failover']['hit_ratio_10s']} (goal 0.8)
warm-up: {res['warmup']['iops']:.0f} IOPS, hit ratio {res['warmup']['hit_ratio']} over the whole warm-up
(slow tier: disk model; UCX over shared memory or unix sockets on one host; no RDMA here)
json: {out}  chart: {chart}""")


if __name__ == "__main__":
    main()
