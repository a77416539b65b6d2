"""The `train` job: run the trainer as a subprocess in its own process group, follow it, stop it on cancel.

The trainer writes metrics.jsonl, run.json, eval.json and the model directory under DATA_DIR/runs/<id>/; the job
reports progress from what the trainer wrote (its last logged step of its total) and, on a retry after a worker
crash, asks the trainer to resume from its checkpoint. A non-zero exit fails the run with the trainer's last
exception line; the whole log is the job's. A supervisor process between the worker and the trainer takes the
trainer down the moment the worker dies (`supervise`).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.jobs.context import JobContext

# The app's database code is imported inside the job's functions, never at the top: the supervisor runs this
# module (`python -m app.runs.train_job --supervise`) for a whole training run, and loads nothing but the stdlib.

STOP_GRACE_S = 10.0
RUN_MARKER = "PREFLAB_TRAINING_RUN"
"""Environment variable every trainer process of a run inherits: how a retry finds a dead attempt's leftovers. Its
value is the run's own directory, not its id: two instances on one host (two data directories, CI beside a dev
server) number their runs alike, and a retry must never kill the other instance's trainer."""


def run_marker(run_dir: Path) -> bytes:
    """The `RUN_MARKER=...` entry, as it appears in /proc/PID/environ, of the trainers writing into run_dir."""
    return f"{RUN_MARKER}={run_dir.resolve()}".encode() + b"\0"


def write_toml(path: Path, config: dict[str, Any]) -> None:
    """The run's config as the trainer's TOML file; an unset value (None), which TOML cannot say, is left out."""
    import tomli_w  # not at the top: the supervisor runs this module with the stdlib alone

    path.write_text(tomli_w.dumps(_without_none(config)), encoding="utf-8")


def _without_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [_without_none(v) for v in value]
    return value


def command(kind: str, config_path: Path, *, accelerate_config: str | None) -> list[str]:
    """`python -m training KIND --config run.toml` (under `accelerate launch` with a config): every path the run
    needs (data, model, output) is in the config."""
    args = ["-m", "training", kind, "--config", str(config_path), "--quiet"]
    if accelerate_config:
        return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", accelerate_config, *args]
    return [sys.executable, *args]


def run(ctx: JobContext) -> dict[str, Any]:
    from app.jobs.context import JobError, JobStopped, will_retry  # not at the top: keeps the supervisor stdlib-only

    try:
        return _run(ctx)
    except JobStopped:
        raise
    except JobError:  # never retried: the run fails now
        _set_state(ctx, int(ctx.payload["training_run_id"]), "failed")
        raise
    except Exception as exc:
        # Whatever went wrong, the run must not stay "running" on the page; a crash the worker retries leaves it
        # queued for that attempt, so training_run.failed is told once, when the last attempt fails.
        retried = will_retry(exc, ctx.attempts, ctx.max_attempts)
        _set_state(ctx, int(ctx.payload["training_run_id"]), "queued" if retried else "failed")
        raise


