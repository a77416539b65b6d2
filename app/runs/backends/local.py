"""The `local` backend: the command runs on the worker's own host, in its own process group under a supervisor that
takes the whole group down the moment the worker dies (`supervise`); its output goes straight into the job's log.

This is how every run executed before there were other backends, and it stays the default.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from app.runs.backends.base import Launch, Status, Submission

STOP_GRACE_S = 10.0
RUN_MARKER = "PREFLAB_TRAINING_RUN"
"""Environment variable every trainer process of a run inherits: how a retry finds a dead attempt's leftovers. Its
value is the run's own directory, not its id: two instances on one host (two data directories, CI beside a dev
server) number their runs alike, and a retry must never kill the other instance's trainer."""
SUPERVISOR = "app.runs.train_job"
"""The module whose `--supervise` entry runs `supervise` (the command line tests and operators know)."""


def run_marker(run_dir: Path) -> bytes:
    """The `RUN_MARKER=...` entry, as it appears in /proc/PID/environ, of the trainers writing into run_dir."""
    return f"{RUN_MARKER}={run_dir.resolve()}".encode() + b"\0"


def command(launch: Launch, *, accelerate_config: str | None) -> list[str]:
    """`python -m MODULE ARGS` (under `accelerate launch` with a config, which spreads it over the host's GPUs)."""
    args = ["-m", launch.module, *launch.args]
    if accelerate_config:
        return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", accelerate_config, *args]
    return [sys.executable, *args]


class LocalBackend:
    """One supervised process group per submission, held by this worker (a new worker cannot adopt it: the
    supervisor killed it when the old one died, so the retry resumes from the trainer's checkpoint instead)."""

    kind = "local"
    remote = False

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self._fds: list[int] = []

    def check(self, launch: Launch) -> None:
        return None  # the worker's own disk: the paths were made on it

    def describe(self, launch: Launch) -> str:
        accelerate = os.environ.get("PREFLAB_ACCELERATE_CONFIG") or None
        return "$ " + " ".join(shlex.quote(c) for c in command(launch, accelerate_config=accelerate))

    def submit(self, launch: Launch) -> Submission:
        accelerate = os.environ.get("PREFLAB_ACCELERATE_CONFIG") or None
        cmd = command(launch, accelerate_config=accelerate)
        env = os.environ.copy() | launch.env | {RUN_MARKER: str(launch.workdir.resolve())}
        # The supervisor's lifeline: this process holds the only write end, so the kernel closes it when the worker
        # dies, however it dies, and the supervisor wakes at once to that end of file.
        lifeline, keep = os.pipe()
        self._fds = [lifeline, keep]
        supervised = [sys.executable, "-m", SUPERVISOR, "--supervise", str(lifeline), "--", *cmd]
        with open(launch.log_path, "ab") as log:
            self.proc = subprocess.Popen(supervised, stdout=log, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True, cwd=str(launch.workdir), pass_fds=(lifeline,))
        os.close(lifeline)
        self._fds = [keep]
        return Submission(self.kind, str(self.proc.pid), launch.attempt)

    def find(self, launch: Launch) -> Submission | None:
        return None  # see the class: nothing of a dead worker's run is left to adopt

    def status(self, submission: Submission) -> Status:
        assert self.proc is not None  # status is asked of the submission this backend made
        code = self.proc.poll()
        if code is None:
            return Status("running")
        if code == 0:
            return Status("succeeded", exit_code=0)
        return Status("failed", f"the trainer exited with code {code}", exit_code=code)

    def read_log(self, submission: Submission, final: bool = False) -> tuple[str, int]:
        return "", submission.log_offset  # the trainer writes into the job's log itself

    def cancel(self, submission: Submission) -> None:
        """SIGTERM the trainer's whole process group (accelerate children too), SIGKILL after a grace period."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        except ProcessLookupError:
            pass

    def close(self) -> None:
        # Closing our end takes the trainer down too: it never outlives the job that supervises it.
        for fd in self._fds:
            os.close(fd)
        self._fds = []


def kill_leftovers(run_dir: Path) -> list[int]:
    """SIGKILL every process that carries this run's marker (a dead attempt's trainer and its children, should
    its supervisor have died too) and wait until they are gone; the pids killed. Linux /proc only: elsewhere
    the supervisor alone guards against orphans."""
    marker = run_marker(run_dir)
    killed = []
    for entry in Path("/proc").glob("[0-9]*"):
        pid = int(entry.name)
        if pid == os.getpid():
            continue
        try:
            if marker not in (entry / "environ").read_bytes():
                continue
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except (OSError, ValueError):  # gone already, or not ours to read
            continue
    deadline = time.monotonic() + 10
    while killed and time.monotonic() < deadline and any(_alive(pid) for pid in killed):
        time.sleep(0.05)
    return killed


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/status").read_text().find("State:\tZ") < 0  # a zombie has stopped writing
    except OSError:
        return False


def supervise(lifeline: int, cmd: list[str]) -> int:
    """Run `cmd` in this process group and take the whole group down the moment the worker dies.

    The worker starts this with start_new_session, so the group is the trainer and everything it spawns
    (accelerate's ranks too). `lifeline` is the read end of a pipe whose only write end the worker holds and
    never writes to: when the worker dies, even by SIGKILL, the kernel closes that end and the read here returns
    end of file at once, with no polling interval for an orphaned trainer to keep training in. Pipes behave so on
    every POSIX system; preflab's workers need POSIX anyway (process groups), so there is no polling fallback.
    SIGTERM from the worker (cancel, shutdown) reaches the trainer through the group; the supervisor just waits.
    """
    signal.signal(signal.SIGTERM, lambda _signum, _frame: None)
    child = subprocess.Popen(cmd)  # close_fds: the trainer does not inherit the lifeline
    threading.Thread(target=_kill_group_when_closed, args=(lifeline,), daemon=True).start()
    code = child.wait()
    return code if code >= 0 else 128 - code


def _kill_group_when_closed(lifeline: int) -> None:
    while True:
        try:
            if not os.read(lifeline, 64):  # end of file: the worker is gone
                break
        except InterruptedError:
            continue
        except OSError:  # the descriptor is unusable: treat it as a dead worker rather than run unsupervised
            break
    os.killpg(os.getpgrp(), signal.SIGKILL)
