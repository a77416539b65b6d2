"""The job table: claims are exclusive, stale leases are taken over, retries are capped, cancel sticks."""

from __future__ import annotations

import threading
from datetime import timedelta

from sqlalchemy import func, select

from app.jobs import queue as jobs
from app.models import Job, utcnow
from app.platform.db import make_session_factory, session_scope


def _enqueue(db, project, n: int) -> list[int]:  # type: ignore[no-untyped-def]
    ids = [jobs.enqueue(db, "sample_completions", {"i": i}, project=project, actor=None).id for i in range(n)]
    db.commit()
    return ids


def test_jobs_are_claimed_oldest_first_and_only_once(db, make_project) -> None:
    project = make_project(db)
    ids = _enqueue(db, project, 3)
    first = jobs.claim(db, "w1")
    assert first.id == ids[0] and first.state == "running" and first.attempts == 1 and first.claimed_by == "w1"
    db.commit()
    assert jobs.claim(db, "w2").id == ids[1]
    db.commit()


def test_two_workers_claiming_at_once_never_share_a_job(db, make_project, clean_engine) -> None:
    project = make_project(db)
    ids = _enqueue(db, project, 30)
    factory = make_session_factory(clean_engine)
    claimed: dict[str, list[int]] = {"a": [], "b": [], "c": []}
    barrier = threading.Barrier(3)

    def work(name: str) -> None:
        barrier.wait()
        while True:
            with session_scope(factory) as session:
                job = jobs.claim(session, name)
                if job is None:
                    return
                claimed[name].append(job.id)

    threads = [threading.Thread(target=work, args=(n,)) for n in claimed]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    everything = [j for js in claimed.values() for j in js]
    assert sorted(everything) == sorted(ids)  # each job claimed exactly once


def test_a_stale_running_job_is_taken_over_and_retries_are_capped(db, make_project) -> None:
    project = make_project(db)
    (job_id,) = _enqueue(db, project, 1)
    for attempt in range(1, 4):
        job = jobs.claim(db, f"w{attempt}")
        assert job is not None and job.id == job_id and job.attempts == attempt
        job.heartbeat_at = utcnow() - timedelta(minutes=5)  # the worker died without a word
        db.commit()
    assert jobs.claim(db, "w4") is None  # three attempts died: the job fails instead of looping
    db.commit()
    db.expire_all()
    job = db.get(Job, job_id)
    assert job.state == "failed" and "gave up" in job.error


def test_a_live_heartbeat_keeps_the_job(db, make_project) -> None:
    project = make_project(db)
    _enqueue(db, project, 1)
    job = jobs.claim(db, "w1")
    db.commit()
    assert jobs.heartbeat(db, job.id, "w1", done=3, total=10, message="going") == "running"
    db.commit()
    assert jobs.claim(db, "w2") is None
    assert jobs.heartbeat(db, job.id, "w2") == "lost"  # only the holder may write
    db.refresh(job)
    assert job.result["done"] == 3 and job.progress == 0.3


def test_cancel_stops_queued_and_running_jobs_and_a_late_finish_does_not_overwrite(db, make_project,
                                                                                   make_user) -> None:
    lead = make_user(db, "lead")
    project = make_project(db, lead=lead)
    queued, running = _enqueue(db, project, 2)
    claimed = jobs.claim(db, "w1")
    assert claimed.id == queued
    db.commit()
    jobs.cancel(db, db.get(Job, queued), lead)
    jobs.cancel(db, db.get(Job, running), lead)
    db.commit()
    assert jobs.heartbeat(db, queued, "w1") == "cancelled"  # the worker learns at its next beat
    assert jobs.succeed(db, queued, "w1", {"x": 1}) is False
    db.commit()
    assert {j.state for j in db.scalars(select(Job))} == {"cancelled"}
    assert jobs.claim(db, "w2") is None


def test_failed_attempts_go_back_to_the_queue_until_the_cap(db, make_project) -> None:
    project = make_project(db)
    (job_id,) = _enqueue(db, project, 1)
    for _ in range(2):
        job = jobs.claim(db, "w")
        assert jobs.fail(db, job.id, "w", "boom", retry=True)
        db.commit()
        assert db.get(Job, job_id).state == "queued"
    job = jobs.claim(db, "w")
    jobs.fail(db, job.id, "w", "boom again", retry=True)
    db.commit()
    job = db.get(Job, job_id)
    assert job.state == "failed" and job.error == "boom again" and job.attempts == 3


