#!/usr/bin/env python3
"""Runs every test of the workspace, as `cargo test --workspace` does, two test binaries at a
time unless TEST_LANES says otherwise.

    scripts/test.py               # what `make test` runs after the lints
    TEST_LANES=1 scripts/test.py  # one binary at a time, its output as it comes
    scripts/test.py parity etcd   # only the binaries whose names hold one of these words

Two at a time take the tests from 22 to 12.5-15 min here: most slow binaries wait (guests under
qemu's emulation on one core, etcd elections, leases, timeouts). Binaries beside each other
share nothing they could take from each other: the ports servers are told to use and the
namespace sets' addresses are claimed under file locks (`crates/testkit`), and one guest runs
at a time. They do share two cores and one disk, so timing moves:
- binaries that measure rates (ALONE below) run alone, after the rest;
- a test that failed beside another binary runs again alone, by name, once the rest is done.
  If it passes alone, the run passes and the summary names it under FLAKY; if it fails
  again, the run fails.

The slowest binaries start first (the times of the last run, kept in target/test-times.json,
else the list below). Each binary's output is printed as it comes with one lane, whole when
it ends with two; a summary of every binary, slowest first, comes last. Exits non-zero when
a binary failed (or a test in it did, alone too), naming them.
"""

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIMES = ROOT / "target" / "test-times.json"
# Binaries that measure rates against each other (a limited volume's IOPS beside an unlimited
# one's): they run alone, after the rest, since a neighbour's load moves their numbers.
ALONE = {"qos"}
# Marks where a binary's output run again alone begins.
RERUN = "\n----- run again alone -----\n"
# Seconds each of the slow binaries took in `.ci/run` on a fresh clone of 8eae9bc, one at a time.
# Only their order matters: the slowest go first.
KNOWN = {
    "kernel_devices": 202, "etcd": 152, "failures": 109, "seeds": 106, "parity": 104,
    "snapshots": 73, "failures_between_hosts": 73, "readme_servers": 59, "hostile": 57,
    "observe": 51, "qos": 34, "nvmf": 33, "ucx_fallback": 27, "etcd_boundary": 24,
}


def build():
    """Builds every test binary; returns them as (name, executable, package directory)."""
    cmd = ["cargo", "test", "--workspace", "--locked", "--no-run",
           "--message-format=json-render-diagnostics"]
    out = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    if out.returncode != 0:
        sys.exit(f"test.py: building the tests failed ({' '.join(cmd)})")
    found = []
    for line in out.stdout.splitlines():
        msg = json.loads(line)
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        if not msg["profile"]["test"]:
            continue
        target = msg["target"]
        kind = "lib" if target["kind"] == ["lib"] else target["kind"][0]
        pkg = Path(msg["manifest_path"]).parent
        name = target["name"] if kind == "test" else f"{pkg.name}:{kind}:{target['name']}"
        found.append((name, msg["executable"], pkg))
    return found


def has_doc_tests():
    """Whether a doc comment in the workspace holds a code block rustdoc would run (a fence
    with no language, or a Rust one). None does today, and rustdoc takes about a minute to
    find none."""
    runs = {"", "rust", "no_run", "should_panic", "compile_fail", "edition2021", "edition2024"}
    for path in ROOT.glob("crates/*/src/**/*.rs"):
        open_fence = False
        for line in path.read_text(errors="replace").splitlines():
            text = line.strip()
            if not text.startswith(("///", "//!")):
                continue
            text = text[3:].strip()
            if not text.startswith("```"):
                continue
            if not open_fence and set(text[3:].strip().split(",")) <= runs:
                return True
            open_fence = not open_fence
    return False


def weight(name, last):
    return last.get(name, KNOWN.get(name, 0))