def _run(ctx: JobContext) -> dict[str, Any]:
    from app.jobs.context import JobError, JobStopped, job_row
    from app.platform.db import session_scope  # not at the top: keeps the supervisor stdlib-only
    from app.runs import training_runs

    run_id = int(ctx.payload["training_run_id"])
    with session_scope(ctx.session_factory) as db:
        tr = job_row(db, training_runs.find, run_id, "training run")
        if tr.state == "cancelled":
            raise JobStopped("cancelled")
        training_runs.set_state(db, run_id, "running")
        kind = tr.kind
        resolved = dict((tr.config or {}).get("resolved") or {})
        if isinstance(resolved.get("server_base_url"), str):  # the trainer fetches from it: checked again now
            resolved["server_base_url"] = _checked_server_url(db, resolved["server_base_url"])
    out = training_runs.run_dir(ctx.settings.data_dir, run_id)
    out.mkdir(parents=True, exist_ok=True)
    config = resolved | {"out": str(out)}
    if ctx.attempts > 1:
        _clear_dead_attempt(ctx, run_id, out)
        config["resume"] = True
    config_path = out / "run.toml"
    write_toml(config_path, config)
    accelerate = os.environ.get("PREFLAB_ACCELERATE_CONFIG") or None
    cmd = command(kind, config_path, accelerate_config=accelerate)
    ctx.log("$ " + " ".join(shlex.quote(c) for c in cmd))
    # No progress bars in the log: a bar redraws its line with carriage returns, which a log file keeps as one
    # line per redraw (the same line over and over); the job writes the run's progress lines itself (Progress).
    env = os.environ.copy() | {"PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                               "TQDM_DISABLE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1", RUN_MARKER: str(out.resolve())}
    # The supervisor's lifeline: this process holds the only write end, so the kernel closes it when the worker
    # dies, however it dies, and the supervisor wakes at once to that end of file.
    lifeline, keep = os.pipe()
    supervised = [sys.executable, "-m", "app.runs.train_job", "--supervise", str(lifeline), "--", *cmd]
    try:
        with open(ctx.log_path, "ab") as log:
            proc = subprocess.Popen(supervised, stdout=log, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True, cwd=str(out), pass_fds=(lifeline,))
        os.close(lifeline)
        lifeline = -1
        stopped = False
        tracker = Progress(out, int(config.get("steps") or 0), ctx)
        while proc.poll() is None:
            if ctx.should_stop() and not stopped:
                stopped = True
                _stop_group(proc, ctx)
            tracker.poll()
            time.sleep(0.5)
    finally:
        # Closing our end takes the trainer down too: it never outlives the job that supervises it.
        for fd in (lifeline, keep):
            if fd >= 0:
                os.close(fd)
    steps = tracker.poll(final=True)
    if stopped:
        if ctx.stop_reason == "cancelled":
            _set_state(ctx, run_id, "cancelled")
        elif ctx.stop_reason == "terminating":
            _set_state(ctx, run_id, "queued")
        # "lost": another worker took the job over and owns the run's state now; leave it alone.
        raise JobStopped(ctx.stop_reason or "stopped")
    if proc.returncode != 0:
        _set_state(ctx, run_id, "failed")
        raise JobError(f"the trainer exited with code {proc.returncode}: {failure_reason(ctx.log_path)}")
    if not _complete_model(out / "model"):
        _set_state(ctx, run_id, "failed")
        raise JobError(f"the trainer exited 0 but {out / 'model'} holds no complete model (config.json and "
                       f"weights):\n{_tail(ctx.log_path)}")
    result: dict[str, Any] = {"training_run_id": run_id, "steps": steps,
                              "message": f"{kind} run finished after {steps} logged steps"}
    if kind == "reward":
        result["human_check"] = write_human_check(ctx, run_id)
    _set_state(ctx, run_id, "succeeded")
    if kind == "reward":
        result["priorities_job_id"] = queue_priorities(ctx, run_id)
    return result


def queue_priorities(ctx: JobContext, run_id: int) -> int | None:
    """A project whose queue is ordered by uncertainty gets new priorities from the reward model just trained."""
    from app.annotation import selection
    from app.platform.db import session_scope  # not at the top: keeps the supervisor stdlib-only
    from app.runs import training_runs

    with session_scope(ctx.session_factory) as db:
        tr = training_runs.find(db, run_id)
        project = training_runs.project_of(db, tr) if tr else None
        if project is None or selection.selection_of(project) != "uncertainty":
            return None
        job = selection.request_priorities(db, project, None, training_run_id=run_id, check_permission=False)
        ctx.log(f"queue priorities from this reward model: job {job.id}")
        return job.id


def _checked_server_url(db: Any, url: str) -> str:
    """A rollout server URL (GRPO's `server_base_url`) under the model endpoints' outbound rules as they stand now
    (a name may resolve inward since the run was accepted, an endpoint's trust may be withdrawn), or JobError."""
    from app.jobs.context import JobError
    from app.judge import endpoints
    from app.platform.errors import DomainError

    try:
        return endpoints.recheck_server_url(db, url, field="config.server_base_url")
    except DomainError as exc:
        raise JobError(f"config.server_base_url: {exc.message}") from None


def _clear_dead_attempt(ctx: JobContext, run_id: int, out: Path) -> None:
    """The worker died mid-run: nothing of that attempt may still write here, and what it finished writing (a model
    directory saved half-way) is not the result. The retry continues from the trainer's checkpoint."""
    killed = kill_leftovers(out)
    if killed:
        ctx.log(f"killed {len(killed)} process(es) left by the previous attempt: {killed}")
    for name in ("model", "value_model", "eval.json", "human_check.json"):
        path = out / name
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def write_human_check(ctx: JobContext, run_id: int) -> dict[str, Any]:
    """Score the project's held-out human pairs and the pairs labelled since the export; saved beside the run."""
    from app.platform.db import session_scope  # not at the top: keeps the supervisor stdlib-only
    from app.runs import rm_check, training_runs

    with session_scope(ctx.session_factory) as db:
        tr = training_runs.find(db, run_id)
        assert tr is not None and tr.model_dir is not None  # checked after the run saved its model
        export = training_runs.export_of(db, tr)
        report = rm_check.check(db, tr.project_id, tr.model_dir, export.created_at if export else None)
    report["checked_at"] = datetime.now(UTC).isoformat()
    path = training_runs.run_dir(ctx.settings.data_dir, run_id) / "human_check.json"
    path.write_text(json.dumps(report, indent=2), encoding="utf-8")
    ctx.log(f"reward model against humans: {report}")
    return report


def _stop_group(proc: subprocess.Popen, ctx: JobContext) -> None:
    """SIGTERM the trainer's whole process group (accelerate children too), SIGKILL after a grace period."""
    ctx.log(f"stopping the trainer ({ctx.stop_reason})")
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def _complete_model(path: Path) -> bool:
    weights = ("*.safetensors", "*.bin", "*.safetensors.index.json")
    return (path / "config.json").is_file() and any(next(path.glob(p), None) for p in weights)


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


def progress(out: Path, configured_steps: int) -> tuple[int, int]:
    """(last step logged, total steps) of a run: what the trainer itself wrote, the same figures as its log.

    The total is the trainer's own (run.json's `total_steps`: an epoch-based run knows it only once its data is
    read); until then the configured `steps`. The step is the `step` of metrics.jsonl's last complete row.
    """
    total = configured_steps
    try:
        total = int(json.loads((out / "run.json").read_text(encoding="utf-8")).get("total_steps") or total)
    except (OSError, ValueError):
        pass
    return _last_step(out / "metrics.jsonl"), total


PROGRESS_FILE = "progress.json"
"""OUT/progress.json: the progress line the job last wrote to the log, as figures for the run page."""
PROGRESS_EVERY_S = 5.0


class Progress:
    """The run's one progress figure, from what the trainer wrote (`progress`): the job logs it as a line
    ("progress: step 7/20, about 2 min 18 s left") and writes the same figures to OUT/progress.json for the run page,
    so the page and the log never disagree. The time left is the pace since the first step the job saw (model
    loading before it is not a step), projected over the steps still to go."""

    def __init__(self, out: Path, configured_steps: int, ctx: JobContext, every_s: float = PROGRESS_EVERY_S) -> None:
        self.out, self.configured, self.ctx, self.every_s = out, configured_steps, ctx, every_s
        self.first: tuple[float, int] | None = None
        self.shown: tuple[float, int] = (0.0, -1)

    def poll(self, final: bool = False) -> int:
        """Read the trainer's figures; log and publish them when they moved (at most every `every_s`, but always the
        first step, the last one and the final figure); the steps done."""
        steps, total = progress(self.out, self.configured)
        total = max(total, steps)
        now = time.monotonic()
        if steps and self.first is None:
            self.first = (now, steps)
        eta = None
        if self.first is not None and steps > self.first[1] and total > steps:
            eta = round((now - self.first[0]) / (steps - self.first[1]) * (total - steps))
        line = f"step {steps}/{total}" + (f", about {duration(eta)} left" if eta is not None else "")
        shown_at, shown_step = self.shown
        due = steps != shown_step and (final or steps >= total or shown_step <= 0 or now - shown_at >= self.every_s)
        if steps and due:
            self.shown = (now, steps)
            self.ctx.log(f"progress: {line}")
            record = {"step": steps, "total": total, "eta_s": eta, "line": line, "at": datetime.now(UTC).isoformat()}
            tmp = self.out / (PROGRESS_FILE + ".tmp")
            tmp.write_text(json.dumps(record), encoding="utf-8")
            tmp.replace(self.out / PROGRESS_FILE)  # whole: the page never reads half a file
        self.ctx.progress(steps, total, line)
        return steps


def duration(seconds: float) -> str:
    """2 h 5 min, 2 min 18 s, 40 s."""
    seconds = max(0, int(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600} h {(seconds % 3600) // 60} min"
    if seconds >= 60:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds} s"


def _last_step(path: Path) -> int:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 65536))  # the last rows are enough: a row is far shorter than this
            lines = fh.read().split(b"\n")[:-1]  # the part after the last newline may be a row still being written
    except OSError:
        return 0
    for line in reversed(lines):
        try:
            return int(json.loads(line).get("step", 0))
        except ValueError:
            continue
    return 0


