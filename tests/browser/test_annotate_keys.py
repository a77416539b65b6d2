"""Keys per task on the ranking page, the Tab order, the key map, CSP across an HTMX swap, and the no-JS fallback."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from app.models import Ranking
from tests.browser.conftest import settle
from tests.browser.test_annotate_page import _focused_card, _login, _seed, new_page, page  # noqa: F401 - fixtures

pytestmark = pytest.mark.slow
K = 4


def _short(live_server, n_prompts: int = 2):  # type: ignore[no-untyped-def]
    return _seed(live_server, n_prompts=n_prompts, flags=["factually wrong"],
                 answer=lambda i, j: f"Answer {i}.{j}: {i + j}")


def _task_ready(pg) -> None:  # type: ignore[no-untyped-def]
    """Wait until annotate.js has set up the task on screen: it does so on htmx:afterSettle, a moment after the swap
    that shows the flash, and focusing the first card is its last step. Keys pressed before then reach no task."""
    pg.wait_for_function("() => { const a = document.activeElement;"
                         " return !!a && a.matches('#unranked > .resp') && !!a.closest('#ranking-form[data-ready]'); }")


def _shown(pg) -> list[int]:  # type: ignore[no-untyped-def]
    return [int(c) for c in pg.locator("#unranked > .resp").evaluate_all("els => els.map(e => e.dataset.cid)")]


def test_a_full_ranking_takes_k_number_keys_and_ctrl_enter(live_server, page) -> None:  # noqa: F811
    project_id, email = _short(live_server)
    _login(page, live_server.base, email)
    page.goto(f"{live_server.base}/projects/{project_id}/annotate")
    assert page.get_by_role("heading", level=1).count() == 1  # axe: page-has-heading-one

    rankings = []
    for task in range(2):  # the second task arrives by HTMX swap and starts the same way
        _task_ready(page)
        shown = _shown(page)
        keys = ["4", "1", "2", "3", "Control+Enter"]  # first shown goes last, and so on: the typed ranking
        for key in keys:
            page.keyboard.press(key)
        page.wait_for_selector("#flash" if task == 0 else "#queue-empty")
        assert len(keys) == K + 1
        rankings.append([[shown[1]], [shown[2]], [shown[3]], [shown[0]]])
    with live_server.session() as db:
        assert [r.tiers for r in db.scalars(select(Ranking).order_by(Ranking.id))] == rankings


def test_tab_walks_cards_not_their_controls_and_enter_reaches_them(live_server, page) -> None:  # noqa: F811
    project_id, email = _short(live_server, n_prompts=1)
    _login(page, live_server.base, email)
    page.goto(f"{live_server.base}/projects/{project_id}/annotate")
    shown = _shown(page)
    assert _focused_card(page) == [shown[0], "unranked"]
    for cid in shown[1:]:
        page.keyboard.press("Tab")
        assert _focused_card(page) == [cid, "unranked"]
    page.keyboard.press("Shift+Tab")
    assert _focused_card(page) == [shown[2], "unranked"]
    page.keyboard.press("1")
    assert _focused_card(page) == [shown[3], "unranked"]  # moved on to the next unranked card
    for cid, where in [(shown[1], "unranked"), (shown[0], "unranked"), (shown[2], "ranked")]:
        page.keyboard.press("Shift+Tab")  # back to the placed card in the ranked list above, skipping every select
        assert _focused_card(page) == [cid, where]

    page.keyboard.press("Enter")  # into the card: its rank select, then Flags
    assert page.evaluate("document.activeElement.name") == f"rank_{shown[2]}"
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.tagName") == "SUMMARY"
    page.keyboard.press("Enter")  # open Flags and tick one with the keyboard
    page.keyboard.press("Tab")
    page.keyboard.press("Space")
    assert page.locator(f'input[name="flag_{shown[2]}"]').is_checked()
    page.keyboard.press("Escape")
    assert _focused_card(page) == [shown[2], "ranked"]
    page.keyboard.press("Tab")  # the controls are out of the Tab order again
    assert _focused_card(page) == [shown[0], "unranked"]


def test_question_mark_shows_the_key_map_and_escape_closes_it(live_server, page) -> None:  # noqa: F811
    project_id, email = _short(live_server, n_prompts=1)
    _login(page, live_server.base, email)
    page.goto(f"{live_server.base}/projects/{project_id}/annotate")
    dialog = page.locator("#keymap")
    assert not dialog.is_visible()
    page.keyboard.press("?")
    assert dialog.is_visible() and "Ctrl" in dialog.inner_text()
    page.keyboard.press("1")  # keys do not reach the cards behind the dialog
    assert page.locator("#ranked > .resp").count() == 0
    page.keyboard.press("Escape")
    assert not dialog.is_visible()
    assert _focused_card(page) is not None  # back where it was
    page.get_by_role("button", name="Keys").click()
    assert dialog.is_visible()
    page.get_by_role("button", name="Close").click()
    assert not dialog.is_visible()


def test_no_csp_violation_when_a_styled_element_is_swapped_out(live_server, page) -> None:  # noqa: F811
    """htmx settles attributes from the old element onto the new one with the same id: a `style` set through CSSOM
    (allowed) would come back as a style attribute (blocked, and logged). The page fixture fails on that log."""
    project_id, email = _short(live_server)
    _login(page, live_server.base, email)
    page.goto(f"{live_server.base}/projects/{project_id}/annotate")
    page.evaluate("() => { document.querySelector('#ranked').style.minHeight = '5rem';"
                  " document.querySelector('#submit-btn').style.opacity = '.9'; }")  # as a library might
    for key in ["1", "2", "3", "4", "Control+Enter"]:
        page.keyboard.press(key)
    page.wait_for_selector("#flash")
    settle(page)
    assert page.console_errors == []


def test_without_javascript_the_selects_still_submit(live_server, new_page) -> None:  # noqa: F811
    project_id, email = _short(live_server, n_prompts=1)
    plain = new_page(java_script_enabled=False)
    _login(plain, live_server.base, email)
    plain.goto(f"{live_server.base}/projects/{project_id}/annotate")
    cids = [int(c) for c in plain.locator(".resp").evaluate_all("els => els.map(e => e.dataset.cid)")]
    assert plain.locator("#rubric-details").evaluate("d => d.open")
    for rank, cid in zip(["2", "1", "3", "3"], cids, strict=True):
        plain.select_option(f'select[name="rank_{cid}"]', rank)
    plain.get_by_role("button", name="Submit ranking").click()
    plain.wait_for_selector("#queue-empty")
    with live_server.session() as db:
        assert db.scalar(select(Ranking)).tiers == [[cids[1]], [cids[0]], sorted(cids[2:])]
