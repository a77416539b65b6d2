"""Monte-Carlo step labels started from the judge page in Chromium: a refused start keeps the form, names the field
and focuses it; a good one lands on the jobs page, and the worker's labels show on the job."""

from __future__ import annotations

import pytest

from app.accounts import users
from app.annotation import steps
from app.models import Completion, Prompt
from app.projects import projects
from app.worker import Worker
from tests.training.tiny import char_tokenizer, save_tiny, silent_gpt2

PASSWORD = "correct horse battery staple"
pytestmark = pytest.mark.slow
ANSWER = "3 + 4 = 7 apples.\nHe gives 2 away: 7 - 2 = 5.\nA: 5"


def test_a_lead_starts_monte_carlo_step_labels_from_the_judge_page(live_server, page, tmp_path) -> None:  # type: ignore[no-untyped-def]
    tokenizer = char_tokenizer()
    model_dir = save_tiny(silent_gpt2(tokenizer), tokenizer, tmp_path / "policy")
    with live_server.session() as db:
        lead = users.create_user(db, "lead@example.org", PASSWORD, "lead")
        project = projects.create_project(db, lead, name="Apples", completions_per_prompt=2, overlap=1,
                                          rubric_text="Rank correct answers first.", criteria=["Correctness"])
        steps.set_options(db, project, lead, enabled=True, separator=None)
        db.add(Prompt(project_id=project.id, text="Tom has 3 apples, buys 4 and gives 2 away. How many?",
                      text_hash="apples", reference="#### 5",
                      completions=[Completion(text=ANSWER), Completion(text=ANSWER.replace("5", "4"))]))
        db.commit()
        pid = project.id

    page.goto(f"{live_server.base}/login")
    page.fill("input[name=email]", "lead@example.org")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(lambda url: "/login" not in url)
    page.goto(f"{live_server.base}/projects/{pid}/judge")
    form = page.locator("#mc-form")
    form.locator("input[name=model]").fill(str(tmp_path / "nowhere"))
    form.locator("input[name=n]").fill("2")
    form.locator("button[type=submit]").click()
    page.wait_for_load_state()
    # Refused: the message sits by this form, names the field by its label, and the field has the focus.
    refusal = page.locator("#mc-step-labels p[data-refusal]")
    assert "Policy model directory" in refusal.inner_text() and "not found" in refusal.inner_text()
    assert page.evaluate("document.activeElement.closest('#mc-form') !== null "
                         "&& document.activeElement.name === 'model'")
    assert page.locator("#mc-form input[name=n]").input_value() == "2"  # what was typed stays

    page.locator("#mc-form input[name=model]").fill(str(model_dir))
    page.locator("#mc-form select[name=estimate]").select_option("soft")
    page.locator("#mc-form button[type=submit]").click()
    page.wait_for_url(f"{live_server.base}/projects/{pid}/jobs")
    assert "mc_step_labels" in page.locator("main").inner_text()

    worker = Worker(live_server.settings, session_factory=live_server.app.state.session_factory, heartbeat_s=0.2)
    assert worker.run_one()
    page.goto(f"{live_server.base}/projects/{pid}/judge")
    assert "Monte-Carlo steps · N=2 · soft · policy" in page.locator("main").inner_text()
    page.goto(f"{live_server.base}/projects/{pid}/jobs")
    assert "succeeded" in page.locator("main").inner_text()
    # The refused start's own page came with status 422, which Chromium reports; nothing else went wrong.
    unexpected = [e for e in page.console_errors if "status of 422" not in e]  # type: ignore[attr-defined]
    assert unexpected == []
