"""Rubric versions: immutable, explicit current version, conflicts instead of silent overwrites, a diff history."""

from __future__ import annotations

import re

import pytest

from app.platform.errors import Conflict
from app.projects import rubrics, versions


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
    from app.projects import projects

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
    diff = re.search(r'<pre class="diff"[^>]*>(.*?)</pre>', html, re.S).group(1)
    assert "\n" not in diff  # one block per line and nothing between them: not double-spaced
    # Word level: "line two" → "line 2" marks only the word that changed.
    assert '<span class="d-del"><span class="d-sign" aria-hidden="true">- </span><span class="sr">removed: </span>' \
           'line <del>two</del></span>' in diff
    assert '<span class="sr">added: </span>line <ins>2</ins></span>' in diff
    assert '<span class="sr">added: </span>- B</span>' in diff  # a new criterion, with no counterpart


def test_word_parts_mark_only_what_changed() -> None:
    left, right = versions.word_parts("Prefer short, correct answers.", "Prefer correct, cited answers.")
    assert [t for k, t in left if k == "changed"] == ["short", "correct"]
    assert [t for k, t in right if k == "changed"] == ["correct", "cited"]
    assert "".join(t for _, t in left) == "Prefer short, correct answers."  # nothing lost
    assert "".join(t for _, t in right) == "Prefer correct, cited answers."


def test_a_criteria_only_conflict_shows_their_criteria_against_yours(db, make_user, make_project, browser) -> None:
    lead = make_user(db, "lead")
    project = make_project(db, lead=lead, rubric="same text", criteria=["Correctness"])
    db.commit()
    page = browser()
    page.login(lead.email)
    page.get(f"/projects/{project.id}/rubric")
    # Someone else adds a criterion; I, on the stale version, change a criterion; the text is the same for both.
    assert page.post(f"/projects/{project.id}/rubric", {"text": "same text", "criteria": "Correctness\nSafety",
                                                        "base_version": "1"}).status_code == 303
    stale = page.post(f"/projects/{project.id}/rubric", {"text": "same text", "criteria": "Correctness, clearly",
                                                         "base_version": "1"})
    assert stale.status_code == 409
    diff = re.search(r'<div id="conflict-diff">(.*?)</div>', stale.text, re.S).group(1)
    assert '<span class="sr">removed: </span>- Safety</span>' in diff  # only theirs: a whole removed line
    assert '<span class="sr">added: </span>- Correctness<ins>, clearly</ins></span>' in diff  # the words I added
    assert "Their criteria" in stale.text and "<li>Safety</li>" in stale.text

    # The same draft as theirs: nothing to merge, and the page says so.
    same = page.post(f"/projects/{project.id}/rubric", {"text": "same text", "criteria": "Correctness\nSafety",
                                                        "base_version": "1"})
    assert same.status_code == 409 and 'id="conflict-same"' in same.text


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
