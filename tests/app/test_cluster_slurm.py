"""Runs on Slurm: a real single-node Slurm on this machine (tests/support/slurm.py), never a mocked one.

A reward run sent from the app ends with its model and curves; a running run is cancelled through scancel; a worker
killed mid-run leaves the run going, and the next worker follows the same Slurm job instead of submitting again;
a run whose shared path is missing fails at submit. The job script and the end states are checked without Slurm.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.runs.backends.base import Cluster, Launch, Resources
from app.runs.backends.slurm import job_script, sbatch_lines, slurm_status
from tests.app.test_job_crashes import _let_lease_lapse, _run_in_process
from tests.app.test_training_runs import _export, _ranked_project, _work, models_dir  # noqa: F401 (a fixture)
from tests.conftest import only_on
from tests.support import slurm as local_slurm
from tests.support.clusters import reward_run, spawn_worker, unavailable, use_clusters
from tests.support.server import wait_for
from training.hold import ENV as HOLD_ENV


@pytest.fixture(scope="module")
def slurm() -> Iterator[local_slurm.Slurm]:
    if os.geteuid() != 0:
        unavailable("Slurm", "the test daemons run as root")
    if local_slurm.missing():
        unavailable("Slurm", f"not installed: {', '.join(local_slurm.missing())} (apt-get install slurm-wlm munge)")
    try:
        started = local_slurm.start()
    except (RuntimeError, subprocess.SubprocessError) as exc:
        unavailable("Slurm", f"it did not start: {exc}")
    os.environ.update(started.env)  # sbatch, squeue and scontrol in the workers find the test's configuration
    yield started
    os.environ.pop("SLURM_CONF", None)
    started.stop()


@pytest.fixture
def hpc(slurm, app, monkeypatch, tmp_path_factory: pytest.TempPathFactory) -> str:  # type: ignore[no-untyped-def]
    """A Slurm cluster named hpc whose shared path holds the test's data directory and models."""
    use_clusters(app, monkeypatch, tmp_path_factory.mktemp("conf") / "clusters.toml", {
        "hpc": {"kind": "slurm", "shared_dir": str(tmp_path_factory.getbasetemp()),
                "resources": {"cpus": 1, "time_limit_min": 30}}})
    return "hpc"


def _jobs(name: str | None = None) -> list[str]:
    """`ID STATE` of every job Slurm knows (of that name), oldest first."""
    done = subprocess.run(["squeue", "--noheader", "--states=all", "--format=%i %T", "--sort=i",
                           *([f"--name={name}"] if name else [])], capture_output=True, text=True, timeout=30, check=True)
    return done.stdout.split("\n")[:-1]


def _node_cpus() -> int:
    done = subprocess.run(["sinfo", "--noheader", "--format=%c"], capture_output=True, text=True, timeout=30, check=True)
    return int(done.stdout.split()[0])


@pytest.fixture
def new_jobs(slurm):  # type: ignore[no-untyped-def]
    """The jobs of a name submitted since the test began (ids start again with every test's database, names too)."""
    before = max((int(line.split()[0]) for line in _jobs()), default=0)
    return lambda name: [line for line in _jobs(name) if int(line.split()[0]) > before]


def test_slurm_reward_run_from_the_app_ends_with_its_model_curves_and_log(db, app, make_user, make_project, token_for,
                                                                          api, models_dir, hpc, new_jobs) -> None:  # noqa: F811
    only_on(db, "sqlite", "the backend is the same; jobs and runs are tested on both")
    project_id, eng = _ranked_project(db, make_user, make_project, api, token_for, n=8)
    pairs = _export(eng, app, project_id, "pairs")
    run = reward_run(eng, project_id, pairs, models_dir["reward"], hpc)
    _work(app)
    job = eng.get(f"/api/jobs/{run['job_id']}").json()
    assert job["state"] == "succeeded", job
    out = eng.get(f"/api/training-runs/{run['run_id']}").json()
    assert out["state"] == "succeeded" and [m["step"] for m in out["metrics"]] == [1, 2, 3, 4]
    assert out["config"]["where"] == {"cluster": "hpc", "kind": "slurm", "resources": {}}
    run_dir = Path(app.state.settings.data_dir) / "runs" / str(run["run_id"])
    assert (run_dir / "model" / "config.json").is_file()
    submission = json.loads((run_dir / "submission.json").read_text())
    assert submission["backend"] == "slurm" and new_jobs(f"preflab-{run['job_id']}-1")[0].split() == [
        submission["id"], "COMPLETED"]
    # The trainer's output, written on the node, is in the job's log (copied from the stored offset), once.
    log = (Path(app.state.settings.data_dir) / "jobs" / f"{run['job_id']}.log").read_text()
    assert f"submitted to slurm as job {submission['id']}" in log and log.count("progress: step 4/4") == 1


