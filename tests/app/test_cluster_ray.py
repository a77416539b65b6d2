"""Runs on Ray: a real local Ray head (`ray start --head`, tests/support/ray_head.py), never a mocked one.

A reward run sent from the app ends with its model and curves; a running run is stopped through the Jobs API; a
worker killed mid-run leaves the job going, and the next worker follows the same submission id instead of
submitting again; a run whose shared path is missing fails at submit; two Ray Train workers (DDP over gloo) learn
what one process learns, loss for loss.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.app.test_job_crashes import _let_lease_lapse, _run_in_process
from tests.app.test_training_runs import _export, _ranked_project, _work, models_dir  # noqa: F401 (a fixture)
from tests.conftest import only_on
from tests.support import ray_head
from tests.support.clusters import reward_run, spawn_worker, unavailable, use_clusters
from tests.support.server import wait_for
from training.hold import ENV as HOLD_ENV


@pytest.fixture(scope="module")
def head() -> Iterator[ray_head.RayHead]:
    try:
        import ray.job_submission  # noqa: F401
    except ImportError:
        unavailable("Ray", "ray[default] is not installed (pip install 'preflab[cluster]')")
    try:
        started = ray_head.start()
    except RuntimeError as exc:
        unavailable("Ray", f"the head did not start: {exc}")
    yield started
    started.stop()


@dataclass
class Lab:
    """A Ray cluster `lab` on the local head, configured for one test; `configure(**env)` hands its runs more
    variables. Its job prefix is the test's own: job ids start again with every test's database, and the head keeps
    the earlier tests' jobs."""

    configure: Callable[..., str]
    prefix: str

    def name(self, job_id: int, attempt: int = 1) -> str:
        return f"{self.prefix}-{job_id}-{attempt}"


@pytest.fixture
def on_ray(head, app, monkeypatch, tmp_path_factory: pytest.TempPathFactory) -> Lab:  # type: ignore[no-untyped-def]
    conf = tmp_path_factory.mktemp("conf")
    prefix = f"preflab-{conf.name}"

    def configure(**env: str) -> str:
        use_clusters(app, monkeypatch, conf / "clusters.toml", {
            "lab": {"kind": "ray", "shared_dir": str(tmp_path_factory.getbasetemp()), "env": env,
                    "job_prefix": prefix, "resources": {"address": head.address, "cpus": 1}}})
        return "lab"

    return Lab(configure, prefix)


def _client(head: ray_head.RayHead) -> Any:
    from ray.job_submission import JobSubmissionClient

    return JobSubmissionClient(head.address)


def _submissions(head: ray_head.RayHead, name: str) -> list[Any]:
    return [job for job in _client(head).list_jobs() if job.submission_id == name]


def _log(app: Any, job_id: int) -> str:
    return (Path(app.state.settings.data_dir) / "jobs" / f"{job_id}.log").read_text()


def test_ray_reward_run_from_the_app_ends_with_its_model_curves_and_log(db, app, make_user, make_project, token_for,
                                                                        api, models_dir, head, on_ray) -> None:  # noqa: F811
    only_on(db, "sqlite", "the backend is the same; jobs and runs are tested on both")
    where = on_ray.configure()
    project_id, eng = _ranked_project(db, make_user, make_project, api, token_for, n=8)
    pairs = _export(eng, app, project_id, "pairs")
    run = reward_run(eng, project_id, pairs, models_dir["reward"], where)
    _work(app)
    job = eng.get(f"/api/jobs/{run['job_id']}").json()
    assert job["state"] == "succeeded", job
    out = eng.get(f"/api/training-runs/{run['run_id']}").json()
    assert out["state"] == "succeeded" and [m["step"] for m in out["metrics"]] == [1, 2, 3, 4]
    run_dir = Path(app.state.settings.data_dir) / "runs" / str(run["run_id"])
    assert (run_dir / "model" / "config.json").is_file()
    name = on_ray.name(run["job_id"])
    assert json.loads((run_dir / "submission.json").read_text())["id"] == name
    assert [job.status.value for job in _submissions(head, name)] == ["SUCCEEDED"]
    log = _log(app, run["job_id"])
    # Ray's own lines about the job come back with the trainer's, in the job's log, once.
    assert f"submitted to ray as job {name}" in log and log.count(f"Running entrypoint for job {name}") == 1
    assert log.count("progress: step 4/4") == 1


def test_ray_cancel_stops_a_running_job(db, app, make_user, make_project, token_for, api, models_dir, head,  # noqa: F811
                                        on_ray, tmp_path) -> None:
    only_on(db, "sqlite", "the backend is the same; jobs and runs are tested on both")
    release = tmp_path / "release"
    where = on_ray.configure(**{HOLD_ENV: f"train.step.2={release}"})  # the trainer on Ray waits at step 2
    project_id, eng = _ranked_project(db, make_user, make_project, api, token_for, n=8)
    pairs = _export(eng, app, project_id, "pairs")
    run = reward_run(eng, project_id, pairs, models_dir["reward"], where, steps=50)
    name = on_ray.name(run["job_id"])
    worker = spawn_worker(app)
    try:
        wait_for("the Ray job to reach step 2", Path(f"{release}.held").exists, timeout=600, every=0.1)
        assert eng.post(f"/api/training-runs/{run['run_id']}/cancel").json()["state"] == "cancelled"
        wait_for("Ray to stop the job", lambda: _submissions(head, name)[0].status.value == "STOPPED", timeout=60)
        wait_for("the job to end", lambda: eng.get(f"/api/jobs/{run['job_id']}").json()["state"] == "cancelled",
                 timeout=60)
    finally:
        release.touch()
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
    assert eng.get(f"/api/training-runs/{run['run_id']}").json()["state"] == "cancelled"


