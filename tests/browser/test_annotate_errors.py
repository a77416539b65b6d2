"""A refused submit on the ranking page speaks to people: the message names what the page shows (or nothing, for
a hidden field such as the rubric version), never the API's field path, and the ranking stays on screen."""

from __future__ import annotations

import pytest

from app.models import Project, User
from app.projects import rubrics
from tests.browser.test_annotate_page import _login, _seed, page  # noqa: F401 - fixture

pytestmark = pytest.mark.slow


def test_a_rubric_changed_under_the_task_reads_as_a_sentence(live_server, page) -> None:  # noqa: F811
    project_id, email = _seed(live_server, n_prompts=1, answer=lambda i, j: f"answer {j}")
    _login(page, live_server.base, email)
    page.goto(f"{live_server.base}/projects/{project_id}/annotate")
    with live_server.session() as db:  # the lead saves a new rubric while the annotator ranks
        project = db.get(Project, project_id)
        lead = db.query(User).filter_by(email="lead@example.org").one()
        rubrics.create_version(db, project, lead, text="Rank **correct** answers first. Units count.",
                               criteria=["Correct"], base_version=1)
        db.commit()
    page.allowed_console = ["status of 422", "Error Code 422"]  # the refusal itself, as the browser and htmx log it
    for key in ["1", "2", "3", "4", "Control+Enter"]:
        page.keyboard.press(key)
    error = page.locator("#submit-error")
    error.wait_for(state="visible")
    assert error.inner_text().startswith("the rubric changed: you ranked under version 1")
    assert "rubric_version" not in error.inner_text() and "Your ranking is kept" in error.inner_text()
    assert page.locator("#ranked > .resp").count() == 4
