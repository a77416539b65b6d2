"""Small things a new annotator trips over: `=` on a card not ranked yet ranks it and ties it with the one above, a
card dropped quickly into the empty strip under the ranked list lands there, and a rubric's numbered list keeps the
number it starts at."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from app.models import Project, Ranking
from tests.browser.screens import shoot
from tests.browser.test_annotate_keys import _shown, _task_ready
from tests.browser.test_annotate_page import _login, _seed, new_page, page  # noqa: F401 - fixtures

pytestmark = pytest.mark.slow
RUBRIC = "Check, in this order:\n\n4. the final number\n5. the units\n6. the working"


def _open(live_server, pg, **seed) -> int:  # type: ignore[no-untyped-def]
    project_id, email = _seed(live_server, n_prompts=1, answer=lambda i, j: f"Answer {i}.{j}", **seed)
    with live_server.session() as db:
        db.get(Project, project_id).settings = {"allow_ties": True}
        db.commit()
    _login(pg, live_server.base, email)
    pg.goto(f"{live_server.base}/projects/{project_id}/annotate")
    _task_ready(pg)
    return project_id


def _ranked(pg) -> list[tuple[int, bool]]:  # type: ignore[no-untyped-def]
    return [(int(c), t == "true") for c, t in pg.locator("#ranked > .resp").evaluate_all(
        "els => els.map(e => [e.dataset.cid, e.dataset.tie])")]


def test_equals_on_an_unranked_card_ranks_it_tied_with_the_one_above(live_server, page) -> None:  # noqa: F811
    _open(live_server, page)
    a, b, c, d = _shown(page)
    page.keyboard.press("=")  # nothing ranked yet: the card is ranked first, tied with nothing
    assert _ranked(page) == [(a, False)]
    page.keyboard.press("=")  # the next card ranks last, tied with the first
    assert _ranked(page) == [(a, False), (b, True)]
    badge = page.locator("#ranked .rank-badge").all_inner_texts()
    assert badge[1] == "= " + badge[0]  # shown as sharing the first place
    page.keyboard.press("3")  # the third place, below the tie
    page.keyboard.press("=")
    assert _ranked(page) == [(a, False), (b, True), (c, False), (d, True)]
    page.keyboard.press("Control+Enter")
    page.wait_for_selector("#queue-empty")
    with live_server.session() as db:
        assert db.scalar(select(Ranking.tiers)) == [sorted([a, b]), sorted([c, d])]


def test_a_quick_drop_into_the_strip_under_the_ranked_list_lands_there(live_server, new_page) -> None:  # noqa: F811
    pg = new_page(height=2000)
    _open(live_server, pg)
    first, second, third = _shown(pg)[:3]
    pg.keyboard.press("1")
    pg.keyboard.press("2")
    pg.wait_for_function("() => [...document.querySelectorAll('.resp')].every(e => !e.animated)")
    grip = pg.locator(f'.resp[data-cid="{third}"] .letter').bounding_box()
    pg.mouse.move(grip["x"] + grip["width"] / 2, grip["y"] + grip["height"] / 2)
    pg.mouse.down()
    pg.mouse.move(grip["x"] + 10, grip["y"] + 10, steps=5)
    pg.wait_for_selector(".sortable-fallback", state="attached")
    # Over the ranked cards first (they slide aside for it), then down into the strip below them and let go soon,
    # as a quick hand does: the cards are still sliding when the card is released.
    top = pg.locator(f'#ranked .resp[data-cid="{first}"]').bounding_box()
    pg.mouse.move(top["x"] + top["width"] / 2, top["y"] + 8, steps=4)
    pg.wait_for_selector(f'#ranked .resp.sortable-ghost[data-cid="{third}"]', state="attached")
    strip = pg.locator("#ranked").bounding_box()  # its bottom padding is the room to drop after the last card
    pg.mouse.move(strip["x"] + strip["width"] / 2, strip["y"] + strip["height"] - 6, steps=2)
    pg.wait_for_timeout(30)
    pg.mouse.up()
    pg.wait_for_function("() => !document.querySelector('.sortable-fallback')")
    assert [cid for cid, _ in _ranked(pg)] == [first, second, third]


def test_a_rubric_list_keeps_its_start_number(live_server, new_page) -> None:  # noqa: F811
    for size in ({"width": 1366, "height": 900}, {"width": 390, "height": 844, "is_mobile": True, "has_touch": True}):
        pg = new_page(**size)
        if size["width"] == 1366:
            _open(live_server, pg, rubric=RUBRIC)
        else:
            _login(pg, live_server.base, "ann@example.org")
            pg.goto(f"{live_server.base}/projects/1/annotate")
            _task_ready(pg)
            pg.locator("#rubric-details summary").click()
        listed = pg.locator("#rubric-details ol")
        assert listed.evaluate("ol => ol.start") == 4 and listed.locator("li").count() == 3  # shown as 4., 5., 6.
        shoot(pg, "annotate-rubric")
