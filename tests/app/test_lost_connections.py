"""A pooled Postgres connection that died (Postgres restarted, its backend terminated) costs the annotator nothing.

The pool pings only connections idle for `app.platform.db.PING_AFTER_IDLE_S`. A connection in steady use is handed out
unchecked: when it turns out dead, its statement fails, the pool is invalidated and the request runs again on a
new connection (`is_transient`). Either way the client gets its answer, never a 500.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from app.platform import db as app_db
from app.platform.db import is_transient
from tests.app.test_annotation_api import _seed


def _need_postgres(database_url: str) -> None:
    if not database_url.startswith("postgresql"):
        pytest.skip(reason="Postgres only: SQLite has no server connection to lose")


def _only_pooled_backend(app: Any) -> int:
    """The server pid of the app's one pooled connection (the pool is emptied first, then one request fills it)."""
    with app.state.engine.connect() as conn:
        return int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())


def _terminate(engine: Any, pid: int) -> None:
    with engine.connect() as conn:
        assert conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid}).scalar_one()
        conn.commit()


def _annotator(db: Any, make_project: Any, make_user: Any, token_for: Any) -> tuple[int, str]:
    """A project with one prompt of two completions, and an annotator's token."""
    _, project, (annotator,) = _seed(db, make_user, make_project, n_prompts=1, k=2)
    token = token_for(db, annotator)
    db.commit()
    return project.id, token


@pytest.mark.parametrize("idle", [False, True], ids=["in-steady-use", "idle"])
def test_a_task_is_served_when_the_pooled_database_connection_died(
        app: Any, api: Any, db: Any, engine: Any, make_project: Any, make_user: Any, token_for: Any,
        database_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, idle: bool) -> None:
    _need_postgres(database_url)
    project_id, token = _annotator(db, make_project, make_user, token_for)
    client = api(token)
    app.state.engine.dispose()  # one connection in the pool from here on
    first = client.get(f"/api/projects/{project_id}/tasks/next")
    assert first.status_code == 200, first.text
    _terminate(engine, _only_pooled_backend(app))
    # Idle: every checkout counts as idle, so the pool pings and replaces the dead connection before the request.
    monkeypatch.setattr(app_db, "PING_AFTER_IDLE_S", 0.0 if idle else 3600.0)

    with caplog.at_level(logging.INFO, logger="preflab.db"):
        again = client.get(f"/api/projects/{project_id}/tasks/next")

    assert again.status_code == 200, again.text
    assert again.json()["assignment_id"] == first.json()["assignment_id"], "the same task, still leased to them"
    reruns = [r.getMessage() for r in caplog.records if "running it again" in r.getMessage()]
    if idle:
        assert reruns == [], "the ping replaced the connection before any statement"
    else:
        assert len(reruns) == 1 and "database connection lost" in reruns[0], reruns


def _lost(statement: str | None) -> OperationalError:
    return OperationalError(statement, {}, Exception("server closed the connection unexpectedly"),
                            connection_invalidated=True)


def test_a_connection_lost_during_a_statement_is_retried_but_not_one_lost_during_commit() -> None:
    # During a statement the server rolled the open transaction back; during COMMIT it may have committed.
    assert is_transient(_lost("SELECT 1"))
    assert not is_transient(_lost(None))
    assert not is_transient(OperationalError("SELECT 1", {}, Exception("could not connect")))