ERROR_LINE = re.compile(r"^(?:[\w.]+(?:Error|Exception|Interrupt)(?::|$)|error: )")


def failure_reason(path: Path) -> str:
    """Why the trainer failed, in one line: the last exception line of its log (`ValueError: …`, `error: …`), else
    its last line; the whole traceback stays in the job's log."""
    lines = [line.strip() for line in _tail(path, 200).splitlines() if line.strip()]
    for line in reversed(lines):
        if ERROR_LINE.match(line):
            return line[:500]
    return lines[-1][:500] if lines else "no output (see the job log)"


def _tail(path: Path, lines: int = 25) -> str:
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _set_state(ctx: JobContext, run_id: int, state: str) -> None:
    from app.platform.db import session_scope  # not at the top: keeps the supervisor stdlib-only
    from app.runs import training_runs

    with session_scope(ctx.session_factory) as db:
        training_runs.set_state(db, run_id, state)


def check_against_humans(ctx: JobContext) -> dict[str, Any]:
    """The `rm_check` job: re-score a finished reward model against today's human labels (drift)."""
    report = write_human_check(ctx, int(ctx.payload["training_run_id"]))
    return {"human_check": report, "message": f"held-out accuracy {report['heldout_accuracy']}, "
                                              f"since export {report['accuracy_after_export']}"}


if __name__ == "__main__":  # python -m app.runs.train_job --supervise <lifeline fd> -- <trainer command…>
    if len(sys.argv) < 5 or sys.argv[1] != "--supervise" or sys.argv[3] != "--":
        sys.exit("usage: python -m app.runs.train_job --supervise LIFELINE_FD -- COMMAND...")
    sys.exit(supervise(int(sys.argv[2]), sys.argv[4:]))
