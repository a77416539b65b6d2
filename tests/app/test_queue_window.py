"""The queue's window (Postgres): the open prompts a process keeps in view past the floor. It only says where to
look first: a task is the same with it as without it, a prompt filled since the window was read is not leased past
its cap, and an annotator who has done every prompt in it still gets the next one beyond it."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from app.annotation import queue
from app.models import Assignment, Prompt
from tests.app.test_selection import _rank, _seed


@pytest.fixture
def window_of_two(monkeypatch):  # type: ignore[no-untyped-def]
    """A window of two prompts that is never re-read during the test (the floor's clocks made long)."""
    monkeypatch.setattr(queue, "_WINDOW_SCAN", queue._floor_scan(Prompt.id, 2))
    monkeypatch.setattr(queue, "FLOOR_STEP_S", 3600.0)
    monkeypatch.setattr(queue, "FLOOR_FULL_S", 7200.0)
    with queue._floors_lock:
        queue._floors.clear()
    yield
    with queue._floors_lock:
        queue._floors.clear()


def _ids(prompt: Prompt) -> list[int]:
    return sorted(c.id for c in prompt.completions)


def _window_is(db, *prompts: Prompt) -> bool:  # type: ignore[no-untyped-def]
    """Whether the by-id scan's window holds these prompts (on SQLite, which has no arrays to bind, it is empty)."""
    with queue._floors_lock:
        windows = [entry[3] for key, entry in queue._floors.items() if not key[3]]
    postgres = db.get_bind().dialect.name == "postgresql"
    return windows == [tuple(p.id for p in prompts) if postgres else ()]


def test_tasks_come_in_prompt_order_through_the_window_and_past_it(db, make_user, make_project,
                                                                   window_of_two) -> None:
    _, (a, _), project, prompts = _seed(db, make_user, make_project, n=5, k=2, overlap=1)
    served = []
    for _ in prompts:
        task = queue.next_task(db, project, a)
        served.append(task.prompt_id)
        _rank(db, project, a, task, _ids(db.get(Prompt, task.prompt_id)))
    assert served == [p.id for p in prompts]  # the window held the first two, both filled: the rest from the floor
    assert queue.next_task(db, project, a) is None
    assert _window_is(db, prompts[0], prompts[1])


def test_a_prompt_leased_since_the_window_was_read_is_not_leased_past_its_cap(db, make_user, make_project,
                                                                              window_of_two) -> None:
    _, (a, b, c), project, prompts = _seed(db, make_user, make_project, n=4, k=2, overlap=1, annotators=3)
    first = queue.next_task(db, project, a)  # reads the window: prompts 0 and 1 had room
    assert first.prompt_id == prompts[0].id
    assert queue.next_task(db, project, b).prompt_id == prompts[1].id
    assert queue.next_task(db, project, c).prompt_id == prompts[2].id  # both window prompts are taken now
    load = dict(db.execute(select(Assignment.prompt_id, func.count()).group_by(Assignment.prompt_id)).all())
    assert load == {prompts[0].id: 1, prompts[1].id: 1, prompts[2].id: 1}
    assert _window_is(db, prompts[0], prompts[1])


def test_an_annotator_who_did_every_prompt_in_the_window_gets_the_next_beyond_it(db, make_user, make_project,
                                                                                window_of_two) -> None:
    _, (a, b), project, prompts = _seed(db, make_user, make_project, n=4, k=2, overlap=2)
    for i in (0, 1):
        task = queue.next_task(db, project, a)
        assert task.prompt_id == prompts[i].id
        _rank(db, project, a, task, _ids(prompts[i]))
    assert _window_is(db, prompts[0], prompts[1])  # both still have room for one more
    assert queue.next_task(db, project, a).prompt_id == prompts[2].id  # a has done both: past the window
    assert queue.next_task(db, project, b).prompt_id == prompts[0].id  # b has not: the window's first
