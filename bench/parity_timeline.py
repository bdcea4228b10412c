#!/usr/bin/env python3
"""Reads a writer's timeline (bench/parity_diag_timeline.patch): `start_us end_us what` lines,
`w` for a client write, else an encode step. Prints, for each kind of step, its count, mean
length and the client writes completed a second while one ran; the rate inside and outside
any encode; and p50/p99 of writes that overlapped an encode against the others."""
import bisect
import collections
import sys

events = [line.split() for line in open(sys.argv[1])]
writes = [(int(a), int(b)) for a, b, w in events if w == "w"]
steps = [(int(a), int(b), w) for a, b, w in events if w != "w"]
t0, t1 = min(b for _, b in writes), max(b for _, b in writes)
ends = sorted(b for _, b in writes)


def done_between(a, b):
    return bisect.bisect(ends, b) - bisect.bisect(ends, a)


print(f"{len(ends)} writes over {(t1 - t0) / 1e6:.1f} s: {len(ends) / ((t1 - t0) / 1e6):.0f} a second")
by = collections.defaultdict(lambda: [0, 0, 0])
for a, b, w in steps:
    if t0 <= a and b <= t1:
        d = by[w]
        d[0] += 1
        d[1] += b - a
        d[2] += done_between(a, b)
print("| step | count | mean | client writes a second meanwhile |")
print("|---|---|---|---|")
for w, (count, us, n) in by.items():
    rate = f"{n / (us / 1e6):.0f}" if us else "-"
    print(f"| {w} | {count} | {us / count / 1000:.2f} ms | {rate} |")
busy = []
for a, b in sorted((a, b) for a, b, _ in steps if t0 <= a and b <= t1):
    if busy and a <= busy[-1][1]:
        busy[-1][1] = max(busy[-1][1], b)
    else:
        busy.append([a, b])
inside = sum(b - a for a, b in busy)
n_in = sum(done_between(a, b) for a, b in busy)
print(f"inside an encode {inside / 1e6:.2f} s, {n_in / (inside / 1e6):.0f} writes a second; "
      f"outside {(t1 - t0 - inside) / 1e6:.2f} s, {(len(ends) - n_in) / ((t1 - t0 - inside) / 1e6):.0f}")
starts = [a for a, _ in busy]
overlapping, alone = [], []
for a, b in writes:
    i = bisect.bisect(starts, b)
    near = busy[max(0, i - 2):i + 1]
    (overlapping if any(x < b and a < y for x, y in near) else alone).append(b - a)
for name, lat in (("overlapping an encode", overlapping), ("not", alone)):
    lat.sort()
    if lat:
        print(f"{name}: {len(lat)} writes, p50 {lat[len(lat) // 2]} us, p99 {lat[int(len(lat) * 0.99)]} us")
