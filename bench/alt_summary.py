#!/usr/bin/env python3
"""Pools the rounds of several runs of bench/snapshots-alt.sh, per build and mode.

Reads files holding runs' output, each run under a heading line `## LABEL: NAME` (as in
bench/results/pool-file-2026-11-29.txt), or plain output files given as LABEL=FILE. Prints per
label the median, quartiles and mean of every round's "snapped vs plain" IOPS ratio, each run's
median, and the median storage CPU per I/O ratio.

  python3 bench/alt_summary.py bench/results/pool-file-2026-11-29.txt
  python3 bench/alt_summary.py head=run1.txt head=run2.txt pool=run3.txt
"""
import re
import statistics as st
import sys

IOPS = re.compile(r"snapped vs plain, IOPS: ([\d. ]+?)  median")
CPU = re.compile(r"snapped vs plain, storage CPU/IO: ([\d. ]+?)  median")


def runs(args):
    """(label, text of one run) for each run in the arguments."""
    for a in args:
        label, sep, path = a.partition("=")
        if sep:
            yield label, open(path).read()
            continue
        label, lines = None, []
        for line in open(a).read().splitlines() + ["## end: "]:
            if line.startswith("## "):
                if label is not None:
                    yield label, "\n".join(lines)
                label, lines = line[3:].split(":")[0], []
            else:
                lines.append(line)


def main(args):
    pooled = {}
    for label, text in runs(args):
        io, cpu = IOPS.search(text), CPU.search(text)
        if not io or not cpu:
            continue
        p = pooled.setdefault(label, ([], [], []))
        rounds = [float(x) for x in io.group(1).split()]
        p[0].extend(rounds)
        p[1].extend(float(x) for x in cpu.group(1).split())
        p[2].append(st.median(rounds))
    for label, (io, cpu, meds) in pooled.items():
        q = st.quantiles(io, n=4) if len(io) > 1 else [io[0]] * 3
        print(f"{label:14} rounds {len(io):2}  IOPS ratio median {st.median(io):.2f} "
              f"(quartiles {q[0]:.2f}/{q[2]:.2f}, mean {st.mean(io):.3f}; run medians "
              f"{' '.join('%.2f' % m for m in meds)})  storage CPU/IO ratio median {st.median(cpu):.2f}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
