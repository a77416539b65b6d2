"""Sampling sent to the project's cluster, on the real engines (a single-node Slurm, a local Ray head; never mocked):
a local model's completions are drawn by `python -m training.sample_batch` on the cluster and written by the worker
exactly as a local job writes them (same count, source and seeds, so the same texts); a worker killed while the
cluster samples leaves that job going and the next worker writes its output without submitting again; a cancel
stops the cluster's job; the cluster's cap holds a second job queued; a shared path the worker cannot see fails the
job at submit, naming the path. Monte-Carlo step labels estimated on the cluster are the worker's own.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from app.models import Completion, Prompt
from tests.app.test_cluster_ray import _submissions, head  # noqa: F401 (a fixture: the real Ray head)
from tests.app.test_cluster_slurm import _jobs, new_jobs, slurm  # noqa: F401 (fixtures: the real Slurm, its new jobs)
from tests.app.test_job_crashes import _let_lease_lapse, _run_in_process
from tests.app.test_mc_step_labels import RIGHT, WRONG, _apples, _labels, silent_dir  # noqa: F401 (a fixture)
from tests.app.test_mc_step_labels import _project as _mc_project
from tests.app.test_training_runs import _work
from tests.conftest import only_on
from tests.support.clusters import spawn_worker, use_clusters
from tests.support.server import wait_for
from tests.training.tiny import char_tokenizer, save_tiny, tiny_gpt2
from training.hold import ENV as HOLD_ENV

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random GPT-2 under the pytest base directory, which the test clusters share."""
    tokenizer = char_tokenizer()
    return save_tiny(tiny_gpt2(tokenizer, n_positions=64), tokenizer, tmp_path_factory.mktemp("tiny") / "model")


def _project(db, make_user, make_project, api, token_for, cluster: str | None, n: int = 3) -> tuple[int, Any]:  # type: ignore[no-untyped-def]
    """A project of `n` arithmetic prompts (K=2) whose default cluster is `cluster`, and its lead's client."""
    lead = make_user(db, "lead")
    project = make_project(db, lead=lead, k=2)
    for i in range(n):
        db.add(Prompt(project_id=project.id, text=f"{i}+{i}=", text_hash=f"h{i}", split="train"))
    return project.id, _lead_on(db, api, token_for, lead, project.id, cluster)


def _lead_on(db, api, token_for, lead, project_id: int, cluster: str | None) -> Any:  # type: ignore[no-untyped-def]
    """The lead's client, once the project (committed now) has `cluster` as its default cluster (None: local)."""
    client = api(token_for(db, lead))
    db.commit()
    if cluster is not None:
        r = client.put(f"/api/projects/{project_id}/default-cluster", json={"default_cluster": cluster})
        assert r.status_code == 200, r.text
    return client


def _sample(client: Any, project_id: int, model: Path) -> int:
    r = client.post(f"/api/projects/{project_id}/sampling-jobs", json={
        "generator": {"backend": "hf", "model": str(model), "max_new_tokens": 8}, "seed": 7,
        "resample_duplicates": 2})
    assert r.status_code == 202, r.text
    return int(r.json()["job_id"])


def _completions(db, project_id: int) -> list[tuple[str, str, int, str, str]]:  # type: ignore[no-untyped-def]
    """(prompt, text, seed, source, generator) of every completion of the project, in the order they were written."""
    db.expire_all()
    rows = db.execute(select(Prompt.text, Completion.text, Completion.seed, Completion.source,
                             Completion.generator_name).join(Prompt)
                      .where(Prompt.project_id == project_id).order_by(Completion.id)).all()
    db.rollback()
    return [tuple(row) for row in rows]


def _log(app: Any, job_id: int) -> str:
    return (Path(app.state.settings.data_dir) / "jobs" / f"{job_id}.log").read_text()


def _same_as_a_local_job(db, make_user, make_project, api, token_for, app, tiny_model: Path, job: dict[str, Any],
                         project_id: int) -> None:  # type: ignore[no-untyped-def]
    """The cluster's job wrote what the same request writes on the worker: every prompt at K, the same texts."""
    assert job["state"] == "succeeded", job
    assert job["result"]["completions_created"] == 6 and job["progress"] == {"done": 3, "total": 3}
    local_id, local = _project(db, make_user, make_project, api, token_for, None)
    _sample(local, local_id, tiny_model)
    _work(app)
    remote, here = _completions(db, project_id), _completions(db, local_id)
    assert len(remote) == 6 and remote == here
    assert {(source, generator) for *_, source, generator in remote} == {("sampled", "hf:model")}


