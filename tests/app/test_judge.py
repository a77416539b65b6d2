"""The AI judge in the app: a judge run ranks prompts like an annotator, with soft labels and provenance;
human–AI agreement, calibration and gold accuracy; the lead's AI-labels decision; resume after a stop."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select

from app.models import Completion, Job, JudgeRun, Pair, Prompt, Ranking
from app.platform.settings import Settings
from app.projects import projects
from app.worker import Worker
from tests.training.tiny import char_tokenizer, save_tiny, tiny_gpt2

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def judge_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tokenizer = char_tokenizer()
    return save_tiny(tiny_gpt2(tokenizer, seed=3, n_positions=512), tokenizer,
                     tmp_path_factory.mktemp("judge") / "model")


def _seed(db, make_user, make_project, n: int = 3, k: int = 3):  # type: ignore[no-untyped-def]
    lead = make_user(db, "lead")
    project = make_project(db, lead=lead, k=k)
    annotator = make_user(db, "annotator")
    projects.add_member(db, project, lead, email=annotator.email, role="annotator")
    for i in range(n):
        prompt = Prompt(project_id=project.id, text=f"What is {i}+1?", text_hash=f"h{i}", split="train")
        db.add(prompt)
        db.flush()
        db.add_all(Completion(prompt_id=prompt.id, text=t) for t in (f"{i + 1}", f"{i + 2}", "no idea")[:k])
    db.flush()
    return lead, annotator, project


def _allow_ai_labels(db, project) -> None:  # type: ignore[no-untyped-def]
    db.refresh(project)
    project.settings = dict(project.settings or {}) | {"ai_labels_for_training": True}
    db.commit()


def _worker(database_url: str, tmp_path: Path, clean_engine) -> Worker:  # type: ignore[no-untyped-def]
    from app.platform.db import make_session_factory

    settings = Settings(database_url=database_url, data_dir=tmp_path, secret_key="x" * 40)
    return Worker(settings, session_factory=make_session_factory(clean_engine), poll_s=0.05, heartbeat_s=0.2)


def test_a_judge_run_ranks_every_prompt_with_soft_labels_and_provenance(db, make_user, make_project, token_for,
                                                                        api, judge_model_dir, database_url,
                                                                        clean_engine, tmp_path) -> None:
    lead, annotator, project = _seed(db, make_user, make_project)
    lead_client, ann_client = api(token_for(db, lead)), api(token_for(db, annotator))
    db.commit()
    pid = project.id
    # A human ranks one prompt (correct answer first), so there is something to agree with.
    task = ann_client.get(f"/api/projects/{pid}/tasks/next").json()
    by_text = {c["text"]: c["id"] for c in task["completions"]}
    n = int(task["prompt"]["text"].split()[2].split("+")[0])
    tiers = [[by_text[str(n + 1)]], [by_text[str(n + 2)]], [by_text["no idea"]]]
    assert ann_client.post(f"/api/projects/{pid}/rankings", json={
        "assignment_id": task["assignment_id"], "tiers": tiers, "rubric_version": 1,
        "submission_id": "h1"}).status_code == 201

    r = lead_client.post(f"/api/projects/{pid}/judge-runs", json={
        "generator": {"backend": "hf", "model": str(judge_model_dir)}, "principles": "all", "seed": 1})
    assert r.status_code == 202, r.text
    run_id, job_id = r.json()["judge_run_id"], r.json()["job_id"]
    assert _worker(database_url, tmp_path, clean_engine).run(exit_when_idle=True) == 1
    job = lead_client.get(f"/api/jobs/{job_id}").json()
    assert job["state"] == "succeeded", job
    db.expire_all()
    ai = list(db.scalars(select(Ranking).where(Ranking.judge_run_id == run_id)))
    assert len(ai) == 3 and all(r.source == "ai" and r.annotator_id is None and r.constitution_id for r in ai)
    assert all(0 <= r.meta["confidence"] <= 1 and r.meta["method"] == "bradley_terry" for r in ai)
    pairs = list(db.scalars(select(Pair).where(Pair.source == "ai")))
    assert pairs and all(0.0 <= p.p <= 1.0 for p in pairs)
    meta = pairs[0].meta
    assert {"p_a_first", "p_a_second", "principles", "position_flip", "compared_as", "low_confidence"} <= set(meta)
    assert len(meta["principles"]) == 5  # "all": every principle of the default constitution
    assert db.get(JudgeRun, run_id).state == "succeeded"
    db.rollback()

    report = lead_client.get(f"/api/projects/{pid}/judge-agreement").json()
    assert report["n_prompts"] == 1 and report["n_pairs"] == 3
    assert report["pair_agreement"] is not None and report["kendall_tau"] is not None
    assert sum(b["n"] for b in report["calibration"]) == 3 and report["position_flip_rate"] is not None
    assert report["ai_labels_enabled"] is False

    # Re-running the same judge config on the same data gives the same labels.
    r2 = lead_client.post(f"/api/projects/{pid}/judge-runs", json={
        "generator": {"backend": "hf", "model": str(judge_model_dir)}, "principles": "all", "seed": 1}).json()
    _worker(database_url, tmp_path, clean_engine).run(exit_when_idle=True)
    first = {r.prompt_id: r.tiers for r in db.scalars(select(Ranking).where(Ranking.judge_run_id == run_id))}
    second = {r.prompt_id: r.tiers for r in db.scalars(select(Ranking).where(Ranking.judge_run_id
                                                                              == r2["judge_run_id"]))}
    db.rollback()
    assert first == second


def test_the_lead_decides_on_ai_labels_and_others_cannot(db, make_user, make_project, token_for, api,
                                                         browser) -> None:
    lead, annotator, project = _seed(db, make_user, make_project, n=1)
    lead_client, ann_client = api(token_for(db, lead)), api(token_for(db, annotator))
    db.commit()
    pid = project.id
    assert ann_client.put(f"/api/projects/{pid}/ai-labels", json={"enabled": True}).status_code == 403
    # Nothing judged yet: the gate refuses (tests/app/test_judge_gate.py); the lead's yes is set directly here.
    assert lead_client.put(f"/api/projects/{pid}/ai-labels", json={"enabled": True}).status_code == 422
    _allow_ai_labels(db, project)
    page = browser()
    page.login(lead.email)
    html = page.get(f"/projects/{pid}/judge").text
    assert '<strong id="ai-labels">Yes</strong>' in html
    assert page.post(f"/projects/{pid}/judge/ai-labels", {"enabled": "no"}).status_code == 303
    assert '<strong id="ai-labels">No</strong>' in page.get(f"/projects/{pid}/judge").text


def test_gold_accuracy_against_known_correct_orders(db, make_user, make_project, token_for, api, judge_model_dir,
                                                    database_url, clean_engine, tmp_path) -> None:
    lead, _, project = _seed(db, make_user, make_project, n=2)
    for prompt in db.scalars(select(Prompt).where(Prompt.project_id == project.id)):
        ids = [c.id for c in prompt.completions]
        prompt.gold_tiers = [[ids[0]], [ids[1], ids[2]]]
    client = api(token_for(db, lead))
    db.commit()
    pid = project.id
    client.post(f"/api/projects/{pid}/judge-runs", json={"generator": {"backend": "hf", "model": str(judge_model_dir)}})
    _worker(database_url, tmp_path, clean_engine).run(exit_when_idle=True)
    report = client.get(f"/api/projects/{pid}/judge-agreement").json()
    assert report["gold_prompts"] == 2 and 0.0 <= report["gold_accuracy"] <= 1.0


def test_a_stopped_judge_run_resumes_without_judging_a_prompt_twice(db, make_user, make_project, token_for, api,
                                                                    judge_model_dir, database_url, clean_engine,
                                                                    tmp_path) -> None:
    lead, _, project = _seed(db, make_user, make_project, n=12)
    client = api(token_for(db, lead))
    db.commit()
    pid = project.id
    r = client.post(f"/api/projects/{pid}/judge-runs",
                    json={"generator": {"backend": "hf", "model": str(judge_model_dir)}}).json()
    worker = _worker(database_url, tmp_path, clean_engine)
    thread = threading.Thread(target=worker.run_one)
    thread.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if client.get(f"/api/jobs/{r['job_id']}").json()["progress"]["done"] > 0:
            break
        time.sleep(0.05)
    worker.terminating = True  # as on SIGTERM: finish the current chunk, give the job back
    thread.join(timeout=60)
    assert client.get(f"/api/jobs/{r['job_id']}").json()["state"] in ("queued", "succeeded")
    _worker(database_url, tmp_path, clean_engine).run(exit_when_idle=True)
    assert client.get(f"/api/jobs/{r['job_id']}").json()["state"] == "succeeded"
    counts = db.execute(select(Ranking.prompt_id, func.count(Ranking.id))
                        .where(Ranking.judge_run_id == r["judge_run_id"]).group_by(Ranking.prompt_id)).all()
    db.rollback()
    assert len(counts) == 12 and {c for _, c in counts} == {1}
    assert db.scalar(select(func.count(Job.id))) == 1


def test_critique_and_revision_become_reviewed_completions(db, make_user, make_project, token_for, api,
                                                           judge_model_dir, database_url, clean_engine, tmp_path,
                                                           browser) -> None:
    lead, annotator, project = _seed(db, make_user, make_project, n=2, k=2)
    client = api(token_for(db, lead))
    db.commit()
    pid = project.id
    r = client.post(f"/api/projects/{pid}/revision-jobs", json={
        "generator": {"backend": "hf", "model": str(judge_model_dir), "max_new_tokens": 12}, "limit": 3})
    assert r.status_code == 202, r.text
    _worker(database_url, tmp_path, clean_engine).run(exit_when_idle=True)
    assert client.get(f"/api/jobs/{r.json()['job_id']}").json()["state"] == "succeeded"
    items = client.get(f"/api/projects/{pid}/revisions").json()
    assert len(items) == 3 and all(i["status"] == "pending" and i["principle"] and i["original"] for i in items)
    first, second = items[0]["id"], items[1]["id"]
    decided = client.post(f"/api/projects/{pid}/revisions/{first}/decision", json={"accept": True}).json()
    assert decided["status"] == "accepted"
    assert client.post(f"/api/projects/{pid}/revisions/{first}/decision", json={"accept": False}).status_code == 409
    assert [i["id"] for i in client.get(f"/api/projects/{pid}/revisions?status=accepted").json()] == [first]
    # An annotator may not decide, and revisions never enter a ranking task.
    ann = api(token_for(db, annotator))
    db.commit()
    assert ann.post(f"/api/projects/{pid}/revisions/{second}/decision", json={"accept": True}).status_code == 403
    task = ann.get(f"/api/projects/{pid}/tasks/next").json()
    assert {c["id"] for c in task["completions"]}.isdisjoint({i["id"] for i in items})
    # The lead sees original, critique and revision side by side.
    page = browser()
    page.login(lead.email)
    html = page.get(f"/projects/{pid}/revisions").text
    assert f'id="r{second}"' in html and "Accept (SFT row)" in html


def test_exports_leave_ai_labels_out_until_the_lead_allows_them_and_carry_accepted_revisions(
        db, app, make_user, make_project, token_for, api, judge_model_dir) -> None:
    import json

    lead, annotator, project = _seed(db, make_user, make_project, n=2, k=2)
    client = api(token_for(db, lead))
    db.commit()
    pid = project.id

    def work() -> None:
        Worker(app.state.settings, session_factory=app.state.session_factory, poll_s=0.05,
               heartbeat_s=0.2).run(exit_when_idle=True)

    def export(kind: str) -> list[dict]:
        r = client.post(f"/api/projects/{pid}/exports", json={"kind": kind, "format": "jsonl"})
        assert r.status_code == 202, r.text
        work()
        out = client.get(f"/api/exports/{r.json()['export_id']}").json()
        assert out["status"] == "ready", out
        name = next(n for n in out["files"] if n.endswith(".jsonl"))
        body = client.get(f"/api/exports/{out['id']}/files/{name}").text
        return [json.loads(line) for line in body.splitlines() if line.strip()]

    client.post(f"/api/projects/{pid}/judge-runs", json={"generator": {"backend": "hf", "model": str(judge_model_dir)}})
    client.post(f"/api/projects/{pid}/revision-jobs",
                json={"generator": {"backend": "hf", "model": str(judge_model_dir), "max_new_tokens": 8}, "limit": 1})
    work()
    assert export("pairs") == []  # only AI labels exist, and the lead has not allowed them
    _allow_ai_labels(db, project)  # two prompts judged are too few for the gate; the decision is set directly
    rows = export("pairs")
    assert rows and {r["source"] for r in rows} == {"ai"} and all(0 <= r["p"] <= 1 for r in rows)

    revision = client.get(f"/api/projects/{pid}/revisions").json()[0]
    assert not [r for r in export("sft") if r["origin"] == "cai_revision"]  # pending is not accepted
    client.post(f"/api/projects/{pid}/revisions/{revision['id']}/decision", json={"accept": True})
    sft = [r for r in export("sft") if r["origin"] == "cai_revision"]
    assert [(r["completion_id"], r["completion"]) for r in sft] == [(revision["id"], revision["revision"])]


def test_a_judge_run_sends_the_prompts_it_is_unsure_of_to_humans_first(db, make_user, make_project, token_for, api,
                                                                        judge_model_dir, database_url, clean_engine,
                                                                        tmp_path) -> None:
    lead, annotator, project = _seed(db, make_user, make_project, n=3)
    client, ann_client = api(token_for(db, lead)), api(token_for(db, annotator))
    last = max(p.id for p in db.scalars(select(Prompt).where(Prompt.project_id == project.id)))
    db.commit()
    pid = project.id
    # A confidence bar of 0.99 makes the tiny judge unsure of everything it ranks: here only the last prompt.
    r = client.post(f"/api/projects/{pid}/judge-runs", json={
        "generator": {"backend": "hf", "model": str(judge_model_dir)}, "prompt_ids": [last],
        "low_confidence": 0.99, "route_low_confidence": True})
    assert r.status_code == 202, r.text
    _worker(database_url, tmp_path, clean_engine).run(exit_when_idle=True)
    job = client.get(f"/api/jobs/{r.json()['job_id']}").json()
    assert job["state"] == "succeeded" and job["result"]["routed_to_humans"] == 1, job
    # random order would serve the first prompt; the one the judge doubted comes first
    assert ann_client.get(f"/api/projects/{pid}/tasks/next").json()["prompt"]["id"] == last
