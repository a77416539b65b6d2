"""The app and the worker through PgBouncer in transaction mode (Debian's package, started here), on Postgres.

Transaction pooling hands a client connection's next transaction to any server connection, so nothing may rely
on session state: psycopg's prepared statements are turned off (PREFLAB_DATABASE_PREPARED_STATEMENTS=false), and
everything else the app keeps per connection is transaction-scoped (SET LOCAL, SET TRANSACTION SNAPSHOT, row
locks of FOR UPDATE SKIP LOCKED, server-side cursors read inside their transaction). Locally these tests skip
when pgbouncer is not installed; with CI=true they fail.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.exc import DBAPIError

from app.jobs import queue as jobs
from app.models import Completion, Job, Pair, Prompt, Ranking
from app.projects import projects
from tests.conftest import IN_CI, TEST_SECRET
from tests.support.pgbouncer import pgbouncer, pgbouncer_binary, pgbouncer_version, transactions_served


def _need_pgbouncer(database_url: str) -> None:
    if not database_url.startswith("postgresql"):
        pytest.skip(reason="PgBouncer pools Postgres connections: Postgres only (SQLite has no server to pool)")
    if pgbouncer_binary() is None:
        if IN_CI:
            pytest.fail("pgbouncer is required in CI (apt-get install pgbouncer)", pytrace=False)
        pytest.skip(reason="pgbouncer not installed (apt-get install pgbouncer)")


@pytest.fixture(scope="module")
def bouncer_url(database_url: str) -> Iterator[str]:
    """The test database through PgBouncer (transaction pooling, 4 server connections)."""
    _need_pgbouncer(database_url)
    with pgbouncer(database_url, pool_size=4) as bouncer:
        yield bouncer.url


def test_the_setting_reaches_the_driver(database_url: str) -> None:
    from app.platform.db import make_engine

    for prepared, threshold in ((True, 5), (False, None)):
        engine = make_engine(database_url, pool_size=1, prepared_statements=prepared)
        try:
            with engine.connect() as conn:
                assert conn.execute(text("SELECT 1")).scalar_one() == 1
                if engine.dialect.name == "postgresql":  # SQLite has no server-side statements: it ignores it
                    assert conn.connection.driver_connection.prepare_threshold == threshold
        finally:
            engine.dispose()


def _run_alternately(engine: Any, times: int) -> None:
    """One statement run `times` times on each of two client connections, taking turns, each in its own
    transaction: with one server connection behind the pooler, both clients' statements land on it."""
    from sqlalchemy import Engine

    assert isinstance(engine, Engine)
    with engine.connect() as first, engine.connect() as second:
        for i in range(times):
            for conn in (first, second):
                assert conn.execute(text("SELECT CAST(:i AS integer) + 1"), {"i": i}).scalar_one() == i + 1
                conn.commit()


def test_prepared_statements_break_under_transaction_pooling_unless_turned_off(database_url: str) -> None:
    from app.platform.db import make_engine

    _need_pgbouncer(database_url)
    with pgbouncer(database_url, pool_size=1) as bouncer:
        url = bouncer.url
        # psycopg prepares a statement its connection ran 5 times, under the same name (_pg3_0) on each client
        # connection: the second client's PREPARE meets the first one's on the shared server connection.
        if pgbouncer_version() < (1, 21):  # 1.21+ can track prepared statements (max_prepared_statements)
            preparing = make_engine(url, pool_size=2)
            try:
                with pytest.raises(DBAPIError, match="prepared statement"):
                    _run_alternately(preparing, 8)
            finally:
                preparing.dispose()
        unprepared = make_engine(url, pool_size=2, prepared_statements=False)
        try:
            _run_alternately(unprepared, 8)
        finally:
            unprepared.dispose()


