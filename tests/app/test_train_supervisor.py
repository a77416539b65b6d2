"""The trainer's supervisor (`python -m app.runs.train_job --supervise`): woken by its lifeline, never by a timer.

Here the test plays the worker: it holds the write end of the lifeline and stays alive throughout, so a
supervisor that polled for a new parent process would never notice anything. Only the pipe can wake it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.crash

FOREVER = "import time\nwhile True:\n    time.sleep(1)\n"


def _wait_for(what: str, condition: Callable[[], Any], timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def _trainer_running(pgid: int) -> bool:
    """The supervised command has been exec'd (a signal sent between fork and exec could be lost)."""
    for pid in set(_group(pgid)) - {pgid}:  # the supervisor leads the group, and its arguments hold the code too
        try:
            if b"time.sleep" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return True
        except OSError:
            continue
    return False


def _group(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group."""
    members = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


@pytest.fixture
def supervised() -> Iterator[Callable[[str], tuple[subprocess.Popen, int]]]:  # type: ignore[type-arg]
    started: list[subprocess.Popen] = []  # type: ignore[type-arg]

    def start(code: str) -> tuple[subprocess.Popen, int]:  # type: ignore[type-arg]
        lifeline, keep = os.pipe()
        proc = subprocess.Popen([sys.executable, "-m", "app.runs.train_job", "--supervise", str(lifeline), "--",
                                 sys.executable, "-c", code], pass_fds=(lifeline,), start_new_session=True)
        os.close(lifeline)
        started.append(proc)
        return proc, keep

    yield start
    for proc in started:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)


def test_the_trainers_group_dies_when_the_lifeline_closes_while_the_parent_lives(supervised) -> None:  # type: ignore[no-untyped-def]
    proc, keep = supervised(FOREVER)
    _wait_for("the trainer to start", lambda: _trainer_running(proc.pid))
    os.close(keep)  # what the kernel does when the worker dies, by SIGKILL or otherwise
    assert proc.wait(timeout=30) == -signal.SIGKILL
    _wait_for("the whole group to be gone", lambda: not _group(proc.pid))


def test_a_trainer_that_ends_on_its_own_returns_its_code_and_nothing_is_killed(supervised) -> None:  # type: ignore[no-untyped-def]
    proc, keep = supervised("import sys; sys.exit(3)")
    try:
        assert proc.wait(timeout=60) == 3
    finally:
        os.close(keep)


def test_sigterm_reaches_the_trainer_and_the_supervisor_reports_it(supervised) -> None:  # type: ignore[no-untyped-def]
    proc, keep = supervised(FOREVER)
    try:
        _wait_for("the trainer to start", lambda: _trainer_running(proc.pid))
        os.killpg(proc.pid, signal.SIGTERM)  # how the worker cancels: the supervisor ignores it, the trainer dies
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        os.close(keep)


def test_the_supervisor_module_loads_the_standard_library_alone() -> None:
    # It lives for a whole training run beside the trainer: no database driver, web framework or TOML writer.
    code = ("import sys\nimport app.runs.train_job\n"
            "third = sorted({m.split('.')[0] for m in sys.modules if not m.startswith('_')}\n"
            "               - set(sys.stdlib_module_names) - {'app'})\n"
            "print(','.join(third))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""