def test_ray_run_outlives_a_killed_worker_and_is_followed_without_a_second_submission(
        db, app, make_user, make_project, token_for, api, models_dir, head, on_ray, tmp_path) -> None:  # noqa: F811
    only_on(db, "sqlite", "the backend is the same; jobs and runs are tested on both")
    release = tmp_path / "release"
    where = on_ray.configure(**{HOLD_ENV: f"train.step.2={release}"})
    project_id, eng = _ranked_project(db, make_user, make_project, api, token_for, n=8)
    pairs = _export(eng, app, project_id, "pairs")
    run = reward_run(eng, project_id, pairs, models_dir["reward"], where)
    worker = spawn_worker(app)
    try:
        wait_for("the Ray job to reach step 2", Path(f"{release}.held").exists, timeout=600, every=0.1)
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=30)
    release.touch()  # the worker is gone; the run goes on on the cluster
    assert eng.get(f"/api/training-runs/{run['run_id']}").json()["state"] == "running"
    _let_lease_lapse(db, run["job_id"], stale_after=1)
    assert _run_in_process(app, stale_after_s=1) == 1
    job = eng.get(f"/api/jobs/{run['job_id']}").json()
    assert (job["state"], job["attempts"]) == ("succeeded", 2), job
    name = on_ray.name(run["job_id"])
    assert len(_submissions(head, name)) == 1 and not _submissions(head, on_ray.name(run["job_id"], 2))
    out = eng.get(f"/api/training-runs/{run['run_id']}").json()
    assert out["state"] == "succeeded" and [m["step"] for m in out["metrics"]] == [1, 2, 3, 4]
    log = _log(app, run["job_id"])
    assert f"following ray job {name} again" in log and log.count(f"Running entrypoint for job {name}") == 1


def test_ray_run_whose_shared_path_is_missing_fails_at_submit(db, app, make_user, make_project, token_for, api,
                                                              models_dir, head, monkeypatch,  # noqa: F811
                                                              tmp_path) -> None:
    only_on(db, "sqlite", "the backend is the same; jobs and runs are tested on both")
    missing = tmp_path / "not-mounted"
    use_clusters(app, monkeypatch, tmp_path / "clusters.toml", {
        "lab": {"kind": "ray", "shared_dir": str(missing), "job_prefix": "preflab-unshared",
                "resources": {"address": head.address}}})
    project_id, eng = _ranked_project(db, make_user, make_project, api, token_for, n=4)
    pairs = _export(eng, app, project_id, "pairs")
    run = reward_run(eng, project_id, pairs, models_dir["reward"], "lab")
    _work(app)
    job = eng.get(f"/api/jobs/{run['job_id']}").json()
    assert job["state"] == "failed" and f"the shared path {missing} of cluster lab does not exist" in job["error"]
    assert not _submissions(head, f"preflab-unshared-{run['job_id']}-1")
    assert eng.get(f"/api/training-runs/{run['run_id']}").json()["state"] == "failed"


def test_ray_two_ddp_workers_learn_what_one_process_learns(db, app, make_user, make_project, token_for, api,
                                                           models_dir, head, on_ray) -> None:  # noqa: F811
    only_on(db, "sqlite", "the backend is the same; jobs and runs are tested on both")
    where = on_ray.configure()
    project_id, eng = _ranked_project(db, make_user, make_project, api, token_for, n=8)
    pairs = _export(eng, app, project_id, "pairs")
    config = {"steps": 3, "batch_size": 4, "lr": 1e-2, "log_every": 1, "eval_every": 1000000}
    alone = eng.post(f"/api/projects/{project_id}/training-runs", json={
        "kind": "reward", "export_id": pairs, "base_model": str(models_dir["reward"]), "config": config}).json()
    ddp = eng.post(f"/api/projects/{project_id}/training-runs", json={
        "kind": "reward", "export_id": pairs, "base_model": str(models_dir["reward"]), "config": config,
        "where": where, "resources": {"workers": 2}}).json()
    _work(app)
    one, two = (eng.get(f"/api/training-runs/{r['run_id']}").json() for r in (alone, ddp))
    assert (one["state"], two["state"]) == ("succeeded", "succeeded"), _log(app, ddp["job_id"])[-3000:]
    run_dir = Path(app.state.settings.data_dir) / "runs" / str(ddp["run_id"])
    assert json.loads((run_dir / "run.json").read_text())["processes"] == 2  # the Accelerator saw both workers
    assert (run_dir / "ray_results").is_dir()  # Ray Train's own records stay beside the run
    assert [m["loss"] for m in two["metrics"]] == pytest.approx([m["loss"] for m in one["metrics"]], abs=1e-5)
