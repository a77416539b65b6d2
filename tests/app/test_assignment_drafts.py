"""Drafts kept on the server per assignment (PUT/GET /api/assignments/{id}/draft), on SQLite and Postgres: only the
task's own annotator sees them, they are checked against the task, and they end with the submit or the lease."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select

from app.annotation import queue, rankings
from app.annotation import tasks as annotation
from app.models import Assignment, AssignmentDraft, Completion, Prompt
from app.projects import projects
from app.schemas import DraftIn


def _seed(db, make_user, make_project, *, n_prompts=1, annotators=1, k=4):  # type: ignore[no-untyped-def]
    lead = make_user(db, "lead")
    project = make_project(db, lead=lead, k=k)
    people = [make_user(db, "annotator") for _ in range(annotators)]
    for person in people:
        projects.add_member(db, project, lead, email=person.email, role="annotator")
    for i in range(n_prompts):
        prompt = Prompt(project_id=project.id, text=f"question {i}", text_hash=f"d{i}-{project.id}", split="train")
        db.add(prompt)
        db.flush()
        db.add_all(Completion(prompt_id=prompt.id, text=f"answer {i}.{j}") for j in range(k))
    db.flush()
    return lead, project, people


def _task(client, project) -> dict:  # type: ignore[no-untyped-def]
    r = client.get(f"/api/projects/{project.id}/tasks/next")
    assert r.status_code == 200, r.text
    return r.json()


def _url(task: dict) -> str:
    return f"/api/assignments/{task['assignment_id']}/draft"


def _ids(task: dict) -> list[int]:
    return [c["id"] for c in task["completions"]]


def test_the_annotator_saves_and_reads_back_their_draft(db, make_user, make_project, token_for, api) -> None:
    _, project, (ann,) = _seed(db, make_user, make_project)
    client = api(token_for(db, ann))
    db.commit()
    task = _task(client, project)
    a, b, c, _ = _ids(task)
    assert client.get(_url(task)).status_code == 204  # nothing saved yet
    body = {"tiers": [[a], [b, c]], "flags": {str(b): ["unsafe"]}, "seconds_spent": 12.5}
    r = client.put(_url(task), json=body)
    assert r.status_code == 200, r.text
    saved = client.get(_url(task)).json()
    assert saved["tiers"] == [[a], [b, c]] and saved["flags"] == {str(b): ["unsafe"]}
    assert saved["seconds_spent"] == 12.5 and saved["assignment_id"] == task["assignment_id"]
    # A second save replaces the first (a card taken out of the ranking again is gone from the draft).
    assert client.put(_url(task), json={"tiers": [[c]]}).status_code == 200
    assert client.get(_url(task)).json()["tiers"] == [[c]]
    assert db.scalar(select(func.count()).select_from(AssignmentDraft)) == 1


def test_no_one_but_the_tasks_annotator_may_read_or_write_it(db, make_user, make_project, token_for, api) -> None:
    lead, project, (ann, other) = _seed(db, make_user, make_project, n_prompts=2, annotators=2)
    admin, outsider = make_user(db, "admin"), make_user(db, "annotator")
    owner = api(token_for(db, ann))
    others = {"other annotator": api(token_for(db, other)), "lead": api(token_for(db, lead)),
              "admin": api(token_for(db, admin)), "outsider": api(token_for(db, outsider))}
    db.commit()
    task = _task(owner, project)
    a, b, *_ = _ids(task)
    assert owner.put(_url(task), json={"tiers": [[a], [b]]}).status_code == 200
    for who, client in others.items():
        assert client.get(_url(task)).status_code == 404, who
        assert client.put(_url(task), json={"tiers": [[b], [a]]}).status_code == 404, who
    assert api(None).get(_url(task)).status_code == 401
    assert api(None).put(_url(task), json={"tiers": []}).status_code == 401  # no credentials to forge: 401, no CSRF 403
    assert owner.get("/api/assignments/999999/draft").status_code == 404
    assert owner.get(_url(task)).json()["tiers"] == [[a], [b]]  # untouched by every refusal


@pytest.mark.parametrize(("case", "field"), [
    ("foreign_completion", "tiers[0][0]"),
    ("twice", "tiers[1][0]"),
    ("empty_tier", "tiers.0"),  # the schema's own rule (minItems 1), named as every schema rule is
    ("tie_not_allowed", "tiers[0]"),
    ("unknown_flag", "flags.{a}"),
    ("flag_on_foreign_completion", "flags.{x}"),
    ("not_an_id", "tiers.0.0"),
    ("unknown_field", "ranks"),
    ("negative_time", "seconds_spent"),
    ("too_many_tiers", "tiers"),
])
def test_bad_drafts_are_refused_naming_the_field(db, make_user, make_project, token_for, api, case,
                                                 field) -> None:
    _, project, (ann,) = _seed(db, make_user, make_project, n_prompts=2)
    client = api(token_for(db, ann))
    db.commit()
    task = _task(client, project)
    a, b, *_ = _ids(task)
    foreign = db.scalar(select(Completion.id).where(Completion.prompt_id != task["prompt"]["id"]))
    if case == "tie_not_allowed":
        project.allow_ties = False
    db.commit()  # on SQLite even a read holds the write lock until the transaction ends
    body = {
        "foreign_completion": {"tiers": [[foreign]]},
        "twice": {"tiers": [[a], [a]]},
        "empty_tier": {"tiers": [[]]},
        "tie_not_allowed": {"tiers": [[a, b]]},
        "unknown_flag": {"flags": {str(a): ["brilliant"]}},
        "flag_on_foreign_completion": {"flags": {str(foreign): ["unsafe"]}},
        "not_an_id": {"tiers": [["first"]]},
        "unknown_field": {"ranks": {str(a): 1}},
        "negative_time": {"seconds_spent": -3},
        "too_many_tiers": {"tiers": [[a]] * 17},
    }[case]
    r = client.put(_url(task), json=body)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["field"] == field.format(a=a, x=foreign)
    assert client.get(_url(task)).status_code == 204  # nothing stored


def test_an_oversized_draft_is_refused_before_it_is_read(db, make_user, make_project, token_for, api) -> None:
    _, project, (ann,) = _seed(db, make_user, make_project)
    client = api(token_for(db, ann))
    db.commit()
    task = _task(client, project)
    body = json.dumps({"tiers": [], "flags": {str(_ids(task)[0]): ["unsafe " * 3000]}})
    r = client.put(_url(task), content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and r.json()["detail"][0]["field"] == "body"


def test_submitting_the_task_clears_its_draft(db, make_user, make_project, token_for, api) -> None:
    _, project, (ann,) = _seed(db, make_user, make_project, n_prompts=2)
    client = api(token_for(db, ann))
    db.commit()
    task = _task(client, project)
    a, b, c, d = _ids(task)
    assert client.put(_url(task), json={"tiers": [[a], [b]]}).status_code == 200
    submit = {"assignment_id": task["assignment_id"], "tiers": [[a], [b], [c], [d]],
              "rubric_version": task["rubric"]["version"], "submission_id": "s1"}
    assert client.post(f"/api/projects/{project.id}/rankings", json=submit).status_code == 201
    assert client.get(_url(task)).status_code == 404  # the task is done: no draft, and no more saving one
    assert client.put(_url(task), json={"tiers": [[a], [b]]}).status_code == 404
    assert db.scalar(select(func.count()).select_from(AssignmentDraft)) == 0
    db.commit()
    # A skip is a submit too.
    task2 = _task(client, project)
    assert client.put(_url(task2), json={"tiers": [[_ids(task2)[0]]]}).status_code == 200
    skip = {"assignment_id": task2["assignment_id"], "tiers": [], "rubric_version": task2["rubric"]["version"],
            "submission_id": "s2", "skipped": True, "skip_reason": "cannot judge"}
    assert client.post(f"/api/projects/{project.id}/rankings", json=skip).status_code == 201
    assert db.scalar(select(func.count()).select_from(AssignmentDraft)) == 0


def test_the_ranking_service_clears_the_draft_in_the_submits_transaction(db, make_user, make_project) -> None:
    """Whoever submits through rankings.submit (the API, the page, a script) ends the draft with the task, and a
    submit that is rolled back keeps it: one transaction."""
    _, project, (ann,) = _seed(db, make_user, make_project)
    assignment = queue.next_task(db, project, ann)
    ids = queue.task_completion_ids(db, assignment.prompt_id, project.completions_per_prompt)
    annotation.save_draft(db, ann, assignment.id, DraftIn(tiers=[[ids[0]]]))
    db.commit()
    body = rankings.RankingInput(tiers=[[i] for i in ids], rubric_version=1, submission_id="svc",
                                 assignment_id=assignment.id)
    with db.begin_nested() as attempt:
        _, created = rankings.submit(db, project, ann, body)
        assert created and db.scalar(select(func.count()).select_from(AssignmentDraft)) == 0
        attempt.rollback()
    assert db.scalar(select(AssignmentDraft.tiers)) == [[ids[0]]]
    rankings.submit(db, project, ann, body)
    db.commit()
    assert db.scalar(select(func.count()).select_from(AssignmentDraft)) == 0


def test_an_expired_lease_takes_its_draft_with_it(db, make_user, make_project, token_for, api) -> None:
    _, project, (ann,) = _seed(db, make_user, make_project)
    client = api(token_for(db, ann))
    db.commit()
    task = _task(client, project)
    a, b, *_ = _ids(task)
    assert client.put(_url(task), json={"tiers": [[a], [b]]}).status_code == 200
    assignment = db.get(Assignment, task["assignment_id"])
    assignment.leased_until = datetime.now(UTC) - timedelta(minutes=1)
    db.commit()
    assert client.get(_url(task)).status_code == 404
    assert client.put(_url(task), json={"tiers": [[b], [a]]}).status_code == 404
    # The same task leased again starts clean.
    again = _task(client, project)
    assert again["assignment_id"] == task["assignment_id"]
    assert client.get(_url(again)).status_code == 204


def test_a_later_save_prunes_the_callers_drafts_of_ended_leases(db, make_user, make_project, token_for,
                                                               api) -> None:
    _, project, (ann,) = _seed(db, make_user, make_project, n_prompts=2)
    other_project = _seed(db, make_user, make_project)[1]
    projects.add_member(db, other_project, db.get(type(ann), other_project.created_by_id), email=ann.email,
                        role="annotator")
    client = api(token_for(db, ann))
    db.commit()
    first = _task(client, project)
    assert client.put(_url(first), json={"tiers": [[_ids(first)[0]]]}).status_code == 200
    db.get(Assignment, first["assignment_id"]).leased_until = datetime.now(UTC) - timedelta(minutes=1)
    db.commit()
    second = _task(client, other_project)
    assert client.put(_url(second), json={"tiers": [[_ids(second)[0]]]}).status_code == 200
    db.expire_all()
    assert db.scalars(select(AssignmentDraft.assignment_id)).all() == [second["assignment_id"]]


def test_the_newer_edit_wins_and_a_late_retry_is_refused(db, make_user, make_project, token_for, api) -> None:
    _, project, (ann,) = _seed(db, make_user, make_project)
    client = api(token_for(db, ann))
    db.commit()
    task = _task(client, project)
    a, b, *_ = _ids(task)
    now = datetime.now(UTC)
    newer = {"tiers": [[a], [b]], "edited_at": (now - timedelta(seconds=5)).isoformat()}
    older = {"tiers": [[b], [a]], "edited_at": (now - timedelta(seconds=60)).isoformat()}
    assert client.put(_url(task), json=newer).status_code == 200
    r = client.put(_url(task), json=older)  # e.g. a phone that was offline comes back with an earlier edit
    assert r.status_code == 409 and r.json()["detail"][0]["field"] == "edited_at"
    assert client.get(_url(task)).json()["tiers"] == [[a], [b]]
    # A clock ahead of the server's is held to the server's time, so it cannot win every later edit.
    ahead = {"tiers": [[b]], "edited_at": (now + timedelta(days=1)).isoformat()}
    saved = client.put(_url(task), json=ahead).json()
    assert datetime.fromisoformat(saved["edited_at"]) <= datetime.now(UTC)
    assert client.put(_url(task), json={"tiers": [[a]]}).status_code == 200  # now, by the server's clock


def test_a_browser_session_needs_the_csrf_header_and_the_page_carries_the_draft(db, make_user, make_project,
                                                                               browser) -> None:
    _, project, (ann,) = _seed(db, make_user, make_project)
    db.commit()
    phone, laptop = browser(), browser()
    phone.login(ann.email)
    page = phone.get(f"/projects/{project.id}/annotate")
    assignment_id = int(re.search(r'data-assignment="(\d+)"', page.text).group(1))  # type: ignore[union-attr]
    assert "data-draft=" not in page.text
    ids = [int(i) for i in re.findall(r'data-cid="(\d+)"', page.text)]
    url = f"/api/assignments/{assignment_id}/draft"
    assert phone.client.put(url, json={"tiers": [[ids[1]], [ids[0]]]}).status_code == 403  # no CSRF header
    r = phone.client.put(url, json={"tiers": [[ids[1]], [ids[0]]], "flags": {str(ids[1]): ["off-topic"]}},
                         headers={"X-CSRF-Token": phone.csrf})
    assert r.status_code == 200, r.text
    # Another device, same person: the page of the same task brings the draft along.
    laptop.login(ann.email)
    page = laptop.get(f"/projects/{project.id}/annotate")
    draft = json.loads(re.search(r"data-draft='([^']*)'", page.text).group(1).replace("&#34;", '"'))  # type: ignore[union-attr]
    assert draft["tiers"] == [[ids[1]], [ids[0]]] and draft["flags"] == {str(ids[1]): ["off-topic"]}


def test_the_draft_endpoints_are_documented(app) -> None:  # type: ignore[no-untyped-def]
    from fastapi.testclient import TestClient

    spec = TestClient(app).get("/openapi.json").json()  # type: ignore[arg-type]
    path = spec["paths"]["/api/v1/assignments/{assignment_id}/draft"]
    for method in ("get", "put"):
        assert path[method]["tags"] == ["annotation"] and path[method]["summary"]
    assert {"204", "404"} <= set(path["get"]["responses"])
    assert {"404", "409", "413", "422"} <= set(path["put"]["responses"])