def test_slurm_sampling_draws_on_the_node_what_the_worker_would_draw(db, app, make_user, make_project, api,
                                                                     token_for, slurm, new_jobs,  # noqa: F811
                                                                     tiny_model, monkeypatch, tmp_path_factory) -> None:
    only_on(db, "sqlite", "the backend is the same; jobs are tested on both")
    _on_slurm(app, monkeypatch, tmp_path_factory)
    project_id, client = _project(db, make_user, make_project, api, token_for, "hpc")
    job_id = _sample(client, project_id, tiny_model)
    _work(app)
    job = client.get(f"/api/jobs/{job_id}").json()
    [slurm_job] = new_jobs(f"preflab-{job_id}-1")
    assert slurm_job.endswith("COMPLETED")
    log = _log(app, job_id)
    # The node's own output is in the job's log, after the submission it came from.
    assert log.index(f"submitted to slurm as job {slurm_job.split()[0]}") < log.index("sampled 3/3 prompts")
    _same_as_a_local_job(db, make_user, make_project, api, token_for, app, tiny_model, job, project_id)


def test_slurm_sampling_outlives_a_killed_worker_and_is_written_without_a_second_submission(
        db, app, make_user, make_project, api, token_for, slurm, tiny_model, monkeypatch,  # noqa: F811
        tmp_path_factory, tmp_path) -> None:
    only_on(db, "sqlite", "the backend is the same; jobs are tested on both")
    use_clusters(app, monkeypatch, tmp_path_factory.mktemp("conf") / "clusters.toml", {
        "hpc": {"kind": "slurm", "shared_dir": str(tmp_path_factory.getbasetemp()), "resources": {"cpus": 1},
                "job_prefix": f"preflab-{tmp_path.name}"[:40].replace(".", "-")}})
    project_id, client = _project(db, make_user, make_project, api, token_for, "hpc", n=9)
    job_id = _sample(client, project_id, tiny_model)
    release = tmp_path / "release"
    # sbatch hands the worker's environment to the job: the node stops after its first batch of prompts.
    worker = spawn_worker(app, env={HOLD_ENV: f"sample.prompts.8={release}"})
    try:
        wait_for("the node to sample its first batch", Path(f"{release}.held").exists, timeout=600, every=0.1)
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=30)
    release.touch()  # the worker is gone; the sampling goes on on the cluster
    _let_lease_lapse(db, job_id, stale_after=1)
    assert _run_in_process(app, stale_after_s=1) == 1
    job = client.get(f"/api/jobs/{job_id}").json()
    assert (job["state"], job["attempts"], job["result"]["completions_created"]) == ("succeeded", 2, 18), job
    prefix = f"preflab-{tmp_path.name}"[:40].replace(".", "-")
    assert len(_jobs(f"{prefix}-{job_id}-1")) == 1 and not _jobs(f"{prefix}-{job_id}-2")
    log = _log(app, job_id)
    assert "following slurm job" in log and log.count("sampled 9/9 prompts") == 1


