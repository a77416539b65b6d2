"""Constitutions: validated principles, immutable versions with conflicts, editor and history pages."""

from __future__ import annotations

import re

from app.projects import constitutions

PRINCIPLE = {"name": "harmless", "rationale": "r", "priority": 1, "comparison": "Which is less harmful?",
             "critique": "Critique it.", "revision": "Revise it."}


def test_versions_conflicts_and_listing(db, make_user, make_project, token_for, api) -> None:
    lead = make_user(db, "lead")
    project = make_project(db, lead=lead)
    client = api(token_for(db, lead))
    db.commit()
    url = f"/api/projects/{project.id}/constitutions"
    first = client.post(url, json={"principles": [PRINCIPLE]})
    assert first.status_code == 201 and first.json()["version"] == 1
    second = client.post(url, json={"principles": [PRINCIPLE | {"name": "honest"}], "base_version": 1})
    assert second.status_code == 201 and second.json()["version"] == 2
    stale = client.post(url, json={"principles": [PRINCIPLE], "base_version": 1})
    assert stale.status_code == 409 and stale.json()["detail"][0]["field"] == "base_version"
    listed = client.get(url).json()
    assert [(c["version"], c["current"]) for c in listed] == [(2, True), (1, False)]
    assert client.get(f"{url}/1").json()["principles"][0]["name"] == "harmless"


def test_bad_principles_name_the_field(db, make_user, make_project, token_for, api) -> None:
    lead, annotator = make_user(db, "lead"), make_user(db, "annotator")
    project = make_project(db, lead=lead)
    client = api(token_for(db, lead))
    from app.projects import projects

    projects.add_member(db, project, lead, email=annotator.email, role="annotator")
    ann_client = api(token_for(db, annotator))
    db.commit()
    url = f"/api/projects/{project.id}/constitutions"
    r = client.post(url, json={"principles": [PRINCIPLE, PRINCIPLE]})
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "principles[1].name"
    r = client.post(url, json={"principles": [PRINCIPLE | {"comparison": ""}]})
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "principles.0.comparison"
    r = client.post(url, json={"principles": []})
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "principles"
    assert ann_client.post(url, json={"principles": [PRINCIPLE]}).status_code == 403


def test_default_constitution_is_valid_and_ordered(db, make_user, make_project) -> None:
    lead = make_user(db, "lead")
    project = make_project(db, lead=lead)
    row = constitutions.ensure_default(db, project, lead)
    assert row.version == 1 and [p["name"] for p in row.principles][:3] == ["harmless", "honest", "helpful"]
    assert constitutions.ensure_default(db, project, lead).id == row.id


def test_editor_saves_a_version_and_history_shows_the_diff(db, make_user, make_project, browser) -> None:
    lead = make_user(db, "lead")
    project = make_project(db, lead=lead)
    db.commit()
    page = browser()
    page.login(lead.email)
    editor = page.get(f"/projects/{project.id}/constitution")
    assert editor.status_code == 200 and "harmless" in editor.text  # the default is offered to start from
    form = {"base_version": "0", "note": "first",
            "p-0-name": "kind", "p-0-priority": "1", "p-0-comparison": "Which is kinder? <script>x</script>",
            "p-0-rationale": "", "p-0-critique": "", "p-0-revision": "",
            "p-1-name": "", "p-1-comparison": ""}
    r = page.post(f"/projects/{project.id}/constitution", form)
    assert r.status_code == 303
    r = page.post(f"/projects/{project.id}/constitution", form | {"base_version": "1", "p-0-name": "gentle"})
    assert r.status_code == 303
    history = page.get(f"/projects/{project.id}/constitution/history").text
    assert 'id="v2"' in history
    # One line per principle heading, marked added or removed, the changed word highlighted (templates/_diff.html).
    added = re.search(r'<span class="d-add">.*?</span></span>', history.replace("\n", " "))
    assert added and "gentle" in added.group(0) and "priority 1" in added.group(0), history
    assert re.search(r'<span class="sr">removed: </span>## <del>kind</del> \(priority 1\)', history), history
    assert "<script>x</script>" not in history and "&lt;script&gt;x&lt;/script&gt;" in history
    stale = page.post(f"/projects/{project.id}/constitution", form)
    assert stale.status_code == 409 and "Someone saved version 2" in stale.text