def test_a_retry_with_a_backoff_waits_while_younger_jobs_run(db, make_project) -> None:
    project = make_project(db)
    first, second = _enqueue(db, project, 2)
    job = jobs.claim(db, "w")
    assert job.id == first
    assert jobs.fail(db, job.id, "w", "receiver down", retry=True, retry_after=timedelta(minutes=5))
    db.commit()
    failed_at = db.get(Job, first).run_after - timedelta(minutes=5)
    younger = jobs.claim(db, "w")
    assert younger.id == second  # the older job waits out its backoff; the younger one runs
    assert jobs.succeed(db, younger.id, "w", {})
    db.commit()
    assert jobs.claim(db, "w", now=failed_at + timedelta(minutes=4)) is None
    db.rollback()
    again = jobs.claim(db, "w", now=failed_at + timedelta(minutes=5, seconds=1))
    assert again.id == first and again.attempts == 2
    db.commit()


def test_sampling_request_with_a_bad_generator_is_refused_before_any_job_exists(db, make_user, make_project,
                                                                                token_for, api, tmp_path) -> None:
    lead = make_user(db, "lead")
    project = make_project(db, lead=lead)
    from app.models import Prompt

    db.add(Prompt(project_id=project.id, text="q", text_hash="h", split="train"))
    client = api(token_for(db, lead))
    db.commit()
    url = f"/api/projects/{project.id}/sampling-jobs"
    r = client.post(url, json={"generator": {"backend": "hf", "model": str(tmp_path / "missing")}})
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "generator.model"
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    r = client.post(url, json={"generator": {"backend": "hf", "model": str(empty)}})
    assert r.status_code == 422 and "weights" in r.json()["detail"][0]["message"]
    r = client.post(url, json={"generator": {"backend": "openai", "base_url": "http://169.254.169.254/v1",
                                             "model": "m"}})
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "generator.base_url"
    r = client.post(url, json={"generator": {"backend": "openai", "base_url": "file:///etc/passwd", "model": "m"}})
    assert r.status_code == 422
    r = client.post(url, json={"generator": {"backend": "hf", "model": "x", "temperature": -1}})
    assert r.status_code == 422 and r.json()["detail"][0]["field"].endswith("temperature")
    r = client.post(url, json={"generator": {"backend": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m"},
                               "k": 40})
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "k"
    assert db.scalar(select(func.count(Job.id))) == 0


def test_job_status_is_private_to_project_members(db, make_user, make_project, token_for, api) -> None:
    lead, outsider = make_user(db, "lead"), make_user(db, "lead")
    project = make_project(db, lead=lead)
    job = jobs.enqueue(db, "sample_completions", {}, project=project, actor=lead)
    lead_client, out_client = api(token_for(db, lead)), api(token_for(db, outsider))
    db.commit()
    body = lead_client.get(f"/api/jobs/{job.id}").json()
    assert body["state"] == "queued" and body["progress"] == {"done": 0, "total": 0} and "payload" not in body
    assert out_client.get(f"/api/jobs/{job.id}").status_code == 404
    assert out_client.post(f"/api/jobs/{job.id}/cancel").status_code == 404
    assert lead_client.post(f"/api/jobs/{job.id}/cancel").json()["state"] == "cancelled"
    assert lead_client.post(f"/api/jobs/{job.id}/cancel").status_code == 409


def test_page_forms_validate_the_generator_like_the_api(db, make_user, make_project, browser) -> None:
    lead = make_user(db, "lead")
    project = make_project(db, lead=lead)
    db.commit()
    page = browser()
    page.login(lead.email)
    r = page.post(f"/projects/{project.id}/jobs/sample", {"backend": "hf", "model": "/x", "temperature": "-1"})
    assert r.status_code == 422 and "generator.temperature" in r.text
    r = page.post(f"/projects/{project.id}/judge/runs", {"backend": "openai", "model": "m",
                                                         "base_url": "http://169.254.169.254/v1"})
    assert r.status_code == 422 and "generator.base_url" in r.text
