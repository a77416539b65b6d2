"""Before Start, the training form says how long the run would take on this machine, and where that figure comes
from; it follows the form as the steps change (with a script, at once; without, on "Update the estimate"); with no
figures measured it says what to run; a long online run offers a first try of a few minutes."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
from playwright.sync_api import expect

from app.accounts import users
from app.models import Export, TrainingRun
from app.projects import projects
from app.runs import estimates
from tests.browser.screens import shoot
from tests.browser.test_annotate_page import PASSWORD, _login, new_page  # noqa: F401 - fixture
from training.estimate import Speed

pytestmark = pytest.mark.slow
LAPTOP = {"width": 1366, "height": 900}
PHONE = {"width": 390, "height": 844, "is_mobile": True, "has_touch": True}
SPEED = Speed(start_s=10.0, forward_token_s=0.001, train_token_s=0.003, optimizer_s=0.5, decode_step_s=0.02,
              decode_row_s=0.01, save_s=2.0)


def _world(live_server) -> dict:  # type: ignore[no-untyped-def]
    """A lead's project with a prompts export (80 train, 20 held out) and a policy model whose speed is measured."""
    data_dir = live_server.settings.data_dir
    with live_server.session() as db:
        lead = users.create_user(db, "eng@example.org", PASSWORD, "lead")
        project = projects.create_project(db, lead, name="First day", completions_per_prompt=4, overlap=1,
                                          rubric_text="r", criteria=[])
        export = Export(project_id=project.id, kind="prompts", format="jsonl", filters={}, row_count=100,
                        row_counts={"split.train": 80, "split.heldout": 20}, sha256="0" * 64,
                        files={"prompts.jsonl": "0" * 64})
        db.add(export)
        db.flush()
        folder = data_dir / "exports" / str(export.id)
        folder.mkdir(parents=True)
        (folder / "prompts.jsonl").write_text(json.dumps({"prompt": "How many clips? " * 20}) + "\n")
        export.path = str(folder)
        reward = TrainingRun(project_id=project.id, kind="reward", state="succeeded", config={})
        db.add(reward)
        db.commit()
        made = {"project": project.id, "export": export.id, "reward": reward.id}
    model = str(data_dir / "models" / "policy")
    figures = estimates.speed_file(data_dir, model)
    figures.parent.mkdir(parents=True)
    figures.write_text(json.dumps(dataclasses.asdict(SPEED) | {
        "model": model, "device": "cpu", "threads": 2, "measured_at": "2026-12-01T09:30:00+00:00"}))
    return made | {"model": model}


def _minutes(pg) -> int:  # type: ignore[no-untyped-def]
    shown = pg.locator("#estimate-minutes")
    minutes = int(shown.get_attribute("data-minutes"))
    said = f"{minutes // 60} h {minutes % 60} min".removesuffix(" 0 min") if minutes >= 60 else f"{minutes} min"
    assert shown.inner_text() == f"About {said} on this machine"
    return minutes


@pytest.mark.parametrize("script", [True, False], ids=["js", "no-js"])
def test_the_form_says_how_long_the_run_takes_and_follows_the_steps(live_server, new_page, script) -> None:  # noqa: F811
    made = _world(live_server)
    pg = new_page(java_script_enabled=script, **LAPTOP)
    _login(pg, live_server.base, "eng@example.org")
    pg.goto(f"{live_server.base}/projects/{made['project']}/training?kind=grpo&base_model={made['model']}"
            if not script else f"{live_server.base}/projects/{made['project']}/training")
    if script:
        assert "Choose a pairs export" in pg.locator("#estimate").inner_text()  # the reward default: none yet
        pg.select_option("select[name=kind]", "grpo")
        pg.get_by_text("Name a base model to see how long the run takes.").wait_for()
        base = pg.locator("input[name=base_model]")
        base.fill(made["model"] + "-other")
        base.dispatch_event("change")
        pg.locator(".measure-command").wait_for()  # a model not measured here: the form says what to run
        assert "python -m training speed --model" in pg.locator(".measure-command").inner_text()
        base.fill(made["model"])
        base.dispatch_event("change")
        pg.locator("#estimate-minutes").wait_for()
    estimate = pg.locator("#estimate")
    assert estimate.is_visible()
    assert "measured 2026-12-01 09:30 UTC on policy (cpu, 2 threads)" in estimate.inner_text()
    at_defaults = _minutes(pg)
    assert at_defaults > 60  # 100 steps of 64 answers
    assert pg.locator("#first-try").is_visible()
    pg.locator("textarea[name=config]").fill("steps = 3\nprompts_per_step = 2\ngroup_size = 4\n"
                                             "max_new_tokens = 100\neval_max_prompts = 0")
    if script:
        pg.wait_for_function(f"() => document.querySelector('#estimate-minutes').dataset.minutes !== '{at_defaults}'")
    else:
        pg.get_by_role("button", name="Update the estimate").click()
        pg.wait_for_load_state()
    assert 1 <= _minutes(pg) < at_defaults / 10  # 3 steps of 8 short answers instead of 100 of 64 long ones
    assert pg.locator("textarea[name=config]").input_value().startswith("steps = 3")
    assert pg.locator("select[name=kind]").input_value() == "grpo"
    shoot(pg, f"training-estimate-{'js' if script else 'no-js'}")


@pytest.mark.parametrize("size", [LAPTOP, PHONE], ids=["laptop", "phone"])
def test_a_long_run_offers_a_first_try_that_the_form_takes_up(live_server, new_page, size) -> None:  # noqa: F811
    made = _world(live_server)
    pg = new_page(**size)
    _login(pg, live_server.base, "eng@example.org")
    pg.goto(f"{live_server.base}/projects/{made['project']}/training?kind=grpo&base_model={made['model']}")
    assert pg.evaluate("document.documentElement.scrollWidth") <= size["width"]
    shoot(pg, "training-estimate-long")
    # The reward model chosen first stays chosen: a policy run without one cannot run a full round later.
    pg.select_option("select[name=reward_run_id]", str(made["reward"]))
    expect(pg.get_by_role("link", name="Use this first try")).to_have_attribute(
        "href", re.compile(f"reward_run_id={made['reward']}&"))
    pg.get_by_role("link", name="Use this first try").click()
    pg.wait_for_load_state()
    assert "steps = 5" in pg.locator("textarea[name=config]").input_value()
    assert pg.locator("select[name=reward_run_id]").input_value() == str(made["reward"])
    assert _minutes(pg) <= 5 and not pg.locator("#first-try").is_visible()
