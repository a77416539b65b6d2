"""A process-reward GRPO run's page: the outcome curve with, beside it, the step reward and advantage by step index,
the first and last step's reward over the run and the share of groups without outcome variance, then the table of
each step's figures; on a laptop the four charts share a row, on a phone nothing runs off the side of the page; axe
finds nothing serious on it."""

from __future__ import annotations

import json

import pytest

from tests.browser.conftest import settle
from tests.browser.screens import shoot
from tests.browser.test_accessibility import axe_violations
from tests.browser.test_annotate_page import PASSWORD, _login, assert_console_clean, new_page  # noqa: F401 - fixture
from tests.support.runs import finished_run

pytestmark = pytest.mark.slow
LAPTOP = {"width": 1366, "height": 900}
PHONE = {"width": 390, "height": 844, "is_mobile": True, "has_touch": True}
STEPS = 6


def _process_run(live_server) -> int:  # type: ignore[no-untyped-def]
    """60 updates of a GRPO run on a process reward model: six step indices, fewer rollouts reaching the later ones,
    step rewards that rise over the run, advantages that shrink with the steps left (the sum form)."""
    out = live_server.settings.data_dir / "runs" / "1"
    out.mkdir(parents=True)
    with (out / "metrics.jsonl").open("w") as fh:
        for step in range(1, 61):
            row = {"step": step, "loss": 0.5 / step, "reward_mean": 0.2 + step / 100, "kl": 0.001 * step,
                   "entropy": 2.0 - step / 60, "lr": 1e-6, "beta": 0.04,
                   "outcome_zero_std_frac": max(0.0, 0.6 - step / 100)}
            for j in range(STEPS):
                row |= {f"step_reward/{j}": 0.3 + step / 250 - j / 40, f"step_adv/{j}": (STEPS - j) * 0.2 - 0.5,
                        f"step_reached/{j}": 16 - 2 * j}
            fh.write(json.dumps(row) + "\n")
    with live_server.session() as db:
        _, run_id, _ = finished_run(db, out, email="eng@example.org", password=PASSWORD, project="Process", steps=60)
        return run_id


@pytest.mark.parametrize("size", [LAPTOP, PHONE], ids=["laptop", "phone"])
def test_the_step_panel_sits_beside_the_outcome_curve_and_reads_on_a_phone(live_server, new_page, size) -> None:  # noqa: F811
    run_id = _process_run(live_server)
    pg = new_page(**size)
    _login(pg, live_server.base, "eng@example.org")
    pg.goto(f"{live_server.base}/training-runs/{run_id}")
    shoot(pg, "step-panel")
    panel = pg.locator("#step-stats")
    table = pg.get_by_role("table", name="Step reward and advantage by step index, last 20 updates and first 20")
    assert table.locator("tbody tr").count() == STEPS
    first = table.locator("tbody tr").first.locator("td")
    assert [first.nth(i).inner_text() for i in range(5)] == ["0.502", "0.342", "0.700", "0.700", "16"]
    outcome, by_index = (panel.locator(f'figure.chart[data-metric="{k}"]') for k in ("reward_mean", "step_by_index"))
    a, b = outcome.bounding_box(), by_index.bounding_box()
    assert a is not None and b is not None
    width = pg.evaluate("document.documentElement.scrollWidth")
    assert width <= size["width"]  # nothing runs off the side
    scroll = pg.locator("#step-stats .table-scroll")
    assert scroll.evaluate("e => e.scrollWidth <= e.clientWidth")  # the whole table shows, no sideways scrolling
    settle(pg)
    assert axe_violations(pg) == []
    assert_console_clean(pg)
    if size is LAPTOP:
        assert abs(a["y"] - b["y"]) < 2 and b["x"] > a["x"] + a["width"]  # side by side, in one row
        tops = {round(box["y"]) for box in (f.bounding_box() for f in panel.locator("figure.chart").all()) if box}
        assert len(tops) == 1 and panel.locator("figure.chart").count() == 4  # all four charts in that row
