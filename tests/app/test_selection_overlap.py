"""`disagreement` gives more overlap: prompts whose human rankings disagree get more annotators, first, and the
queue's guarantees hold at the raised cap (overlap + extra) as they hold at the overlap, on SQLite and Postgres."""

from __future__ import annotations

import json
from collections import Counter

import httpx
import pytest
from sqlalchemy import func, select

from app.annotation import queue, rankings, selection
from app.annotation.rankings import RankingInput
from app.exports import writer as export_writer
from app.models import Assignment, Prompt, Ranking
from app.platform.errors import Conflict
from app.projects.rubrics import current as current_rubric
from app.quality import agreement, rollups
from tests.app.test_queue_concurrency import _active_per_prompt, _all_at_once
from tests.app.test_selection import _rank, _seed, _worker


def _forget_queue_caches() -> None:
    """The queue's floor and progress caches (5 s) would hold the order from before a priorities job."""
    with queue._floors_lock:
        queue._floors.clear()
        queue._progress_cache.clear()


def _ids(prompt: Prompt) -> list[int]:
    return sorted(c.id for c in prompt.completions)


def _contested(db, make_user, make_project, *, annotators: int = 5, n: int = 4):  # type: ignore[no-untyped-def]
    """overlap 2, K = 2: a and b agree on prompt 0 and disagree on prompt 1 (share 0.5); the others are unranked."""
    lead, people, project, prompts = _seed(db, make_user, make_project, n=n, k=2, overlap=2, annotators=annotators)
    a, b = people[:2]
    for person, flip in ((a, False), (b, True)):
        for i in (0, 1):
            task = queue.next_task(db, project, person)
            assert task.prompt_id == prompts[i].id
            _rank(db, project, person, task, _ids(prompts[i])[::-1] if (flip and i == 1) else _ids(prompts[i]))
    return lead, people, project, prompts


def _submit_by_prompt(db, project, person, prompt: Prompt) -> None:  # type: ignore[no-untyped-def]
    body = RankingInput(tiers=[[c] for c in _ids(prompt)], rubric_version=current_rubric(db, project).version,
                        submission_id=f"p{prompt.id}-{person.id}", prompt_id=prompt.id)
    rankings.submit(db, project, person, body)


def _submitted(db, prompt: Prompt) -> int:  # type: ignore[no-untyped-def]
    return int(db.scalar(select(func.count(Assignment.id)).where(Assignment.prompt_id == prompt.id,
                                                                 Assignment.state == "submitted")))


def test_a_contested_prompt_gets_extra_overlap_and_goes_first_to_annotators_who_have_not_ranked_it(
        db, make_user, make_project) -> None:
    lead, (a, b, c, d, e), project, prompts = _contested(db, make_user, make_project)
    selection.set_selection(db, project, lead, "disagreement")
    result = selection.compute(db, project, "disagreement", None)
    assert result["extra_overlap_prompts"] == 1
    db.expire_all()
    # the default: +2 for a share above 0.2; prompt 1 (share 0.5) is served first, prompt 0 (share 0) after it
    assert [(p.extra_overlap, p.queue_rank) for p in prompts] == [(0, 1), (2, 0), (0, None), (0, None)]
    assert selection.state(project).extra_overlap_prompts == 1

    assert queue.next_task(db, project, c).prompt_id == prompts[1].id  # a new annotator: the contested prompt first
    assert queue.next_task(db, project, a).prompt_id == prompts[2].id  # a ranked it: never again, the next one
    _submit_by_prompt(db, project, d, prompts[1])  # without a lease: room under overlap + extra (2 + 1 lease < 4)
    # c's lease and d's ranking fill it: 4 = overlap 2 + extra 2, so e is served something else and cannot force it
    assert queue.next_task(db, project, e).prompt_id == prompts[2].id
    with pytest.raises(Conflict, match="all the rankings it needs"):
        _submit_by_prompt(db, project, e, prompts[1])
    _rank(db, project, c, queue.next_task(db, project, c), _ids(prompts[1]))
    assert _submitted(db, prompts[1]) == 4
    assert queue.progress(db, project, lead).left_in_project == 4  # prompts 2 and 3 want two each; 1 is full
    assert all(queue.next_task(db, project, p) is None or queue.next_task(db, project, p).prompt_id != prompts[1].id
               for p in (lead, e))
    counts = Counter(db.execute(select(Assignment.prompt_id, Assignment.annotator_id)
                                .where(Assignment.project_id == project.id)).all())
    assert max(counts.values()) == 1  # no annotator twice on a prompt


