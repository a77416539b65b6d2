"""Rubric versions: immutable, explicit current version, conflicts instead of silent overwrites, a diff history."""

from __future__ import annotations

import pytest

from app.errors import Conflict
from app.services import rubrics


def test_each_save_is_a_new_version_and_the_old_one_is_kept(db, make_user, make_project, token_for, api) -> None:
    lead = make_user(db, "lead")
    project = make_project(db, lead=lead, rubric="v1 text")
    client = api(token_for(db, lead))
    db.commit()
    r = client.post(f"/api/projects/{project.id}/rubrics",
                    json={"text": "v2 text", "criteria": ["A"], "base_version": 1, "note": "tighter"})
    assert r.status_code == 201 and r.json()["version"] == 2 and r.json()["current"]
    versions = client.get(f"/api/projects/{project.id}/rubrics").json()
    assert [(v["version"], v["text"], v["current"]) for v in versions] == [(2, "v2 text", True),
                                                                         (1, "v1 text", False)]
    assert client.get(f"/api/projects/{project.id}/rubrics/1").json()["text"] == "v1 text"
    assert client.get(f"/api/projects/{project.id}").json()["rubric_version"] == 2
    assert client.get(f"/api/projects/{project.id}/rubrics/7").status_code == 404


def test_second_lead_saving_on_the_same_version_gets_a_conflict(db, make_user, make_project, token_for,
                                                                api) -> None:
    lead1, lead2 = make_user(db, "lead"), make_user(db, "lead")
    project = make_project(db, lead=lead1)
    from app.services import projects

    projects.add_member(db, project, lead1, email=lead2.email, role="lead")
    c1, c2 = api(token_for(db, lead1)), api(token_for(db, lead2))
    db.commit()
    assert c1.post(f"/api/projects/{project.id}/rubrics",
                   json={"text": "first", "criteria": [], "base_version": 1}).status_code == 201
    r = c2.post(f"/api/projects/{project.id}/rubrics", json={"text": "second", "criteria": [], "base_version": 1})
    assert r.status_code == 409 and r.json()["detail"][0]["field"] == "base_version"
    assert c2.get(f"/api/projects/{project.id}/rubrics/2").json()["text"] == "first"
    assert len(c2.get(f"/api/projects/{project.id}/rubrics").json()) == 2


def test_conflict_in_the_service_writes_nothing(db, make_user, make_project) -> None:
    lead = make_user(db, "lead")
    project = make_project(db, lead=lead)
    rubrics.create_version(db, project, lead, text="two", criteria=[], base_version=1)
    with pytest.raises(Conflict):
        rubrics.create_version(db, project, lead, text="stale", criteria=[], base_version=1)
    assert [r.version for r in rubrics.list_versions(db, project)] == [2, 1]


def test_editor_conflict_keeps_the_users_text_and_shows_the_current_version(db, make_user, make_project,
                                                                          browser) -> None:
    lead = make_user(db, "lead")
    project = make_project(db, lead=lead, rubric="original")
    db.commit()
    page = browser()
    page.login(lead.email)
    assert "original" in page.get(f"/projects/{project.id}/rubric").text
    ok = page.post(f"/projects/{project.id}/rubric", {"text": "edited by me", "criteria": "A", "base_version": "1"})
    assert ok.status_code == 303
    stale = page.post(f"/projects/{project.id}/rubric", {"text": "my stale edit", "criteria": "", "base_version": "1"})
    assert stale.status_code == 409
    assert "my stale edit" in stale.text and "Someone saved version 2" in stale.text
    assert 'name="base_version" value="2"' in stale.text  # saving again is on top of the real current version


def test_history_shows_every_version_with_a_diff(db, make_user, make_project, browser) -> None:
    lead = make_user(db, "lead")
    project = make_project(db, lead=lead, rubric="line one\nline two", criteria=["A"])
    rubrics.create_version(db, project, lead, text="line one\nline 2", criteria=["A", "B"], base_version=1,
                           note="renamed")
    db.commit()
    page = browser()
    page.login(lead.email)
    html = page.get(f"/projects/{project.id}/rubric/history").text
    assert 'id="v2"' in html and 'id="v1"' in html and "renamed" in html
    assert '<span class="d-del">- line two</span>' in html
    assert '<span class="d-add">+ line 2</span>' in html
    assert '<span class="d-add">+ - B</span>' in html


def test_rubric_markdown_is_sanitised(db, make_user, make_project, browser) -> None:
    lead = make_user(db, "lead")
    evil = ('**ok** <img src=x onerror=alert(1)> <script>alert(2)</script> [x](javascript:alert(3)) '
            '<div hx-get="/logout" hx-trigger="load">y</div>')
    project = make_project(db, lead=lead, rubric=evil, criteria=['"><svg onload=alert(4)>'])
    db.commit()
    page = browser()
    page.login(lead.email)
    html = page.get(f"/projects/{project.id}").text
    assert "<strong>ok</strong>" in html
    for bad in ["<img src=x", "<script>alert(2)", 'href="javascript', "<svg onload", "<div hx-get"]:
        assert bad not in html, bad
    preview = page.post(f"/projects/{project.id}/rubric/preview", {"text": evil})
    assert "<strong>ok</strong>" in preview.text and "<script>" not in preview.text