def test_slurm_cancel_stops_a_running_job_through_scancel(db, app, make_user, make_project, token_for, api,
                                                          models_dir, hpc, tmp_path, new_jobs) -> None:  # noqa: F811
    only_on(db, "sqlite", "the backend is the same; jobs and runs are tested on both")
    project_id, eng = _ranked_project(db, make_user, make_project, api, token_for, n=8)
    pairs = _export(eng, app, project_id, "pairs")
    release = tmp_path / "release"
    run = reward_run(eng, project_id, pairs, models_dir["reward"], hpc, steps=50)
    # sbatch hands the worker's environment to the job: the trainer on the node waits at step 2.
    worker = spawn_worker(app, env={HOLD_ENV: f"train.step.2={release}"})
    try:
        try:
            wait_for("the Slurm job to reach step 2", Path(f"{release}.held").exists, timeout=600, every=0.1)
            assert new_jobs(f"preflab-{run['job_id']}-1")[0].endswith("RUNNING")
            assert eng.post(f"/api/training-runs/{run['run_id']}/cancel").json()["state"] == "cancelled"
            wait_for("Slurm to cancel the job",
                     lambda: new_jobs(f"preflab-{run['job_id']}-1")[0].endswith("CANCELLED"), timeout=60)
            wait_for("the job to end", lambda: eng.get(f"/api/jobs/{run['job_id']}").json()["state"] == "cancelled",
                     timeout=60)
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(timeout=60)
    finally:
        release.touch()
    assert eng.get(f"/api/training-runs/{run['run_id']}").json()["state"] == "cancelled"


def test_slurm_run_outlives_a_killed_worker_and_is_followed_without_a_second_submission(
        db, app, make_user, make_project, token_for, api, models_dir, hpc, tmp_path, new_jobs) -> None:  # noqa: F811
    only_on(db, "sqlite", "the backend is the same; jobs and runs are tested on both")
    project_id, eng = _ranked_project(db, make_user, make_project, api, token_for, n=8)
    pairs = _export(eng, app, project_id, "pairs")
    release = tmp_path / "release"
    run = reward_run(eng, project_id, pairs, models_dir["reward"], hpc)
    worker = spawn_worker(app, env={HOLD_ENV: f"train.step.2={release}"})
    try:
        wait_for("the Slurm job to reach step 2", Path(f"{release}.held").exists, timeout=600, every=0.1)
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=30)
    # The worker is gone; the run goes on on the cluster.
    release.touch()
    assert eng.get(f"/api/training-runs/{run['run_id']}").json()["state"] == "running"
    _let_lease_lapse(db, run["job_id"], stale_after=1)
    assert _run_in_process(app, stale_after_s=1) == 1
    job = eng.get(f"/api/jobs/{run['job_id']}").json()
    assert (job["state"], job["attempts"]) == ("succeeded", 2), job
    assert len(new_jobs(f"preflab-{run['job_id']}-1")) == 1 and not new_jobs(f"preflab-{run['job_id']}-2")
    out = eng.get(f"/api/training-runs/{run['run_id']}").json()
    assert out["state"] == "succeeded" and [m["step"] for m in out["metrics"]] == [1, 2, 3, 4]
    log = (Path(app.state.settings.data_dir) / "jobs" / f"{run['job_id']}.log").read_text()
    assert "following slurm job" in log and log.count("progress: step 4/4") == 1


