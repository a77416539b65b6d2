"""The annotation queue and ranking submission through the JSON API, on SQLite and Postgres."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import func, select

from app.models import Assignment, Completion, Pair, Prompt, Ranking
from app.projects import projects


def _seed(db, make_user, make_project, *, n_prompts=3, k=4, overlap=1, annotators=1, **project_kw):  # type: ignore[no-untyped-def]
    lead = make_user(db, "lead")
    project = make_project(db, lead=lead, k=k, overlap=overlap)
    for key, value in project_kw.items():
        setattr(project, key, value)
    people = [make_user(db, "annotator") for _ in range(annotators)]
    for person in people:
        projects.add_member(db, project, lead, email=person.email, role="annotator")
    for i in range(n_prompts):
        prompt = Prompt(project_id=project.id, text=f"question {i}", text_hash=f"h{i}-{project.id}", split="train")
        db.add(prompt)
        db.flush()
        db.add_all(Completion(prompt_id=prompt.id, text=f"answer {i}.{j}") for j in range(k))
    db.flush()
    return lead, project, people


def _ranking(task: dict, tiers: list[list[int]] | None = None, **over: object) -> dict:
    ids = [c["id"] for c in task["completions"]]
    body = {"assignment_id": task["assignment_id"], "tiers": tiers or [[i] for i in ids],
            "rubric_version": task["rubric"]["version"], "submission_id": f"sub-{task['assignment_id']}"}
    body.update(over)
    return body


def test_next_submit_next_until_the_queue_is_empty(db, make_user, make_project, token_for, api) -> None:
    _, project, (ann,) = _seed(db, make_user, make_project, n_prompts=2)
    client = api(token_for(db, ann))
    db.commit()
    seen = []
    for _ in range(2):
        r = client.get(f"/api/projects/{project.id}/tasks/next")
        assert r.status_code == 200
        task = r.json()
        assert set(task) >= {"assignment_id", "prompt", "completions", "rubric", "lease_expires_at"}
        assert len(task["completions"]) == 4 and task["rubric"]["version"] == 1
        # Asking again before submitting gives the same task (a reload does not skip work).
        assert client.get(f"/api/projects/{project.id}/tasks/next").json()["assignment_id"] == task["assignment_id"]
        sub = client.post(f"/api/projects/{project.id}/rankings", json=_ranking(task))
        assert sub.status_code == 201 and sub.json()["pairs_created"] == 6
        seen.append(task["prompt"]["id"])
    assert len(set(seen)) == 2
    assert client.get(f"/api/projects/{project.id}/tasks/next").status_code == 204


def test_pairs_follow_the_tiers_with_margins_and_ties(db, make_user, make_project, token_for, api) -> None:
    _, project, (ann,) = _seed(db, make_user, make_project, n_prompts=1)
    client = api(token_for(db, ann))
    db.commit()
    task = client.get(f"/api/projects/{project.id}/tasks/next").json()
    a, b, c, d = sorted(x["id"] for x in task["completions"])
    r = client.post(f"/api/projects/{project.id}/rankings", json=_ranking(task, [[a, b], [c], [d]]))
    assert r.status_code == 201 and r.json()["pairs_created"] == 5
    db.expire_all()
    pairs = {(p.chosen_id, p.rejected_id, p.margin) for p in db.scalars(select(Pair))}
    assert pairs == {(a, c, 1), (b, c, 1), (a, d, 2), (b, d, 2), (c, d, 1)}
    ranking = db.scalar(select(Ranking))
    assert ranking.display_order == [x["id"] for x in task["completions"]]
    assert ranking.source == "human" and ranking.rubric_id is not None


def test_display_order_is_shuffled_per_annotator_and_stable(db, make_user, make_project, token_for, api) -> None:
    _, project, people = _seed(db, make_user, make_project, n_prompts=1, k=8, overlap=8, annotators=6)
    clients = [api(token_for(db, p)) for p in people]
    db.commit()
    orders = []
    for client in clients:
        first = [c["id"] for c in client.get(f"/api/projects/{project.id}/tasks/next").json()["completions"]]
        again = [c["id"] for c in client.get(f"/api/projects/{project.id}/tasks/next").json()["completions"]]
        assert first == again
        orders.append(tuple(first))
    assert len(set(orders)) > 1


def test_same_submission_id_is_idempotent(db, make_user, make_project, token_for, api) -> None:
    _, project, (ann,) = _seed(db, make_user, make_project, n_prompts=2)
    client = api(token_for(db, ann))
    db.commit()
    task = client.get(f"/api/projects/{project.id}/tasks/next").json()
    first = client.post(f"/api/projects/{project.id}/rankings", json=_ranking(task))
    again = client.post(f"/api/projects/{project.id}/rankings", json=_ranking(task))
    assert first.status_code == 201 and again.status_code == 200
    assert again.json()["ranking_id"] == first.json()["ranking_id"] and again.json()["pairs_created"] == 6
    assert db.scalar(select(func.count(Ranking.id))) == 1 and db.scalar(select(func.count(Pair.id))) == 6


@pytest.mark.parametrize(("case", "field"), [
    ("unknown_id", "tiers[0][0]"),
    ("duplicate", "tiers[1][0]"),
    ("one_tier", "tiers"),
    ("empty_tier", "tiers.1"),  # the schema's own rule (minItems 1), named as every schema rule is
    ("missing", "tiers"),
    ("stale_rubric", "rubric_version"),
    ("foreign_assignment", "assignment_id"),
    ("expired", "assignment_id"),
    ("bad_flag", "flags.{c0}"),
])
def test_invalid_rankings_are_refused_and_write_nothing(db, make_user, make_project, token_for, api, case,
                                                        field) -> None:
    lead, project, (ann, other) = _seed(db, make_user, make_project, n_prompts=2, overlap=2, annotators=2)
    client, other_client = api(token_for(db, ann)), api(token_for(db, other))
    db.commit()
    task = client.get(f"/api/projects/{project.id}/tasks/next").json()
    ids = [c["id"] for c in task["completions"]]
    body = _ranking(task)
    if case == "unknown_id":
        body["tiers"] = [[999999], *[[i] for i in ids[1:]]]
    elif case == "duplicate":
        body["tiers"] = [[ids[0]], [ids[0]], [ids[1]], [ids[2]], [ids[3]]]
    elif case == "one_tier":
        body["tiers"] = [ids]
    elif case == "empty_tier":
        body["tiers"] = [[ids[0]], [], [ids[1]]]
    elif case == "missing":
        body["tiers"] = [[ids[0]], [ids[1]]]
    elif case == "stale_rubric":
        from app.projects import rubrics

        rubrics.create_version(db, project, lead, text="new rules", criteria=[], base_version=1)
        db.commit()
    elif case == "foreign_assignment":
        other_task = other_client.get(f"/api/projects/{project.id}/tasks/next").json()
        body["assignment_id"] = other_task["assignment_id"]
    elif case == "expired":
        assignment = db.get(Assignment, task["assignment_id"])
        assignment.leased_until = assignment.leased_until - timedelta(hours=2)
        db.commit()
    elif case == "bad_flag":
        body["flags"] = {str(ids[0]): ["not-a-flag"]}
    r = client.post(f"/api/projects/{project.id}/rankings", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["field"] == field.format(c0=ids[0])
    db.expire_all()
    assert db.scalar(select(func.count(Ranking.id))) == 0 and db.scalar(select(func.count(Pair.id))) == 0


def test_skip_with_a_reason_records_no_pairs_and_frees_the_prompt(db, make_user, make_project, token_for,
                                                                  api) -> None:
    _, project, (ann, other) = _seed(db, make_user, make_project, n_prompts=1, overlap=1, annotators=2)
    client, other_client = api(token_for(db, ann)), api(token_for(db, other))
    db.commit()
    task = client.get(f"/api/projects/{project.id}/tasks/next").json()
    assert other_client.get(f"/api/projects/{project.id}/tasks/next").status_code == 204  # leased to ann
    r = client.post(f"/api/projects/{project.id}/rankings",
                    json=_ranking(task, [], skipped=True, skip_reason="cannot judge"))
    assert r.status_code == 201 and r.json()["pairs_created"] == 0
    assert other_client.get(f"/api/projects/{project.id}/tasks/next").status_code == 200
    assert client.get(f"/api/projects/{project.id}/tasks/next").status_code == 204


def test_overlap_caps_concurrent_leases_and_expired_leases_return(db, make_user, make_project, token_for,
                                                                  api) -> None:
    _, project, people = _seed(db, make_user, make_project, n_prompts=1, overlap=2, annotators=3)
    clients = [api(token_for(db, p)) for p in people]
    db.commit()
    assert clients[0].get(f"/api/projects/{project.id}/tasks/next").status_code == 200
    assert clients[1].get(f"/api/projects/{project.id}/tasks/next").status_code == 200
    assert clients[2].get(f"/api/projects/{project.id}/tasks/next").status_code == 204
    lease = db.scalar(select(Assignment).where(Assignment.annotator_id == people[0].id))
    lease.leased_until = lease.leased_until - timedelta(hours=1)
    db.commit()
    assert clients[2].get(f"/api/projects/{project.id}/tasks/next").status_code == 200


def test_submit_by_prompt_id_without_a_lease(db, make_user, make_project, token_for, api) -> None:
    _, project, (ann,) = _seed(db, make_user, make_project, n_prompts=1)
    client = api(token_for(db, ann))
    prompt = db.scalar(select(Prompt))
    ids = [c.id for c in prompt.completions]
    db.commit()
    body = {"prompt_id": prompt.id, "tiers": [[i] for i in ids], "rubric_version": 1, "submission_id": "x1"}
    assert client.post(f"/api/projects/{project.id}/rankings", json=body).status_code == 201
    r = client.post(f"/api/projects/{project.id}/rankings", json=body | {"submission_id": "x2"})
    assert r.status_code == 409


def test_only_members_who_annotate_get_tasks(db, make_user, make_project, token_for, api) -> None:
    _, project, _ = _seed(db, make_user, make_project, n_prompts=1)
    outsider, engineer = make_user(db, "annotator"), make_user(db, "engineer")
    lead = db.get(type(outsider), project.created_by_id)
    projects.add_member(db, project, lead, email=engineer.email, role="engineer")
    out_client, eng_client = api(token_for(db, outsider)), api(token_for(db, engineer))
    db.commit()
    assert out_client.get(f"/api/projects/{project.id}/tasks/next").status_code == 404
    assert eng_client.get(f"/api/projects/{project.id}/tasks/next").status_code == 403
    assert api(None).get(f"/api/projects/{project.id}/tasks/next").status_code == 401


def test_the_annotation_routes_refuse_a_revoked_or_unknown_token_before_anything_about_the_project(
        db, make_user, make_project, token_for, api) -> None:
    from app.accounts import users
    from app.models import ApiToken

    _, project, (ann,) = _seed(db, make_user, make_project, n_prompts=1)
    token = token_for(db, ann)
    db.commit()
    client = api(token)
    task = client.get(f"/api/projects/{project.id}/tasks/next").json()
    assert client.get(f"/api/projects/{project.id + 1000}/tasks/next").status_code == 404
    users.revoke_token(db, ann, db.scalar(select(ApiToken.id).where(ApiToken.user_id == ann.id)))
    db.commit()
    for path in (f"/api/projects/{project.id}/tasks/next", f"/api/projects/{project.id + 1000}/tasks/next"):
        r = client.get(path)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    r = client.post(f"/api/projects/{project.id}/rankings", json=_ranking(task))
    assert r.status_code == 401 and db.scalar(select(func.count(Ranking.id))) == 0
    db.commit()  # SQLite: the test's own transaction holds the write lock (app.platform.db)
    assert api("pfl_bogus").get(f"/api/projects/{project.id}/tasks/next").status_code == 401
    ann.active = False
    fresh = token_for(db, ann)
    db.commit()
    assert api(fresh).get(f"/api/projects/{project.id}/tasks/next").status_code == 401


def test_a_resend_answers_with_the_first_result_even_once_the_rubric_changed(db, make_user, make_project,
                                                                            token_for, api) -> None:
    from app.projects import rubrics

    lead, project, (ann,) = _seed(db, make_user, make_project, n_prompts=2)
    client = api(token_for(db, ann))
    db.commit()
    task = client.get(f"/api/projects/{project.id}/tasks/next").json()
    first = client.post(f"/api/projects/{project.id}/rankings", json=_ranking(task))
    rubrics.create_version(db, project, lead, text="A stricter rubric.", criteria=["Correctness"], base_version=1)
    db.commit()
    again = client.post(f"/api/projects/{project.id}/rankings", json=_ranking(task))
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["ranking_id"] == first.json()["ranking_id"]


def test_a_submission_id_used_in_another_project_is_refused_naming_it(db, make_user, make_project, token_for,
                                                                     api) -> None:
    lead, project, (ann,) = _seed(db, make_user, make_project, n_prompts=1)
    _, other, _ = _seed(db, make_user, make_project, n_prompts=1)
    projects.add_member(db, other, db.get(type(ann), other.created_by_id), email=ann.email, role="annotator")
    client = api(token_for(db, ann))
    db.commit()
    task = client.get(f"/api/projects/{project.id}/tasks/next").json()
    assert client.post(f"/api/projects/{project.id}/rankings", json=_ranking(task, submission_id="s1")).status_code == 201
    other_task = client.get(f"/api/projects/{other.id}/tasks/next").json()
    r = client.post(f"/api/projects/{other.id}/rankings", json=_ranking(other_task, submission_id="s1"))
    assert r.status_code == 422
    assert r.json()["detail"][0]["field"] == "submission_id" and "another project" in r.json()["detail"][0]["message"]
    assert db.scalar(select(func.count(Ranking.id)).where(Ranking.project_id == other.id)) == 0
