"""Twenty people writing at once through a real uvicorn server: no request fails and no write is lost.

On SQLite every transaction takes the single write lock up front (`BEGIN IMMEDIATE`) and waits for it (busy
timeout, then retries); "database is locked" must never reach a user. Postgres runs the same mix as a control.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from sqlalchemy import func, select

from app.models import Assignment, Completion, Pair, Prompt, Ranking, Rubric
from app.projects import projects

pytestmark = pytest.mark.crash

ANNOTATORS = 14
ROUNDS = 3  # rankings per annotator
IMPORTERS = 3
IMPORTS_EACH = 2
PROMPTS_PER_IMPORT = 10
EDITORS = 3
EDITS_EACH = 3
K = 3


def _seed(db, make_user, make_project, token_for):  # type: ignore[no-untyped-def]
    """A ranking project with one prompt per ranking to be made, an import project, one rubric project per editor."""
    lead = make_user(db, "lead")
    ranked = make_project(db, lead=lead, k=K, overlap=1)
    annotator_tokens = []
    for _ in range(ANNOTATORS):
        person = make_user(db, "annotator")
        projects.add_member(db, ranked, lead, email=person.email, role="annotator")
        annotator_tokens.append(token_for(db, person))
    for i in range(ANNOTATORS * ROUNDS):
        prompt = Prompt(project_id=ranked.id, text=f"question {i}", text_hash=f"w{i}-{ranked.id}", split="train")
        db.add(prompt)
        db.flush()
        db.add_all(Completion(prompt_id=prompt.id, text=f"answer {i}.{j}") for j in range(K))
    imported = make_project(db, lead=lead, k=K)
    importer_tokens = []
    for _ in range(IMPORTERS):
        engineer = make_user(db, "engineer")
        projects.add_member(db, imported, lead, email=engineer.email, role="engineer")
        importer_tokens.append(token_for(db, engineer))
    editor_projects, editor_tokens = [], []
    for _ in range(EDITORS):
        editor = make_user(db, "lead")
        editor_projects.append(make_project(db, lead=editor, k=K).id)
        editor_tokens.append(token_for(db, editor))
    db.commit()
    return ranked.id, imported.id, editor_projects, annotator_tokens, importer_tokens, editor_tokens


def _annotate(url: str, token: str, project_id: int) -> list[httpx.Response]:
    responses = []
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=120) as client:
        for _ in range(ROUNDS):
            task = client.get(f"/api/projects/{project_id}/tasks/next")
            responses.append(task)
            if task.status_code != 200:
                break
            body = task.json()
            ids = sorted(c["id"] for c in body["completions"])
            responses.append(client.post(f"/api/projects/{project_id}/rankings", json={
                "assignment_id": body["assignment_id"], "tiers": [[i] for i in ids],
                "rubric_version": body["rubric"]["version"], "submission_id": f"s-{body['assignment_id']}"}))
    return responses


def _import(url: str, token: str, project_id: int, who: int) -> list[httpx.Response]:
    responses = []
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=120) as client:
        for n in range(IMPORTS_EACH):
            lines = [json.dumps({"prompt": f"imported {who}.{n}.{i}", "completions": [f"c{j}" for j in range(K)]})
                     for i in range(PROMPTS_PER_IMPORT)]
            data = ("\n".join(lines) + "\n").encode()
            responses.append(client.post(f"/api/projects/{project_id}/imports",
                                         files={"file": ("p.jsonl", data, "application/x-ndjson")}))
    return responses


def _edit(url: str, token: str, project_id: int) -> list[httpx.Response]:
    responses = []
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=120) as client:
        for version in range(1, EDITS_EACH + 1):
            responses.append(client.post(f"/api/projects/{project_id}/rubrics", json={
                "text": f"Rubric edit {version}: rank correct answers first.", "criteria": ["Correctness"],
                "base_version": version, "note": f"edit {version}"}))
    return responses


def test_twenty_concurrent_writers_all_succeed_and_every_row_lands(db, make_user, make_project, token_for,
                                                                  server_url, caplog) -> None:
    ranked, imported, edited, annotators, importers, editors = _seed(db, make_user, make_project, token_for)
    calls: list[Callable[[], list[httpx.Response]]] = (
        [lambda t=t: _annotate(server_url, t, ranked) for t in annotators]
        + [lambda t=t, i=i: _import(server_url, t, imported, i) for i, t in enumerate(importers)]
        + [lambda t=t, p=p: _edit(server_url, t, p) for t, p in zip(editors, edited, strict=True)])
    assert len(calls) == 20
    barrier = threading.Barrier(len(calls))

    def run(call: Callable[[], list[httpx.Response]]) -> list[httpx.Response]:
        barrier.wait(timeout=30)
        return call()

    caplog.set_level(logging.WARNING)
    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        responses = [r for batch in pool.map(run, calls) for r in batch]

    failures = [(r.request.method, r.request.url.path, r.status_code, r.text[:300]) for r in responses
                if r.status_code >= 300]
    assert not failures, failures
    assert not [r for r in responses if "locked" in r.text.lower()]
    logged = [rec.getMessage() + (rec.exc_text or "") for rec in caplog.records if rec.levelno >= logging.ERROR]
    assert not logged, logged
    assert not [m for m in caplog.messages if "database is locked" in m]
    assert Counter(r.status_code for r in responses) == {
        200: ANNOTATORS * ROUNDS, 201: ANNOTATORS * ROUNDS + IMPORTERS * IMPORTS_EACH + EDITORS * EDITS_EACH}

    db.expire_all()
    made = ANNOTATORS * ROUNDS
    assert db.scalar(select(func.count(Ranking.id)).where(Ranking.project_id == ranked)) == made
    assert db.scalar(select(func.count(Pair.id)).join(Ranking).where(Ranking.project_id == ranked)) == made * 3
    assert db.scalar(select(func.count(Assignment.id)).where(Assignment.project_id == ranked,
                                                             Assignment.state == "submitted")) == made
    # Every prompt ranked once (overlap 1): no lease was handed out twice under the load.
    assert db.scalar(select(func.count(func.distinct(Ranking.prompt_id))).where(Ranking.project_id == ranked)) == made
    n_imported = IMPORTERS * IMPORTS_EACH * PROMPTS_PER_IMPORT
    assert db.scalar(select(func.count(Prompt.id)).where(Prompt.project_id == imported)) == n_imported
    assert db.scalar(select(func.count(Completion.id)).join(Prompt)
                     .where(Prompt.project_id == imported)) == n_imported * K
    for project_id in edited:
        versions = db.scalars(select(Rubric.version).where(Rubric.project_id == project_id)).all()
        assert sorted(versions) == list(range(1, EDITS_EACH + 2))
    db.rollback()


def _sqlite_only(database_url: str) -> None:
    if not database_url.startswith("sqlite"):
        pytest.skip(reason="SQLite's single write lock")


def test_a_writer_waits_past_sqlites_own_busy_timeout(database_url, clean_engine, monkeypatch) -> None:
    from app.platform import db as dbmod

    _sqlite_only(database_url)
    monkeypatch.setattr(dbmod, "SQLITE_BUSY_TIMEOUT_MS", 100)  # SQLite gives up quickly; the begin hook does not
    engine = dbmod.make_engine(database_url)
    holder = engine.connect()
    holder.begin()  # BEGIN IMMEDIATE: the write lock
    threading.Timer(0.6, holder.commit).start()
    try:
        with dbmod.session_scope(dbmod.make_session_factory(engine)) as session:
            assert session.scalar(select(func.count(Prompt.id))) == 0
    finally:
        holder.close()
        engine.dispose()


def test_a_lock_held_too_long_is_a_clear_503_not_a_500(database_url, app, db, make_user, token_for,
                                                       monkeypatch) -> None:
    import sqlite3

    from fastapi.testclient import TestClient
    from sqlalchemy.engine import make_url

    from app.main import create_app
    from app.platform import db as dbmod

    _sqlite_only(database_url)
    user = make_user(db, "lead")
    token = token_for(db, user)
    db.commit()
    monkeypatch.setattr(dbmod, "SQLITE_BUSY_TIMEOUT_MS", 100)
    monkeypatch.setattr(dbmod, "SQLITE_LOCK_WAIT_S", 0.5)
    fresh = create_app(app.state.settings)  # type: ignore[attr-defined]  # its connections get the short busy wait
    other = sqlite3.connect(make_url(database_url).database, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # a writer that does not let go (a CLI import, a stuck process)
    try:
        with TestClient(fresh, headers={"Authorization": f"Bearer {token}"}) as client:
            r = client.post("/api/projects", json={"name": "p", "completions_per_prompt": 2,
                                                   "rubric": {"text": "r"}})
        assert r.status_code == 503, r.text
        message = r.json()["detail"][0]["message"]
        assert "one transaction write at a time" in message and "Postgres" in message
    finally:
        other.execute("ROLLBACK")
        other.close()
        fresh.state.engine.dispose()  # type: ignore[attr-defined]