def test_extra_overlap_is_bounded_by_the_annotators_and_the_settings(db, make_user, make_project, token_for,
                                                                     api) -> None:
    # lead + 2 annotators may annotate, overlap 2: only one more ranking can come from someone new
    lead, (a, b), project, prompts = _contested(db, make_user, make_project, annotators=2, n=2)
    selection.set_selection(db, project, lead, "disagreement")
    selection.compute(db, project, "disagreement", None)
    db.expire_all()
    assert db.get(Prompt, prompts[1].id).extra_overlap == 1
    # 0 extra gives none, and so does a threshold the share is not above (0.5 is the most a pair can disagree)
    selection.set_selection(db, project, lead, "disagreement", extra=0)
    assert selection.compute(db, project, "disagreement", None)["extra_overlap_prompts"] == 0
    client = api(token_for(db, lead))
    db.commit()
    url = f"/api/projects/{project.id}/selection"
    for body, field in (({"disagreement_extra": 11}, "disagreement_extra"),
                        ({"disagreement_threshold": 0.5}, "disagreement_threshold"),
                        ({"disagreement_extra": "2"}, "disagreement_extra")):
        r = client.put(url, json={"selection": "disagreement", **body})
        assert r.status_code == 422 and r.json()["detail"][0]["field"] == field, r.text
    r = client.put(url, json={"selection": "disagreement", "disagreement_extra": 3, "disagreement_threshold": 0.3})
    assert r.status_code == 200, r.text
    assert (r.json()["disagreement_extra"], r.json()["disagreement_threshold"]) == (3, 0.3)
    got = client.get(url).json()
    assert (got["disagreement_extra"], got["disagreement_threshold"], got["extra_overlap_prompts"]) == (3, 0.3, 0)
    schema = client.get("/openapi.json").json()["components"]["schemas"]
    assert {"disagreement_extra", "disagreement_threshold"} <= set(schema["SelectionIn"]["properties"])
    assert "extra_overlap_prompts" in schema["SelectionOut"]["properties"]


def test_leaving_disagreement_a_new_round_or_another_job_stops_serving_extras(db, make_user, make_project) -> None:
    lead, (a, b, c, d, e), project, prompts = _contested(db, make_user, make_project)
    selection.set_selection(db, project, lead, "disagreement")
    selection.compute(db, project, "disagreement", None)
    held = queue.next_task(db, project, c)
    assert held.prompt_id == prompts[1].id
    selection.set_selection(db, project, lead, "random")
    db.flush()
    db.expire_all()
    assert db.get(Prompt, prompts[1].id).extra_overlap == 0 and selection.state(project).extra_overlap_prompts == 0
    assert queue.next_task(db, project, d).prompt_id == prompts[2].id  # prompt 1 is at its overlap again
    with pytest.raises(Conflict):
        _submit_by_prompt(db, project, d, prompts[1])
    _rank(db, project, c, held, _ids(prompts[1]))  # a lease given on the extra is kept: its ranking counts
    assert _submitted(db, prompts[1]) == 3

    # back on disagreement: no extras until a priorities job gives them again (c's vote: share 1/3, still above)
    selection.set_selection(db, project, lead, "disagreement")
    assert queue.next_task(db, project, e).prompt_id != prompts[1].id
    db.rollback()
    _forget_queue_caches()
    lead, (a, b, c, d, e), project, prompts = _contested(db, make_user, make_project)
    selection.set_selection(db, project, lead, "disagreement")
    selection.compute(db, project, "disagreement", None)
    # changing a knob ends the extras given under the old one
    selection.set_selection(db, project, lead, "disagreement", threshold=0.1)
    assert selection.state(project).extra_overlap_prompts == 0
    assert queue.next_task(db, project, c).prompt_id != prompts[1].id
    db.rollback()
    _forget_queue_caches()
    lead, (a, b, c, d, e), project, prompts = _contested(db, make_user, make_project)
    selection.set_selection(db, project, lead, "disagreement")
    selection.compute(db, project, "disagreement", None)
    project.current_round += 1  # a new round asks for the overlap again, on the new answers
    assert not queue.extra_on(project)
    project.current_round -= 1
    # a later job for another selection resets every extra overlap
    selection.store_priorities(db, project, {prompts[3].id: 0.9}, selection="uncertainty")
    db.expire_all()
    assert [p.extra_overlap for p in prompts] == [0, 0, 0, 0] and not queue.extra_on(project)


def test_agreement_rollups_and_exports_take_prompts_with_more_rankings_than_the_overlap(
        db, engine, make_user, make_project, tmp_path) -> None:
    lead, (a, b, c, d, e), project, prompts = _contested(db, make_user, make_project)
    selection.set_selection(db, project, lead, "disagreement")
    selection.compute(db, project, "disagreement", None)
    x, y = _ids(prompts[1])
    _rank(db, project, c, queue.next_task(db, project, c), [x, y])
    _rank(db, project, d, queue.next_task(db, project, d), [x, y])
    # prompt 1: a, c, d say x ≻ y, b says y ≻ x (4 rankings, overlap 2); prompt 0: a and b agree
    report = agreement.project_report(db, project)
    assert (report.human_rankings, report.prompts_at_overlap, report.shared_prompts) == (6, 2, 2)
    assert report.comparisons == 1 + 6  # every two annotators of a prompt are compared: C(2,2) + C(4,2)
    kept, _ = rollups.current_report(db, project, lead)
    assert kept is not None and (kept.human_rankings, kept.comparisons, kept.prompts_at_overlap) == (6, 7, 2)
    db.commit()
    spec = export_writer.ExportSpec(project.id, "pairs", "jsonl", {}, "aggregated", "keep")
    export_writer.write_export(engine, spec, tmp_path / "agg", secret="s" * 40)
    rows = [json.loads(line) for line in (tmp_path / "agg" / "pairs.jsonl").read_text().splitlines()]
    contested = [r for r in rows if r["prompt_id"] == prompts[1].id]
    assert [(r["chosen_id"], r["rejected_id"], r["votes"], r["total_votes"]) for r in contested] == [(x, y, 3, 4)]


