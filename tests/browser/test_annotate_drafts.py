"""Drafts follow the annotator: part of a task ranked in one browser is there when the same person opens the task in
another (a second context: its own storage, like another device), the newer draft wins, and one made offline
reaches the server once the browser is back online."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import func, select

from app.models import AssignmentDraft, Ranking
from tests.browser.test_annotate_page import _login, _seed, new_page  # noqa: F401 - fixtures

pytestmark = pytest.mark.slow
FLAG = "factually wrong"


def _short(live_server):  # type: ignore[no-untyped-def]
    return _seed(live_server, n_prompts=1, flags=[FLAG], answer=lambda i, j: f"Answer {i}.{j}: {i + j}")


def _ids(pg, board: str) -> list[int]:  # type: ignore[no-untyped-def]
    return [int(c) for c in pg.locator(f"#{board} > .resp").evaluate_all("els => els.map(e => e.dataset.cid)")]


def _server_draft(live_server, tiers: list[list[int]], timeout: float = 20.0) -> dict:  # type: ignore[no-untyped-def]
    """The server's draft once it holds `tiers` (the page saves after a pause, so wait for it, with a deadline)."""
    deadline = time.monotonic() + timeout
    while True:
        with live_server.session() as db:
            draft = db.scalar(select(AssignmentDraft))
            seen = None if draft is None else {"tiers": draft.tiers, "flags": draft.flags}
        if seen is not None and seen["tiers"] == tiers:
            return seen
        if time.monotonic() > deadline:
            raise AssertionError(f"the server's draft is {seen}, not {tiers}")
        time.sleep(0.1)


def _open(pg, live_server, project_id: int, email: str) -> None:  # type: ignore[no-untyped-def]
    _login(pg, live_server.base, email)
    pg.goto(f"{live_server.base}/projects/{project_id}/annotate")
    _ready(pg)


def _ready(pg) -> None:  # type: ignore[no-untyped-def]
    pg.wait_for_function("() => document.querySelector('#rank-status').textContent !== ''")  # annotate.js ran


def test_a_task_ranked_in_part_on_one_device_resumes_on_another(live_server, new_page) -> None:  # noqa: F811
    project_id, email = _short(live_server)
    laptop, phone = new_page(), new_page(390, 844, has_touch=True, is_mobile=True)
    _open(laptop, live_server, project_id, email)
    shown = _ids(laptop, "unranked")
    laptop.keyboard.press("1")  # the focused (first) card goes first, the focus moves on
    laptop.keyboard.press("2")
    first = laptop.locator(f'#ranked .resp[data-cid="{shown[0]}"]')
    first.locator("details.flags summary").click()
    first.get_by_label(FLAG).check()
    saved = _server_draft(live_server, [[shown[0]], [shown[1]]])
    assert saved["flags"] == {str(shown[0]): [FLAG]}

    # The phone has never seen this task: nothing in its storage, the draft comes from the server.
    _open(phone, live_server, project_id, email)
    assert _ids(phone, "ranked") == shown[:2]
    assert _ids(phone, "unranked") == shown[2:]
    assert phone.locator(f'#ranked .resp[data-cid="{shown[0]}"]').get_by_label(FLAG).is_checked()
    assert phone.locator("#rank-status").inner_text().startswith("2 of 4 ranked")
    # It carries on from there: the focus is on the first card still to rank.
    phone.keyboard.press("3")
    phone.keyboard.press("4")
    phone.keyboard.press("Control+Enter")
    phone.wait_for_selector("#queue-empty")
    with live_server.session() as db:
        ranking = db.scalar(select(Ranking))
        assert ranking.tiers == [[c] for c in shown] and ranking.flags == {str(shown[0]): [FLAG]}
        assert db.scalar(select(func.count()).select_from(AssignmentDraft)) == 0  # the submit cleared it


def test_the_newer_draft_wins_and_an_offline_one_is_sent_once_online(live_server, new_page) -> None:  # noqa: F811
    project_id, email = _short(live_server)
    laptop, phone = new_page(), new_page()
    laptop.allowed_console = ["ERR_INTERNET_DISCONNECTED"]  # the draft's PUT while offline
    _open(laptop, live_server, project_id, email)
    a, b, c, _ = _ids(laptop, "unranked")
    laptop.keyboard.press("1")
    _server_draft(live_server, [[a]])

    _open(phone, live_server, project_id, email)
    assert _ids(phone, "ranked") == [a]
    phone.keyboard.press("1")  # the phone's focused card, b, goes above a
    _server_draft(live_server, [[b], [a]])

    # The laptop's own copy is older than the phone's edit: on reload the server's draft is shown.
    laptop.reload()
    _ready(laptop)
    assert _ids(laptop, "ranked") == [b, a]

    laptop.context.set_offline(True)
    laptop.keyboard.press("3")  # c, ranked third while offline: kept in the browser
    assert _ids(laptop, "ranked") == [b, a, c]
    laptop.wait_for_function("id => JSON.parse(localStorage.getItem('preflab:draft:' + id)).tiers.length === 3",
                             arg=laptop.locator("#ranking-form").get_attribute("data-assignment"))
    laptop.context.set_offline(False)
    _server_draft(live_server, [[b], [a], [c]])
