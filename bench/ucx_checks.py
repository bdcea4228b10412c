#!/usr/bin/env python3
"""What a check on the UCX path costs, side by side in one run.

The baseline is the same tree with the check taken out by a patch, built into its own binary
(a git worktree of HEAD with the patch applied, under target/). The patch:

  bench/ucx_answer_baseline.patch (the default; issue 34): a writer takes a UCX answer for its
    call without checking that it carries the link's secret and comes from the endpoint the
    call went to, and nodes answer without naming their endpoint.

(Issue 16 measured the per-request secret the same way; its numbers are in bench/results.)
Two local clusters run at once, one per binary, each 3 nodes with a 3-way memory volume, and
rounds alternate between them:

1. s2d (the seeds' profile) through the native client, whose links go over UCX (shared
   memory on this host: no RDMA device here): IOPS, CPU us per IO, p90 read and write.
2. 4K random reads at QD1: mean latency, where a per-message cost shows most.

    python3 bench/ucx_checks.py [ROUNDS] [SECONDS]     (defaults: 3 rounds of 8 s)
    TRIREME_BASELINE_PATCH=bench/OTHER.patch python3 bench/ucx_checks.py

Needs a release build (cargo build --release). The baseline is built on first use.
"""

import os
import statistics
import subprocess
import sys

from localcluster import Cluster, cpu

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
T = os.environ.get("TRIREME_BIN", os.path.join(ROOT, "target/release/trireme"))
PATCH = os.environ.get("TRIREME_BASELINE_PATCH", os.path.join(ROOT, "bench/ucx_answer_baseline.patch"))
BASE_TREE = os.path.join(ROOT, "target", "baseline-" + os.path.basename(PATCH).rsplit(".", 1)[0])
BASE = os.environ.get("TRIREME_BASELINE_BIN", os.path.join(BASE_TREE, "target/release/trireme"))
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 3
SECS = int(sys.argv[2]) if len(sys.argv) > 2 else 8


def build_baseline():
    if os.path.exists(BASE):
        return
    if not os.path.exists(BASE_TREE):
        subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", BASE_TREE, "HEAD"],
                       check=True)
        subprocess.run(["git", "-C", BASE_TREE, "apply", PATCH], check=True)
    print(f"building the baseline ({os.path.basename(PATCH)}) in", BASE_TREE, flush=True)
    subprocess.run(["cargo", "build", "--release", "-p", "trireme"], cwd=BASE_TREE, check=True)


def main():
    build_baseline()
    clusters = []
    try:
        clusters = [Cluster("checked", T, size="64M"), Cluster("baseline", BASE, size="64M")]
        for c in clusters:
            c.cli("volume", "create", "b", "--size", "256M", "--replicas", "3")
            # The memory store allocates at a page's first write: fill once, untimed.
            c.bench("-s", "-b1M", "-w100", "-t1", "-o4", "-W0", "-d6", "volume:b")
            links = ", ".join(c.bench("-b4K", "-r", "-t1", "-o1", "-W0", "-d1", "volume:b")["links"])
            print(f"{c.name}: {links}")
        runs = {(c.name, k): [] for c in clusters for k in ("s2d", "qd1")}
        print(f"$ trireme bench --profile s2d -d{SECS} volume:b; "
              f"trireme bench -b4K -r -t1 -o1 -d{SECS} volume:b   # {ROUNDS} rounds, "
              "alternating sides and which goes first")
        for r in range(ROUNDS):
            # Which side runs first alternates: the first of a pair runs on a machine the
            # other just left (an A/A run of one binary on both sides shows a few % for that).
            for c in (clusters if r % 2 == 0 else clusters[::-1]):
                j = c.bench("--profile", "s2d", f"-d{SECS}", "volume:b")
                runs[(c.name, "s2d")].append(j)
                q = c.bench("-b4K", "-r", "-t1", "-o1", "-W0", f"-d{SECS}", "volume:b")
                runs[(c.name, "qd1")].append(q)
                print(f"  round {r + 1} {c.name:8}: s2d {j['iops']:8.0f} IOPS, "
                      f"{cpu(j):6.1f} CPU us/IO; QD1 read {q['read']['latency_us']['mean']:6.1f} us")

        def med(name, kind, f):
            return statistics.median(f(j) for j in runs[(name, kind)])
        rows = [
            ("s2d IOPS", "s2d", lambda j: j["iops"]),
            ("s2d CPU us per IO", "s2d", cpu),
            ("s2d p90 read (us)", "s2d", lambda j: j["read"]["latency_us"]["p90"]),
            ("s2d p90 write (us)", "s2d", lambda j: j["write"]["latency_us"]["p90"]),
            ("QD1 4K read mean (us)", "qd1", lambda j: j["read"]["latency_us"]["mean"]),
            ("QD1 4K read IOPS", "qd1", lambda j: j["iops"]),
        ]
        print()
        # Medians of each side, and the median of the ratios of rounds run back to back (the
        # machine's load drifts between rounds more than within one pair).
        print(f"{'3-way volume, native client over UCX':38} {'checked':>10} {'baseline':>10} "
              f"{'ratio':>8} {'paired':>8}")
        for label, kind, f in rows:
            a, b = med("checked", kind, f), med("baseline", kind, f)
            pairs = statistics.median(
                f(x) / f(y) for x, y in zip(runs[("checked", kind)], runs[("baseline", kind)]))
            print(f"{label:38} {a:10.1f} {b:10.1f} {a / b:8.3f} {pairs:8.3f}")
    finally:
        for c in clusters:
            c.stop()


if __name__ == "__main__":
    main()