def test_the_project_page_says_how_many_prompts_got_extra_overlap(db, make_user, make_project, app, token_for,
                                                                   api, browser) -> None:
    lead, people, project, prompts = _contested(db, make_user, make_project)
    client = api(token_for(db, lead))
    pid, email = project.id, lead.email
    db.commit()
    assert client.put(f"/api/projects/{pid}/selection", json={"selection": "disagreement"}).status_code == 200
    r = client.post(f"/api/projects/{pid}/priority-jobs", json={})
    assert r.status_code == 202 and _worker(app).run_one()
    job = client.get(f"/api/jobs/{r.json()['job_id']}").json()
    assert job["state"] == "succeeded" and job["result"]["extra_overlap_prompts"] == 1, job
    assert client.get(f"/api/projects/{pid}/selection").json()["extra_overlap_prompts"] == 1
    db.rollback()
    person = browser()
    person.login(email)
    page = person.get(f"/projects/{pid}").text
    assert "<strong>1</strong> prompt got extra overlap" in page and 'name="disagreement_extra" ' in page
    bad = person.post(f"/projects/{pid}/selection", {"selection": "disagreement", "disagreement_extra": "99"})
    assert bad.status_code == 422 and "Extra rankings for contested prompts" in bad.text
    ok = person.post(f"/projects/{pid}/selection", {"selection": "disagreement", "disagreement_extra": "3",
                                                    "disagreement_threshold": "0.25"})
    assert ok.status_code == 303
    page = person.get(f"/projects/{pid}").text
    assert "No prompt has extra overlap now" in page and 'value="3"' in page and 'value="0.25"' in page


# --- under real concurrency ----------------------------------------------------------------------------------


def _filled_with_extras(db, make_user, make_project, token_for, *, clients: int, n: int):  # type: ignore[no-untyped-def]
    """n prompts at overlap 1, each ranked once, each given 2 extra: room for exactly 2 n more."""
    lead, people, project, prompts = _seed(db, make_user, make_project, n=n, k=2, overlap=1, annotators=clients + 1)
    first = people[0]
    for _ in range(n):
        task = queue.next_task(db, project, first)
        _rank(db, project, first, task, _ids(db.get(Prompt, task.prompt_id)))
    selection.set_selection(db, project, lead, "disagreement")
    selection.store_priorities(db, project, {p.id: 0.5 for p in prompts}, selection="disagreement",
                               extras={p.id: 2 for p in prompts})
    tokens = [token_for(db, person) for person in people[1:]]
    db.commit()
    return project, prompts, tokens


@pytest.mark.crash
def test_concurrent_next_task_never_exceeds_overlap_plus_extra(db, make_user, make_project, token_for,
                                                               server_url) -> None:
    n, clients = 6, 20
    project, prompts, tokens = _filled_with_extras(db, make_user, make_project, token_for, clients=clients, n=n)

    def ask(i: int) -> httpx.Response:
        with httpx.Client(base_url=server_url, headers={"Authorization": f"Bearer {tokens[i]}"},
                          timeout=60) as client:
            return client.get(f"/api/projects/{project.id}/tasks/next")

    responses = _all_at_once(clients, ask)
    statuses = Counter(r.status_code for r in responses)
    assert statuses == {200: 2 * n, 204: clients - 2 * n}, statuses
    db.expire_all()
    active = _active_per_prompt(db, project.id)
    assert len(active) == n and set(active.values()) == {3}, active  # 1 ranking + 2 leases each


@pytest.mark.crash
def test_concurrent_submits_without_a_lease_never_exceed_overlap_plus_extra(db, make_user, make_project,
                                                                            token_for, server_url) -> None:
    project, prompts, tokens = _filled_with_extras(db, make_user, make_project, token_for, clients=10, n=1)
    prompt_id, project_id = prompts[0].id, project.id
    version = current_rubric(db, project).version
    tiers = [[c] for c in _ids(prompts[0])]
    db.rollback()  # the test's session lets go of SQLite's write lock (and is not touched until the end)

    def submit(i: int) -> httpx.Response:
        with httpx.Client(base_url=server_url, headers={"Authorization": f"Bearer {tokens[i]}"},
                          timeout=60) as client:
            return client.post(f"/api/projects/{project_id}/rankings",
                               json={"prompt_id": prompt_id, "tiers": tiers, "rubric_version": version,
                                     "submission_id": f"race-{i}"})

    responses = _all_at_once(10, submit)
    assert Counter(r.status_code for r in responses) == {201: 2, 409: 8}, [(r.status_code, r.text)
                                                                            for r in responses]
    db.expire_all()
    assert db.scalar(select(func.count(Ranking.id)).where(Ranking.prompt_id == prompt_id)) == 3
