"""The queue's `selection`: the lead chooses it, a priorities job scores the prompts (from an ensemble reward model,
or from the humans' disagreement), and the queue serves by priority with every guarantee it had."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from sqlalchemy import select

from app.annotation import queue, rankings, selection
from app.annotation.rankings import RankingInput
from app.models import Assignment, Completion, Prompt, TrainingRun
from app.projects import projects
from app.projects.rubrics import current as current_rubric

ROOT = Path(__file__).resolve().parents[2]


def _seed(db, make_user, make_project, *, n: int = 6, k: int = 3, overlap: int = 1, annotators: int = 2,
          texts=None):  # type: ignore[no-untyped-def]
    lead = make_user(db, "lead")
    project = make_project(db, lead=lead, k=k, overlap=overlap)
    people = []
    for _ in range(annotators):
        person = make_user(db, "annotator")
        projects.add_member(db, project, lead, email=person.email, role="annotator")
        people.append(person)
    prompts = []
    for i in range(n):
        prompt = Prompt(project_id=project.id, text=f"what is rain {i}", text_hash=f"sel{i}-{project.id}",
                        split="train")
        db.add(prompt)
        db.flush()
        answers = texts[i] if texts else [f"answer {i}.{j}" for j in range(k)]
        db.add_all(Completion(prompt_id=prompt.id, text=t) for t in answers)
        prompts.append(prompt)
    db.flush()
    return lead, people, project, prompts


def _rank(db, project, person, assignment, best_first: list[int]) -> None:  # type: ignore[no-untyped-def]
    body = RankingInput(tiers=[[c] for c in best_first], rubric_version=current_rubric(db, project).version,
                        submission_id=f"s{assignment.id}-{person.id}", assignment_id=assignment.id)
    rankings.submit(db, project, person, body)


def _worker(app):  # type: ignore[no-untyped-def]
    from app.worker import Worker

    return Worker(app.state.settings, session_factory=app.state.session_factory, heartbeat_s=0.2)


# --- the setting -------------------------------------------------------------------------------


def test_only_the_lead_chooses_the_selection_and_a_bad_one_is_named(db, make_user, make_project, token_for,
                                                                     api) -> None:
    lead, (annotator, _), project, _ = _seed(db, make_user, make_project)
    lead_client, ann_client = api(token_for(db, lead)), api(token_for(db, annotator))
    db.commit()
    got = lead_client.get(f"/api/projects/{project.id}/selection")
    assert got.status_code == 200 and got.json()["selection"] == "random", got.text  # the default
    r = ann_client.put(f"/api/projects/{project.id}/selection", json={"selection": "uncertainty"})
    assert r.status_code == 403 and "choose the queue order" in r.text
    r = lead_client.put(f"/api/projects/{project.id}/selection", json={"selection": "loudest"})
    assert r.status_code == 422 and "selection" in r.text
    r = lead_client.put(f"/api/projects/{project.id}/selection", json={"selection": "uncertainty"})
    assert r.status_code == 200 and r.json()["selection"] == "uncertainty" and r.json()["computed_at"] is None
    # uncertainty needs a reward model: asking for priorities without one says so, naming the field
    r = lead_client.post(f"/api/projects/{project.id}/priority-jobs", json={})
    assert r.status_code == 422 and "training_run_id" in r.text and "reward-model run" in r.text
    assert ann_client.post(f"/api/projects/{project.id}/priority-jobs", json={}).status_code == 403


def _measured(text: str) -> list[str]:
    """The figures a MEASURED sentence states: each ratio and each interval, as written."""
    return re.findall(r"\d+\.\d\d×|\d+\.\d\d–\d+\.\d\d", text)


def test_the_queue_order_setting_says_what_each_order_was_measured_to_save(db, make_user, make_project, api,
                                                                            browser) -> None:
    lead, _, project, _ = _seed(db, make_user, make_project)
    pid, email = project.id, lead.email
    db.commit()
    person = browser()
    person.login(email)
    page = person.get(f"/projects/{pid}").text
    described = api(None).get("/openapi.json").json()["components"]["schemas"]["SelectionIn"]["properties"][
        "selection"]["description"]
    benchmarks = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert set(selection.MEASURED) == set(selection.SELECTIONS)
    for order in ("uncertainty", "disagreement"):
        figures = _measured(selection.MEASURED[order])
        assert len(figures) >= 2, order  # a ratio and its interval at least
        for figure in figures[:2]:  # the page, the API's description and the docs say the same gain
            assert figure in page and figure in described and figure.replace("×", "") in benchmarks, (order, figure)
    assert "Random stays the default" in described and selection.DEFAULT == "random"


# --- the queue ---------------------------------------------------------------------------------


def test_the_queue_serves_by_priority_and_keeps_overlap_and_one_ranking_per_annotator(db, make_user,
                                                                                     make_project) -> None:
    lead, people, project, prompts = _seed(db, make_user, make_project, n=6, overlap=2, annotators=3)
    a, b, c = people
    # random order (today's): by id
    assert queue.next_task(db, project, a).prompt_id == prompts[0].id
    db.rollback()
    lead, people, project, prompts = _seed(db, make_user, make_project, n=6, overlap=2, annotators=3)
    a, b, c = people
    selection.set_selection(db, project, lead, "uncertainty")
    scores = {prompts[4].id: 0.9, prompts[1].id: 0.5, prompts[2].id: 0.5, prompts[5].id: 0.1}  # 0 and 3 unscored
    assert selection.store_priorities(db, project, scores, selection="uncertainty", training_run_id=None) == 4
    db.expire_all()
    assert [p.queue_rank for p in prompts] == [None, 1, 2, None, 0, 3]  # ties by id

    first = queue.next_task(db, project, a)
    assert first.prompt_id == prompts[4].id
    assert queue.next_task(db, project, a).id == first.id  # asking again renews the same lease
    assert queue.next_task(db, project, b).prompt_id == prompts[4].id  # overlap 2: a second annotator
    assert queue.next_task(db, project, c).prompt_id == prompts[1].id  # the top prompt is full (two leases)
    # a ranks the top prompt; from then on a is served the rest in priority order, never that prompt again
    _rank(db, project, a, first, sorted(cc.id for cc in prompts[4].completions))
    served = []
    while (task := queue.next_task(db, project, a)) is not None:
        served.append(task.prompt_id)
        _rank(db, project, a, task, sorted(cc.id for cc in db.get(Prompt, task.prompt_id).completions))
    # scored prompts by priority, then the unscored ones (new since the job) by id; each once
    assert served == [prompts[i].id for i in (1, 2, 5, 0, 3)]
    counts = {}
    for row in db.scalars(select(Assignment).where(Assignment.project_id == project.id)):
        counts[(row.prompt_id, row.annotator_id)] = counts.get((row.prompt_id, row.annotator_id), 0) + 1
    assert max(counts.values()) == 1
    # back to random: id order again
    selection.set_selection(db, project, lead, "random")
    assert queue.next_task(db, project, b).id == queue.next_task(db, project, b).id  # b's own lease on prompt 4
    assert queue.next_task(db, project, c).prompt_id == prompts[1].id


def test_prompts_a_judge_was_unsure_of_go_to_humans_first_under_any_selection(db, make_user, make_project,
                                                                               browser) -> None:
    lead, people, project, prompts = _seed(db, make_user, make_project, n=6, overlap=1, annotators=2)
    a, b = people
    reasons = {prompts[4].id: "low_confidence", prompts[2].id: "position_flip"}
    assert selection.route_to_humans(db, project, reasons, judge_run_id=7) == 2
    db.commit()
    # random order: the routed prompts first (by id among them), then the rest by id
    assert [queue.next_task(db, project, a).prompt_id, queue.next_task(db, project, b).prompt_id] == [
        prompts[2].id, prompts[4].id]
    db.rollback()
    routed = selection.state(project).routed
    assert (routed["prompts"], routed["low_confidence"], routed["position_flip"], routed["judge_run_id"]) == (2, 1, 1, 7)
    # a priorities job keeps them ahead of every computed rank
    selection.set_selection(db, project, lead, "disagreement")
    selection.store_priorities(db, project, {p.id: 1.0 - i / 10 for i, p in enumerate(prompts)}, selection="disagreement")
    db.expire_all()
    assert [p.queue_rank for p in prompts] == [0, 1, -2, 2, -1, 3]
    email, project_id = lead.email, project.id  # read before the commit: a read after it would open a transaction
    db.commit()
    page = browser()
    page.login(email)
    text = page.get(f"/projects/{project_id}").text
    assert "2 prompts the AI judge was unsure of are served to humans first" in text
    assert "1 with a low-confidence ranking, 1 with a verdict that flipped" in text


# --- the priorities job ------------------------------------------------------------------------


def test_disagreement_puts_the_contested_prompt_first_and_the_page_says_so(db, make_user, make_project, token_for,
                                                                           api, app, browser) -> None:
    lead, (a, b), project, prompts = _seed(db, make_user, make_project, n=3, k=2, overlap=2)
    # a and b agree on prompt 0 and disagree on prompt 1; prompt 2 has no rankings yet
    for person, flip in ((a, False), (b, True)):
        for i in (0, 1):
            task = queue.next_task(db, project, person)
            assert task.prompt_id == prompts[i].id
            ids = sorted(c.id for c in prompts[i].completions)
            _rank(db, project, person, task, ids[::-1] if (flip and i == 1) else ids)
    assert selection.disagreement_scores(db, project) == {prompts[0].id: 0.0, prompts[1].id: 0.5}
    client = api(token_for(db, lead))
    db.commit()
    assert client.put(f"/api/projects/{project.id}/selection", json={"selection": "disagreement"}).status_code == 200
    r = client.post(f"/api/projects/{project.id}/priority-jobs", json={})
    assert r.status_code == 202
    assert _worker(app).run_one()
    job = client.get(f"/api/jobs/{r.json()['job_id']}").json()
    assert job["state"] == "succeeded", job
    state = client.get(f"/api/projects/{project.id}/selection").json()
    assert state["computed_for"] == "disagreement" and state["prompts"] == 2 and state["measure"] == "disagreement"
    db.expire_all()
    assert db.get(Prompt, prompts[1].id).queue_rank == 0 and db.get(Prompt, prompts[0].id).queue_rank == 1
    pid, lead_email, annotator_email = project.id, lead.email, a.email
    db.rollback()  # the test's session lets go of SQLite's write lock (and is not touched again) before pages write

    # the project page shows the active selection and when its priorities were computed; the lead can switch it
    person = browser()
    person.login(lead_email)
    page = person.get(f"/projects/{pid}")
    assert page.status_code == 200
    assert '<strong id="selection-active">disagreement</strong>' in page.text and state["computed_at"] in page.text
    assert "Compute priorities now" in page.text
    assert person.post(f"/projects/{pid}/selection", {"selection": "random"}).status_code == 303
    assert '<strong id="selection-active">random</strong>' in person.get(f"/projects/{pid}").text
    bad = person.post(f"/projects/{pid}/selection", {"selection": "loudest"})
    assert bad.status_code == 422 and "Queue order" in bad.text
    watcher = browser()
    watcher.login(annotator_email)
    assert "Compute priorities now" not in watcher.get(f"/projects/{pid}").text  # annotators only see it


@pytest.fixture(scope="module")
def ensemble_dir(tmp_path_factory) -> Path:
    from tests.training.test_reward_model import FAST, as_rows, synthetic_pairs, tiny_bert_dir
    from training.reward_model import RewardConfig, train_reward_model

    base = tiny_bert_dir(tmp_path_factory.mktemp("tiny-bert"))
    out = tmp_path_factory.mktemp("ensemble")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train_reward_model(RewardConfig(model=str(base), epochs=2, ensemble=3, **FAST),
                           as_rows(synthetic_pairs(160, seed=1)), None, out)
    finally:
        torch.set_num_threads(threads)
    return out / "model"


def test_uncertainty_priorities_come_from_the_ensemble_and_the_queue_follows_them(
        db, make_user, make_project, token_for, api, app, ensemble_dir) -> None:
    from training.reward_model import RewardModel

    texts = [["great kind clear", "rude wrong vague"],  # easy: every head agrees
             ["great w1", "great w2"], ["kind w3 rude", "clear w4 wrong"], ["w5", "w6 w7"]]
    lead, (annotator, _), project, prompts = _seed(db, make_user, make_project, n=4, k=2, texts=texts)
    run = TrainingRun(project_id=project.id, kind="reward", state="succeeded", model_dir=str(ensemble_dir),
                      config={"ensemble": 3})
    db.add(run)
    client = api(token_for(db, lead))
    db.commit()
    client.put(f"/api/projects/{project.id}/selection", json={"selection": "uncertainty"})
    r = client.post(f"/api/projects/{project.id}/priority-jobs", json={"training_run_id": run.id})
    assert r.status_code == 202, r.text
    assert _worker(app).run_one()
    job = client.get(f"/api/jobs/{r.json()['job_id']}").json()
    assert job["state"] == "succeeded", job
    state = client.get(f"/api/projects/{project.id}/selection").json()
    assert (state["training_run_id"], state["prompts"], state["measure"]) == (run.id, 4, "spread")

    # the stored priority is each prompt's spread across the heads, the most uncertain first
    model = RewardModel.load(ensemble_dir, device="cpu")
    spread = model.compare([p.text for p in prompts], [t[0] for t in texts], [t[1] for t in texts]).spread
    db.expire_all()
    stored = [db.get(Prompt, p.id) for p in prompts]
    assert [s.priority for s in stored] == pytest.approx(spread.tolist(), abs=1e-5)
    expected_first = prompts[int(torch.argmax(spread))].id
    assert queue.next_task(db, project, annotator).prompt_id == expected_first
    assert stored[0].queue_rank == 3 or spread[0] != spread.min()  # the easy pair is not served first
