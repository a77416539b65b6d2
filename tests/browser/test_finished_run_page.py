"""A finished policy run's page reads from the top: the verdict (did the policy beat its reference, by how much) and
the next steps (*Sample into project*, *Run a full round*) in view without scrolling, the curves in a compact grid,
the held-out samples a page at a time with each prompt beside its answers, once; on a phone nothing runs off the
side of the page."""

from __future__ import annotations

import json

import pytest

from tests.browser.screens import shoot
from tests.browser.test_annotate_page import PASSWORD, _login, new_page  # noqa: F401 - fixture
from tests.support.runs import finished_run

pytestmark = pytest.mark.slow
LAPTOP = {"width": 1366, "height": 900}
PHONE = {"width": 390, "height": 844, "is_mobile": True, "has_touch": True}
QUESTION = ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many "
            "clips did Natalia sell altogether in April and May?")
ANSWER = "Natalia sold 48/2 = 24 clips in May. Altogether she sold 48 + 24 = 72 clips in April and May. " * 3


def _finished_grpo(live_server) -> dict[str, int]:  # type: ignore[no-untyped-def]
    """A GRPO run as the trainer leaves it: 100 steps of metrics, an evaluation on 40 held-out prompts with curves,
    four samples a prompt from the policy and the reference, and a long log."""
    data_dir = live_server.settings.data_dir
    out = data_dir / "runs" / "1"
    (out / "model").mkdir(parents=True)
    with (out / "metrics.jsonl").open("w") as fh:
        for step in range(1, 101):
            fh.write(json.dumps({"step": step, "loss": 1.0 / step, "reward_mean": 0.2 + step / 300, "kl": 0.001 * step,
                                 "entropy": 2.0 - step / 100, "clipfrac": 0.1, "lr": 1e-6, "beta": 0.04}) + "\n")
    (out / "eval.json").write_text(json.dumps({
        "prompts": 40, "k": 4, "policy": {"reward_mean": 0.52, "reward_std": 0.3, "response_length": 180.0},
        "reference": {"reward_mean": 0.31, "reward_std": 0.3, "response_length": 200.0},
        "reward_mean": {"policy": 0.52, "reference": 0.31}, "kl": 0.031, "win_rate": 0.64, "pass_at_k": 0.7,
        "maj_at_k": 0.55, "curves": {"pass_at": {"1": 0.5, "2": 0.6, "4": 0.7}, "maj_at": {"1": 0.5, "2": 0.5,
                                                                                           "4": 0.55}},
        "steps": 100}))
    with (out / "samples.jsonl").open("w") as fh:
        for i in range(40):
            for sample in range(4):
                for model, reward in (("policy", 1.0 if sample % 2 else 0.0), ("reference", 0.0)):
                    fh.write(json.dumps({"prompt": f"Question {i}: {QUESTION}", "reference": "72", "model": model,
                                         "sample": sample, "answer": f"{model} {sample}: {ANSWER}",
                                         "reward": reward}) + "\n")
    with live_server.session() as db:
        project_id, run_id, job_id = finished_run(db, out, email="eng@example.org", password=PASSWORD,
                                                  project="Runs", steps=100)
        made = {"project": project_id, "run": run_id}
    log = data_dir / "jobs" / f"{job_id}.log"
    log.parent.mkdir(parents=True)
    log.write_text("".join(f"step {i}/100 loss 0.5\n" for i in range(1, 101)) + "progress: step 100/100\n")
    return made


@pytest.mark.parametrize("size", [LAPTOP, PHONE], ids=["laptop", "phone"])
def test_a_finished_policy_run_leads_with_its_verdict_and_next_steps(live_server, new_page, size) -> None:  # noqa: F811
    made = _finished_grpo(live_server)
    pg = new_page(**size)
    _login(pg, live_server.base, "eng@example.org")
    pg.goto(f"{live_server.base}/training-runs/{made['run']}")
    assert pg.locator("#outcome h2").inner_text() == "Beats its reference on 40 held-out prompts"
    assert "+0.210 on the reference's 0.310" in pg.locator("#verdict").inner_text()
    buttons = [pg.get_by_role("button", name="Sample into project (next round)"),
               pg.get_by_role("button", name="Run a full round (export → reward model → policy → sample)")]
    width, height = pg.evaluate("[document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
    assert width <= size["width"]  # nothing runs off the side
    shoot(pg, "finished-run")
    if size is PHONE:
        assert height < 6000  # 8,300 px before: every chart a screen wide, every sample twice
        return
    for button in buttons:  # in view as the page opens
        box = button.bounding_box()
        assert box is not None and box["y"] + box["height"] <= size["height"], box
    assert height < 3000  # 4,000 px before on this run; charts a third the height, samples a page at a time
    rows = pg.locator("#samples tbody tr")
    prompts = [rows.nth(i).locator("td").first.inner_text() for i in range(rows.count())]
    assert len(prompts) == 5 and len(set(prompts)) == 5 and prompts[0].startswith("Question 0:")
    assert rows.first.locator("td").first.bounding_box()["width"] > 250  # a prompt reads as lines, not a word each
    assert "4 samples, reward 0 · 1 · 0 · 1" in rows.first.inner_text()
    pg.get_by_role("link", name="Next ›").click()
    pg.wait_for_load_state()
    assert pg.locator("#samples tbody tr td").first.inner_text().startswith("Question 5:")
    assert "Page 2 of 8" in pg.locator(".pager").inner_text()
