"""Soak: run the tests that could race the clock many times in a row, idle and with every core busy.

    python tests/soak.py [--idle 10] [--busy 3] [--budget-minutes 240] [-- PYTEST ARGS...]

By default the tests are the slow ones (training, workers, the demo, browser), every crash and kill test, and
every browser test, on SQLite and, when PREFLAB_TEST_DATABASE_URL is set, on Postgres too. The busy phase starts
one CPU burner per core (each ends by itself at the deadline, or when this script dies) and stops them itself.
Prints one JSON line per run and a summary line; exits 1 if any run failed or the budget cut the soak short.
A test that fails here races the clock somewhere: fix the cause, never with a retry or a longer sleep.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SELECTION = ["tests", "-m", "slow or crash or browser"]


def burn(deadline: float, parent: int) -> None:
    """Keep one core busy until the deadline, or until the soak that started it is gone."""
    spins = 0
    while True:
        spins += 1
        if spins % 200_000 == 0 and (time.time() > deadline or os.getppid() != parent):
            return


class Burners:
    """One busy process per core for the length of a phase."""

    def __init__(self, seconds: float) -> None:
        deadline = time.time() + seconds
        self.procs = [multiprocessing.Process(target=burn, args=(deadline, os.getpid()), daemon=True)
                      for _ in range(os.cpu_count() or 1)]

    def __enter__(self) -> Burners:
        for proc in self.procs:
            proc.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            proc.join(timeout=10)


def run_once(pytest_args: list[str], phase: str, index: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "junit.xml"
        started = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
                               *pytest_args], cwd=ROOT, capture_output=True, text=True)
        seconds = time.monotonic() - started
        failures, counts = _read_report(report)
    row: dict[str, object] = {"soak": "run", "phase": phase, "run": index, "exit": proc.returncode,
                              "seconds": round(seconds, 1), "load": round(os.getloadavg()[0], 2), **counts,
                              "failed_tests": failures}
    if proc.returncode not in (0, 5) and not failures:  # a crash of pytest itself: show its last words
        row["output"] = proc.stdout[-2000:] + proc.stderr[-2000:]
    return row


def _read_report(path: Path) -> tuple[list[str], dict[str, int]]:
    if not path.exists():
        return [], {"tests": 0, "failed": 0, "skipped": 0}
    suite = ET.parse(path).getroot()
    suite = suite.find("testsuite") if suite.tag == "testsuites" else suite
    failed = []
    for case in suite.iter("testcase"):
        problem = case.find("failure") if case.find("failure") is not None else case.find("error")
        if problem is not None:
            message = (problem.get("message") or "").splitlines()[0][:300] if problem.get("message") else ""
            failed.append(f"{case.get('classname')}::{case.get('name')}: {message}")
    counts = {"tests": int(suite.get("tests", 0)), "failed": len(failed), "skipped": int(suite.get("skipped", 0))}
    return failed, counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle", type=int, default=10, help="runs with nothing else on the machine")
    parser.add_argument("--busy", type=int, default=3, help="runs with one CPU burner per core")
    parser.add_argument("--budget-minutes", type=float, default=240, help="stop before a run that would not fit")
    parser.add_argument("pytest_args", nargs="*", help="after --: what pytest runs (default: the soak selection)")
    args = parser.parse_args(argv)
    pytest_args = args.pytest_args or DEFAULT_SELECTION
    deadline = time.monotonic() + args.budget_minutes * 60
    rows: list[dict[str, object]] = []
    cut_short = False
    for phase, runs in (("idle", args.idle), ("busy", args.busy)):
        for index in range(1, runs + 1):
            longest = max((float(r["seconds"]) for r in rows), default=0.0)  # type: ignore[arg-type]
            if time.monotonic() + longest * (1.5 if phase == "busy" else 1.0) > deadline:
                cut_short = True
                break
            if phase == "busy":
                with Burners(seconds=max(60.0, deadline - time.monotonic())):
                    row = run_once(pytest_args, phase, index)
            else:
                row = run_once(pytest_args, phase, index)
            rows.append(row)
            print(json.dumps(row), flush=True)
    failed_runs = [r for r in rows if r["exit"] not in (0, 5)]
    summary = {"soak": "summary", "runs": len(rows), "failed_runs": len(failed_runs),
               "failures": sum(int(r["failed"]) for r in rows),  # type: ignore[call-overload]
               "cut_short_by_budget": cut_short, "minutes": round(sum(float(r["seconds"]) for r in rows) / 60, 1),
               "selection": " ".join(pytest_args)}
    print(json.dumps(summary), flush=True)
    return 1 if failed_runs or cut_short else 0


if __name__ == "__main__":
    sys.exit(main())
