"""Workers killed with SIGKILL mid-job, two workers at once, retries that run out: real worker processes.

Every job must run to one end: reclaimed after its lease lapses, executed once (counted by what the handler
did, not by the job's state), never left "running", with no temp files or orphaned trainers behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert, select

from app.annotation.pairs import expand_tiers
from app.exports import writer as export_writer
from app.models import Completion, Export, Job, Pair, Prompt, Ranking
from app.platform.db import make_engine, make_session_factory
from app.projects import projects
from app.runs import training_runs
from app.runs.train_job import run_marker
from app.worker import Worker
from tests.conftest import TEST_SECRET
from tests.support.server import wait_for
from training.hold import ENV as HOLD_ENV

pytestmark = pytest.mark.crash

K = 4


# ------------------------------------------------------------------------------------------------
# helpers


@pytest.fixture(autouse=True)
def _fresh_data_dir(app: Any) -> None:
    """The app's data directory is shared by the session and ids restart per test: clear job logs, exports and
    runs, so that what a test counts in them is its own."""
    import shutil

    data_dir = Path(app.state.settings.data_dir)
    for name in ("jobs", "exports", "runs", "worker-output.log"):
        path = data_dir / name
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


def _spawn_worker(app: Any, *options: str, hold: str | None = None) -> subprocess.Popen:  # type: ignore[type-arg]
    """`preflab worker` in its own process, on the test app's database, data directory and secret; `hold`
    ("POINT=PATH", training.hold) stops it, or the trainer it starts, at that point until PATH exists."""
    settings = app.state.settings
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFLAB_")}
    env.update(PREFLAB_DATABASE_URL=settings.database_url, PREFLAB_DATA_DIR=str(settings.data_dir),
               PREFLAB_SECRET_KEY=TEST_SECRET)
    if hold:
        env[HOLD_ENV] = hold
    # Frequent heartbeats: progress reaches the database quickly, and the lease lapses soon after a kill.
    with open(Path(settings.data_dir) / "worker-output.log", "ab") as output:  # the child keeps its own copy
        return subprocess.Popen([sys.executable, "-m", "app.cli", "worker", "--poll", "0.1", "--heartbeat", "0.1",
                                 *options], env=env, stdout=output, stderr=subprocess.STDOUT)


def _worker_output(app: Any) -> str:
    return (Path(app.state.settings.data_dir) / "worker-output.log").read_text(errors="replace")[-3000:]


def _kill(proc: subprocess.Popen) -> None:  # type: ignore[type-arg]
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


def _job(db, job_id: int) -> Job:  # type: ignore[no-untyped-def]
    db.expire_all()
    job = db.get(Job, job_id)
    db.expunge(job)  # detached with its values loaded: reading them later opens no transaction
    db.rollback()  # end the read: on SQLite an open transaction holds the write lock
    return job


def _let_lease_lapse(db, job_id: int, stale_after: float) -> None:  # type: ignore[no-untyped-def]
    """Wait until the dead worker's last heartbeat is older than `stale_after` (the database's clock decides)."""
    job = _job(db, job_id)
    assert job.state == "running"  # nobody told the database the worker died
    from app.models import utcnow

    wait_for("the lease to lapse", lambda: utcnow() - job.heartbeat_at > timedelta(seconds=stale_after + 0.2),
             timeout=90, every=0.05)


def _marked_processes(app, run_id: int) -> list[int]:  # type: ignore[no-untyped-def]
    """Live processes carrying a training run's marker (its trainer, or anything the trainer started): this test's
    run directory, so a run of the same id in another test session on the machine is never counted."""
    marker = run_marker(training_runs.run_dir(Path(app.state.settings.data_dir), run_id))
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if marker in (entry / "environ").read_bytes() and "State:\tZ" not in (entry / "status").read_text():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _ranked_project(db, make_user, make_project, token_for, n_prompts: int):  # type: ignore[no-untyped-def]
    """A project with `n_prompts` fully ranked prompts (K completions, one human ranking, 6 pairs each), written in
    bulk, and an engineer's token."""
    lead, annotator, engineer = make_user(db, "lead"), make_user(db, "annotator"), make_user(db, "engineer")
    project = make_project(db, lead=lead, k=K)
    projects.add_member(db, project, lead, email=engineer.email, role="engineer")
    prompt_ids = db.scalars(insert(Prompt).returning(Prompt.id, sort_by_parameter_order=True), [
        {"project_id": project.id, "text": f"what is {i} plus {i}, and why?", "text_hash": f"{project.id}-{i}",
         "split": "heldout" if i % 10 == 9 else "train"} for i in range(n_prompts)]).all()
    completion_ids = db.scalars(insert(Completion).returning(Completion.id, sort_by_parameter_order=True), [
        {"prompt_id": pid, "text": f"{'good right' if j == 0 else 'bad wrong'} answer {j} to {pid}"}
        for pid in prompt_ids for j in range(K)]).all()
    tiers = [[[c] for c in completion_ids[i * K:(i + 1) * K]] for i in range(n_prompts)]
    ranking_ids = db.scalars(insert(Ranking).returning(Ranking.id, sort_by_parameter_order=True), [
        {"project_id": project.id, "prompt_id": pid, "source": "human", "annotator_id": annotator.id,
         "rubric_id": project.current_rubric_id, "tiers": t, "display_order": [c[0] for c in t]}
        for pid, t in zip(prompt_ids, tiers, strict=True)]).all()
    db.execute(insert(Pair), [
        {"ranking_id": rid, "prompt_id": pid, "chosen_id": s.chosen, "rejected_id": s.rejected, "margin": s.margin,
         "source": "human"}
        for rid, pid, t in zip(ranking_ids, prompt_ids, tiers, strict=True) for s in expand_tiers(t)])
    token = token_for(db, engineer)
    db.commit()
    return project.id, token