def _seed(db: Any, make_user: Any, make_project: Any, n_prompts: int) -> tuple[Any, Any, Any, Any]:
    lead = make_user(db, "lead")
    project = make_project(db, lead=lead, k=4, overlap=1)
    annotator, engineer = make_user(db, "annotator"), make_user(db, "engineer")
    projects.add_member(db, project, lead, email=annotator.email, role="annotator")
    projects.add_member(db, project, lead, email=engineer.email, role="engineer")
    for i in range(n_prompts):
        prompt = Prompt(project_id=project.id, text=f"question {i}", text_hash=f"h{i}-{project.id}", split="train")
        db.add(prompt)
        db.flush()
        db.add_all(Completion(prompt_id=prompt.id, text=f"answer {i}.{j}") for j in range(4))
    db.flush()
    return lead, project, annotator, engineer


def _annotate(client: Any, project_id: int, n: int) -> None:
    """next → submit `n` times (past psycopg's prepare threshold of 5), the first submission sent twice."""
    for i in range(n):
        task = client.get(f"/api/projects/{project_id}/tasks/next")
        assert task.status_code == 200, task.text
        task = task.json()
        body = {"assignment_id": task["assignment_id"], "tiers": [[c["id"]] for c in task["completions"]],
                "rubric_version": task["rubric"]["version"], "submission_id": f"bouncer-{i}"}
        first = client.post(f"/api/projects/{project_id}/rankings", json=body)
        assert first.status_code == 201 and first.json()["pairs_created"] == 6, first.text
        if i == 0:  # an idempotent resend: the same ranking, nothing new written
            again = client.post(f"/api/projects/{project_id}/rankings", json=body)
            assert again.status_code == 200 and again.json()["ranking_id"] == first.json()["ranking_id"]
    assert client.get(f"/api/projects/{project_id}/tasks/next").status_code == 204


def test_annotation_export_and_worker_jobs_through_pgbouncer(db, make_user, make_project, token_for,  # type: ignore[no-untyped-def]
                                                             bouncer_url, tmp_path) -> None:
    from fastapi.testclient import TestClient

    from app.main import create_app
    from app.platform.settings import Settings
    from app.worker import Worker

    n = 8
    lead, project, annotator, engineer = _seed(db, make_user, make_project, n)
    tokens = token_for(db, annotator), token_for(db, engineer)
    db.commit()
    settings = Settings(env="dev", database_url=bouncer_url, database_prepared_statements=False,
                        secret_key=TEST_SECRET, data_dir=tmp_path)
    before = transactions_served(bouncer_url)
    app = create_app(settings)
    worker = Worker(settings, heartbeat_s=0.05)
    try:
        annotate, export = (TestClient(app, base_url="http://testserver",  # type: ignore[arg-type]
                                       headers={"Authorization": f"Bearer {t}"}) for t in tokens)
        _annotate(annotate, project.id, n)
        accepted = export.post(f"/api/projects/{project.id}/exports", json={"format": "jsonl"})
        assert accepted.status_code == 202, accepted.text
        # A rebuild of the agreement figures reads every ranking inside one transaction.
        jobs.enqueue(db, "project_rollup", {"agreement": "rebuild", "requested_at": datetime.now(UTC).isoformat()},
                     project=project, actor=lead, max_attempts=1)
        db.commit()
        assert worker.run(exit_when_idle=True) == 2
        out = export.get(f"/api/exports/{accepted.json()['export_id']}").json()
        assert out["status"] == "ready" and out["row_count"] == 6 * n, out
        pairs = export.get(f"/api/exports/{out['id']}/files/pairs.jsonl")
        assert pairs.status_code == 200 and len(pairs.text.splitlines()) == 6 * n
    finally:
        app.state.engine.dispose()  # type: ignore[attr-defined]
        worker.session_factory.kw["bind"].dispose()
    db.expire_all()
    assert db.scalar(select(func.count(Ranking.id))) == n and db.scalar(select(func.count(Pair.id))) == 6 * n
    states = dict(db.execute(select(Job.kind, Job.state)).all())
    assert states == {"export": "succeeded", "project_rollup": "succeeded"}, states
    assert transactions_served(bouncer_url) - before > 4 * n  # every request and job step went through PgBouncer
