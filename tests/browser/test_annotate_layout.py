"""The ranking page's layout: on a phone (390×844, touch) and on a laptop (1280×800), in headless Chromium."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from app.demo.seed import DEMO_RUBRIC
from app.models import Ranking
from tests.browser.conftest import settle
from tests.browser.test_annotate_page import _login, _seed, new_page, page  # noqa: F401 - fixtures

pytestmark = pytest.mark.slow
PHONE = {"width": 390, "height": 844, "has_touch": True, "is_mobile": True}
LONG_RUBRIC = DEMO_RUBRIC + "\n\n" + DEMO_RUBRIC  # taller than the demo's, which filled 640 px of a phone


def _box(pg, selector: str) -> dict:  # type: ignore[no-untyped-def]
    return pg.locator(selector).first.bounding_box()


def _on_first_screen(pg, selector: str) -> bool:  # type: ignore[no-untyped-def]
    box, height = _box(pg, selector), pg.viewport_size["height"]
    return box is not None and 0 <= box["y"] and box["y"] + box["height"] <= height


def _touch_drag(pg, start: tuple[float, float], end: tuple[float, float], steps: int = 12) -> None:  # type: ignore[no-untyped-def]
    """A finger on the screen, as the phone's touch events deliver it (CDP Input.dispatchTouchEvent)."""
    cdp = pg.context.new_cdp_session(pg)
    (x0, y0), (x1, y1) = start, end
    cdp.send("Input.dispatchTouchEvent", {"type": "touchStart", "touchPoints": [{"x": x0, "y": y0}]})
    for i in range(1, steps + 1):
        point = {"x": x0 + (x1 - x0) * i / steps, "y": y0 + (y1 - y0) * i / steps}
        cdp.send("Input.dispatchTouchEvent", {"type": "touchMove", "touchPoints": [point]})
        settle(pg)
    cdp.send("Input.dispatchTouchEvent", {"type": "touchEnd", "touchPoints": []})
    settle(pg)
    cdp.detach()


def test_a_phone_shows_the_prompt_first_with_submit_in_reach(live_server, new_page) -> None:  # noqa: F811
    project_id, email = _seed(live_server, n_prompts=2, rubric=LONG_RUBRIC, annotators=2)
    phone = new_page(**PHONE)
    _login(phone, live_server.base, email)
    phone.goto(f"{live_server.base}/projects/{project_id}/annotate")
    settle(phone)
    assert phone.evaluate("scrollY") == 0
    assert _box(phone, "header.top")["height"] < 48  # one line: brand and menu
    assert _box(phone, ".task-head")["height"] < 32  # one line: project, today, left
    assert phone.get_by_role("heading", level=1).count() == 1
    assert not phone.locator("#rubric-details").evaluate("d => d.open")  # a one-line bar above the prompt
    assert _box(phone, ".prompt")["y"] < 844 / 3
    assert _on_first_screen(phone, ".prompt h2") and _on_first_screen(phone, "#unranked > .resp .resp-head")
    # No empty band between the question and the first answer (it was ~205 px: a line for the monospace switch,
    # then a two-line empty drop zone): the switch shares the heading's line, the empty zone is one short line.
    prompt, first = _box(phone, ".prompt"), _box(phone, "#unranked > .resp")
    assert first["y"] - (prompt["y"] + prompt["height"]) < 140
    assert _box(phone, "#ranked")["height"] < 48
    tools, heading = _box(phone, ".board-tools"), _box(phone, ".board-h")
    assert abs(tools["y"] - heading["y"]) < 8 and tools["x"] > heading["x"] + 100  # beside it, not below
    assert _on_first_screen(phone, "#submit-btn")  # sticky at the bottom, without scrolling
    phone.mouse.wheel(0, 1500)
    settle(phone)
    assert phone.evaluate("scrollY") > 500 and _on_first_screen(phone, "#submit-btn")

    # The rubric's open/closed state is this user's: opened here, open after a reload, closed for someone else.
    phone.locator("#rubric-details > summary").tap()
    settle(phone)
    phone.reload()
    settle(phone)
    assert phone.locator("#rubric-details").evaluate("d => d.open")
    phone.keyboard.press("r")  # the key closes it again
    assert not phone.locator("#rubric-details").evaluate("d => d.open")
    phone.keyboard.press("r")
    phone.locator("header.top form button").click()  # log out; the next user shares this browser's storage
    phone.wait_for_url("**/login*")
    _login(phone, live_server.base, "ann2@example.org")
    phone.goto(f"{live_server.base}/projects/{project_id}/annotate")
    settle(phone)
    assert not phone.locator("#rubric-details").evaluate("d => d.open")