def test_slurm_cap_holds_a_second_sampling_job_queued_until_the_first_ends(
        db, app, make_user, make_project, api, token_for, slurm, tiny_model, monkeypatch,  # noqa: F811
        tmp_path_factory, tmp_path) -> None:
    only_on(db, "sqlite", "the backend is the same; the cap's lock is Postgres's own")
    use_clusters(app, monkeypatch, tmp_path_factory.mktemp("conf") / "clusters.toml", {
        "hpc": {"kind": "slurm", "shared_dir": str(tmp_path_factory.getbasetemp()), "resources": {"cpus": 1},
                "max_running": 1, "job_prefix": f"preflab-{tmp_path.name}"[:40].replace(".", "-")}})
    first_project, first_client = _project(db, make_user, make_project, api, token_for, "hpc", n=9)
    first = _sample(first_client, first_project, tiny_model)
    project_id, client = _project(db, make_user, make_project, api, token_for, "hpc")
    second = _sample(client, project_id, tiny_model)
    release = tmp_path / "release"
    worker = spawn_worker(app, env={HOLD_ENV: f"sample.prompts.8={release}"})
    try:
        wait_for("the node to sample the first job's first batch", Path(f"{release}.held").exists, timeout=600,
                 every=0.1)
        _work(app)  # a second worker takes the second job, and gives it back: the cluster is full
        job = client.get(f"/api/jobs/{second}").json()
        assert job["state"] == "queued" and job["message"] == "waiting for a slot on hpc (1 of 1 running)", job
        release.touch()
        wait_for("the second job to end", lambda: client.get(f"/api/jobs/{second}").json()["state"]
                 in ("succeeded", "failed"), timeout=600)
    finally:
        release.touch()
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
    assert [first_client.get(f"/api/jobs/{first}").json()["state"], client.get(f"/api/jobs/{second}").json()[
        "state"]] == ["succeeded", "succeeded"]
    log = _log(app, second)
    assert log.count("waiting for a slot on hpc (1 of 1 running)") == 1 and log.count("got a slot on hpc") == 1


def test_slurm_sampling_whose_shared_path_is_missing_fails_at_submit(db, app, make_user, make_project, api,
                                                                     token_for, slurm, new_jobs,  # noqa: F811
                                                                     tiny_model, monkeypatch, tmp_path) -> None:
    only_on(db, "sqlite", "the backend is the same; jobs are tested on both")
    missing = tmp_path / "not-mounted"
    use_clusters(app, monkeypatch, tmp_path / "clusters.toml", {"hpc": {"kind": "slurm", "shared_dir": str(missing)}})
    project_id, client = _project(db, make_user, make_project, api, token_for, "hpc")
    job_id = _sample(client, project_id, tiny_model)
    _work(app)
    job = client.get(f"/api/jobs/{job_id}").json()
    assert job["state"] == "failed" and f"the shared path {missing} of cluster hpc does not exist" in job["error"]
    assert job["attempts"] == 1 and not new_jobs(f"preflab-{job_id}-1") and not _completions(db, project_id)


