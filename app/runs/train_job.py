"""The `train` job: submit the trainer through the run's execution backend, follow it, stop it on cancel.

The backend is the run's cluster (`app.runs.backends`): `local`, the worker's own host, by default, where the trainer
is a subprocess in its own process group under a supervisor that takes it down the moment the worker dies; or a
Slurm or Ray cluster, where the run outlives the worker and the next worker polls it again from the submission
stored in its directory. The trainer writes metrics.jsonl, run.json, eval.json and the model directory under the
run's directory; the job reports progress from what the trainer wrote (its last logged step of its total), copies
new log text from the backend into the job's log and, on a retry after a worker crash (or after the cluster
preempted the run), asks the trainer to resume from its checkpoint. A failed run fails with the backend's reason and
the trainer's last exception line; the whole log is the job's.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.runs import cluster_job
from app.runs.backends.base import LOCAL, Backend, Cluster, Launch, Resources, Status, Submission, submission_name
from app.runs.backends.local import RUN_MARKER, STOP_GRACE_S, kill_leftovers, run_marker, supervise
from app.runs.cluster_job import failure_reason, tail

if TYPE_CHECKING:
    from app.jobs.context import JobContext

# The app's database code is imported inside the job's functions, never at the top: the supervisor runs this
# module (`python -m app.runs.train_job --supervise`) for a whole training run, and loads nothing but the stdlib.

# The supervisor and the leftovers' sweep live with the local backend; their names stay importable here.
__all__ = ["RUN_MARKER", "STOP_GRACE_S", "check_against_humans", "failure_reason", "kill_leftovers", "run",
           "run_marker", "supervise"]

READS = ("model", "train", "eval", "prompts", "reward_model", "process_reward_model")
"""Config fields that name files or directories the trainer reads: a cluster must see each of them."""


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


def trainer_args(kind: str, config_path: Path) -> list[str]:
    """The arguments of `python -m training`: every path the run needs (data, model, output) is in the config."""
    return [kind, "--config", str(config_path), "--quiet"]


def run(ctx: JobContext) -> dict[str, Any]:
    from app.jobs.context import (  # not at the top: keeps the supervisor stdlib-only
        JobError,
        JobStopped,
        JobWait,
        will_retry,
    )

    try:
        return _run(ctx)
    except (JobStopped, JobWait):  # stopped, or waiting for a slot: the run's state is not this attempt's to end
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
    from app.jobs.context import JobStopped, job_row
    from app.platform.db import session_scope  # not at the top: keeps the supervisor stdlib-only
    from app.runs import training_runs

    run_id = int(ctx.payload["training_run_id"])
    out = training_runs.run_dir(ctx.settings.data_dir, run_id)
    with session_scope(ctx.session_factory) as db:
        tr = job_row(db, training_runs.find, run_id, "training run")
        if tr.state == "cancelled":
            raise JobStopped("cancelled")
        kind = tr.kind
        resolved = dict((tr.config or {}).get("resolved") or {})
        where = dict((tr.config or {}).get("where") or {})
        cluster, resources = cluster_job.placement(ctx, db, where)
        if not (out / cluster_job.SUBMISSION_FILE).exists():  # a run already on the cluster keeps its slot
            _wait_for_slot(ctx, db, cluster, run_id)
        training_runs.set_state(db, run_id, "running")
        checksums = _export_checksums(ctx, training_runs.export_of(db, tr))
        if isinstance(resolved.get("server_base_url"), str):  # the trainer fetches from it: checked again now
            resolved["server_base_url"] = _checked_server_url(db, resolved["server_base_url"])
    out.mkdir(parents=True, exist_ok=True)
    backend = cluster_job.backend_for(cluster)
    config = resolved | {"out": str(out)}
    submission = _earlier_submission(ctx, backend, run_id, out, config)
    launch = _launch(ctx, kind, config, out, resources, submission_name(cluster.job_prefix, ctx.job_id,
                                                                        submission.attempt if submission else 1))
    launch = dataclasses.replace(launch, checksums=checksums if backend.remote else {})
    tracker = Progress(out, int(config.get("steps") or 0), ctx)
    try:
        if submission is None:
            submission = cluster_job.submit(ctx, backend, launch)
        else:
            ctx.log(f"following {backend.kind} job {submission.id} again (submitted by an earlier attempt)")
        status, stopped = cluster_job.follow(ctx, backend, submission, launch, poll=tracker.poll,
                                             next_launch=lambda done: _next_attempt(done, config), what="trainer",
                                             resumes=", resuming from the last checkpoint")
    finally:
        backend.close()
    _end_unless_succeeded(ctx, run_id, backend, status, stopped, out, tracker)
    steps = tracker.poll(final=True)  # only now: a run that stopped early gets `end`'s line, not a time left
    result: dict[str, Any] = {"training_run_id": run_id, "steps": steps,
                              "message": f"{kind} run finished after {steps} logged steps"}
    if cluster.name != LOCAL:
        result["cluster"] = cluster.name
    if kind == "reward":
        result["human_check"] = write_human_check(ctx, run_id)
    _set_state(ctx, run_id, "succeeded")
    if kind == "reward":
        result["priorities_job_id"] = queue_priorities(ctx, run_id)
    return result


def _earlier_submission(ctx: JobContext, backend: Backend, run_id: int, out: Path,
                        config: dict[str, Any]) -> Submission | None:
    """What an earlier attempt submitted to a cluster, to follow again; None, and the run's config written (to resume
    from the checkpoint on a retry, a dead local attempt's leftovers gone), when a new submission is due."""
    submission = cluster_job.earlier(backend, out)
    if submission is not None:
        return submission
    if ctx.attempts > 1:
        if not backend.remote:
            _clear_dead_attempt(ctx, run_id, out)
        config["resume"] = True
    write_toml(out / "run.toml", config)
    return None


