"""The exports page as an engineer reads it, on a laptop and on a phone: the Filters column wraps between words and
never inside one, the page never scrolls sideways, and the new-export form shows only the chosen kind's options,
with JavaScript and without."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from app.accounts import users
from app.exports import service as exports
from app.models import Export
from app.projects import projects
from tests.browser.screens import shoot
from tests.browser.test_annotate_page import PASSWORD, _login, new_page  # noqa: F401 - fixture

pytestmark = pytest.mark.slow
LAPTOP = {"width": 1366, "height": 900}
NEW = "form[action$='/exports']"  # the new-export form
PHONE = {"width": 390, "height": 844, "is_mobile": True, "has_touch": True}
# Each option's label, and the kinds whose form shows it (the server reads it only for those).
OPTIONS = {"Aggregation (pairs)": {"pairs"}, "Conflicts (aggregated)": set(), "Neutral steps (steps)": {"steps"},
           "Every labelled step (steps)": {"steps"},
           "Minimum agreement (pairs)": {"pairs"}, "Rubric versions": {"pairs", "rankings", "sft", "steps"},
           "Flagged items": {"pairs", "rankings", "sft", "steps"}, "human": {"pairs", "rankings", "sft", "steps"},
           "Split": {"pairs", "rankings", "sft", "steps", "prompts"}, "Layout": {"pairs", "rankings", "sft", "steps", "prompts"}}

# Every word of the Filters column, and whether the browser laid it out on more than one line.
BROKEN_WORDS = """() => {
  const broken = [];
  for (const cell of document.querySelectorAll('#export-table td:has(> dl.filters)')) {
    const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      for (const m of node.textContent.matchAll(/\\S+/g)) {
        const range = document.createRange();
        range.setStart(node, m.index);
        range.setEnd(node, m.index + m[0].length);
        const tops = new Set([...range.getClientRects()].map(r => Math.round(r.top)));
        if (tops.size > 1) broken.push(m[0]);
      }
    }
  }
  return broken;
}"""

WIDE = """() => [...document.querySelectorAll('body *')].filter(e => e.getBoundingClientRect().right > innerWidth + 1)
  .slice(0, 5).map(e => e.tagName + '.' + e.className)"""


def _world(live_server) -> int:  # type: ignore[no-untyped-def]
    with live_server.session() as db:
        eng = users.create_user(db, "eng@example.org", PASSWORD, "lead")
        project = projects.create_project(db, eng, name="Exports", completions_per_prompt=2, overlap=1,
                                          rubric_text="r", criteria=[])
        exports.request_export(db, project, eng, "pairs", "jsonl",
                               {"source": ["human", "imported"], "flagged": "exclude", "split": "heldout",
                                "rubric_versions": [1], "min_agreement": 0.75, "created_after": "2025-01-01"},
                               aggregation="aggregated", conflicts="drop", layout="conversational")
        exports.request_export(db, project, eng, "steps", "parquet", {"flagged": "include"}, neutral="truncate")
        exports.request_export(db, project, eng, "prompts", "jsonl")
        db.commit()
        return project.id


def _shown(pg) -> dict[str, bool]:  # type: ignore[no-untyped-def]
    form = pg.locator(NEW)
    return {name: form.locator("label", has_text=name).first.is_visible() for name in OPTIONS}


@pytest.mark.parametrize("size", [LAPTOP, PHONE], ids=["laptop", "phone"])
def test_filters_wrap_between_words_and_the_page_never_scrolls_sideways(live_server, new_page, size) -> None:  # noqa: F811
    project_id = _world(live_server)
    pg = new_page(**size)
    _login(pg, live_server.base, "eng@example.org")
    pg.goto(f"{live_server.base}/projects/{project_id}/exports")
    assert pg.locator("#export-table dl.filters dt").count() > 10
    shoot(pg, "exports")
    assert pg.evaluate(BROKEN_WORDS) == []
    assert pg.evaluate("document.documentElement.scrollWidth") <= size["width"], pg.evaluate(WIDE)
    shoot(pg, "exports")


@pytest.mark.parametrize("script", [True, False], ids=["js", "no-js"])
def test_the_new_export_form_shows_only_the_chosen_kinds_options(live_server, new_page, script) -> None:  # noqa: F811
    project_id = _world(live_server)
    pg = new_page(java_script_enabled=script)
    _login(pg, live_server.base, "eng@example.org")
    pg.goto(f"{live_server.base}/projects/{project_id}/exports")
    for kind in ("pairs", "rankings", "sft", "prompts", "steps"):
        pg.select_option(NEW + " select[name=kind]", kind)
        assert _shown(pg) == {name: kind in kinds for name, kinds in OPTIONS.items()}, kind
    pg.select_option(NEW + " select[name=kind]", "pairs")
    pg.select_option(NEW + " select[name=aggregation]", "aggregated")
    assert _shown(pg)["Conflicts (aggregated)"]
    # The options shown are the ones the export is made with.
    pg.select_option(NEW + " select[name=kind]", "steps")
    pg.select_option(NEW + " select[name=neutral]", "negative")
    pg.check(NEW + " input[name=every_step]")
    pg.get_by_role("button", name="Start export").click()
    pg.wait_for_url(f"**/projects/{project_id}/exports")
    with live_server.session() as db:
        newest = db.scalars(select(Export).order_by(Export.id.desc())).first()
        assert (newest.kind, newest.filters["neutral"], newest.filters["every_step"]) == ("steps", "negative", True)
        assert "aggregation" not in newest.filters
