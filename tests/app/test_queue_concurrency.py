"""The queue under real concurrency: many annotators ask at once, through a real uvicorn server, on both databases.

Only Postgres exercises `FOR UPDATE SKIP LOCKED`; SQLite serialises writers with `BEGIN IMMEDIATE`. Either way the
database, not the Python process, must keep every prompt at or under its overlap.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from sqlalchemy import and_, func, or_, select

from app.models import Assignment, Completion, Pair, Prompt, Ranking, utcnow
from app.projects import projects

pytestmark = pytest.mark.crash

N_CLIENTS = 50
N_PROMPTS = 10


def _seed(db, make_user, make_project, token_for, *, overlap: int, annotators: int):  # type: ignore[no-untyped-def]
    lead = make_user(db, "lead")
    project = make_project(db, lead=lead, k=4, overlap=overlap)
    tokens = []
    for _ in range(annotators):
        person = make_user(db, "annotator")
        projects.add_member(db, project, lead, email=person.email, role="annotator")
        tokens.append(token_for(db, person))
    for i in range(N_PROMPTS):
        prompt = Prompt(project_id=project.id, text=f"question {i}", text_hash=f"c{i}-{project.id}", split="train")
        db.add(prompt)
        db.flush()
        db.add_all(Completion(prompt_id=prompt.id, text=f"answer {i}.{j}") for j in range(4))
    db.commit()
    return project, tokens


def _all_at_once(n: int, call: Callable[[int], httpx.Response]) -> list[httpx.Response]:
    """Run `call(i)` for i in 0..n-1 on n threads released together by a barrier."""
    barrier = threading.Barrier(n)

    def run(i: int) -> httpx.Response:
        barrier.wait(timeout=30)
        return call(i)

    with ThreadPoolExecutor(max_workers=n) as pool:
        return list(pool.map(run, range(n)))


def _active_per_prompt(db, project_id: int) -> Counter[int]:  # type: ignore[no-untyped-def]
    now = utcnow()
    rows = db.execute(select(Assignment.prompt_id, func.count(Assignment.id))
                      .where(Assignment.project_id == project_id,
                             or_(Assignment.state == "submitted",
                                 and_(Assignment.state == "leased", Assignment.leased_until > now)))
                      .group_by(Assignment.prompt_id)).all()
    return Counter({prompt_id: n for prompt_id, n in rows})


@pytest.mark.parametrize("overlap", [1, 3])
def test_concurrent_next_task_never_exceeds_the_overlap(db, make_user, make_project, token_for, server_url,
                                                        overlap: int) -> None:
    project, tokens = _seed(db, make_user, make_project, token_for, overlap=overlap, annotators=N_CLIENTS)

    def ask(i: int) -> httpx.Response:
        with httpx.Client(base_url=server_url, headers={"Authorization": f"Bearer {tokens[i]}"},
                          timeout=60) as client:
            return client.get(f"/api/projects/{project.id}/tasks/next")

    responses = _all_at_once(N_CLIENTS, ask)
    statuses = Counter(r.status_code for r in responses)
    capacity = N_PROMPTS * overlap
    assert statuses == {200: capacity, 204: N_CLIENTS - capacity}, statuses
    handed_out = Counter(r.json()["prompt"]["id"] for r in responses if r.status_code == 200)
    assert set(handed_out.values()) == {overlap}, handed_out
    db.expire_all()
    active = _active_per_prompt(db, project.id)
    assert len(active) == N_PROMPTS and max(active.values()) == overlap, active
    assert active == handed_out


def test_the_same_submission_ten_times_at_once_makes_one_ranking(db, make_user, make_project, token_for,
                                                                  server_url) -> None:
    project, (token,) = _seed(db, make_user, make_project, token_for, overlap=1, annotators=1)
    headers = {"Authorization": f"Bearer {token}"}
    task = httpx.get(f"{server_url}/api/projects/{project.id}/tasks/next", headers=headers, timeout=30).json()
    body = {"assignment_id": task["assignment_id"], "tiers": [[c["id"]] for c in task["completions"]],
            "rubric_version": task["rubric"]["version"], "submission_id": "double-click"}

    def submit(_: int) -> httpx.Response:
        with httpx.Client(base_url=server_url, headers=headers, timeout=60) as client:
            return client.post(f"/api/projects/{project.id}/rankings", json=body)

    responses = _all_at_once(10, submit)
    statuses = Counter(r.status_code for r in responses)
    assert statuses == {201: 1, 200: 9}, [(r.status_code, r.text) for r in responses]
    assert {r.json()["ranking_id"] for r in responses} and len({r.json()["ranking_id"] for r in responses}) == 1
    assert {r.json()["pairs_created"] for r in responses} == {6}
    db.expire_all()
    assert db.scalar(select(func.count(Ranking.id))) == 1
    assert db.scalar(select(func.count(Pair.id))) == 6
    assert db.scalar(select(Assignment.state).where(Assignment.id == task["assignment_id"])) == "submitted"


def test_a_prompt_filled_while_its_lock_was_awaited_is_recounted_and_not_leased_past_its_overlap(
        db, make_user, make_project, token_for) -> None:
    """The candidate scan reads the load in its own snapshot; a lease committed while it waited for the prompt's row
    lock is seen only by the re-count under the lock (on Postgres, in the lease's insert). One prompt, overlap 1:
    B leases it and holds it uncommitted, A's request waits on the lock (the "wait" pass), B commits, A gets nothing."""
    from tests.conftest import only_on

    only_on(db, "postgresql", "SQLite serialises writers: no request ever waits on a row lock")
    from app.annotation import queue
    from app.models import User
    from app.platform.db import make_session_factory

    lead = make_user(db, "lead")
    project = make_project(db, lead=lead, k=4, overlap=1)
    people = [make_user(db, "annotator") for _ in range(2)]
    for person in people:
        projects.add_member(db, project, lead, email=person.email, role="annotator")
    prompt = Prompt(project_id=project.id, text="the only question", text_hash=f"only-{project.id}", split="train")
    db.add(prompt)
    db.flush()
    db.add_all(Completion(prompt_id=prompt.id, text=f"answer {j}") for j in range(4))
    db.commit()
    factory = make_session_factory(db.get_bind())
    holder, waiter = factory(), factory()
    try:
        held = queue.next_task(holder, holder.get(type(project), project.id), holder.get(User, people[0].id))
        assert held is not None and held.prompt_id == prompt.id  # B's lease, uncommitted, the prompt row locked
        waiter_pid = waiter.connection().exec_driver_sql("SELECT pg_backend_pid()").scalar()
        got: dict[str, object] = {}
        a = threading.Thread(target=lambda: got.setdefault("task", queue.next_task(
            waiter, waiter.get(type(project), project.id), waiter.get(User, people[1].id))))
        a.start()
        deadline = time.monotonic() + 30
        while not _waits_on_a_lock(db, waiter_pid):
            assert time.monotonic() < deadline, "A never waited on the prompt's row lock"
            time.sleep(0.01)
        holder.commit()
        a.join(timeout=30)
        assert not a.is_alive() and got["task"] is None
        waiter.commit()
    finally:
        holder.close()
        waiter.close()
    assert _active_per_prompt(db, project.id) == Counter({prompt.id: 1})


def _waits_on_a_lock(db, pid: int) -> bool:  # type: ignore[no-untyped-def]
    from sqlalchemy import text

    found = db.execute(text("SELECT wait_event_type FROM pg_stat_activity WHERE pid = :pid"), {"pid": pid}).scalar()
    db.rollback()
    return found == "Lock"
