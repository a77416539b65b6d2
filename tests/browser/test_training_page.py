"""The run page follows a run while it goes: charts gain points, one progress figure, the log panel follows its end
like `tail -f` (unless the reader scrolled up), every scrollable region can be reached by keyboard; the training
form shows the chosen kind's default model and fields. No console errors (the CSP is strict)."""

from __future__ import annotations

import json
import time

import pytest

from app.accounts import users
from app.models import Job, TrainingRun
from app.projects import projects
from tests.browser.conftest import settle

PASSWORD = "correct horse battery staple"
pytestmark = pytest.mark.slow


def _login(page, base: str) -> None:  # type: ignore[no-untyped-def]
    page.goto(f"{base}/login")
    page.fill("input[name=email]", "eng@example.org")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")


def _running_run(live_server, tmp_path):  # type: ignore[no-untyped-def]
    out = tmp_path / "runs" / "1"
    out.mkdir(parents=True)
    (tmp_path / "jobs").mkdir()
    with live_server.session() as db:
        eng = users.create_user(db, "eng@example.org", PASSWORD, "lead")
        project = projects.create_project(db, eng, name="Runs", completions_per_prompt=2, overlap=1,
                                          rubric_text="r", criteria=[])
        job = Job(kind="train", payload={}, state="running", result={}, project_id=project.id)
        db.add(job)
        db.flush()
        run = TrainingRun(project_id=project.id, kind="grpo", state="running", config={}, job_id=job.id,
                          metrics_path=str(out / "metrics.jsonl"), model_dir=str(out / "model"))
        db.add(run)
        db.commit()
        return run.id, out, tmp_path / "jobs" / f"{job.id}.log"


def _step(out, log, step: int, total: int = 20) -> None:  # type: ignore[no-untyped-def]
    """What the trainer and the job write at a step: a metrics row, the job's progress line and its figures."""
    with (out / "metrics.jsonl").open("a") as fh:
        fh.write(json.dumps({"step": step, "loss": 1.0 / step, "reward_mean": 0.1 * step, "kl": 0.01 * step}) + "\n")
    line = f"step {step}/{total}, about {(total - step) * 7} s left"
    (out / "progress.json").write_text(json.dumps({"step": step, "total": total, "eta_s": (total - step) * 7,
                                                   "line": line, "at": "2099-01-01T00:00:00+00:00"}))
    with log.open("a") as fh:
        fh.write("".join(f"trainer output {step}.{i}\n" for i in range(15)) + f"progress: {line}\n")


def _scrollable_regions_are_focusable(page) -> list[str]:  # type: ignore[no-untyped-def]
    """axe's scrollable-region-focusable, and a name for each: elements that scroll must take focus and say what
    they are."""
    return page.evaluate("""() => [...document.querySelectorAll('body *')].filter(el => {
        const s = getComputedStyle(el);
        const scrolls = (/(auto|scroll)/.test(s.overflowY) && el.scrollHeight > el.clientHeight)
                     || (/(auto|scroll)/.test(s.overflowX) && el.scrollWidth > el.clientWidth);
        const named = el.getAttribute('aria-label') || el.getAttribute('aria-labelledby');
        return scrolls && el.offsetParent !== null && !(el.tabIndex >= 0 && named);
      }).map(el => el.outerHTML.slice(0, 80))""")


