"""The engineer's first day in the demo, in Chromium with a real worker beside the server: export pairs from the
form, watch the exports list turn the export ready by itself, start a reward run on the shipped MiniLM with a tiny
config, and watch its run page draw a curve with every logged point, with no console error on the way."""

from __future__ import annotations

import re
import threading

import pytest

from app.demo.seed import demo_policy_dir, setup_demo
from app.worker import Worker
from tests.app.test_training_demo import _rank_some
from tests.browser.test_annotate_page import page  # noqa: F401 - fixture: fails on any console error

pytestmark = pytest.mark.slow


@pytest.fixture
def worker(live_server):  # type: ignore[no-untyped-def]
    """`preflab worker` as the demo starts it, in a thread on the live server's database."""
    w = Worker(live_server.settings, session_factory=live_server.app.state.session_factory, poll_s=0.2,
               heartbeat_s=0.5)
    thread = threading.Thread(target=w.run, daemon=True)
    thread.start()
    yield w
    w.terminating = True
    thread.join(timeout=120)


def test_an_engineer_exports_trains_a_reward_model_then_a_policy_and_watches_their_curves(live_server, worker,
                                                                                          page) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    accounts, pid = setup_demo(live_server.settings, "tiny")
    passwords = {email: password for _, email, password in accounts}
    _rank_some(live_server.app, passwords, pid, per_annotator=8)
    base = live_server.base
    page.goto(f"{base}/login")
    page.fill("input[name=email]", "engineer@example.org")
    page.fill("input[name=password]", passwords["engineer@example.org"])
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/projects")

    page.goto(f"{base}/projects/{pid}/exports")
    page.select_option("select[name=kind]", "pairs")
    page.get_by_role("button", name="Start export").click()
    page.wait_for_url(f"**/projects/{pid}/exports")
    # The list follows the export while the worker writes it: no reload.
    page.wait_for_function("() => document.querySelector('#export-table .state').textContent === 'ready'",
                           timeout=60_000)

    page.goto(f"{base}/projects/{pid}/training")
    page.select_option("select[name=kind]", "reward")
    export = page.locator("select[name=export_id] option", has_text="pairs").first.get_attribute("value")
    page.select_option("select[name=export_id]", export)
    page.fill("textarea[name=config]", "steps = 3\nbatch_size = 4\nmax_length = 96")
    page.get_by_role("button", name="Start run").click()
    page.wait_for_url(re.compile(r".*/training-runs/\d+$"))

    # The run page polls: the state moves on and the loss chart gains a point per step, with axes, no reload.
    page.wait_for_function("() => document.querySelector('#run-state').textContent === 'succeeded'",
                           timeout=240_000)
    chart = page.locator('figure.chart[data-metric="loss"] svg')
    assert "3 points" in chart.get_attribute("aria-label")
    assert chart.locator("line.axis").count() >= 2 and chart.locator("text.tick").count() >= 2  # axes, labelled
    points = chart.locator("circle.pt")
    assert points.count() == 3 and "step 3" in points.nth(2).locator("title").text_content()  # hover values
    assert page.locator("#run-progress").inner_text().startswith("3/3")
    assert "Calibration (reliability diagram)" in page.locator("#evaluation").inner_text()

    reward_run = page.url.rsplit("/", 1)[1]

    # Then a policy: a prompts export, and GRPO from the demo's tiny policy against that reward model.
    page.goto(f"{base}/projects/{pid}/exports")
    page.select_option("select[name=kind]", "prompts")
    page.get_by_role("button", name="Start export").click()
    page.wait_for_url(f"**/projects/{pid}/exports")
    page.wait_for_function("() => [...document.querySelectorAll('#export-table .state')]"
                           ".every(e => e.textContent === 'ready')", timeout=60_000)
    page.goto(f"{base}/projects/{pid}/training")
    page.select_option("select[name=kind]", "grpo")
    prompts = page.locator("select[name=export_id] option", has_text="prompts").first.get_attribute("value")
    page.select_option("select[name=export_id]", prompts)
    page.select_option("select[name=reward_run_id]", reward_run)
    page.fill("input[name=base_model]", str(demo_policy_dir(live_server.settings, "tiny")))
    page.fill("textarea[name=config]", "steps = 2\ngroup_size = 2\nprompts_per_step = 2\nmax_new_tokens = 8\n"
                                        "eval_max_prompts = 3\neval_k = 2")
    page.get_by_role("button", name="Start run").click()
    page.wait_for_url(re.compile(r".*/training-runs/\d+$"))
    page.wait_for_function("() => document.querySelector('#run-state').textContent === 'succeeded'",
                           timeout=240_000)
    reward = page.locator('figure.chart[data-metric="reward_mean"] svg')
    assert "2 points" in reward.get_attribute("aria-label")
    assert reward.locator("circle.pt").count() == 2