def _end_unless_succeeded(ctx: JobContext, run_id: int, backend: Backend, status: Status, stopped: bool,
                          out: Path, tracker: Progress) -> None:
    """Record how a run that did not succeed ended, and raise what ends its job (JobStopped or JobError)."""
    from app.jobs.context import JobError, JobStopped

    if stopped:
        if ctx.stop_reason == "cancelled":
            tracker.end("cancelled")
            _set_state(ctx, run_id, "cancelled")
        elif ctx.stop_reason == "terminating" and not backend.remote:
            tracker.end("stopped: the worker shut down, the run will resume")
            _set_state(ctx, run_id, "queued")
        # "terminating" on a cluster: the run goes on there, and the worker that takes the job follows it again.
        # "lost": another worker took the job over and owns the run's state now; leave it alone.
        raise JobStopped(ctx.stop_reason or "stopped")
    if status.state == "cancelled":
        tracker.end("cancelled")
        _set_state(ctx, run_id, "cancelled")
        raise JobError(status.reason or "the run was cancelled on the cluster")
    if status.state != "succeeded":
        reason = failure_reason(ctx.log_path)  # read before the progress line below becomes the log's last
        tracker.end("failed")
        _set_state(ctx, run_id, "failed")
        raise JobError(f"{status.reason}: {reason}")
    if not _complete_model(out / "model"):
        _set_state(ctx, run_id, "failed")
        raise JobError(f"the trainer exited 0 but {out / 'model'} holds no complete model (config.json and "
                       f"weights):\n{tail(ctx.log_path)}")


def _export_checksums(ctx: JobContext, export: Any) -> dict[str, str]:
    """The export's files (as its card lists them, with their sha256) where the run reads them."""
    if export is None or not export.files:
        return {}
    root = Path(export.path) if export.path else ctx.settings.data_dir / "exports" / str(export.id)
    return {str(root / name): str(sha) for name, sha in dict(export.files).items()}


def _wait_for_slot(ctx: JobContext, db: Any, cluster: Cluster, run_id: int) -> None:
    """JobWait (back to the queue, the run still queued) while the cluster runs as many runs as its cap allows."""
    from app.runs import cluster_config

    cluster_job.wait_for_slot(ctx, cluster, cluster_config.slot_wait(db, cluster, run_id))


def _launch(ctx: JobContext, kind: str, config: dict[str, Any], out: Path, resources: Resources,
            name: str) -> Launch:
    env = cluster_job.OFFLINE_ENV | {RUN_MARKER: str(out.resolve())}  # the job writes progress lines (Progress)
    reads = tuple(Path(config[k]) for k in READS if isinstance(config.get(k), str) and config[k])
    return Launch(name=name, attempt=int(name.rsplit("-", 1)[1]), module="training",
                  args=trainer_args(kind, out / "run.toml"), workdir=out, log_path=ctx.log_path,
                  resources=resources, reads=reads, env=env)


def _next_attempt(launch: Launch, config: dict[str, Any]) -> Launch:
    """A preempted run submitted again resumes from its last checkpoint."""
    config["resume"] = True
    write_toml(launch.workdir / "run.toml", config)
    return cluster_job.again(launch)


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


def _complete_model(path: Path) -> bool:
    weights = ("*.safetensors", "*.bin", "*.safetensors.index.json")
    return (path / "config.json").is_file() and any(next(path.glob(p), None) for p in weights)


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
            self._publish(steps, total, eta, line)
        self.ctx.progress(steps, total, line)
        return steps

    def end(self, how: str) -> None:
        """The run stopped before its last step ("cancelled", "failed"): the last word on its progress says so, with
        no time left, so neither the log nor the page goes on promising minutes that will never come."""
        steps, total = progress(self.out, self.configured)
        total = max(total, steps)
        line = f"step {steps}/{total}, {how}"
        self._publish(steps, total, None, line)
        self.ctx.progress(steps, total, line)

    def _publish(self, steps: int, total: int, eta: int | None, line: str) -> None:
        self.ctx.log(f"progress: {line}")
        record = {"step": steps, "total": total, "eta_s": eta, "line": line, "at": datetime.now(UTC).isoformat()}
        tmp = self.out / (PROGRESS_FILE + ".tmp")
        tmp.write_text(json.dumps(record), encoding="utf-8")
        tmp.replace(self.out / PROGRESS_FILE)  # whole: the page never reads half a file


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
