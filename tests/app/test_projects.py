"""Projects through the API and the pages: creation, visibility by membership, members, counts."""

from __future__ import annotations

import pytest


def _project_body(name: str = "Maths", **over: object) -> dict:
    body = {"name": name, "completions_per_prompt": 4, "overlap": 2,
            "rubric": {"text": "Rank **correct** first.", "criteria": ["Correctness", "Clarity"]}}
    body.update(over)
    return body


def test_lead_creates_lists_and_gets_a_project(db, make_user, token_for, api) -> None:
    lead = make_user(db, "lead")
    client = api(token_for(db, lead))
    db.commit()
    created = client.post("/api/projects", json=_project_body())
    assert created.status_code == 201
    body = created.json()
    assert body | {"id": 0, "created_at": ""} == {
        "id": 0, "name": "Maths", "description": "", "completions_per_prompt": 4, "overlap": 2,
        "rubric_version": 1, "created_at": "", "step_labels": False, "step_separator": None}
    assert [p["id"] for p in client.get("/api/projects").json()] == [body["id"]]
    assert client.get(f"/api/projects/{body['id']}").json()["name"] == "Maths"
    assert client.post("/api/projects", json=_project_body()).status_code == 409  # same name


@pytest.mark.parametrize(("override", "field"), [
    ({"completions_per_prompt": 1}, "completions_per_prompt"),
    ({"overlap": 0}, "overlap"),
    ({"name": ""}, "name"),
    ({"rubric": {"text": "", "criteria": []}}, "rubric.text"),
    ({"k": 3}, "k"),
])
def test_invalid_project_names_the_field(db, make_user, token_for, api, override, field) -> None:
    lead = make_user(db, "lead")
    client = api(token_for(db, lead))
    db.commit()
    r = client.post("/api/projects", json=_project_body(**override))
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == field


def test_annotators_cannot_create_projects(db, make_user, token_for, api) -> None:
    annotator = make_user(db, "annotator")
    client = api(token_for(db, annotator))
    db.commit()
    assert client.post("/api/projects", json=_project_body()).status_code == 403


def test_member_of_project_a_gets_404_on_every_object_of_project_b(db, make_user, make_project, token_for,
                                                                    api) -> None:
    lead_a, lead_b = make_user(db, "lead"), make_user(db, "lead")
    a, b = make_project(db, lead=lead_a), make_project(db, lead=lead_b)
    client = api(token_for(db, lead_a))
    db.commit()
    assert client.get(f"/api/projects/{a.id}").status_code == 200
    for method, path, kw in [
        ("get", f"/api/projects/{b.id}", {}),
        ("get", f"/api/projects/{b.id}/rubrics", {}),
        ("get", f"/api/projects/{b.id}/rubrics/1", {}),
        ("get", f"/api/projects/{b.id}/members", {}),
        ("post", f"/api/projects/{b.id}/rubrics", {"json": {"text": "x", "criteria": [], "base_version": 1}}),
        ("post", f"/api/projects/{b.id}/members", {"json": {"email": lead_a.email, "role": "lead"}}),
        ("post", f"/api/projects/{b.id}/imports", {"files": {"file": ("a.jsonl", b'{"prompt": "p"}\n')}}),
        ("get", "/api/projects/999999", {}),
    ]:
        r = getattr(client, method)(path, **kw)
        assert r.status_code == 404, (method, path, r.status_code)
    assert [p["id"] for p in client.get("/api/projects").json()] == [a.id]


def test_pages_hide_other_projects_too(db, make_user, make_project, browser) -> None:
    lead_a = make_user(db, "lead")
    b = make_project(db)
    db.commit()
    page = browser()
    page.login(lead_a.email)
    for path in [f"/projects/{b.id}", f"/projects/{b.id}/rubric", f"/projects/{b.id}/rubric/history",
                 f"/projects/{b.id}/import"]:
        assert page.get(path).status_code == 404, path
    assert page.post(f"/projects/{b.id}/rubric", {"text": "x", "base_version": "1"}).status_code == 404
    assert page.post(f"/projects/{b.id}/members", {"email": lead_a.email, "role": "lead"}).status_code == 404


def test_lead_adds_members_who_then_see_the_project(db, make_user, make_project, token_for, api) -> None:
    lead, annotator = make_user(db, "lead"), make_user(db, "annotator")
    project = make_project(db, lead=lead)
    lead_client, ann_client = api(token_for(db, lead)), api(token_for(db, annotator))
    db.commit()
    assert ann_client.get(f"/api/projects/{project.id}").status_code == 404
    r = lead_client.post(f"/api/projects/{project.id}/members", json={"email": annotator.email, "role": "annotator"})
    assert r.status_code == 201 and r.json()["role"] == "annotator"
    assert ann_client.get(f"/api/projects/{project.id}").status_code == 200
    # An annotator member may not add members or edit the rubric.
    assert ann_client.post(f"/api/projects/{project.id}/members",
                           json={"email": annotator.email, "role": "lead"}).status_code == 403
    assert ann_client.post(f"/api/projects/{project.id}/rubrics",
                           json={"text": "x", "criteria": [], "base_version": 1}).status_code == 403
    r = lead_client.post(f"/api/projects/{project.id}/members", json={"email": "ghost@example.org", "role": "lead"})
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "email"


def test_admin_sees_every_project(db, make_user, make_project, token_for, api) -> None:
    admin = make_user(db, "admin")
    p1, p2 = make_project(db), make_project(db)
    client = api(token_for(db, admin))
    db.commit()
    assert {p["id"] for p in client.get("/api/projects").json()} == {p1.id, p2.id}


