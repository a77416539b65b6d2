"""Sampling completions as jobs run by real workers, with a tiny GPT-2 built here (no hub, no fakes)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select, update

from app.models import Completion, Job, Prompt, TrainingRun
from app.platform.settings import Settings
from app.projects import projects
from app.worker import Worker
from tests.conftest import only_on
from tests.training.tiny import char_tokenizer, save_tiny, tiny_gpt2
from training.hold import ENV as HOLD_ENV

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tokenizer = char_tokenizer()
    return save_tiny(tiny_gpt2(tokenizer, n_positions=64), tokenizer, tmp_path_factory.mktemp("tiny") / "model")


def _project_with_prompts(db, make_user, make_project, n: int, k: int = 3):  # type: ignore[no-untyped-def]
    lead = make_user(db, "lead")
    project = make_project(db, lead=lead, k=k)
    for i in range(n):
        db.add(Prompt(project_id=project.id, text=f"{i}+{i}=", text_hash=f"h{i}", split="train"))
    db.flush()
    return lead, project


def _trusted_endpoint(db, make_user, api, token_for, url: str, model: str, **fields) -> int:  # type: ignore[no-untyped-def]
    """An admin's model endpoint for a server on this machine: loopback needs the admin's explicit trust."""
    admin = make_user(db, "admin")
    client = api(token_for(db, admin))
    db.commit()
    r = client.post("/api/model-endpoints", json={"name": f"local {url}", "base_url": url, "model": model,
                                                  "allow_private": True, **fields})
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def _worker(database_url: str, tmp_path: Path, clean_engine, *, retry_base_s: float = 10.0,  # type: ignore[no-untyped-def]
            **kw) -> Worker:
    from app.platform.db import make_session_factory

    settings = Settings(database_url=database_url, data_dir=tmp_path, secret_key="x" * 40,
                        job_retry_base_s=retry_base_s)
    return Worker(settings, session_factory=make_session_factory(clean_engine), poll_s=0.05, heartbeat_s=0.2, **kw)


def _counts(db, project_id: int) -> dict[int, int]:  # type: ignore[no-untyped-def]
    db.expire_all()
    rows = db.execute(select(Prompt.id, func.count(Completion.id)).outerjoin(Completion)
                      .where(Prompt.project_id == project_id).group_by(Prompt.id)).all()
    db.rollback()  # end the read: on SQLite an open transaction holds the write lock
    return dict(rows)


def test_hf_sampling_fills_every_prompt_to_k_reproducibly(db, make_user, make_project, token_for, api,
                                                          tiny_model_dir, database_url, clean_engine,
                                                          tmp_path) -> None:
    lead, project = _project_with_prompts(db, make_user, make_project, n=4, k=3)
    client = api(token_for(db, lead))
    db.commit()
    project_id = project.id
    spec = {"backend": "hf", "model": str(tiny_model_dir), "temperature": 1.0, "max_new_tokens": 8}
    r = client.post(f"/api/projects/{project.id}/sampling-jobs", json={"generator": spec, "seed": 7})
    assert r.status_code == 202
    job_id = r.json()["job_id"]
    assert client.get(f"/api/jobs/{job_id}").json()["state"] == "queued"
    assert _worker(database_url, tmp_path, clean_engine).run(exit_when_idle=True) == 1

    status = client.get(f"/api/jobs/{job_id}").json()
    assert status["state"] == "succeeded" and status["progress"] == {"done": 4, "total": 4}
    assert status["result"]["completions_created"] == 12 and len(status["result"]["diversity"]) == 4
    assert set(_counts(db, project.id).values()) == {3}
    rows = list(db.scalars(select(Completion).join(Prompt).where(Prompt.project_id == project.id)
                           .order_by(Completion.id)))
    assert {c.source for c in rows} == {"sampled"}
    assert all(c.generator_name == f"hf:{tiny_model_dir.name}" and c.seed is not None for c in rows)
    assert rows[0].generator_params["max_new_tokens"] == 8 and "fingerprint" in rows[0].generator_params
    texts = [c.text for c in rows]
    db.rollback()

    # The same request on a second project with the same prompts and seed gives the same texts.
    lead2, project2 = _project_with_prompts(db, make_user, make_project, n=4, k=3)
    client2 = api(token_for(db, lead2))
    db.commit()
    client2.post(f"/api/projects/{project2.id}/sampling-jobs", json={"generator": spec, "seed": 7})
    _worker(database_url, tmp_path, clean_engine).run(exit_when_idle=True)
    again = list(db.scalars(select(Completion.text).join(Prompt).where(Prompt.project_id == project2.id)
                            .order_by(Completion.id)))
    db.rollback()
    assert again == texts

    # Nothing left to do: a second job succeeds without writing anything.
    client.post(f"/api/projects/{project_id}/sampling-jobs", json={"generator": spec, "seed": 7})
    _worker(database_url, tmp_path, clean_engine).run(exit_when_idle=True)
    assert set(_counts(db, project_id).values()) == {3}


def test_sampled_prompts_enter_the_annotation_queue(db, make_user, make_project, token_for, api, tiny_model_dir,
                                                    database_url, clean_engine, tmp_path) -> None:
    lead, project = _project_with_prompts(db, make_user, make_project, n=1, k=2)
    annotator = make_user(db, "annotator")
    projects.add_member(db, project, lead, email=annotator.email, role="annotator")
    lead_client, ann_client = api(token_for(db, lead)), api(token_for(db, annotator))
    db.commit()
    assert ann_client.get(f"/api/projects/{project.id}/tasks/next").status_code == 204  # nothing to rank yet
    lead_client.post(f"/api/projects/{project.id}/sampling-jobs",
                     json={"generator": {"backend": "hf", "model": str(tiny_model_dir), "max_new_tokens": 6},
                           "seed": 1})
    _worker(database_url, tmp_path, clean_engine).run(exit_when_idle=True)
    task = ann_client.get(f"/api/projects/{project.id}/tasks/next")
    assert task.status_code == 200 and len(task.json()["completions"]) == 2


def test_cancel_stops_a_running_job(db, make_user, make_project, token_for, api, tiny_model_dir, database_url,
                                    clean_engine, tmp_path, monkeypatch) -> None:
    lead, project = _project_with_prompts(db, make_user, make_project, n=120, k=4)
    client = api(token_for(db, lead))
    db.commit()
    job_id = client.post(f"/api/projects/{project.id}/sampling-jobs",
                         json={"generator": {"backend": "hf", "model": str(tiny_model_dir), "max_new_tokens": 24,
                                             "batch_size": 4}, "seed": 3,
                               "resample_duplicates": 5}).json()["job_id"]  # the tiny model answers "" at times
    # Held after its first batch until the cancel reaches it (the hold ends when the job is told to stop).
    release = tmp_path / "release"
    monkeypatch.setenv(HOLD_ENV, f"job.sample_completions.progress.8={release}")
    worker = _worker(database_url, tmp_path, clean_engine)
    thread = threading.Thread(target=worker.run_one)
    thread.start()
    try:
        _wait_for_file(Path(f"{release}.held"))
        assert client.post(f"/api/jobs/{job_id}/cancel").json()["state"] == "cancelled"
        thread.join(timeout=60)
    finally:
        release.touch()
        thread.join(timeout=60)
    assert not thread.is_alive()
    assert client.get(f"/api/jobs/{job_id}").json()["state"] == "cancelled"
    counts = _counts(db, project.id)
    assert sorted(counts.values(), reverse=True)[:9] == [4] * 8 + [0]  # the first batch, and nothing after it


def _spawn_worker(database_url: str, data_dir: Path, hold: str) -> subprocess.Popen:  # type: ignore[type-arg]
    """A worker process that stops at the hold point `hold` ("POINT=PATH", training.hold) until PATH exists."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFLAB_")}
    env.update(PREFLAB_DATABASE_URL=database_url, PREFLAB_DATA_DIR=str(data_dir), PREFLAB_SECRET_KEY="k" * 40)
    env[HOLD_ENV] = hold
    return subprocess.Popen([sys.executable, "-m", "app.cli", "worker", "--poll", "0.1", "--heartbeat", "0.1"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wait_for_file(path: Path, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {path}")
        time.sleep(0.01)


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_a_worker_killed_mid_job_loses_nothing_and_doubles_nothing(db, make_user, make_project, token_for, api,
                                                                   tiny_model_dir, database_url, clean_engine,
                                                                   tmp_path, how) -> None:
    # One backend per signal: claims, heartbeats and reclaims are tested on both in tests/app/test_job_crashes.py.
    only_on(db, "postgresql" if how == "SIGKILL" else "sqlite", "each kill signal runs on one backend")
    lead, project = _project_with_prompts(db, make_user, make_project, n=320, k=4)
    client = api(token_for(db, lead))
    db.commit()
    job_id = client.post(f"/api/projects/{project.id}/sampling-jobs",
                         json={"generator": {"backend": "hf", "model": str(tiny_model_dir), "max_new_tokens": 24,
                                             "batch_size": 8}, "seed": 5,
                               "resample_duplicates": 5}).json()["job_id"]  # the tiny model answers "" at times
    # The worker stops after its first batch of 8 prompts is written, until the test lets it go: the signal lands
    # mid-job on any machine. SIGTERM ends the hold by itself (the worker is stopping); SIGKILL needs no release.
    release = tmp_path / "release"
    proc = _spawn_worker(database_url, tmp_path, hold=f"job.sample_completions.progress.8={release}")
    try:
        _wait_for_file(Path(f"{release}.held"))
        proc.send_signal(signal.SIGKILL if how == "SIGKILL" else signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    db.expire_all()
    job = db.get(Job, job_id)
    if how == "SIGKILL":
        assert job.state == "running"  # nobody told the database: the lease must lapse first
        job.heartbeat_at = job.heartbeat_at - timedelta(minutes=5)
        db.commit()
    else:
        assert proc.returncode == 0 and job.state == "queued" and job.attempts == 0  # given back cleanly
    partial = _counts(db, project.id)
    assert sum(partial.values()) == 8 * 4 and max(partial.values()) <= 4  # the first batch, and no more

    _worker(database_url, tmp_path, clean_engine).run(exit_when_idle=True)
    db.expire_all()
    job = db.get(Job, job_id)
    assert job.state == "succeeded" and job.attempts == (2 if how == "SIGKILL" else 1)
    assert set(_counts(db, project.id).values()) == {4}  # every prompt exactly K, nothing doubled


def test_two_workers_never_run_the_same_job(db, make_user, make_project, token_for, api, tiny_model_dir,
                                            database_url, clean_engine, tmp_path) -> None:
    lead, project = _project_with_prompts(db, make_user, make_project, n=6, k=2)
    client = api(token_for(db, lead))
    prompt_ids = list(db.scalars(select(Prompt.id).where(Prompt.project_id == project.id).order_by(Prompt.id)))
    db.commit()
    spec = {"backend": "hf", "model": str(tiny_model_dir), "max_new_tokens": 6}
    job_ids = [client.post(f"/api/projects/{project.id}/sampling-jobs",
                           json={"generator": spec, "seed": i, "prompt_ids": [pid]}).json()["job_id"]
               for i, pid in enumerate(prompt_ids)]
    workers = [_worker(database_url, tmp_path, clean_engine) for _ in range(2)]
    threads = [threading.Thread(target=w.run, kwargs={"exit_when_idle": True}) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    db.expire_all()
    jobs_ = [db.get(Job, j) for j in job_ids]
    assert [(j.state, j.attempts, j.error) for j in jobs_] == [("succeeded", 1, None)] * len(jobs_)
    assert set(_counts(db, project.id).values()) == {2}


def test_openai_backend_through_a_real_local_server(db, make_user, make_project, token_for, api, tiny_model_dir,
                                                    database_url, clean_engine, tmp_path) -> None:
    from tests.support.openai_server import OpenAICompatibleServer

    lead, project = _project_with_prompts(db, make_user, make_project, n=3, k=2)
    client = api(token_for(db, lead))
    db.commit()
    project_id = project.id
    with OpenAICompatibleServer(tiny_model_dir, model_name="tiny", api_key="sk-endpoint-key") as server:
        endpoint_id = _trusted_endpoint(db, make_user, api, token_for, server.url, "tiny", api_key="sk-endpoint-key")
        server.fail_next(429, times=1, retry_after=0)
        # The lead names the endpoint; its URL and key stay with the admin's configuration.
        spec = {"backend": "openai", "endpoint_id": endpoint_id, "max_new_tokens": 6, "max_retries": 3,
                "timeout_s": 30}
        job_id = client.post(f"/api/projects/{project_id}/sampling-jobs",
                             json={"generator": spec, "seed": 11}).json()["job_id"]
        _worker(database_url, tmp_path, clean_engine).run(exit_when_idle=True)
    status = client.get(f"/api/jobs/{job_id}").json()
    assert status["state"] == "succeeded", status
    assert set(_counts(db, project_id).values()) == {2}
    params = db.scalar(select(Completion.generator_params).join(Prompt).where(Prompt.project_id == project_id))
    db.rollback()
    assert params["backend"] == "openai" and "api_key" not in params
    payload = db.scalar(select(Job.payload).where(Job.id == job_id))
    db.rollback()
    assert payload["generator"]["endpoint_id"] == endpoint_id and "sk-endpoint-key" not in repr(payload)


def test_an_unreachable_server_fails_the_job_with_a_clear_reason(db, make_user, make_project, token_for, api,
                                                                 database_url, clean_engine, tmp_path) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    lead, project = _project_with_prompts(db, make_user, make_project, n=1, k=2)
    client = api(token_for(db, lead))
    db.commit()
    endpoint_id = _trusted_endpoint(db, make_user, api, token_for, f"http://127.0.0.1:{port}/v1", "m")
    spec = {"backend": "openai", "endpoint_id": endpoint_id, "max_retries": 0, "timeout_s": 2}
    job_id = client.post(f"/api/projects/{project.id}/sampling-jobs", json={"generator": spec}).json()["job_id"]
    # The server may come back: the job goes back to the queue with the reason and waits out a backoff (the worker
    # runs other jobs meanwhile), instead of failing or holding the worker.
    assert _worker(database_url, tmp_path, clean_engine).run(exit_when_idle=True) == 1
    status = client.get(f"/api/jobs/{job_id}").json()
    assert (status["state"], status["attempts"]) == ("queued", 1), status
    assert "will retry in 10s" in status["message"] and status["error"]
    assert _worker(database_url, tmp_path, clean_engine).run(exit_when_idle=True) == 0  # not due yet
    # Once the backoff is over (the clock moved on), attempts run out (no backoff now) and the job fails with the reason.
    db.execute(update(Job).where(Job.id == job_id).values(run_after=None))
    db.commit()
    _worker(database_url, tmp_path, clean_engine, retry_base_s=0).run(exit_when_idle=True)
    status = client.get(f"/api/jobs/{job_id}").json()
    assert status["state"] == "failed" and status["attempts"] == 3
    assert "unreachable" in status["error"].lower() or "connect" in status["error"].lower()
    assert set(_counts(db, project.id).values()) == {0}


def test_a_prompt_longer_than_the_model_context_fails_the_job_at_once_with_the_reason(
        db, make_user, make_project, token_for, api, browser, tiny_model_dir, database_url, clean_engine,
        tmp_path) -> None:
    """The same on every attempt, so never retried: one attempt, and the jobs page that started it says why."""
    lead, project = _project_with_prompts(db, make_user, make_project, n=1, k=2)
    client = api(token_for(db, lead))
    db.commit()
    spec = {"backend": "hf", "model": str(tiny_model_dir), "max_new_tokens": 62}  # the prompt is 4 tokens; the model's context is 64
    job_id = client.post(f"/api/projects/{project.id}/sampling-jobs", json={"generator": spec}).json()["job_id"]
    assert _worker(database_url, tmp_path, clean_engine, retry_base_s=0).run(exit_when_idle=True) == 1
    status = client.get(f"/api/jobs/{job_id}").json()
    assert (status["state"], status["attempts"]) == ("failed", 1), status
    assert "with max_new_tokens=62" in status["error"] and "model context is 64" in status["error"]
    page = browser()
    page.login(lead.email)
    row = next(r for r in page.get(f"/projects/{project.id}/jobs").text.split("<tr>") if f"#{job_id}<" in r)
    assert "failed" in row and "model context is 64" in row


def test_sampled_completions_are_split_into_steps_when_the_project_labels_steps(
        db, make_user, make_project, token_for, api, tiny_model_dir, database_url, clean_engine, tmp_path) -> None:
    from app.annotation import steps

    lead, project = _project_with_prompts(db, make_user, make_project, n=2, k=2)
    steps.set_options(db, project, lead, enabled=True, separator=None)
    client = api(token_for(db, lead))
    project_id = project.id
    db.commit()
    client.post(f"/api/projects/{project_id}/sampling-jobs",
                json={"generator": {"backend": "hf", "model": str(tiny_model_dir), "max_new_tokens": 12}, "seed": 3})
    _worker(database_url, tmp_path, clean_engine).run(exit_when_idle=True)
    rows = db.execute(select(Completion.text, Completion.steps).join(Prompt)
                      .where(Prompt.project_id == project_id)).all()
    db.rollback()
    assert len(rows) == 4 and all(stored == steps.split(text) for text, stored in rows)


def test_sampling_a_policy_into_its_project_can_answer_only_the_first_prompts(db, make_user, make_project, token_for,
                                                                               api, tiny_model_dir, database_url,
                                                                               clean_engine, tmp_path) -> None:
    lead, project = _project_with_prompts(db, make_user, make_project, n=5, k=2)
    run = TrainingRun(project_id=project.id, kind="grpo", state="succeeded", model_dir=str(tiny_model_dir),
                      config={"resolved": {"max_new_tokens": 6}})
    db.add(run)
    client = api(token_for(db, lead))
    db.commit()
    project_id, run_id = project.id, run.id
    db.rollback()
    r = client.post(f"/api/training-runs/{run_id}/sample-into-project", json={"max_prompts": 3, "seed": 1})
    assert r.status_code == 202, r.text
    _worker(database_url, tmp_path, clean_engine).run(exit_when_idle=True)
    status = client.get(f"/api/jobs/{r.json()['job_id']}").json()
    assert status["state"] == "succeeded" and status["progress"] == {"done": 3, "total": 3}
    counts = _counts(db, project_id)
    first = sorted(counts)[:3]
    # The three oldest prompts got the policy's answers (the tiny model may drop an empty one); the others none.
    assert all(counts[p] >= 1 for p in first) and all(counts[p] == 0 for p in sorted(counts)[3:])
