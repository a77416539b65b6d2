"""Every link a member sees leads to a page their role may use: an annotator (or an engineer) who follows the
project's links from page to page never meets a refusal."""

from __future__ import annotations

import pytest

from app.accounts import users
from app.exports import service as exports
from app.models import Project
from app.projects import projects
from tests.browser.test_annotate_page import PASSWORD, _login, _seed, new_page  # noqa: F401 - fixture

pytestmark = pytest.mark.slow


def _crawl(pg, base: str, start: str) -> dict[str, int]:  # type: ignore[no-untyped-def]
    """Status of every same-site page reachable by links from `start` (downloads and the API left out)."""
    seen: dict[str, int] = {}
    todo = [start]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        response = pg.goto(base + path)
        seen[path] = response.status if response else 0
        if seen[path] != 200 or path.startswith("/docs"):
            continue
        for href in pg.eval_on_selector_all("a[href^='/']", "els => els.map(e => e.getAttribute('href'))"):
            target = href.split("#")[0]
            if target and not target.startswith(("/api/", "/static/")) and target not in seen:
                todo.append(target)
    return seen


@pytest.mark.parametrize("role", ["annotator", "engineer"])
def test_no_link_leads_a_member_to_a_page_their_role_refuses(live_server, new_page, role) -> None:  # noqa: F811
    project_id, email = _seed(live_server, n_prompts=1, answer=lambda i, j: f"Answer {i}.{j}")
    with live_server.session() as db:
        project = db.get(Project, project_id)
        lead = users.get_by_email(db, "lead@example.org")
        if role == "engineer":
            email = users.create_user(db, "eng@example.org", PASSWORD, "engineer").email
            projects.add_member(db, project, lead, email=email, role="engineer")
        exports.request_export(db, project, lead, "pairs", "jsonl")  # an export and its job to link to
        db.commit()
    pg = new_page()
    _login(pg, live_server.base, email)
    seen = _crawl(pg, live_server.base, f"/projects/{project_id}")
    assert len(seen) > 8, seen
    assert {path: status for path, status in seen.items() if status != 200} == {}
