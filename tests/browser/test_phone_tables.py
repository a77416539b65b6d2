"""Wide things on a phone: the project's members and the training runs scroll in their own box, a long address in
the top bar is cut with an ellipsis, and the page never scrolls sideways."""

from __future__ import annotations

import pytest

from app.accounts import users
from app.models import Job
from app.projects import projects
from tests.browser.test_annotate_page import PASSWORD, _login, new_page  # noqa: F401 - fixture
from tests.browser.test_exports_page import PHONE

pytestmark = pytest.mark.slow
LONG = "a.lead.with.a.rather.long.address@annotation-team.example.org"
# What sticks out of the page, leaving out what scrolls inside its own box.
WIDE = """() => [...document.querySelectorAll('body *')].filter(e => e.getBoundingClientRect().right > innerWidth + 1
  && !e.closest('.table-scroll')).slice(0, 5).map(e => e.tagName + '.' + e.className)"""


def test_the_project_and_training_pages_do_not_scroll_sideways_on_a_phone(live_server, new_page) -> None:  # noqa: F811
    with live_server.session() as db:
        lead = users.create_user(db, LONG, PASSWORD, "lead")
        project = projects.create_project(db, lead, name="Tables", completions_per_prompt=2, overlap=1,
                                          rubric_text="r", criteria=[])
        for i in range(3):
            person = users.create_user(db, f"annotator{i}@example.org", PASSWORD, "annotator")
            projects.add_member(db, project, lead, email=person.email, role="annotator")
        project_id = project.id
        db.commit()
    pg = new_page(**PHONE)
    _login(pg, live_server.base, LONG)
    for url in (f"/projects/{project_id}", f"/projects/{project_id}/training"):
        pg.goto(live_server.base + url)
        assert pg.evaluate("document.documentElement.scrollWidth") <= PHONE["width"], (url, pg.evaluate(WIDE))
        who = pg.locator("header.top a.who")
        assert who.get_attribute("title") == LONG  # the whole address is one hover away
        assert pg.evaluate("e => e.scrollWidth > e.clientWidth", who.element_handle())  # cut, not wrapped


def test_the_admin_lists_stack_each_row_on_a_phone(live_server, new_page) -> None:  # noqa: F811
    """A cluster's and a model endpoint's row is a whole form: on a phone it is read top to bottom, not side to side."""
    with live_server.session() as db:
        admin = users.create_user(db, "admin@example.org", PASSWORD, "admin")
        db.commit()
    pg = new_page(**PHONE)
    _login(pg, live_server.base, admin.email)
    pg.goto(live_server.base + "/admin/clusters")
    form = pg.locator("form[action='/admin/clusters']")
    form.locator("input[name=name]").fill("hpc")
    form.locator("input[name=login]").fill("preflab@login.hpc")
    form.locator("input[name=shared_dir]").fill("/shared/preflab")
    form.locator("button[type=submit]").click()
    pg.wait_for_load_state()
    assert pg.locator("table.list input[name=login]").input_value() == "preflab@login.hpc"
    with live_server.session() as db:
        project = projects.create_project(db, db.merge(admin), name="Jobs", completions_per_prompt=2, overlap=1,
                                          rubric_text="r", criteria=[])
        db.add(Job(kind="sample_completions", payload={}, state="running", project_id=project.id,
                   result={"done": 3, "total": 8, "message": "sampling 8 prompts with hf:smollm2-135m-instruct, "
                                                             "batch of 8 prompts written (24 completions so far)"}))
        db.commit()
        jobs_page = f"/projects/{project.id}/jobs"
    for url in ("/admin/clusters", "/admin/endpoints", jobs_page):
        pg.goto(live_server.base + url)
        assert pg.evaluate("document.documentElement.scrollWidth") <= PHONE["width"], (url, pg.evaluate(WIDE))
    # The jobs list is stacked too, not left to scroll sideways in its box: a job's message is read whole.
    box = pg.locator("#job-table .table-scroll")
    assert pg.evaluate("e => e.scrollWidth <= e.clientWidth", box.element_handle())
    assert pg.get_by_text("24 completions so far").is_visible()
