"""AI judging sent to the project's cluster, on the real engines (a single-node Slurm, a local Ray head; never
mocked): a local judge model's verdicts are made by `python -m training.judge_batch` on the cluster and the worker
writes the rankings from them as it writes its own, so a judge run there gives the same orders, confidences, soft
labels, step labels and routing as the same run on the worker. A revision job with a local model critiques and
revises on the cluster (`python -m training.revise_batch`) the texts the worker would write.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import delete, select

from app.annotation import steps
from app.models import Completion, JudgeRun, Pair, Prompt, Ranking, StepLabel
from tests.app.test_cluster_ray import _submissions, head  # noqa: F401 (a fixture: the real Ray head)
from tests.app.test_cluster_sampling import _lead_on, _log, _on_ray, _on_slurm
from tests.app.test_cluster_slurm import new_jobs, slurm  # noqa: F401 (fixtures: the real Slurm, its new jobs)
from tests.app.test_judge import judge_model_dir  # noqa: F401 (a fixture: a tiny random GPT-2 the clusters share)
from tests.app.test_training_runs import _work
from tests.conftest import only_on
from tests.support.clusters import spawn_worker, use_clusters
from tests.support.server import wait_for
from training.hold import ENV as HOLD_ENV

pytestmark = pytest.mark.slow


def _project(db, make_user, make_project, api, token_for, cluster: str | None) -> tuple[int, Any]:  # type: ignore[no-untyped-def]
    """Five prompts of three two-step answers each (two chunks of the judge's calls), step labels on, the project's
    default cluster `cluster`; and its lead's client."""
    lead = make_user(db, "lead")
    project = make_project(db, lead=lead, k=3)
    steps.set_options(db, project, lead, enabled=True, separator=None)
    for i in range(5):
        prompt = Prompt(project_id=project.id, text=f"What is {i}+1?", text_hash=f"h{i}", split="train")
        db.add(prompt)
        db.flush()
        db.add_all(Completion(prompt_id=prompt.id, text=t) for t in (
            f"{i}+1={i + 1}\nSo {i + 1}.", f"{i}+1={i + 2}\nSo {i + 2}.", "No idea.\nSorry."))
    return project.id, _lead_on(db, api, token_for, lead, project.id, cluster)


def _judge(client: Any, project_id: int, model: Path) -> dict[str, Any]:
    """A judge run (every principle, step labels, unsure prompts routed to humans) carried out: its job."""
    r = client.post(f"/api/projects/{project_id}/judge-runs", json={
        "generator": {"backend": "hf", "model": str(model)}, "principles": "all", "seed": 1, "label_steps": True,
        "low_confidence": 0.9, "route_low_confidence": True})
    assert r.status_code == 202, r.text
    return {"run_id": r.json()["judge_run_id"], "job_id": r.json()["job_id"]}


def _outcome(db, run_id: int) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """What the run wrote, by texts (ids differ between projects): per prompt its order, confidence and scores, each
    pair's soft label and verdict, each step's label."""
    db.expire_all()
    text = dict(db.execute(select(Completion.id, Completion.text)).all())
    out: dict[str, Any] = {}
    for ranking in db.scalars(select(Ranking).where(Ranking.judge_run_id == run_id)):
        prompt = db.get(Prompt, ranking.prompt_id).text
        pairs = sorted((text[p.chosen_id], text[p.rejected_id], p.p, p.meta["p_a_first"], p.meta["p_a_second"],
                        [text[c] for c in p.meta["compared_as"]], p.meta["low_confidence"])
                       for p in db.scalars(select(Pair).where(Pair.ranking_id == ranking.id)))
        labels = sorted((text[s.completion_id], s.step_index, s.label, s.p)
                        for s in db.scalars(select(StepLabel).where(StepLabel.ranking_id == ranking.id)))
        out[prompt] = {"order": [[text[c] for c in tier] for tier in ranking.tiers],
                       "confidence": ranking.meta["confidence"],
                       "scores": {text[int(c)]: s for c, s in ranking.meta["scores"].items()},
                       "pairs": pairs, "steps": labels}
    db.rollback()
    return out


def _same_as_on_the_worker(db, make_user, make_project, api, token_for, app, model: Path, client: Any,
                           run: dict[str, Any]) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """The cluster's run wrote what the same run writes on the worker; its job."""
    job = client.get(f"/api/jobs/{run['job_id']}").json()
    assert job["state"] == "succeeded", job
    local_id, local = _project(db, make_user, make_project, api, token_for, None)
    here = _judge(local, local_id, model)
    _work(app)
    local_job = local.get(f"/api/jobs/{here['job_id']}").json()
    assert local_job["state"] == "succeeded" and "cluster" not in local_job["result"], local_job
    remote, on_worker = _outcome(db, run["run_id"]), _outcome(db, here["run_id"])
    assert len(remote) == 5 and remote == on_worker
    assert all(o["pairs"] and len(o["steps"]) == 6 for o in remote.values())  # two steps of three answers
    ignored = ("judge_run_id", "cluster", "on_cluster")  # the slot the cluster's job held
    assert ({k: v for k, v in job["result"].items() if k not in ignored}
            == {k: v for k, v in local_job["result"].items() if k not in ignored})
    assert job["result"]["rankings_written"] == 5 and job["result"]["step_labels_written"] == 30
    assert job["result"]["routed_to_humans"] == local_job["result"]["routed_to_humans"] > 0
    return job


def test_slurm_judging_gives_the_rankings_the_worker_would_give(db, app, make_user, make_project, api, token_for,
                                                                slurm, new_jobs, judge_model_dir,  # noqa: F811
                                                                monkeypatch, tmp_path_factory) -> None:
    only_on(db, "sqlite", "the backend is the same; jobs are tested on both")
    _on_slurm(app, monkeypatch, tmp_path_factory)
    project_id, client = _project(db, make_user, make_project, api, token_for, "hpc")
    run = _judge(client, project_id, judge_model_dir)
    _work(app)
    [slurm_job] = new_jobs(f"preflab-{run['job_id']}-1")
    assert slurm_job.endswith("COMPLETED")
    job = _same_as_on_the_worker(db, make_user, make_project, api, token_for, app, judge_model_dir, client, run)
    assert job["result"]["cluster"] == "hpc"
    log = _log(app, run["job_id"])
    # The node's own output is in the job's log, after the submission it came from.
    assert log.index(f"submitted to slurm as job {slurm_job.split()[0]}") < log.index("judged 5/5 prompts")


def test_ray_judging_gives_the_rankings_the_worker_would_give(db, app, make_user, make_project, api, token_for,
                                                              head, judge_model_dir, monkeypatch,  # noqa: F811
                                                              tmp_path_factory) -> None:
    only_on(db, "sqlite", "the backend is the same; jobs are tested on both")
    prefix = _on_ray(app, monkeypatch, tmp_path_factory.mktemp("conf"), head.address)
    project_id, client = _project(db, make_user, make_project, api, token_for, "lab")
    run = _judge(client, project_id, judge_model_dir)
    _work(app)
    name = f"{prefix}-{run['job_id']}-1"
    assert [found.status.value for found in _submissions(head, name)] == ["SUCCEEDED"]
    job = _same_as_on_the_worker(db, make_user, make_project, api, token_for, app, judge_model_dir, client, run)
    assert job["result"]["cluster"] == "lab"
    log = _log(app, run["job_id"])
    assert f"submitted to ray as job {name}" in log and log.count("judged 5/5 prompts") == 1


def _revisions(db, project_id: int, client: Any, model: Path, app: Any) -> tuple[dict[str, Any], list[Any]]:  # type: ignore[no-untyped-def]
    """A revision job of three completions carried out: its job, and (original, principle, critique, revision, seed)
    of each revision it stored."""
    r = client.post(f"/api/projects/{project_id}/revision-jobs", json={
        "generator": {"backend": "hf", "model": str(model), "max_new_tokens": 12}, "limit": 3, "seed": 2})
    assert r.status_code == 202, r.text
    _work(app)
    job = client.get(f"/api/jobs/{r.json()['job_id']}").json()
    db.expire_all()
    text = dict(db.execute(select(Completion.id, Completion.text)).all())
    stored = sorted((text[c.meta["original_id"]], c.meta["principle"], c.meta["critique"], c.text, c.seed,
                     c.generator_name) for c in db.scalars(select(Completion).join(Prompt).where(
                         Prompt.project_id == project_id, Completion.source == "revision")))
    db.rollback()
    return job, stored


def test_slurm_revisions_are_the_ones_the_worker_would_write(
        db, app, make_user, make_project, api, token_for, judge_model_dir, monkeypatch,  # noqa: F811
        tmp_path_factory, slurm, new_jobs) -> None:  # noqa: F811
    only_on(db, "sqlite", "the backend is the same; jobs are tested on both")
    _on_slurm(app, monkeypatch, tmp_path_factory)
    project_id, client = _project(db, make_user, make_project, api, token_for, "hpc")
    job, remote = _revisions(db, project_id, client, judge_model_dir, app)
    assert job["state"] == "succeeded" and job["result"]["revisions"] == 3 and job["result"]["cluster"] == "hpc", job
    [slurm_job] = new_jobs(f"preflab-{job['id']}-1")
    assert slurm_job.endswith("COMPLETED") and "revised 3/3 completions" in _log(app, job["id"])
    # The same completions revised again on the worker (each one's principle is drawn from its id and the seed).
    db.execute(delete(Completion).where(Completion.source == "revision"))
    db.commit()
    assert client.put(f"/api/projects/{project_id}/default-cluster", json={"default_cluster": None}).is_success
    local_job, here = _revisions(db, project_id, client, judge_model_dir, app)
    assert local_job["state"] == "succeeded" and "cluster" not in local_job["result"], local_job
    assert len(remote) == 3 and remote == here


def test_slurm_cap_keeps_a_second_judge_run_queued_until_the_first_ends(
        db, app, make_user, make_project, api, token_for, judge_model_dir, monkeypatch,  # noqa: F811
        tmp_path, slurm) -> None:  # noqa: F811
    only_on(db, "sqlite", "the backend is the same; the cap's lock is Postgres's own")
    use_clusters(app, monkeypatch, tmp_path / "clusters.toml", {"hpc": {
        "kind": "slurm", "shared_dir": str(judge_model_dir.parents[1]), "resources": {"cpus": 1}, "max_running": 1,
        "job_prefix": f"preflab-{tmp_path.name}"[:40].replace(".", "-")}})
    runs = [_judge(client, project_id, judge_model_dir)
            for project_id, client in [_project(db, make_user, make_project, api, token_for, "hpc") for _ in "ab"]]
    release = tmp_path / "release"
    # The first run's node stops after its first chunk, holding the cluster's one slot.
    worker = spawn_worker(app, env={HOLD_ENV: f"judge.prompts.4={release}"})
    try:
        wait_for("the node to judge the first chunk", Path(f"{release}.held").exists, timeout=600, every=0.1)
        _work(app)  # this worker takes the second run, and gives it back: the cluster is full
        db.expire_all()
        assert db.get(JudgeRun, runs[1]["run_id"]).state == "queued"
        db.rollback()
        release.touch()
        wait_for("both runs to end", lambda: _states(db, runs) == {"succeeded"}, timeout=600)
    finally:
        release.touch()
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
    log = _log(app, runs[1]["job_id"])
    assert log.count("waiting for a slot on hpc (1 of 1 running)") == 1 and log.count("got a slot on hpc") == 1


def _states(db, runs: list[dict[str, Any]]) -> set[str]:  # type: ignore[no-untyped-def]
    db.expire_all()
    states = {db.get(JudgeRun, run["run_id"]).state for run in runs}
    db.rollback()
    return states
