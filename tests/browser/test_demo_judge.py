"""The lead's judge run in the demo, in Chromium with a worker beside the server: the form offers the demo's
SmolLM2-135M-Instruct and the prompts the annotators ranked, the run finishes, and the judge page shows agreement
figures against the annotators; the page checked at laptop and phone size."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest

from app.demo.seed import setup_demo
from app.worker import Worker
from tests.app.test_training_demo import _rank_some
from tests.browser.conftest import LiveServer
from tests.browser.screens import shoot
from tests.browser.test_annotate_page import page  # noqa: F401 - fixture: fails on any console error

pytestmark = pytest.mark.slow


@pytest.fixture
def demo(tmp_path: Path, smollm2: Path):  # type: ignore[no-untyped-def]
    """The demo's server and worker on a data directory that holds the prepared SmolLM2 (the session's copy stands in
    for the demo's first-run conversion, which tests/training/test_base_model.py covers)."""
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / smollm2.name).symlink_to(smollm2, target_is_directory=True)
    server = LiveServer(tmp_path)
    server.start()
    accounts, project_id = setup_demo(server.settings)
    worker = Worker(server.settings, session_factory=server.app.state.session_factory, poll_s=0.2, heartbeat_s=0.5)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    yield server, {email: password for _, email, password in accounts}, project_id
    worker.terminating = True
    thread.join(timeout=300)
    server.stop()


def test_the_lead_runs_the_demo_judge_and_sees_agreement_with_the_annotators(demo, page, chromium) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    server, passwords, pid = demo
    _rank_some(server.app, passwords, pid, per_annotator=1)
    base = server.base
    page.goto(f"{base}/login")
    page.fill("input[name=email]", "lead@example.org")
    page.fill("input[name=password]", passwords["lead@example.org"])
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/projects")

    page.goto(f"{base}/projects/{pid}/judge")
    model = page.locator("input[name=model]").input_value()
    assert Path(model).name == "smollm2-135m-instruct" and Path(model, "config.json").is_file()
    assert page.locator("input[name=scope][value=human_ranked]").is_checked()
    page.get_by_role("button", name="Start judge run").click()
    page.wait_for_url(f"**/projects/{pid}/jobs")

    page.goto(f"{base}/projects/{pid}/judge")
    # The runs table follows the run (no reload) and says when it has ended.
    page.wait_for_selector("#judge-run-ended", timeout=900_000)
    state = page.locator("#judge-runs .state").first.inner_text()
    result = page.locator("#judge-runs td.msg").first.inner_text()
    assert state == "succeeded", result
    assert re.search(r"judged [12] of [12] prompts", result), result
    page.click("#judge-run-ended a")
    page.wait_for_load_state()
    assert int(page.locator("#judge-prompts").inner_text()) >= 1
    assert re.fullmatch(r"[01]\.\d\d", page.locator("#judge-pair-agreement").inner_text())
    assert re.fullmatch(r"-?[01]\.\d\d", page.locator("#judge-tau").inner_text())
    assert page.locator("#no-calibration").count() == 0  # a calibration chart, not "nothing to draw"
    shoot(page, "demo-judge")

    phone = chromium.new_context(viewport={"width": 390, "height": 844})
    try:
        small = phone.new_page()
        small.goto(f"{base}/login")
        small.fill("input[name=email]", "lead@example.org")
        small.fill("input[name=password]", passwords["lead@example.org"])
        small.click("button[type=submit]")
        small.goto(f"{base}/projects/{pid}/judge")
        # Nothing wider than the phone: the runs table scrolls in its own box.
        assert small.evaluate("() => document.documentElement.scrollWidth") <= 390
        shoot(small, "demo-judge")
    finally:
        phone.close()