def test_slurm_preempted_run_is_submitted_again_and_resumes_from_its_checkpoint(
        db, app, make_user, make_project, token_for, api, models_dir, hpc, tmp_path, new_jobs) -> None:  # noqa: F811
    only_on(db, "sqlite", "the backend is the same; jobs and runs are tested on both")
    project_id, eng = _ranked_project(db, make_user, make_project, api, token_for, n=8)
    pairs = _export(eng, app, project_id, "pairs")
    release = tmp_path / "release"
    # The run takes the whole node in the low partition and waits at step 2, checkpointed; a job in the high
    # partition then needs the node, and Slurm preempts the run.
    run = reward_run(eng, project_id, pairs, models_dir["reward"], hpc, save_every=2,
                     resources={"partition": "low", "cpus": _node_cpus()})
    worker = spawn_worker(app, env={HOLD_ENV: f"train.step.2={release}"})
    try:
        wait_for("the Slurm job to reach step 2", Path(f"{release}.held").exists, timeout=600, every=0.1)
        subprocess.run(["sbatch", "--partition=high", f"--cpus-per-task={_node_cpus()}",
                        f"--output={tmp_path / 'high.log'}", "--wrap", "sleep 1"], check=True, capture_output=True)
        wait_for("the run to be preempted", lambda: (new_jobs(f"preflab-{run['job_id']}-1") or [""])[0]
                 .endswith("PREEMPTED"), timeout=120)
        release.touch()
        wait_for("the job to end", lambda: eng.get(f"/api/jobs/{run['job_id']}").json()["state"] in
                 ("succeeded", "failed"), timeout=600)
    finally:
        release.touch()
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
    job = eng.get(f"/api/jobs/{run['job_id']}").json()
    assert job["state"] == "succeeded", job
    assert new_jobs(f"preflab-{run['job_id']}-2")[0].endswith("COMPLETED")
    run_dir = Path(app.state.settings.data_dir) / "runs" / str(run["run_id"])
    # The second submission went on from the step-2 checkpoint: every step logged once, in order.
    assert json.loads((run_dir / "run.json").read_text())["resumed_from_step"] == 2
    assert [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4]
    log = (Path(app.state.settings.data_dir) / "jobs" / f"{run['job_id']}.log").read_text()
    assert "PREEMPTED: the scheduler took the nodes back for another job; submitting again, resuming" in log


def test_slurm_run_whose_shared_path_is_missing_fails_at_submit(db, app, make_user, make_project, token_for, api,
                                                                models_dir, slurm, monkeypatch,  # noqa: F811
                                                                tmp_path, new_jobs) -> None:
    only_on(db, "sqlite", "the backend is the same; jobs and runs are tested on both")
    missing = tmp_path / "not-mounted"
    use_clusters(app, monkeypatch, tmp_path / "clusters.toml", {
        "hpc": {"kind": "slurm", "shared_dir": str(missing)}})
    project_id, eng = _ranked_project(db, make_user, make_project, api, token_for, n=4)
    pairs = _export(eng, app, project_id, "pairs")
    run = reward_run(eng, project_id, pairs, models_dir["reward"], "hpc")
    _work(app)
    job = eng.get(f"/api/jobs/{run['job_id']}").json()
    assert job["state"] == "failed" and f"the shared path {missing} of cluster hpc does not exist" in job["error"]
    assert job["attempts"] == 1 and not new_jobs(f"preflab-{run['job_id']}-1")
    assert eng.get(f"/api/training-runs/{run['run_id']}").json()["state"] == "failed"


def test_slurm_run_on_an_export_that_differs_on_the_node_stops_before_training(db, app, make_user, make_project,
                                                                                token_for, api, models_dir, hpc,  # noqa: F811
                                                                                new_jobs) -> None:
    only_on(db, "sqlite", "the backend is the same; jobs and runs are tested on both")
    project_id, eng = _ranked_project(db, make_user, make_project, api, token_for, n=4)
    pairs = _export(eng, app, project_id, "pairs")
    data = next((Path(app.state.settings.data_dir) / "exports" / str(pairs)).glob("*.jsonl"))
    with data.open("a", encoding="utf-8") as fh:  # what a stale or partial copy on the shared path looks like
        fh.write("\n")
    run = reward_run(eng, project_id, pairs, models_dir["reward"], hpc)
    _work(app)
    job = eng.get(f"/api/jobs/{run['job_id']}").json()
    assert job["state"] == "failed" and job["error"].startswith("FAILED: the run exited with an error (exit code 1)")
    assert f"error: the export is not the one the app wrote: {data}: sha256 " in job["error"], job["error"]
    assert new_jobs(f"preflab-{run['job_id']}-1")[0].endswith("FAILED")
    assert not (Path(app.state.settings.data_dir) / "runs" / str(run["run_id"]) / "metrics.jsonl").exists()