class Lanes:
    """A pool that runs jobs `lanes` at a time and prints each job's output."""

    def __init__(self, jobs, lanes):
        self.jobs = list(jobs)
        self.lanes = lanes
        self.lock = threading.Lock()
        self.results = []

    def run(self):
        threads = [threading.Thread(target=self.lane) for _ in range(self.lanes)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return self.results

    def lane(self):
        while True:
            with self.lock:
                if not self.jobs:
                    return
                name, argv, cwd = self.jobs.pop(0)
                print(f"----- {name}: started", flush=True)
            start = time.monotonic()
            code, text = run_binary(argv, cwd, stream=self.lanes == 1)
            secs = time.monotonic() - start
            with self.lock:
                print(f"\n===== {name}: {'ok' if code == 0 else 'FAILED'}, "
                      f"{secs:.1f} s =====", flush=True)
                if self.lanes > 1:
                    sys.stdout.write(text)
                    sys.stdout.flush()
                self.results.append((name, secs, code, text))


def run_binary(argv, cwd, stream):
    """Runs one binary; returns its exit code and output. With `stream` (alone in its lane)
    its output is printed as it comes (a hung test shows how far it got); beside others, kept
    for the end so that two binaries' lines do not mix."""
    env = dict(os.environ, CARGO_MANIFEST_DIR=str(cwd))
    p = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    lines = []
    for raw in p.stdout:
        line = raw.decode("utf-8", "replace")
        lines.append(line)
        if stream:
            sys.stdout.write(line)
            sys.stdout.flush()
    return p.wait(), "".join(lines)


def counts(text):
    """The passed and failed counts of a libtest output."""
    passed = failed = 0
    for line in text.splitlines():
        if line.startswith("test result:"):
            words = line.replace(";", "").split()
            passed += int(words[words.index("passed") - 1])
            failed += int(words[words.index("failed") - 1])
    return passed, failed


def outcome(text):
    """Passed and failed counts of a binary's output, reruns included: after a rerun of its
    failed tests alone, the first run's failures that passed count as passed."""
    runs = text.split(RERUN)
    passed, failed = counts(runs[0])
    for again in runs[1:]:
        p2, f2 = counts(again)
        passed, failed = passed + (failed - f2), f2
    return passed, failed


def failed_tests(text):
    """The names of the tests a libtest output says failed."""
    names = []
    for line in text.splitlines():
        if line.startswith("test ") and line.rstrip().endswith("... FAILED"):
            names.append(line[len("test "):-len(" ... FAILED")].strip())
    return names


def rerun_alone(results, jobs):
    """Runs again, one at a time, the tests that failed beside another binary (not those of
    ALONE, which ran alone already): their failed tests by name, or the whole binary if none
    was named (a crash). Returns the results with each failure that passed alone marked, and
    the names of those tests."""
    by_name = {name: (argv, cwd) for name, argv, cwd in jobs}
    flaky = []
    out = []
    for name, secs, code, text in results:
        if code == 0 or name in ALONE:
            out.append((name, secs, code, text))
            continue
        argv, cwd = by_name[name]
        names = failed_tests(text)
        again = argv + (names + ["--exact"] if names else [])
        print(f"\n----- {name}: failed beside another binary; again alone: "
              f"{', '.join(names) or 'every test'}", flush=True)
        code2, text2 = run_binary(again, cwd, stream=True)
        text2 = RERUN + text2
        if code2 == 0:
            flaky += [f"{name}::{t}" for t in names] or [name]
            code = 0
        out.append((name, secs, code, text + text2))
    return out, flaky


def main():
    words = sys.argv[1:]
    lanes = int(os.environ.get("TEST_LANES", "2"))
    if lanes < 1:
        sys.exit("test.py: TEST_LANES must be 1 or more")
    binaries = build()
    if words:
        binaries = [b for b in binaries if any(w in b[0] for w in words)]
    try:
        last = json.loads(TIMES.read_text())
    except (OSError, ValueError):
        last = {}
    binaries.sort(key=lambda b: -weight(b[0], last))
    jobs = [(name, [exe], cwd) for name, exe, cwd in binaries]
    if not words and has_doc_tests():
        jobs.append(("doc-tests", ["cargo", "test", "--workspace", "--locked", "--doc", "-q"],
                     ROOT))
    start = time.monotonic()
    shared = [j for j in jobs if j[0] not in ALONE]
    alone = [j for j in jobs if j[0] in ALONE]
    results = Lanes(shared, lanes).run() + Lanes(alone, 1).run()
    flaky = []
    if lanes > 1:
        results, flaky = rerun_alone(results, jobs)
    wall = time.monotonic() - start
    last.update({name: round(secs, 1) for name, secs, _, _ in results})
    TIMES.parent.mkdir(exist_ok=True)
    TIMES.write_text(json.dumps(last, indent=1, sort_keys=True))

    print(f"\n===== summary: {len(results)} binaries, {lanes} at a time =====")
    print(f"{'binary':<40} {'seconds':>8} {'passed':>7} {'failed':>7}")
    total_pass = total_fail = 0
    bad = []
    for name, secs, code, text in sorted(results, key=lambda r: -r[1]):
        passed, failed = outcome(text)
        total_pass += passed
        total_fail += failed
        if code != 0:
            bad.append(name)
        print(f"{name:<40} {secs:8.1f} {passed:7} {failed:7}{'' if code == 0 else '  FAILED'}")
    busy = sum(r[1] for r in results)
    print(f"\n{total_pass} passed, {total_fail} failed; {wall:.0f} s of wall time "
          f"for {busy:.0f} s of binaries")
    if flaky:
        print("\nFLAKY: failed beside another binary, then passed alone (look into them):")
        for t in flaky:
            print(f"  {t}")
    if bad:
        sys.exit(f"test.py: failed: {', '.join(bad)}")


if __name__ == "__main__":
    main()
