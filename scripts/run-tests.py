#!/usr/bin/env python3
"""Runs every test binary of the workspace, several at a time; `make test` calls it.

`cargo test` runs test binaries one after another. Most of kedge's are end-to-end tests
that spend their time waiting on simulated clusters and real sockets (a full run keeps the
CPU about 10 % busy), so running a few binaries at once cuts the wall time without making
any of them wait for a CPU. What runs is exactly what `cargo test --workspace` runs: the
same binaries (listed by `cargo test --no-run`), each in its package's directory as cargo
runs it, plus the doc tests.

Usage: scripts/run-tests.py [--jobs N] [-- ARGS for every test binary]
  --jobs N   binaries run at once (default: $KEDGE_TEST_JOBS, else 3)

Each binary's output goes to target/test-logs/NAME.log; a line per binary says how it
ended; every failing binary's output is printed at the end. The durations of the last run
(target/test-logs/durations.json) order the next one, longest first. Exit status 1 when
anything failed.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / "target" / "test-logs"
DURATIONS = LOGS / "durations.json"
RESULT = re.compile(
    r"test result: (\w+)\. (\d+) passed; (\d+) failed; (\d+) ignored"
)


def binaries():
    """(name, executable, cwd) of every test binary `cargo test --workspace` runs."""
    out = subprocess.run(
        ["cargo", "test", "--workspace", "--no-run", "--message-format=json-render-diagnostics"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        check=True,
        text=True,
    ).stdout
    found = {}
    for line in out.splitlines():
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            continue
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        if not msg.get("profile", {}).get("test"):
            continue
        target = msg["target"]
        package = Path(msg["manifest_path"]).parent
        kind = target["kind"][0]
        name = f"{package.name}-{'unit' if kind in ('lib', 'bin') else target['name']}"
        if kind == "bin":
            name = f"{package.name}-bin-{target['name']}"
        found[name] = (msg["executable"], package)
    return [(n, exe, cwd) for n, (exe, cwd) in sorted(found.items())]


def summarize(text):
    """passed, failed, ignored over every `test result` line of a libtest output."""
    passed = failed = ignored = 0
    for m in RESULT.finditer(text):
        passed += int(m.group(2))
        failed += int(m.group(3))
        ignored += int(m.group(4))
    return passed, failed, ignored


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=int(os.environ.get("KEDGE_TEST_JOBS", "3")))
    parser.add_argument("args", nargs="*", help="passed to every test binary")
    opts = parser.parse_args()
    if opts.jobs < 1:
        sys.exit("--jobs must be at least 1")

    started = time.monotonic()
    print("building the test binaries (cargo test --workspace --no-run)...", flush=True)
    jobs = [(n, [exe, *opts.args], cwd) for n, exe, cwd in binaries()]
    jobs.append(("doc-tests", ["cargo", "test", "--workspace", "--doc", "-q"], ROOT))
    LOGS.mkdir(parents=True, exist_ok=True)
    try:
        last = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        last = {}
    # Longest first; a binary never timed goes first of all.
    jobs.sort(key=lambda j: -last.get(j[0], float("inf")))
    print(f"running {len(jobs)} test binaries, {opts.jobs} at a time; logs in {LOGS}", flush=True)

    lock = threading.Lock()
    pending = list(jobs)
    results = {}

    def worker():
        while True:
            with lock:
                if not pending:
                    return
                name, argv, cwd = pending.pop(0)
            log = LOGS / f"{name}.log"
            t0 = time.monotonic()
            with open(log, "w") as f:
                code = subprocess.run(argv, cwd=cwd, stdout=f, stderr=subprocess.STDOUT).returncode
            took = time.monotonic() - t0
            passed, failed, ignored = summarize(log.read_text(errors="replace"))
            ok = code == 0
            with lock:
                results[name] = (ok, took, log)
                state = "ok    " if ok else "FAILED"
                print(
                    f"{state} {name:<40} {took:7.1f} s  {passed} passed, {failed} failed, {ignored} ignored",
                    flush=True,
                )

    threads = [threading.Thread(target=worker) for _ in range(opts.jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    durations = {**last, **{n: round(r[1], 1) for n, r in results.items()}}
    DURATIONS.write_text(json.dumps(durations, indent=1, sort_keys=True))
    failed = [n for n, r in sorted(results.items()) if not r[0]]
    for name in failed:
        print(f"\n===== {name}: {results[name][2]} =====")
        sys.stdout.write(results[name][2].read_text(errors="replace"))
    totals = [summarize(r[2].read_text(errors="replace")) for r in results.values()]
    passed = sum(t[0] for t in totals)
    wall = time.monotonic() - started
    if failed:
        print(f"\n{len(failed)} of {len(results)} test binaries FAILED: {' '.join(failed)}")
        sys.exit(1)
    print(f"\nall {len(results)} test binaries passed ({passed} tests) in {wall:.0f} s")


if __name__ == "__main__":
    main()