def test_slurm_job_script_asks_for_the_runs_resources_and_starts_torchrun_on_each_node(tmp_path: Path) -> None:
    launch = Launch(name="preflab-7-1", attempt=1, module="training", args=["reward", "--config", "run.toml"],
                    workdir=tmp_path, log_path=tmp_path / "job.log", env={"HF_HUB_OFFLINE": "1"},
                    resources=Resources(cpus=4, gpus=2, memory_gb=16, nodes=2, workers=4, time_limit_min=90,
                                        partition="gpu"))
    assert sbatch_lines(launch, tmp_path / "slurm-1.log") == [
        "#SBATCH --job-name=preflab-7-1", f"#SBATCH --output={tmp_path}/slurm-1.log", f"#SBATCH --chdir={tmp_path}",
        "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --no-requeue",
        "#SBATCH --cpus-per-task=8", "#SBATCH --gpus-per-node=2", "#SBATCH --mem=16384M", "#SBATCH --time=90",
        "#SBATCH --partition=gpu"]
    script = job_script(launch, Cluster("hpc", "slurm", python="/opt/venv/bin/python"), tmp_path / "slurm-1.log")
    assert "export HF_HUB_OFFLINE=1" in script
    assert ("exec srun --ntasks-per-node=1 --kill-on-bad-exit=1 /opt/venv/bin/python -m torch.distributed.run "
            "--nnodes=2 --nproc_per_node=2 --rdzv_backend=c10d --rdzv_id=$SLURM_JOB_ID "
            "--rdzv_endpoint=$HEAD:29500 --module training reward --config run.toml") in script
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0  # the shell can read it
    # The export's files are checked on the node before anything starts.
    script = job_script(dataclasses.replace(launch, checksums={"/shared/e/pairs.jsonl": "ab" * 32}),
                        Cluster("hpc", "slurm", python="/opt/venv/bin/python"), tmp_path / "slurm-1.log")
    check = f"/opt/venv/bin/python -m training.checksums /shared/e/pairs.jsonl {'ab' * 32}\n"
    assert check in script and script.index(check) < script.index("exec srun")
    # An admin's template: the run's lines go where its placeholders are; $$ is a dollar sign.
    template = tmp_path / "site.sh"
    template.write_text("#!/bin/bash\n$sbatch\n#SBATCH --account=lab\nmodule load cuda\necho $$HOME\n$launch\n")
    script = job_script(launch, Cluster("hpc", "slurm", template=template), tmp_path / "slurm-1.log")
    assert "#SBATCH --account=lab\nmodule load cuda\necho $HOME\n" in script and "--module training" in script


def test_slurm_end_states_become_the_runs_with_their_reason() -> None:
    assert slurm_status("COMPLETED", "0:0").state == "succeeded"
    assert slurm_status("RUNNING").state == "running" and slurm_status("PENDING").state == "queued"
    assert slurm_status("CANCELLED by 0").state == "cancelled"
    for state, words in (("TIMEOUT", "time limit"), ("OUT_OF_ME+", "more memory"), ("NODE_FAIL", "node")):
        status = slurm_status(state, "0:15")
        assert status.state == "failed" and not status.requeue and words in (status.reason or ""), status
    assert slurm_status("OUT_OF_MEMORY").reason == "OUT_OF_MEMORY: the run used more memory than it asked for"
    assert slurm_status("FAILED", "2:0").reason == "FAILED: the run exited with an error (exit code 2)"
    preempted = slurm_status("PREEMPTED", "0:15")
    assert (preempted.state, preempted.requeue) == ("queued", True) and "PREEMPTED" in (preempted.reason or "")