def _request_export(client, project_id: int) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    r = client.post(f"/api/projects/{project_id}/exports", json={"kind": "pairs", "format": "jsonl"})
    assert r.status_code == 202, r.text
    return r.json()["export_id"], r.json()["job_id"]


def _in_process_worker(app: Any, **kw: Any) -> Worker:
    # Its own engine, as a separate worker process would have.
    factory = make_session_factory(make_engine(app.state.settings.database_url))
    return Worker(app.state.settings, session_factory=factory, poll_s=0.05, heartbeat_s=0.2, **kw)


def _run_in_process(app: Any, **kw: Any) -> int:
    """Run a worker here until the queue is empty; how many jobs it ran."""
    worker = _in_process_worker(app, **kw)
    try:
        return worker.run(exit_when_idle=True)
    finally:
        worker.session_factory.kw["bind"].dispose()


def _executions(app: Any, job_id: int, line: str) -> int:
    """How many times a handler got as far as writing `line` into the job's log: executions, not states."""
    log = Path(app.state.settings.data_dir) / "jobs" / f"{job_id}.log"
    return sum(line in row for row in log.read_text(encoding="utf-8").splitlines())


# ------------------------------------------------------------------------------------------------
# exports


def test_an_export_killed_mid_write_is_reclaimed_and_written_once_atomically(db, app, make_user, make_project,
                                                                              token_for, api) -> None:
    project_id, token = _ranked_project(db, make_user, make_project, token_for, n_prompts=2000)
    client = api(token)
    export_id, job_id = _request_export(client, project_id)
    exports_dir = Path(app.state.settings.data_dir) / "exports"
    final = exports_dir / str(export_id)

    def writing() -> list[Path]:
        # The writer's temp directory exists only while write_export runs; a file in it means rows are going out.
        return [t for t in exports_dir.glob(f".tmp-{export_id}-*") if any(t.iterdir())]

    proc = _spawn_worker(app)
    try:
        (temp,) = wait_for("the export to start writing", writing, timeout=90, every=0.002)
        _kill(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert temp.exists() and not final.exists(), "the kill must land mid-write"  # partial files, no export yet
    r = client.get(f"/api/exports/{export_id}").json()
    assert r["status"] == "running" and not r["files"], r

    _let_lease_lapse(db, job_id, stale_after=1)
    retry = _spawn_worker(app, "--once", "--stale-after", "1")
    assert retry.wait(timeout=120) == 0, _worker_output(app)

    job = _job(db, job_id)
    assert (job.state, job.attempts, job.error) == ("succeeded", 2, None)
    assert _executions(app, job_id, "succeeded") == 1
    assert _executions(app, job_id, "wrote 12000 rows") == 1  # the killed attempt never got that far
    out = client.get(f"/api/exports/{export_id}").json()
    assert out["status"] == "ready" and out["row_count"] == 12000
    on_disk = sorted(str(p.relative_to(final)) for p in final.rglob("*") if p.is_file())
    assert on_disk == sorted(out["files"])
    assert not list(exports_dir.glob(".tmp-*")), "the dead attempt's temp directory is gone"
    for name in out["files"]:
        assert client.get(f"/api/exports/{export_id}/files/{name}").status_code == 200

    # The same data exported cleanly, without any kill, gives the same bytes.
    clean_id, _ = _request_export(client, project_id)
    assert _run_in_process(app) == 1
    clean = client.get(f"/api/exports/{clean_id}").json()
    assert clean["status"] == "ready"
    assert clean["files"] == out["files"] and clean["sha256"] == out["sha256"]
    assert clean["sha256"] == export_writer.manifest_sha256(out["files"])


def test_two_workers_at_once_run_each_job_exactly_once(db, app, make_user, make_project, token_for, api) -> None:
    project_id, token = _ranked_project(db, make_user, make_project, token_for, n_prompts=300)
    client = api(token)
    jobs_ = [_request_export(client, project_id) for _ in range(8)]
    workers = [_in_process_worker(app, worker_id=f"worker-{i}") for i in range(2)]
    barrier = threading.Barrier(len(workers))
    ran: dict[str, int] = {}

    def work(worker: Worker) -> None:
        barrier.wait(timeout=30)
        ran[worker.worker_id] = worker.run(exit_when_idle=True)

    threads = [threading.Thread(target=work, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    for w in workers:
        w.session_factory.kw["bind"].dispose()
    assert sum(ran.values()) == len(jobs_) and all(ran.values()), ran  # both took part, every job ran
    shas = set()
    for export_id, job_id in jobs_:
        job = _job(db, job_id)
        assert (job.state, job.attempts) == ("succeeded", 1), (job.state, job.attempts, job.error)
        assert _executions(app, job_id, "export ") == 1  # the handler started once…
        assert _executions(app, job_id, "wrote 1800 rows") == 1  # …and wrote once
        export = db.get(Export, export_id)
        shas.add(export.sha256)
        db.rollback()
    assert len(shas) == 1  # the same data, the same bytes, whichever worker wrote it


@pytest.mark.slow
def test_a_job_killed_on_every_attempt_fails_with_the_reason_and_its_run_with_it(db, app, make_user, make_project,
                                                                                  token_for, api,
                                                                                  models_dir) -> None:
    project_id, token = _ranked_project(db, make_user, make_project, token_for, n_prompts=40)
    client = api(token)
    export_id, _ = _request_export(client, project_id)
    assert _run_in_process(app) == 1
    r = client.post(f"/api/projects/{project_id}/training-runs", json={
        "kind": "reward", "export_id": export_id, "base_model": str(models_dir["reward"]),
        "config": {"steps": 100000, "batch_size": 2, "log_every": 1, "eval_every": 1000000}})
    assert r.status_code == 202, r.text
    run_id, job_id = r.json()["run_id"], r.json()["job_id"]
    max_attempts = _job(db, job_id).max_attempts
    for attempt in range(1, max_attempts + 1):
        proc = _spawn_worker(app, "--stale-after", "1")
        try:
            # Kill only once the trainer runs, so that each kill also leaves a trainer for the supervisor to stop.
            wait_for("the trainer to start", lambda: _marked_processes(app, run_id), timeout=90, every=0.05)
            assert _job(db, job_id).attempts == attempt
            _kill(proc)
        finally:
            if proc.poll() is None:
                proc.kill()
        wait_for("the orphaned trainer to be stopped", lambda: not _marked_processes(app, run_id), timeout=10)
        _let_lease_lapse(db, job_id, stale_after=1)

    assert _run_in_process(app, stale_after_s=1) == 0  # nothing left to claim…
    job = _job(db, job_id)
    assert job.state == "failed" and "gave up" in job.error and job.attempts == max_attempts  # …so it failed
    run = client.get(f"/api/training-runs/{run_id}").json()
    assert run["state"] == "failed"  # not "running" forever


# ------------------------------------------------------------------------------------------------
# training


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tests.app.test_training_runs import _tiny_reward_base

    return {"reward": _tiny_reward_base(tmp_path_factory.mktemp("models") / "reward")}


@pytest.mark.slow
def test_a_training_run_killed_mid_run_resumes_once_with_no_orphan_and_a_complete_model(
        db, app, make_user, make_project, token_for, api, models_dir, tmp_path) -> None:
    project_id, token = _ranked_project(db, make_user, make_project, token_for, n_prompts=40)
    client = api(token)
    export_id, _ = _request_export(client, project_id)
    assert _run_in_process(app) == 1
    steps, held = 40, 8
    r = client.post(f"/api/projects/{project_id}/training-runs", json={
        "kind": "reward", "export_id": export_id, "base_model": str(models_dir["reward"]),
        "config": {"steps": steps, "batch_size": 4, "log_every": 1, "eval_every": 1000000,
                   "save_every": 4}})
    assert r.status_code == 202, r.text
    run_id, job_id = r.json()["run_id"], r.json()["job_id"]
    run_dir = Path(app.state.settings.data_dir) / "runs" / str(run_id)
    metrics = run_dir / "metrics.jsonl"

    def logged_steps() -> int:
        return len(metrics.read_text().splitlines()) if metrics.exists() else 0

    # The trainer stops after logging and checkpointing step 8 and waits for `release`: the kill lands mid-run
    # on any machine, however fast its trainer.
    release = tmp_path / "release"
    proc = _spawn_worker(app, hold=f"train.step.{held}={release}")
    try:
        wait_for("the trainer to be held at step 8", Path(f"{release}.held").exists, timeout=90, every=0.02)
        assert logged_steps() == held and (run_dir / "checkpoint" / "trainer_state.json").exists()
        assert _marked_processes(app, run_id)
        _kill(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    # The supervisor takes the trainer down with the worker; then the hold is let go, so anything of the trainer
    # still alive would go on writing into the run directory.
    wait_for("the orphaned trainer to be stopped", lambda: not _marked_processes(app, run_id), timeout=10)
    release.touch()
    assert logged_steps() == held, "a step was logged after the worker died"
    assert not (run_dir / "model").exists()
    assert client.get(f"/api/training-runs/{run_id}").json()["state"] == "running"

    _let_lease_lapse(db, job_id, stale_after=1)
    assert _run_in_process(app, stale_after_s=1) == 1
    job = _job(db, job_id)
    assert (job.state, job.attempts, job.error) == ("succeeded", 2, None)
    assert _executions(app, job_id, "succeeded") == 1
    out = client.get(f"/api/training-runs/{run_id}").json()
    assert out["state"] == "succeeded"
    assert [m["step"] for m in out["metrics"]][-1] == steps
    # Resumed from the step-8 checkpoint, not started again: every step logged exactly once, in order.
    assert json.loads((run_dir / "run.json").read_text())["resumed_from_step"] == held
    logged = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    assert logged == list(range(1, steps + 1)), logged
    model = run_dir / "model"
    assert (model / "config.json").is_file() and list(model.glob("*.safetensors"))
    from transformers import AutoModelForSequenceClassification

    assert AutoModelForSequenceClassification.from_pretrained(model).config.num_labels == 1
    assert not _marked_processes(app, run_id)


# ------------------------------------------------------------------------------------------------
# Postgres conflicts: serialization failures and deadlocks are retried, not reported


def _postgres_only(database_url: str) -> None:
    if not database_url.startswith("postgresql"):
        pytest.skip(reason="Postgres serialization failures and deadlocks")


def _job_row(db, make_project, n: int = 1) -> list[int]:  # type: ignore[no-untyped-def]
    from app.jobs import queue as jobs

    project = make_project(db)
    ids = [jobs.enqueue(db, "export", {}, project=project, actor=None).id for _ in range(n)]
    db.commit()
    return ids


def test_a_real_serialization_failure_is_retried(database_url, db, clean_engine, make_project) -> None:
    from sqlalchemy import update

    from app.platform.db import is_transient, run_transaction

    _postgres_only(database_url)
    (job_id,) = _job_row(db, make_project)
    factory = make_session_factory(clean_engine)
    errors: list[BaseException] = []
    attempts = 0

    def bump(session) -> int:  # type: ignore[no-untyped-def]
        nonlocal attempts
        attempts += 1
        session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
        session.get(Job, job_id)  # the snapshot is taken here
        if attempts == 1:  # another transaction changes the row after our snapshot and commits
            with clean_engine.begin() as other:
                other.execute(update(Job).where(Job.id == job_id).values(progress=0.5))
        session.execute(update(Job).where(Job.id == job_id).values(progress=Job.progress + 0.25))
        return attempts

    from app.platform.db import session_scope

    try:  # the same work without the helper: the database refuses it (40001), it is not a made-up error
        with session_scope(factory) as session:
            bump(session)
    except Exception as exc:
        errors.append(exc)
    assert len(errors) == 1 and is_transient(errors[0]) and errors[0].orig.sqlstate == "40001"  # type: ignore[attr-defined]

    attempts = 0
    assert run_transaction(factory, bump) == 2  # failed once, then went through
    assert _job(db, job_id).progress == 0.75


def test_a_real_deadlock_between_two_transactions_is_retried(database_url, db, clean_engine, make_project) -> None:
    from sqlalchemy import update

    from app.platform.db import run_transaction

    _postgres_only(database_url)
    first, second = _job_row(db, make_project, n=2)
    barrier = threading.Barrier(2)
    runs: list[tuple[str, int]] = []
    done: dict[str, int] = {}

    def locker(name: str, order: tuple[int, int]) -> Callable[[Any], int]:
        attempt = 0

        def work(session) -> int:  # type: ignore[no-untyped-def]
            nonlocal attempt
            attempt += 1
            runs.append((name, attempt))
            session.execute(update(Job).where(Job.id == order[0]).values(progress=Job.progress + 0.1))
            if attempt == 1:
                barrier.wait(timeout=30)  # both hold their first row: each now waits for the other's
            session.execute(update(Job).where(Job.id == order[1]).values(progress=Job.progress + 0.1))
            return attempt

        return work

    def run(name: str, order: tuple[int, int]) -> None:
        done[name] = run_transaction(make_session_factory(clean_engine), locker(name, order))

    threads = [threading.Thread(target=run, args=("a", (first, second))),
               threading.Thread(target=run, args=("b", (second, first)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(done.values()) == [1, 2], runs  # Postgres aborted one (40P01); it ran again and both committed
    assert [round(_job(db, j).progress, 6) for j in (first, second)] == [0.2, 0.2]  # each update landed once


def test_a_request_aborted_by_a_deadlock_runs_again(database_url, app, db, clean_engine, make_user, make_project,
                                                     token_for, caplog) -> None:
    import logging

    from fastapi.testclient import TestClient
    from sqlalchemy import func, text

    from app.main import create_app
    from app.platform.db import RetryTransientErrors

    _postgres_only(database_url)
    lead, annotator = make_user(db, "lead"), make_user(db, "annotator")
    project = make_project(db, lead=lead, k=2)
    projects.add_member(db, project, lead, email=annotator.email, role="annotator")
    prompt = Prompt(project_id=project.id, text="q", text_hash="q", split="train")
    db.add(prompt)
    db.flush()
    db.add_all([Completion(prompt_id=prompt.id, text="a"), Completion(prompt_id=prompt.id, text="b")])
    token = token_for(db, annotator)
    db.commit()
    retrying = create_app(app.state.settings)  # the app as served: create_app registers the retry middleware
    assert any(m.cls is RetryTransientErrors for m in retrying.user_middleware)
    client = TestClient(retrying, headers={"Authorization": f"Bearer {token}"})
    task = client.get(f"/api/projects/{project.id}/tasks/next").json()
    body = {"assignment_id": task["assignment_id"], "tiers": [[c["id"]] for c in task["completions"]],
            "rubric_version": task["rubric"]["version"], "submission_id": "deadlocked"}

    caplog.set_level(logging.INFO, logger="preflab.db")
    other = clean_engine.connect()
    other.begin()
    # This transaction waits long before it checks for deadlocks, so Postgres picks the request as the victim.
    other.execute(text("SET LOCAL deadlock_timeout = '20s'"))
    other.execute(text("SELECT id FROM prompts WHERE id = :p FOR UPDATE"), {"p": prompt.id})
    answer: dict[str, Any] = {}
    submit = threading.Thread(target=lambda: answer.update(
        r=client.post(f"/api/projects/{project.id}/rankings", json=body)))
    submit.start()
    try:
        # The request locks its assignment, then waits for the prompt row (the ranking's foreign key) …
        wait_for("the request to wait for the prompt lock", lambda: other.execute(text(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
        )).scalar(), every=0.05, timeout=30)
        # … and now this transaction wants the assignment: a deadlock, which aborts the request's transaction.
        other.execute(text("SELECT id FROM assignments WHERE id = :a FOR UPDATE"), {"a": task["assignment_id"]})
        other.commit()
    finally:
        other.close()
        submit.join(timeout=60)
        retrying.state.engine.dispose()
    assert answer["r"].status_code == 201, answer["r"].text
    assert any("deadlock" in m and "running it again" in m for m in caplog.messages), caplog.messages
    assert db.scalar(select(func.count(Ranking.id)).where(Ranking.project_id == project.id)) == 1
    assert db.scalar(select(func.count(Pair.id)).where(Pair.prompt_id == prompt.id)) == 1
    db.rollback()