def _on_slurm(app: Any, monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """A Slurm cluster `hpc` on the test's Slurm, its shared path the pytest base directory, one CPU a job."""
    use_clusters(app, monkeypatch, tmp_path_factory.mktemp("conf") / "clusters.toml", {
        "hpc": {"kind": "slurm", "shared_dir": str(tmp_path_factory.getbasetemp()), "resources": {"cpus": 1}}})


def _on_ray(app: Any, monkeypatch: pytest.MonkeyPatch, conf: Path, address: str, **env: str) -> str:
    """A Ray cluster `lab` on the test's head with a job prefix of the test's own (the head keeps earlier tests'
    jobs, whose ids start again with every test's database); the prefix."""
    prefix = f"preflab-{conf.name}"[:40].replace(".", "-")
    use_clusters(app, monkeypatch, conf / "clusters.toml", {
        "lab": {"kind": "ray", "shared_dir": str(conf.parent), "env": env, "job_prefix": prefix,
                "resources": {"address": address, "cpus": 1}}})
    return prefix


def test_ray_sampling_draws_on_the_cluster_what_the_worker_would_draw(db, app, make_user, make_project, api,
                                                                      token_for, head, tiny_model,  # noqa: F811
                                                                      monkeypatch, tmp_path_factory) -> None:
    only_on(db, "sqlite", "the backend is the same; jobs are tested on both")
    prefix = _on_ray(app, monkeypatch, tmp_path_factory.mktemp("conf"), head.address)
    project_id, client = _project(db, make_user, make_project, api, token_for, "lab")
    job_id = _sample(client, project_id, tiny_model)
    _work(app)
    job = client.get(f"/api/jobs/{job_id}").json()
    name = f"{prefix}-{job_id}-1"
    assert [found.status.value for found in _submissions(head, name)] == ["SUCCEEDED"]
    log = _log(app, job_id)
    assert f"submitted to ray as job {name}" in log and log.count("sampled 3/3 prompts") == 1
    _same_as_a_local_job(db, make_user, make_project, api, token_for, app, tiny_model, job, project_id)


def test_ray_cancelled_sampling_stops_the_clusters_job(db, app, make_user, make_project, api, token_for,
                                                       head, tiny_model, monkeypatch,  # noqa: F811
                                                       tmp_path_factory, tmp_path) -> None:
    only_on(db, "sqlite", "the backend is the same; jobs are tested on both")
    release = tmp_path / "release"
    prefix = _on_ray(app, monkeypatch, tmp_path_factory.mktemp("conf"), head.address,
                     **{HOLD_ENV: f"sample.prompts.8={release}"})
    project_id, client = _project(db, make_user, make_project, api, token_for, "lab", n=9)
    job_id = _sample(client, project_id, tiny_model)
    name = f"{prefix}-{job_id}-1"
    worker = spawn_worker(app)
    try:
        wait_for("the cluster to sample its first batch", Path(f"{release}.held").exists, timeout=600, every=0.1)
        assert client.post(f"/api/jobs/{job_id}/cancel").status_code == 200
        wait_for("Ray to stop the job", lambda: _submissions(head, name)[0].status.value == "STOPPED", timeout=60)
    finally:
        release.touch()
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
    assert client.get(f"/api/jobs/{job_id}").json()["state"] == "cancelled"
    assert not _completions(db, project_id) and "stopping the sampling (cancelled)" in _log(app, job_id)


def _mc_labels_on(db, make_user, make_project, api, token_for, app, cluster: str, model: Path) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """A Monte-Carlo run of a project whose runs go to `cluster`, carried out: its job and labels."""
    lead, _, project = _mc_project(db, make_user, make_project)
    _apples(db, project)
    client = api(token_for(db, lead))
    db.commit()
    assert client.put(f"/api/projects/{project.id}/default-cluster", json={"default_cluster": cluster}).is_success
    r = client.post(f"/api/projects/{project.id}/mc-step-labels", json={"model": str(model), "n": 2})
    assert r.status_code == 202, r.text
    _work(app)
    job = client.get(f"/api/jobs/{r.json()['job_id']}").json()
    db.expire_all()
    labels = _labels(db, r.json()["run_id"])
    db.rollback()
    return {"job": job, "labels": labels, "log": _log(app, job["id"])}


def test_slurm_monte_carlo_labels_are_the_ones_the_worker_would_estimate(db, app, make_user, make_project, api,
                                                                         token_for, slurm, silent_dir,  # noqa: F811
                                                                         monkeypatch, tmp_path_factory) -> None:
    only_on(db, "sqlite", "the backend is the same; jobs are tested on both")
    _on_slurm(app, monkeypatch, tmp_path_factory)
    out = _mc_labels_on(db, make_user, make_project, api, token_for, app, "hpc", silent_dir)
    assert out["job"]["state"] == "succeeded", out["job"]
    assert out["job"]["result"]["step_labels_written"] == 6 and out["job"]["result"]["continuations_sampled"] == 8
    # The labels of tests/app/test_mc_step_labels.py's run on the worker, with the same silent policy.
    assert out["labels"] == {RIGHT: [(-1, 0.0), (1, 1.0), (1, 1.0)], WRONG: [(-1, 0.0), (-1, 0.0), (-1, 0.0)]}
    assert "submitted to slurm as job" in out["log"] and out["log"].count("labelled 1/1 prompts") == 1


def test_ray_monte_carlo_labels_are_the_ones_the_worker_would_estimate(db, app, make_user, make_project, api,
                                                                       token_for, head, silent_dir,  # noqa: F811
                                                                       monkeypatch, tmp_path_factory) -> None:
    only_on(db, "sqlite", "the backend is the same; jobs are tested on both")
    _on_ray(app, monkeypatch, tmp_path_factory.mktemp("conf"), head.address)
    out = _mc_labels_on(db, make_user, make_project, api, token_for, app, "lab", silent_dir)
    assert out["job"]["state"] == "succeeded", out["job"]
    assert out["labels"] == {RIGHT: [(-1, 0.0), (1, 1.0), (1, 1.0)], WRONG: [(-1, 0.0), (-1, 0.0), (-1, 0.0)]}
    assert "submitted to ray as job" in out["log"] and out["log"].count("labelled 1/1 prompts") == 1
