"""The run page follows metrics.jsonl while it grows: its charts gain points without a reload."""

from __future__ import annotations

import json
import time

import pytest

from app.models import TrainingRun
from app.services import projects, users

PASSWORD = "correct horse battery staple"
pytestmark = pytest.mark.slow


def test_run_page_charts_update_while_metrics_are_written(live_server, page, tmp_path) -> None:  # type: ignore[no-untyped-def]
    metrics = tmp_path / "runs" / "1" / "metrics.jsonl"
    metrics.parent.mkdir(parents=True)
    with live_server.session() as db:
        eng = users.create_user(db, "eng@example.org", PASSWORD, "lead")
        project = projects.create_project(db, eng, name="Runs", completions_per_prompt=2, overlap=1,
                                          rubric_text="r", criteria=[])
        run = TrainingRun(project_id=project.id, kind="grpo", state="running", config={},
                          metrics_path=str(metrics), model_dir=str(metrics.parent / "model"))
        db.add(run)
        db.commit()
        run_id = run.id

    def write(step: int) -> None:
        with metrics.open("a") as fh:
            fh.write(json.dumps({"step": step, "loss": 1.0 / step, "reward_mean": 0.1 * step, "kl": 0.01 * step})
                     + "\n")

    write(1)
    write(2)
    page.goto(f"{live_server.base}/login")
    page.fill("input[name=email]", "eng@example.org")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.goto(f"{live_server.base}/training-runs/{run_id}")
    chart = page.locator('figure.chart[data-metric="reward_mean"] svg')
    assert "2 points" in chart.get_attribute("aria-label")
    for step in range(3, 6):
        write(step)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and "5 points" not in (chart.get_attribute("aria-label") or ""):
        time.sleep(0.25)
    assert "5 points" in chart.get_attribute("aria-label")  # updated by HTMX polling, no reload
    assert page.locator("#run-step").inner_text() == "5"
    with live_server.session() as db:
        db.get(TrainingRun, run_id).state = "succeeded"
        db.commit()
    page.wait_for_function("() => document.querySelector('#run-state').textContent === 'succeeded'", timeout=15000)
    assert page.console_errors == []  # type: ignore[attr-defined]