def test_project_page_shows_counts_and_the_rubric(db, make_user, make_project, browser) -> None:
    lead = make_user(db, "lead")
    project = make_project(db, lead=lead, rubric="Prefer *clear* answers.", criteria=["Clarity"])
    db.commit()
    page = browser()
    page.login(lead.email)
    html = page.get(f"/projects/{project.id}").text
    assert '<dd id="count-prompts">0</dd>' in html
    assert "<em>clear</em>" in html and "Clarity" in html


def test_lead_creates_a_project_from_the_page(db, make_user, browser) -> None:
    lead = make_user(db, "lead")
    db.commit()
    page = browser()
    page.login(lead.email)
    r = page.post("/projects", {"name": "From the page", "completions_per_prompt": "3", "overlap": "2",
                                "rubric": "Be right.", "criteria": "Correct\nKind"})
    assert r.status_code == 303
    html = page.get(r.headers["location"]).text
    assert "From the page" in html and "Kind" in html
    bad = page.post("/projects", {"name": "x", "completions_per_prompt": "40", "overlap": "1", "rubric": "r"})
    assert bad.status_code == 422 and "completions_per_prompt" in bad.text


def test_healthz(app, api) -> None:
    assert api(None).get("/healthz").json() == {"status": "ok", "database": "ok"}


def test_healthz_reports_a_dead_database_with_503(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from fastapi.testclient import TestClient

    from app.main import create_app
    from app.platform.settings import Settings

    settings = Settings(database_url="postgresql://nobody@127.0.0.1:1/none", data_dir=tmp_path)
    r = TestClient(create_app(settings)).get("/healthz")
    assert r.status_code == 503 and r.json()["database"] == "down"


def test_security_headers_on_every_page(app, api) -> None:
    r = api(None).get("/login")
    csp = r.headers["content-security-policy"]
    for part in ["default-src 'self'", "object-src 'none'", "base-uri 'none'", "frame-ancestors 'none'"]:
        assert part in csp
    assert "unsafe-eval" not in csp and "unsafe-inline" not in csp
    assert r.headers["x-content-type-options"] == "nosniff"


def test_openapi_documents_the_contract(app, api) -> None:
    spec = api(None).get("/openapi.json").json()
    for path in ["/healthz", "/api/v1/projects", "/api/v1/projects/{project_id}", "/api/v1/projects/{project_id}/rubrics",
                 "/api/v1/projects/{project_id}/imports", "/api/v1/projects/{project_id}/members", "/api/v1/users"]:
        assert path in spec["paths"], path
    assert not any(p.startswith("/projects") for p in spec["paths"])  # pages stay out of the API docs


def test_a_role_is_read_once_per_request_and_follows_every_membership_change(db, make_user, make_project) -> None:
    # The project page asks for the viewer's role for every control it shows; one read serves them all, and a
    # change in the same session (flushed or not), a commit or a rollback makes the next check read it again.
    from sqlalchemy import event

    from app.accounts import permissions
    from app.projects import projects

    lead, engineer = make_user(db, "lead"), make_user(db, "engineer")
    project = make_project(db, lead=lead)
    projects.add_member(db, project, lead, email=engineer.email, role="engineer")
    db.commit()
    roles_read: list[str] = []

    def listener(_conn, _cursor, statement, *_args) -> None:  # type: ignore[no-untyped-def]
        if "FROM project_members" in statement:
            roles_read.append(statement)

    event.listen(db.get_bind(), "before_cursor_execute", listener)
    try:
        for action in ("project.see", "agreement.see", "export.create", "members.manage"):
            permissions.may(db, engineer, project, action)
        assert len(roles_read) == 1
        assert permissions.may(db, engineer, project, "export.create")

        projects.add_member(db, project, lead, email=engineer.email, role="annotator")  # flushed
        assert permissions.member_role(db, project, engineer) == "annotator"
        assert not permissions.may(db, engineer, project, "export.create")

        projects.remove_member(db, project, lead, engineer.id)  # not flushed yet
        assert permissions.member_role(db, project, engineer) is None

        db.rollback()
        assert permissions.member_role(db, project, engineer) == "engineer"
    finally:
        event.remove(db.get_bind(), "before_cursor_execute", listener)


def test_the_project_page_lists_every_member_and_each_remove_form_works(db, make_user, make_project,
                                                                       browser) -> None:
    import re

    from app.projects import projects

    lead = make_user(db, "lead", name="Lena Lead")
    project = make_project(db, lead=lead)
    people = [make_user(db, "annotator", name=f"Ann <{i}>") for i in range(3)]
    for person in people:
        projects.add_member(db, project, lead, email=person.email, role="annotator")
    db.commit()
    page = browser()
    page.login(lead.email)
    html = page.get(f"/projects/{project.id}").text
    for person in people:
        assert person.email in html and person.name.replace("<", "&lt;").replace(">", "&gt;") in html
    removes = re.findall(rf'action="/projects/{project.id}/members/(\d+)/remove"', html)
    assert sorted(map(int, removes)) == sorted([lead.id, *(p.id for p in people)])
    assert len(set(re.findall(r'name="csrf_token" value="([0-9a-f]{64})"', html))) == 1  # one browser, one token
    r = page.post(f"/projects/{project.id}/members/{people[0].id}/remove")
    assert r.status_code == 303
    assert people[0].email not in page.get(f"/projects/{project.id}").text
