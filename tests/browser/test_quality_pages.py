"""The quality pages in Chromium: the exports list follows a queued export until it is ready, then stops asking;
a lead sees the flagged annotator and clicks through to the rows; the AI-labels button cannot be pressed early."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import select

from app.accounts import users
from app.exports import service as exports
from app.models import Completion, Export, Job, Prompt, Ranking
from app.projects import projects

PASSWORD = "correct horse battery staple"
pytestmark = pytest.mark.slow


def _login(page, base: str, email: str) -> None:  # type: ignore[no-untyped-def]
    page.goto(f"{base}/login")
    page.fill("input[name=email]", email)
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(lambda url: "/login" not in url)


def _lead_and_project(db):  # type: ignore[no-untyped-def]
    lead = users.create_user(db, "lead@example.org", PASSWORD, "lead")
    project = projects.create_project(db, lead, name="Quality", completions_per_prompt=4, overlap=2,
                                      rubric_text="Rank correct answers first.", criteria=["Correctness"])
    return lead, project


def test_the_exports_list_refreshes_while_an_export_is_queued_and_stops_when_done(live_server, page) -> None:  # type: ignore[no-untyped-def]
    with live_server.session() as db:
        lead, project = _lead_and_project(db)
        export = exports.request_export(db, project, lead, "pairs", "jsonl")  # queued: no worker runs here
        db.commit()
        pid, export_id, job_id = project.id, export.id, export.job_id
    _login(page, live_server.base, "lead@example.org")
    page.goto(f"{live_server.base}/projects/{pid}/exports")
    assert page.locator("#export-table .state").first.inner_text() == "queued"
    assert page.locator("#export-table").get_attribute("hx-trigger") == "every 2s"

    with live_server.session() as db:  # what the worker does when it finishes
        row = db.get(Export, export_id)
        row.sha256, row.files, row.row_count, row.path = "ab" * 32, {"pairs.jsonl": "ab" * 32}, 0, "/nowhere"
        db.get(Job, job_id).state = "succeeded"
        db.commit()
    page.wait_for_function("() => document.querySelector('#export-table .state').textContent === 'ready'",
                           timeout=15000)  # no reload: the list asked again by itself
    assert page.locator("#export-table").get_attribute("hx-trigger") is None  # and stops asking now
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url) if "/exports" in r.url else None)
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:  # three poll intervals pass without a request
        page.wait_for_timeout(250)
    assert requests == []
    assert page.console_errors == []  # type: ignore[attr-defined]


def test_a_lead_sees_the_flagged_annotator_and_clicks_through_to_the_rows(live_server, page) -> None:  # type: ignore[no-untyped-def]
    with live_server.session() as db:
        lead, project = _lead_and_project(db)
        people = {}
        for who in ("careful", "fast"):
            people[who] = users.create_user(db, f"{who}@example.org", PASSWORD, "annotator")
            projects.add_member(db, project, lead, email=people[who].email, role="annotator")
        for i in range(6):
            prompt = Prompt(project_id=project.id, text=f"What is {i} + 1?", text_hash=f"{i:064d}",
                            completions=[Completion(text=f"answer {x}") for x in "abcd"])
            db.add(prompt)
            db.flush()
            ids = [c.id for c in prompt.completions]
            db.add(Ranking(project_id=project.id, prompt_id=prompt.id, source="human", annotator_id=people["careful"].id,
                           rubric_id=project.current_rubric_id, tiers=[[c] for c in ids],
                           display_order=ids[i % 4:] + ids[:i % 4], seconds_spent=40.0))
            db.add(Ranking(project_id=project.id, prompt_id=prompt.id, source="human", annotator_id=people["fast"].id,
                           rubric_id=project.current_rubric_id, tiers=[[c] for c in ids[::-1]],
                           display_order=ids[::-1], seconds_spent=0.2))
        db.commit()
        pid = project.id
    _login(page, live_server.base, "lead@example.org")
    page.goto(f"{live_server.base}/projects/{pid}/agreement")
    flag = page.locator('#attention .agr-flag[data-flag="too_fast"]')
    assert "fast@example.org" in flag.inner_text() and "too little time to read" in flag.inner_text()
    # Coloured: the flag stands out from the neutral panels around it.
    colour = flag.evaluate("e => getComputedStyle(e).borderLeftColor")
    neutral = page.locator("#agreement-summary div").first.evaluate("e => getComputedStyle(e).borderLeftColor")
    assert colour != neutral
    flag.get_by_role("link", name="Their rankings").click()
    page.wait_for_url(f"**/agreement/annotators/{people['fast'].id}?view=all")
    assert page.locator("#rankings tbody tr").count() == 6
    row = page.locator("#rankings tbody tr").first
    assert "D > C > B > A" in row.inner_text() and "What is " in row.locator("th").inner_text()  # the prompt
    row.locator("details summary").click()  # and what the letters stand for
    assert row.locator("dl.agr-letters dd").first.is_visible() and "answer a" in row.locator("dl").inner_text()

    page.goto(f"{live_server.base}/projects/{pid}/agreement")
    page.locator("#mean-agreement a").click()
    page.wait_for_url("**/agreement/prompts")
    assert page.locator("article.agr-prompt").count() == 6
    assert page.console_errors == []  # type: ignore[attr-defined]


def test_allow_ai_labels_cannot_be_pressed_without_evidence(live_server, page) -> None:  # type: ignore[no-untyped-def]
    with live_server.session() as db:
        _, project = _lead_and_project(db)
        db.commit()
        pid = project.id
    _login(page, live_server.base, "lead@example.org")
    page.goto(f"{live_server.base}/projects/{pid}/judge")
    button = page.locator("#allow-ai-labels")
    assert button.is_disabled()
    assert "no agreement with humans measured yet" in page.locator("#gate-missing").inner_text()
    with live_server.session() as db:
        assert not db.scalar(select(Export.id))  # nothing else happened on the way
    assert page.console_errors == []  # type: ignore[attr-defined]