def test_touch_drag_ranks_on_a_phone_and_a_swipe_on_the_text_still_scrolls(live_server, new_page) -> None:  # noqa: F811
    project_id, email = _seed(live_server, n_prompts=1, prompt=lambda i: "Which answer is right?",
                              answer=lambda i, j: f"Answer {j}: " + "some words " * 40)
    phone = new_page(**PHONE)
    _login(phone, live_server.base, email)
    phone.goto(f"{live_server.base}/projects/{project_id}/annotate")
    settle(phone)

    # A swipe up on an answer's text scrolls the page and drags nothing.
    body = _box(phone, "#unranked > .resp >> nth=1 >> .resp-body")
    _touch_drag(phone, (body["x"] + 40, body["y"] + 30), (body["x"] + 40, body["y"] - 150))
    assert phone.locator("#ranked > .resp").count() == 0
    phone.evaluate("scrollTo(0, 0)")
    settle(phone)

    order = []
    for _ in range(4):
        phone.wait_for_function("() => [...document.querySelectorAll('.resp')].every(e => !e.animated)")
        card = phone.locator("#unranked > .resp").first
        cid = int(card.get_attribute("data-cid"))
        card.scroll_into_view_if_needed()
        grip = card.locator(".grip").bounding_box()
        ranked = _box(phone, "#ranked")
        _touch_drag(phone, (grip["x"] + grip["width"] / 2, grip["y"] + grip["height"] / 2),
                    (ranked["x"] + ranked["width"] / 2, ranked["y"] + ranked["height"] - 10))
        phone.wait_for_function(f"() => document.querySelector('#ranked > .resp[data-cid=\"{cid}\"]:not(.sortable-ghost)')"
                                " !== null && !document.querySelector('.sortable-fallback')")
        order.append(cid)
    assert [int(c) for c in phone.locator("#ranked > .resp").evaluate_all("els => els.map(e => e.dataset.cid)")] \
        == order
    phone.locator("#submit-btn").tap()
    phone.wait_for_selector("#queue-empty")
    with live_server.session() as db:
        assert db.scalar(select(Ranking)).tiers == [[c] for c in order]


def test_a_laptop_shows_four_short_answers_and_submit_above_the_fold(live_server, page) -> None:  # noqa: F811
    project_id, email = _seed(live_server, n_prompts=1, rubric=LONG_RUBRIC, flags=["factually wrong"],
                              prompt=lambda i: "Natalia sold clips to 48 of her friends in April, and then she sold half "
                                               "as many clips in May. How many clips did Natalia sell altogether?",
                              answer=lambda i, j: f"In May she sold 48 / 2 = 24 clips, so {48 + 24 + j} in all.")
    page.set_viewport_size({"width": 1280, "height": 800})
    _login(page, live_server.base, email)
    page.goto(f"{live_server.base}/projects/{project_id}/annotate")
    settle(page)
    assert page.locator("#rubric-details").evaluate("d => d.open")  # wide screens show the rubric by default
    assert _on_first_screen(page, "#unranked > .resp >> nth=3")
    assert _on_first_screen(page, "#submit-btn")
    page.keyboard.press("1")  # ranking one moves it up into the ranked list: everything still fits
    settle(page)
    assert _on_first_screen(page, "#unranked > .resp >> nth=2") and _on_first_screen(page, "#submit-btn")
    assert page.locator(".show-all:visible").count() == 0  # short answers need no "show all"


def test_long_answers_collapse_until_focus_or_show_all(live_server, page) -> None:  # noqa: F811
    project_id, email = _seed(live_server, n_prompts=1)  # 150 × "long text": many lines each
    page.set_viewport_size({"width": 1280, "height": 800})
    _login(page, live_server.base, email)
    page.goto(f"{live_server.base}/projects/{project_id}/annotate")
    settle(page)
    cards = page.locator("#unranked > .resp")
    first, second = cards.nth(0), cards.nth(1)
    assert first.evaluate("e => e === document.activeElement")
    assert first.bounding_box()["height"] > 2 * second.bounding_box()["height"]  # the focused card shows all
    collapsed = second.bounding_box()["height"]
    assert collapsed < 200
    show_all = second.locator(".show-all")
    assert show_all.is_visible() and show_all.inner_text() == "Show all"
    show_all.click()
    assert second.bounding_box()["height"] > 2 * collapsed and show_all.get_attribute("aria-expanded") == "true"
    show_all.click()
    assert second.bounding_box()["height"] == pytest.approx(collapsed, abs=2)
    first.focus()
    page.keyboard.press("1")  # places the focused first card: it collapses, and the next card opens
    settle(page)
    assert page.locator("#ranked > .resp").first.bounding_box()["height"] == pytest.approx(collapsed, abs=2)
    assert cards.nth(0).evaluate("e => e === document.activeElement && e.classList.contains('open')")
