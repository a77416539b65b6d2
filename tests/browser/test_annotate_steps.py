"""Step labels on the ranking page in real Chromium: numbered steps, +1/0/−1 by key and by click, "first error
here", submitted with the ranking, kept across a reload by the draft; no console error or CSP violation."""

from __future__ import annotations

import itertools

import pytest
from sqlalchemy import select

from app.annotation import steps
from app.models import Project, Ranking
from tests.browser.conftest import settle
from tests.browser.test_annotate_page import _focused_card, _login, _seed, page  # noqa: F401 - fixtures

pytestmark = pytest.mark.slow


def _stepwise(live_server, n_prompts: int = 1):  # type: ignore[no-untyped-def]
    project_id, email = _seed(live_server, n_prompts=n_prompts,
                              answer=lambda i, j: f"First {i}.{j}\nSecond {i}.{j}\nThird {i}.{j}")
    with live_server.session() as db:
        project = db.get(Project, project_id)
        project.settings = dict(project.settings or {}) | {"step_labels": True}  # the lead's switch, as stored
        db.commit()
    return project_id, email


def _shown(pg) -> list[int]:  # type: ignore[no-untyped-def]
    return [int(c) for c in pg.locator("#unranked > .resp").evaluate_all("els => els.map(e => e.dataset.cid)")]


def _active_step(pg):  # type: ignore[no-untyped-def]
    return pg.evaluate("() => { const a = document.activeElement; return a.classList.contains('step') ? "
                       "[parseInt(a.closest('ol').dataset.cid), parseInt(a.dataset.step)] : null; }")


def _labels(live_server) -> dict[int, list[int]]:
    with live_server.session() as db:
        ranking = db.scalar(select(Ranking).order_by(Ranking.id.desc()))
        return steps.of_ranking(db, ranking.id)


def test_steps_are_numbered_and_labelled_with_the_keyboard_then_submitted(live_server, page) -> None:  # noqa: F811
    project_id, email = _stepwise(live_server)
    _login(page, live_server.base, email)
    page.goto(f"{live_server.base}/projects/{project_id}/annotate")
    shown = _shown(page)
    first = page.locator(f'.resp[data-cid="{shown[0]}"]')
    assert first.locator(".step-n").all_inner_texts() == ["1", "2", "3"]
    assert [t.split(" ")[0] for t in first.locator(".step-text").all_inner_texts()] == ["First", "Second", "Third"]
    # No blank lines around or between the steps (the body is pre-wrap: template whitespace would show).
    body, steps = first.locator(".resp-body").bounding_box(), first.locator(".step").all()
    boxes = [st.bounding_box() for st in steps]
    assert boxes[0]["y"] - body["y"] < 6, (body, boxes[0])
    assert all(b["y"] - (a["y"] + a["height"]) < 12 for a, b in itertools.pairwise(boxes)), boxes
    assert _focused_card(page) == [shown[0], "unranked"]

    page.keyboard.press("s")  # into the focused response's steps
    assert _active_step(page) == [shown[0], 0]
    page.keyboard.press("c")  # +1, and on to step 2
    assert _active_step(page) == [shown[0], 1]
    page.keyboard.press("w")
    page.keyboard.press("k")  # back up to step 2
    page.keyboard.press("n")  # neutral after all
    page.keyboard.press("e")  # step 3: first error here
    settle(page)
    assert [s.get_attribute("data-label") for s in first.locator(".step").all()] == ["1", "0", "-1"]
    page.keyboard.press("k")
    page.keyboard.press("k")
    page.keyboard.press("e")  # first error on step 1: the steps after it are left unlabelled
    settle(page)
    assert [s.get_attribute("data-label") for s in first.locator(".step").all()] == ["-1", None, None]
    page.keyboard.press("Escape")  # back to the response, where the ranking keys work as before
    assert _focused_card(page) == [shown[0], "unranked"]
    for key in ["4", "1", "2", "3", "Control+Enter"]:
        page.keyboard.press(key)
    page.wait_for_selector("#queue-empty")
    assert _labels(live_server) == {shown[0]: [-1]}


def test_a_gap_is_refused_before_sending_and_clicks_survive_a_reload(live_server, page) -> None:  # noqa: F811
    project_id, email = _stepwise(live_server)
    _login(page, live_server.base, email)
    page.goto(f"{live_server.base}/projects/{project_id}/annotate")
    shown = _shown(page)
    card = page.locator(f'.resp[data-cid="{shown[1]}"]')
    card.focus()
    with page.expect_response(lambda r: r.url.endswith("/draft") and r.request.method == "PUT") as saved:
        card.locator(f'input[name="step_{shown[1]}_0"][value="1"]').check()
    assert saved.value.ok
    page.reload()
    card = page.locator(f'.resp[data-cid="{shown[1]}"]')
    assert card.locator(f'input[name="step_{shown[1]}_0"][value="1"]').is_checked()
    assert card.locator(".step").first.get_attribute("data-label") == "1"

    page.locator(f'.resp[data-cid="{shown[0]}"]').focus()
    for key in ["1", "2", "3", "4", "Control+Enter"]:
        page.keyboard.press(key)
    error = page.locator("#submit-error")
    error.wait_for(state="visible")
    assert "step 2 has no label" in error.inner_text()
    card.locator(f'input[name="step_{shown[1]}_1"][value="1"]').check()
    card.locator(f'input[name="step_{shown[1]}_2"][value="0"]').check()
    page.locator("#submit-btn").click()
    page.wait_for_selector("#queue-empty")
    assert _labels(live_server) == {shown[1]: [1, 1, 0]}