def test_run_page_follows_the_run_and_its_log(live_server, page, tmp_path) -> None:  # type: ignore[no-untyped-def]
    run_id, out, log = _running_run(live_server, tmp_path)
    for step in (1, 2):
        _step(out, log, step)
    _login(page, live_server.base)
    page.goto(f"{live_server.base}/training-runs/{run_id}")
    chart = page.locator('figure.chart[data-metric="reward_mean"] svg')
    assert "2 points" in chart.get_attribute("aria-label")
    assert page.locator("#run-progress").inner_text() == "2/20 steps"
    panel = page.locator("#run-log")
    at_end = "el => el.scrollHeight - el.scrollTop - el.clientHeight <= 8"
    assert panel.evaluate("el => el.scrollHeight > el.clientHeight") and panel.evaluate(at_end)
    assert _scrollable_regions_are_focusable(page) == []

    for step in range(3, 6):
        _step(out, log, step)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and "5 points" not in (chart.get_attribute("aria-label") or ""):
        time.sleep(0.25)
    assert "5 points" in chart.get_attribute("aria-label")  # updated by HTMX polling, no reload
    # One figure, the log's: the tiles say what the last progress line says.
    assert page.locator("#run-progress").inner_text() == "5/20 steps"
    assert "progress: step 5/20, about 105 s left" in panel.inner_text()
    assert page.locator("#run-eta").inner_text() == "1 min 45 s"
    settle(page)
    assert panel.evaluate(at_end), "the log panel no longer shows its last line after a poll"

    # Scrolled up to read: the next polls keep the reader's place.
    panel.evaluate("el => { el.scrollTop = 10; }")
    _step(out, log, 6)
    page.wait_for_function("() => document.querySelector('#run-progress').textContent.startsWith('6/20')",
                           timeout=15000)
    settle(page)
    assert panel.evaluate("el => el.scrollTop") == 10
    panel.evaluate("el => { el.scrollTop = el.scrollHeight; }")  # back at the end: following again
    _step(out, log, 7)
    page.wait_for_function("() => document.querySelector('#run-progress').textContent.startsWith('7/20')",
                           timeout=15000)
    settle(page)
    assert panel.evaluate(at_end) and "progress: step 7/20" in panel.inner_text()

    # Every step done, the run still going: it is evaluating and saving, not "0 s" left for minutes.
    _step(out, log, 20)
    page.wait_for_function("() => document.querySelector('#run-progress').textContent.startsWith('20/20')",
                           timeout=15000)
    assert page.locator("#run-eta").inner_text() == "the steps are done: evaluating and saving"

    with live_server.session() as db:
        db.get(TrainingRun, run_id).state = "succeeded"
        db.commit()
    page.wait_for_function("() => document.querySelector('#run-state').textContent === 'succeeded'", timeout=15000)
    assert page.locator("#run-eta").count() == 0
    assert page.console_errors == []  # type: ignore[attr-defined]


def test_finished_run_draws_its_evaluation_for_people(live_server, page, tmp_path) -> None:  # type: ignore[no-untyped-def]
    run_id, out, log = _running_run(live_server, tmp_path)
    _step(out, log, 1, total=1)
    k = {"1": 0.25, "2": 0.4, "3": 0.5, "4": 0.55}
    (out / "eval.json").write_text(json.dumps({"reward_mean": {"policy": 0.6, "reference": 0.2}, "kl": 0.3,
                                               "curves": {"pass_at": {"policy": k}, "maj_at": {"policy": k}}}))
    (out / "samples.jsonl").write_text("".join(json.dumps({"prompt": "q", "model": m, "answer": "a", "reward": r})
                                               + "\n" for m, r in [("policy", 0.9), ("reference", 0.1)] * 4))
    with live_server.session() as db:
        db.get(TrainingRun, run_id).state = "succeeded"
        db.commit()
    _login(page, live_server.base)
    page.goto(f"{live_server.base}/training-runs/{run_id}")
    evaluation = page.locator("#evaluation")
    assert evaluation.locator('figure[data-metric="pass_at"]').is_visible()
    assert evaluation.locator('figure[data-metric="reward_before_after"]').is_visible()
    assert evaluation.locator("#eval-table th[scope=row]", has_text="reward_mean").is_visible()
    raw = evaluation.locator("details pre")
    assert not raw.is_visible()  # the JSON is there for whoever opens it, not in the way
    evaluation.locator("details summary").click()
    assert '"reward_mean"' in raw.inner_text()
    assert _scrollable_regions_are_focusable(page) == []
    assert page.console_errors == []  # type: ignore[attr-defined]


def test_the_form_shows_the_chosen_kinds_default_and_fields(live_server, page, tmp_path) -> None:  # type: ignore[no-untyped-def]
    _running_run(live_server, tmp_path)
    _login(page, live_server.base)
    page.goto(f"{live_server.base}/projects/1/training")
    hint = page.locator("#base-model-default")
    assert "shipped MiniLM" in hint.inner_text() and "grpo" not in hint.inner_text()  # reward is chosen first
    page.locator("#config-fields > summary").click()
    fields = page.locator("#config-fields")
    assert fields.locator("code", has_text="use_margin").first.is_visible()
    assert not fields.locator("code", has_text="group_size").first.is_visible()
    page.select_option("select[name=kind]", "grpo")
    assert "grpo" in hint.inner_text() and "must name a causal LM" in hint.inner_text()  # no default is set here
    assert fields.locator("code", has_text="group_size").first.is_visible()
    assert not fields.locator("code", has_text="use_margin").first.is_visible()
    assert page.console_errors == []  # type: ignore[attr-defined]
