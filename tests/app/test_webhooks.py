"""Webhooks end to end on SQLite and Postgres: a real HTTP receiver in a thread, the real job worker, the API.

The receiver listens on 127.0.0.1, so its hooks are registered by an admin with `allow_private` (the same trust an
admin gives a model endpoint on localhost); a lead asking for that is refused, and so is a private address
without it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest
from sqlalchemy import select

from app.jobs import queue as jobs
from app.models import Job
from app.worker import Worker
from tests.support.server import serve_in_thread


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes
    at: float


@dataclass
class Receiver:
    """Answers each POST with the next status in `answers` (200 once they run out) and keeps what it got."""

    answers: list[int]
    got: list[Received] = field(default_factory=list)
    changed: threading.Condition = field(default_factory=threading.Condition)
    url: str = ""

    def wait_for(self, n: int, deadline_s: float = 30.0) -> list[Received]:
        with self.changed:
            assert self.changed.wait_for(lambda: len(self.got) >= n, timeout=deadline_s), \
                f"the receiver got {len(self.got)} of {n} requests"
            return list(self.got)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state = Receiver(answers=[])

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            with state.changed:
                status = state.answers.pop(0) if state.answers else 200
                state.got.append(Received(dict(self.headers.items()), body, time.monotonic()))
                state.changed.notify_all()
            self.send_response(status)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *_: Any) -> None:
            pass

    with serve_in_thread(Handler) as base:
        state.url = base + '/hooks/preflab'
        yield state


def _world(db, make_user, make_project, token_for, api):  # type: ignore[no-untyped-def]
    admin = make_user(db, "admin")
    lead = make_user(db, "lead")
    project = make_project(db, lead=lead)
    clients = api(token_for(db, admin)), api(token_for(db, lead))
    db.commit()
    return project, *clients


def _hook(client, project_id: int, url: str, events: list[str]) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    r = client.post(f"/api/projects/{project_id}/webhooks", json={"url": url, "events": events,
                                                                  "allow_private": True})
    assert r.status_code == 201, r.text
    return r.json()


def _worker(app, **settings: Any) -> Worker:  # type: ignore[no-untyped-def]
    return Worker(app.state.settings.model_copy(update=settings), session_factory=app.state.session_factory,
                  heartbeat_s=0.2, poll_s=0.05)


def _verify(secret: str, got: Received) -> dict[str, Any]:
    """What a receiver does (the docs' recipe): HMAC the raw body, compare in constant time, then parse."""
    want = "sha256=" + hmac.new(secret.encode(), got.body, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(want, got.headers["X-Preflab-Signature"])
    return json.loads(got.body)


def test_a_receiver_gets_a_signed_export_ready(db, app, make_user, make_project, token_for, api,
                                               receiver) -> None:
    project, admin, lead = _world(db, make_user, make_project, token_for, api)
    hook = _hook(admin, project.id, receiver.url, ["export.ready", "training_run.failed"])
    assert hook["secret"].startswith("whsec_")
    listed = lead.get(f"/api/projects/{project.id}/webhooks").json()
    assert [h["id"] for h in listed] == [hook["id"]] and "secret" not in listed[0]  # shown once, never again

    r = lead.post(f"/api/projects/{project.id}/exports", json={"format": "jsonl"})
    assert r.status_code == 202, r.text
    export_id = r.json()["export_id"]
    worker = _worker(app)
    assert worker.run_one()  # the export: its success queues the delivery in the same transaction
    assert worker.run_one()  # the delivery

    [got] = receiver.wait_for(1)
    body = _verify(hook["secret"], got)
    assert got.headers["X-Preflab-Event"] == "export.ready" == body["event"]
    assert body["data"]["export_id"] == export_id and body["project_id"] == project.id
    assert got.headers["X-Preflab-Delivery"] == body["id"]
    wrong = "sha256=" + hmac.new(b"whsec_wrong", got.body, hashlib.sha256).hexdigest()
    assert not hmac.compare_digest(wrong, got.headers["X-Preflab-Signature"])

    [delivery] = lead.get(f"/api/projects/{project.id}/webhooks/{hook['id']}/deliveries").json()
    assert (delivery["state"], delivery["status_code"], delivery["attempts"]) == ("delivered", 200, 1)
    assert delivery["delivery_id"] == body["id"] and delivery["log"][0]["status_code"] == 200


def test_a_failed_delivery_is_retried_after_its_backoff(db, app, make_user, make_project, token_for, api,
                                                        receiver) -> None:
    project, admin, lead = _world(db, make_user, make_project, token_for, api)
    hook = _hook(admin, project.id, receiver.url, ["export.ready"])
    receiver.answers = [500]
    assert lead.post(f"/api/projects/{project.id}/exports", json={"format": "jsonl"}).status_code == 202
    worker = _worker(app, webhook_retry_base_s=1.0)
    assert worker.run_one() and worker.run_one()  # the export, then the first attempt (answered 500)
    [first] = receiver.wait_for(1)

    with app.state.session_factory() as probe:  # its own short transaction: SQLite has one write lock
        job = probe.scalars(select(Job).where(Job.kind == "webhook_delivery")).one()
        assert job.state == "queued" and job.attempts == 1 and job.run_after is not None
        assert "HTTP 500" in (job.error or "")
        # Not claimable a moment before its backoff has passed (the claim is asked at that moment).
        assert jobs.claim(probe, "probe", now=job.run_after - timedelta(milliseconds=100)) is None
        probe.rollback()
    [pending] = lead.get(f"/api/projects/{project.id}/webhooks/{hook['id']}/deliveries").json()
    assert (pending["state"], pending["status_code"], pending["attempts"]) == ("pending", 500, 1)

    runner = threading.Thread(target=worker.run, kwargs={"max_jobs": 1})
    runner.start()
    try:
        first, second = receiver.wait_for(2)
    finally:
        worker.terminating = True
        runner.join()
    assert second.at - first.at >= 1.0  # the backoff was waited out
    assert second.headers["X-Preflab-Delivery"] == first.headers["X-Preflab-Delivery"]  # one delivery, retried
    assert second.body == first.body
    _verify(hook["secret"], second)
    [delivered] = lead.get(f"/api/projects/{project.id}/webhooks/{hook['id']}/deliveries").json()
    assert (delivered["state"], delivered["attempts"]) == ("delivered", 2)
    assert [a["status_code"] for a in delivered["log"]] == [500, 200]


def test_private_addresses_need_an_admin(db, app, make_user, make_project, token_for, api, receiver) -> None:
    project, admin, lead = _world(db, make_user, make_project, token_for, api)
    url = f"/api/projects/{project.id}/webhooks"
    r = lead.post(url, json={"url": "https://127.0.0.1:9/hook", "events": ["export.ready"]})
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "url", r.text
    assert "private or loopback" in r.json()["detail"][0]["message"]
    r = lead.post(url, json={"url": receiver.url, "events": ["export.ready"], "allow_private": True})
    assert r.status_code == 403, r.text
    r = lead.post(url, json={"url": "http://hooks.example.org/x", "events": ["export.ready"]})
    assert r.status_code == 422 and "https" in r.json()["detail"][0]["message"], r.text
    r = lead.post(url, json={"url": "https://169.254.169.254/latest", "events": ["export.ready"]})
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "url", r.text
    r = admin.post(url, json={"url": receiver.url, "events": ["no.such"], "allow_private": True})
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "events", r.text
    assert lead.get(url).json() == []


def test_a_lead_removes_a_hook_and_other_projects_cannot_reach_it(db, app, make_user, make_project, token_for, api,
                                                                 receiver) -> None:
    project, admin, lead = _world(db, make_user, make_project, token_for, api)
    other_lead = make_user(db, "lead")
    other = make_project(db, lead=other_lead)
    outsider = api(token_for(db, other_lead))
    db.commit()
    hook = _hook(admin, project.id, receiver.url, ["export.ready"])
    assert outsider.get(f"/api/projects/{project.id}/webhooks").status_code == 404
    assert outsider.delete(f"/api/projects/{other.id}/webhooks/{hook['id']}").status_code == 404
    assert lead.delete(f"/api/projects/{project.id}/webhooks/{hook['id']}").status_code == 204
    assert lead.get(f"/api/projects/{project.id}/webhooks").json() == []
    assert lead.post(f"/api/projects/{project.id}/exports", json={"format": "jsonl"}).status_code == 202
    assert _worker(app).run_one()  # the export
    assert not _worker(app).run_one()  # no hook, no delivery
    assert receiver.got == []


def test_the_webhooks_page_adds_shows_the_secret_once_and_removes(db, app, make_user, make_project,
                                                                 browser) -> None:
    lead = make_user(db, "lead")
    project = make_project(db, lead=lead)
    annotator = make_user(db, "annotator")
    from app.projects import projects

    projects.add_member(db, project, lead, email=annotator.email, role="annotator")
    db.commit()
    b = browser()
    b.login(lead.email)
    assert f'href="/projects/{project.id}/webhooks"' in b.get(f"/projects/{project.id}").text
    page = b.get(f"/projects/{project.id}/webhooks")
    assert page.status_code == 200 and "No webhooks yet." in page.text and "trusted private host" not in page.text
    url = "https://hooks.example.invalid/preflab"
    assert b.post(f"/projects/{project.id}/webhooks", {"url": url, "events": ["export.ready"]},
                  csrf=False).status_code == 403
    bad = b.post(f"/projects/{project.id}/webhooks", {"url": "http://hooks.example.invalid/x",
                                                      "events": ["export.ready"]})
    assert bad.status_code == 422 and "URL" in bad.text and "https" in bad.text
    assert 'value="http://hooks.example.invalid/x"' in bad.text  # what the lead typed is kept
    added = b.post(f"/projects/{project.id}/webhooks", {"url": url, "events": ["export.ready", "training_run.failed"]})
    assert added.status_code == 201, added.text
    secret = re.search(r"<code>(whsec_[A-Za-z0-9_-]+)</code>", added.text)
    assert secret, added.text
    again = b.get(f"/projects/{project.id}/webhooks")
    assert url in again.text and "export.ready, training_run.failed" in again.text
    assert secret.group(1) not in again.text  # never shown again
    hook_id = int(re.search(r'id="webhook-(\d+)"', again.text).group(1))
    gone = b.post(f"/projects/{project.id}/webhooks/{hook_id}/delete")
    assert gone.status_code == 303
    assert "No webhooks yet." in b.get(f"/projects/{project.id}/webhooks").text

    other = browser()
    other.login(annotator.email)
    assert other.get(f"/projects/{project.id}/webhooks").status_code == 403
    assert f'href="/projects/{project.id}/webhooks"' not in other.get(f"/projects/{project.id}").text


def test_training_and_judge_runs_that_end_are_announced_once(db, app, make_user, make_project, token_for, api,
                                                             receiver) -> None:
    from types import SimpleNamespace

    from app.judge import judge_job
    from app.models import JudgeRun, TrainingRun
    from app.runs import train_job

    project, admin, lead = _world(db, make_user, make_project, token_for, api)
    hook = _hook(admin, project.id, receiver.url, ["training_run.finished", "training_run.failed",
                                                   "judge_run.finished"])
    finished = TrainingRun(project_id=project.id, kind="reward", state="running", config={})
    failed = TrainingRun(project_id=project.id, kind="dpo", state="running", config={})
    judged = JudgeRun(project_id=project.id, name="judge 1", params={}, state="running")
    db.add_all([finished, failed, judged])
    db.commit()
    # The job handlers' own end-of-run step (what a worker's train and judge jobs call as a run ends).
    ctx = SimpleNamespace(session_factory=app.state.session_factory)
    train_job._set_state(ctx, finished.id, "succeeded")
    train_job._set_state(ctx, failed.id, "failed")
    train_job._set_state(ctx, failed.id, "failed")  # already failed: not announced twice
    judge_job._set_state(ctx, judged.id, "succeeded")
    worker = _worker(app)
    assert worker.run(exit_when_idle=True) == 3
    got = {(b := _verify(hook["secret"], r))["event"]: b["data"] for r in receiver.wait_for(3)}
    assert got == {
        "training_run.finished": {"training_run_id": finished.id, "kind": "reward", "state": "succeeded",
                                  "export_id": None, "url": f"/api/training-runs/{finished.id}"},
        "training_run.failed": {"training_run_id": failed.id, "kind": "dpo", "state": "failed", "export_id": None,
                                "url": f"/api/training-runs/{failed.id}"},
        "judge_run.finished": {"judge_run_id": judged.id, "name": "judge 1", "state": "succeeded"}}


def test_annotators_the_kept_figures_newly_flag_are_announced_once(db, app, make_user, make_project, token_for,
                                                                   api, receiver) -> None:
    from app.models import Project, User
    from app.platform.db import session_scope
    from app.quality import upkeep
    from tests.app.test_agreement_scale import _campaign

    project, _ = _campaign(db, make_user, make_project, n_prompts=24, seed=11)  # two annotators rank in 1 s
    admin = api(token_for(db, make_user(db, "admin")))
    fast = set(db.scalars(select(User.id).where(User.email.in_(["a6@example.org", "a7@example.org"]))))
    db.commit()
    hook = _hook(admin, project.id, receiver.url, ["annotator.flagged"])

    def fold(how) -> None:  # type: ignore[no-untyped-def]
        with session_scope(app.state.session_factory) as s:
            how(s, s.get(Project, project.id))

    fold(upkeep.drain)  # the campaign's rankings, folded into the figures
    announced = _worker(app).run(exit_when_idle=True)
    bodies = [_verify(hook["secret"], r)["data"] for r in receiver.wait_for(announced)]
    too_fast = {b["user_id"] for b in bodies if "too_fast" in b["flags"]}
    assert too_fast == fast, bodies
    fold(upkeep.rebuild)  # the same people with the same flags: nothing new to tell
    assert _worker(app).run(exit_when_idle=True) == 0
    assert len(receiver.got) == announced


def test_the_overlap_target_reached_is_announced_once(db, app, make_user, make_project, token_for, api,
                                                      receiver) -> None:
    from tests.app.test_annotation_api import _ranking, _seed

    lead, project, people = _seed(db, make_user, make_project, n_prompts=2, overlap=2, annotators=3)
    admin = api(token_for(db, make_user(db, "admin")))
    clients = [api(token_for(db, p)) for p in people]
    db.commit()
    hook = _hook(admin, project.id, receiver.url, ["overlap.reached"])

    def rank(client) -> None:  # type: ignore[no-untyped-def]
        task = client.get(f"/api/projects/{project.id}/tasks/next").json()
        assert client.post(f"/api/projects/{project.id}/rankings", json=_ranking(task)).status_code == 201

    worker = _worker(app)
    rank(clients[0])
    rank(clients[0])
    rank(clients[1])  # one prompt has both rankings, the other one of two: not reached yet
    assert worker.run(exit_when_idle=True) == 0
    rank(clients[1])  # the last prompt reaches its overlap
    assert worker.run(exit_when_idle=True) == 1
    [got] = receiver.wait_for(1)
    body = _verify(hook["secret"], got)
    assert body["event"] == "overlap.reached" and body["project_id"] == project.id
    assert body["data"] == {"round": 1, "prompts": 2, "overlap": 2, "url": f"/api/projects/{project.id}"}
    # A third annotator may still rank a gold or leftover task; nothing more is announced either way.
    task = clients[2].get(f"/api/projects/{project.id}/tasks/next")
    assert task.status_code == 204
    assert worker.run(exit_when_idle=True) == 0 and len(receiver.got) == 1


def test_a_run_whose_job_gave_up_is_announced_as_failed(db, app, make_user, make_project, token_for, api,
                                                        receiver) -> None:
    from app.models import TrainingRun

    project, admin, _ = _world(db, make_user, make_project, token_for, api)
    hook = _hook(admin, project.id, receiver.url, ["training_run.failed"])
    job = jobs.enqueue(db, "train", {"training_run_id": 0}, project=project, actor=None, max_attempts=2)
    run = TrainingRun(project_id=project.id, kind="dpo", state="running", config={}, job_id=job.id)
    db.add(run)
    db.flush()
    job.payload = {"training_run_id": run.id}
    # The worker died on its last attempt: running, no attempts left, its heartbeat long stale.
    job.state, job.attempts, job.claimed_by = "running", 2, "dead-worker"
    job.heartbeat_at = job.created_at - timedelta(hours=1)
    db.commit()
    run_id = run.id

    worker = _worker(app)
    assert not worker.run_one()  # nothing to run: the claim fails the job (and its run) instead
    db.expire_all()
    assert (db.get(Job, job.id).state, db.get(TrainingRun, run.id).state) == ("failed", "failed")
    db.rollback()  # SQLite: the test's read transaction would hold the write lock the worker needs
    assert worker.run(exit_when_idle=True) == 1  # the delivery
    [got] = receiver.wait_for(1)
    body = _verify(hook["secret"], got)
    assert body["event"] == "training_run.failed"
    assert body["data"] == {"training_run_id": run_id, "kind": "dpo", "state": "failed", "export_id": None,
                            "url": f"/api/training-runs/{run_id}"}
    assert worker.run(exit_when_idle=True) == 0 and len(receiver.got) == 1


def test_an_export_is_announced_once_when_its_worker_dies_before_finishing(db, app, make_user, make_project,
                                                                          token_for, api, receiver) -> None:
    from app.models import Export, WebhookDelivery

    project, admin, lead = _world(db, make_user, make_project, token_for, api)
    _hook(admin, project.id, receiver.url, ["export.ready"])
    r = lead.post(f"/api/projects/{project.id}/exports", json={"format": "jsonl"})
    assert r.status_code == 202, r.text
    export_id = r.json()["export_id"]
    job_id = db.get(Export, export_id).job_id
    db.rollback()  # SQLite: the test's read transaction would hold the write lock the worker needs
    assert _worker(app).run_one()
    db.expire_all()
    first_sha = db.get(Export, export_id).sha256
    # As if the worker died after publishing the export, before it marked the job done: the lease lapses and
    # another worker takes the job over.
    job = db.get(Job, job_id)
    job.state, job.claimed_by, job.finished_at = "running", "dead-worker", None
    job.heartbeat_at = job.created_at - timedelta(hours=1)
    db.commit()
    assert _worker(app).run_one()
    db.expire_all()
    assert db.get(Job, job_id).state == "succeeded" and db.get(Export, export_id).sha256 == first_sha
    events = db.scalars(select(WebhookDelivery.event)).all()
    assert events == ["export.ready"]


def test_a_training_crash_the_worker_retries_is_not_announced_as_failed(db, app, make_user, make_project, token_for,
                                                                        api, receiver, monkeypatch) -> None:
    from types import SimpleNamespace

    from app.models import TrainingRun, WebhookDelivery
    from app.runs import train_job

    project, admin, _ = _world(db, make_user, make_project, token_for, api)
    _hook(admin, project.id, receiver.url, ["training_run.failed"])
    run = TrainingRun(project_id=project.id, kind="dpo", state="running", config={})
    db.add(run)
    db.commit()
    run_id = run.id

    def crash(ctx: Any) -> None:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(train_job, "_run", crash)
    for attempt in (1, 2, 3):  # the worker retries a crash while attempts remain
        ctx = SimpleNamespace(session_factory=app.state.session_factory, payload={"training_run_id": run_id},
                              attempts=attempt, max_attempts=3)
        with pytest.raises(RuntimeError):
            train_job.run(ctx)
        db.expire_all()
        assert db.get(TrainingRun, run_id).state == ("failed" if attempt == 3 else "queued")
        db.rollback()
    assert db.scalars(select(WebhookDelivery.event)).all() == ["training_run.failed"]


def test_an_export_made_from_the_command_line_is_announced_too(db, app, make_user, make_project, token_for, api,
                                                               receiver, tmp_path, monkeypatch, database_url) -> None:
    from typer.testing import CliRunner

    from app.cli import cli

    project, admin, _ = _world(db, make_user, make_project, token_for, api)
    hook = _hook(admin, project.id, receiver.url, ["export.ready"])
    settings = app.state.settings
    monkeypatch.setenv("PREFLAB_DATABASE_URL", database_url)
    monkeypatch.setenv("PREFLAB_SECRET_KEY", settings.resolved_secret())
    monkeypatch.setenv("PREFLAB_DATA_DIR", str(settings.data_dir))
    result = CliRunner().invoke(cli, ["export", str(project.id), "--format", "jsonl", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    export_id = int(result.output.split()[1].rstrip(":"))

    assert _worker(app).run_one()  # the delivery the CLI's export queued
    [got] = receiver.wait_for(1)
    body = _verify(hook["secret"], got)
    assert body["event"] == "export.ready" and body["data"]["export_id"] == export_id
