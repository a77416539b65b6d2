"""The AI judge on steps: a judge run with `label_steps` stores one soft label p(correct) per step of its own
ranking; its agreement with the human majority (neutral steps left out) and Brier score; the lead's step gate;
steps exports hold the judge's step labels only once the lead allowed them."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from app.annotation import steps
from app.judge import steps as judge_steps
from app.models import Completion, JudgeRun, Prompt, Ranking, StepLabel
from app.projects import projects
from app.quality import step_agreement
from app.quality.judge_agreement import GATE_MIN_PROMPTS
from tests.app.test_exports import _download, _export
from tests.training.tiny import char_tokenizer, save_tiny, tiny_gpt2
from training.judge import Judge, read_openai_answer
from training.judge_prompts import STEP_ANSWER_PREFIX, step_question


@pytest.fixture(scope="module")
def judge_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tokenizer = char_tokenizer()
    return save_tiny(tiny_gpt2(tokenizer, seed=5, n_positions=512), tokenizer,
                     tmp_path_factory.mktemp("step-judge") / "model")


def test_the_step_label_is_p_yes_over_yes_and_no_at_the_answer_position() -> None:
    import torch

    tokenizer = char_tokenizer()
    model = tiny_gpt2(tokenizer, seed=5, n_positions=512)
    judge = Judge.from_model(model, tokenizer)
    (ps,) = judge.label_steps([("Human: 2+2?", ["2+2", "=4"])])
    assert len(ps) == 2
    for n, p in enumerate(ps):
        # By hand: one forward over the question about step n, then Yes against No at the next position (with one
        # token per character these are the first letters, "Y" and "N").
        text = step_question("Human: 2+2?", ["2+2", "=4"], n) + STEP_ANSWER_PREFIX
        assert "Step 2: =4" in text if n == 1 else "Step 2" not in text  # steps after N are not shown
        ids = torch.tensor([tokenizer(text)["input_ids"]])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, -1]
        yes, no = tokenizer.convert_tokens_to_ids(["Y", "N"])
        assert p == pytest.approx(torch.softmax(logits[[yes, no]], -1)[0].item(), abs=1e-5)


def test_a_model_endpoints_yes_and_no_are_read_from_its_logprobs_or_its_word() -> None:
    data = {"choices": [{"message": {"content": "Yes"}, "logprobs": {"content": [
        {"token": " Yes", "logprob": math.log(0.5),
         "top_logprobs": [{"token": " Yes", "logprob": math.log(0.5)}, {"token": "yes", "logprob": math.log(0.1)},
                          {"token": " No", "logprob": math.log(0.2)}, {"token": " A", "logprob": math.log(0.1)}]}]}}]}
    p, mass, hard = read_openai_answer(data, "chat", ("Yes", "No"))
    assert p == pytest.approx(0.6 / 0.8) and mass == pytest.approx(0.8) and not hard  # " Yes" and "yes" summed
    assert read_openai_answer({"choices": [{"text": " no, 2+2=4"}]}, "completions", ("Yes", "No")) == (0.0, None, True)
    assert read_openai_answer({"choices": [{"text": "maybe"}]}, "completions", ("Yes", "No")) == (0.5, None, True)


def _project(db, make_user, make_project, *, step_labels: bool = True):  # type: ignore[no-untyped-def]
    lead = make_user(db, "lead")
    project = make_project(db, k=2, lead=lead)
    annotator = make_user(db, "annotator")
    projects.add_member(db, project, lead, email=annotator.email, role="annotator")
    if step_labels:
        steps.set_options(db, project, lead, enabled=True, separator=None)
    return lead, annotator, project


def _human(db, project, annotator, prompt, labels: dict[int, list[int]]) -> Ranking:  # type: ignore[no-untyped-def]
    ids = [c.id for c in prompt.completions]
    ranking = Ranking(project_id=project.id, prompt_id=prompt.id, source="human", annotator_id=annotator.id,
                      tiers=[[ids[0]], [ids[1]]], display_order=ids)
    db.add(ranking)
    db.flush()
    steps.write(db, ranking.id, labels)
    return ranking


def _judge(db, project, run, prompt, soft: dict[int, list[float]]) -> Ranking:  # type: ignore[no-untyped-def]
    ids = [c.id for c in prompt.completions]
    ranking = Ranking(project_id=project.id, prompt_id=prompt.id, source="ai", judge_run_id=run.id,
                      tiers=[[ids[0]], [ids[1]]], display_order=[])
    db.add(ranking)
    db.flush()
    judge_steps.write(db, ranking.id, soft)
    return ranking


def _prompt(db, project, i: int) -> Prompt:  # type: ignore[no-untyped-def]
    prompt = Prompt(project_id=project.id, text=f"q{i}", text_hash=f"{project.id}-{i:060d}",
                    completions=[Completion(text="a\nb", steps=["a", "b"]), Completion(text="c", steps=["c"])])
    db.add(prompt)
    db.flush()
    return prompt


def _evidence(db, project, annotator, n: int, *, agrees: bool = True, start: int = 0,  # type: ignore[no-untyped-def]
              ai_only: int = 0) -> JudgeRun:
    """n prompts whose first completion a human labelled [+1, −1] and the judge p = [0.9, 0.2] (or the
    reverse, when it disagrees); then `ai_only` prompts only the judge labelled."""
    run = JudgeRun(project_id=project.id, name="steps", state="succeeded", params={"label_steps": True})
    db.add(run)
    db.flush()
    for i in range(start, start + n + ai_only):
        prompt = _prompt(db, project, i)
        first = prompt.completions[0].id
        if i < start + n:
            _human(db, project, annotator, prompt, {first: [1, -1]})
        _judge(db, project, run, prompt, {first: [0.9, 0.2] if agrees else [0.2, 0.9]})
    db.flush()
    return run


def test_agreement_brier_and_neutral_steps_on_a_hand_made_case(db, make_user, make_project) -> None:
    lead, annotator, project = _project(db, make_user, make_project)
    second = make_user(db, "annotator")
    projects.add_member(db, project, lead, email=second.email, role="annotator")
    prompt = Prompt(project_id=project.id, text="q", text_hash="hand",
                    completions=[Completion(text="x\ny\nz", steps=["x", "y", "z"]), Completion(text="w", steps=["w"])])
    db.add(prompt)
    db.flush()
    cid = prompt.completions[0].id
    # Step 1: +1, +1 → +1. Step 2: +1, −1 → a tie, the worse label −1. Step 3: 0, 0 → neutral, left out.
    _human(db, project, annotator, prompt, {cid: [1, 1, 0]})
    _human(db, project, second, prompt, {cid: [1, -1, 0]})
    run = JudgeRun(project_id=project.id, name="steps", state="succeeded")
    db.add(run)
    db.flush()
    _judge(db, project, run, prompt, {cid: [0.8, 0.7, 0.4]})

    report = judge_steps.judge_step_agreement(db, project)
    # Compared: (0.8, +1) agrees, (0.7, −1) does not. Brier: ((0.8 − 1)² + (0.7 − 0)²) / 2 = (0.04 + 0.49) / 2.
    assert (report.n_prompts, report.n_completions, report.n_steps, report.neutral_steps) == (1, 1, 2, 1)
    assert report.step_agreement == 0.5 and report.brier == pytest.approx(0.265)
    assert report.wrong_step_recall == 0.0  # the one wrong step, called correct (p = 0.7)
    assert report.mean_p == 0.75 and report.human_correct_rate == 0.5
    assert judge_steps.judge_step_agreement(db, project, judge_run_id=run.id + 1).n_steps == 0
    # The judge's labels are no human agreement data: two human labellers, as before the judge came.
    human = step_agreement.report(db, project)
    assert human.labelled_completions == 1 and human.compared_steps == 3
    stored = sorted(db.execute(select(StepLabel.step_index, StepLabel.label, StepLabel.p)
                               .join(Ranking).where(Ranking.source == "ai")).all())
    assert stored == [(0, 1, 0.8), (1, 1, 0.7), (2, -1, 0.4)]  # hard label: +1 when p ≥ 0.5


def test_untrusted_numbers_are_refused_before_anything_is_stored(db, make_user, make_project) -> None:
    _, _, project = _project(db, make_user, make_project)
    prompt = _prompt(db, project, 0)
    run = JudgeRun(project_id=project.id, name="steps", state="succeeded")
    db.add(run)
    db.flush()
    ranking = _judge(db, project, run, prompt, {})
    for bad in (float("nan"), float("inf"), 1.5, -0.1, "0.5", True, None):
        # The first step is fine, the second is not: nothing of the completion is written.
        with pytest.raises(ValueError, match="step 2 must be a number in \\[0, 1\\]"):
            judge_steps.write(db, ranking.id, {prompt.completions[0].id: [0.5, bad]})
    assert db.scalar(select(StepLabel.id)) is None


@pytest.mark.slow
def test_a_judge_run_with_label_steps_stores_a_soft_label_per_step(db, make_user, make_project, token_for, api,
                                                                   judge_model_dir, app) -> None:
    from tests.app.test_exports import _run_worker

    lead, annotator, project = _project(db, make_user, make_project)
    for i in range(2):
        db.add(Prompt(project_id=project.id, text=f"{i}+1?", text_hash=f"j{i}", split="train",
                      completions=[Completion(text=f"{i}+1\n={i + 1}"), Completion(text=f"{i}+1\n={i + 2}\nok")]))
    db.flush()
    first = db.scalars(select(Prompt).where(Prompt.project_id == project.id).order_by(Prompt.id)).first()
    assert first is not None
    stored = steps.task_steps(db, project, [c.id for c in first.completions])
    _human(db, project, annotator, first, {c.id: [1] * len(stored[c.id]) for c in first.completions})
    client = api(token_for(db, lead))
    db.commit()
    pid = project.id

    r = client.post(f"/api/projects/{pid}/judge-runs", json={
        "generator": {"backend": "hf", "model": str(judge_model_dir)}, "label_steps": True})
    assert r.status_code == 202, r.text
    run_id, job_id = r.json()["judge_run_id"], r.json()["job_id"]
    _run_worker(app)
    job = client.get(f"/api/jobs/{job_id}").json()
    assert job["state"] == "succeeded", job
    db.expire_all()
    rankings = list(db.scalars(select(Ranking).where(Ranking.judge_run_id == run_id)))
    assert len(rankings) == 2
    for ranking in rankings:
        labels = list(db.scalars(select(StepLabel).where(StepLabel.ranking_id == ranking.id)))
        completions = db.scalars(select(Completion).where(Completion.prompt_id == ranking.prompt_id)).all()
        # One label per stored step of each completion, a number in [0, 1] with its hard label beside it.
        assert sorted((s.completion_id, s.step_index) for s in labels) == sorted(
            (c.id, i) for c in completions for i in range(len(c.steps)))
        assert all(0.0 <= s.p <= 1.0 and s.label == (1 if s.p >= 0.5 else -1) for s in labels)
    assert job["result"]["step_labels_written"] == 2 * (2 + 3)
    db.rollback()

    report = client.get(f"/api/projects/{pid}/judge-agreement/steps").json()
    assert report["n_prompts"] == 1 and report["n_steps"] == 5 and 0 <= report["brier"] <= 1
    assert report["ai_step_labels_enabled"] is False and report["gate_missing"]
    assert step_agreement.report(db, project).labelled_completions == 2  # the human's two, not the judge's


def test_label_steps_needs_the_projects_step_option(db, make_user, make_project, token_for, api, browser) -> None:
    lead, _, project = _project(db, make_user, make_project, step_labels=False)
    client = api(token_for(db, lead))
    db.commit()
    page = browser()
    page.login(lead.email)
    assert 'name="label_steps"' not in page.get(f"/projects/{project.id}/judge").text  # offered with steps on
    refused = page.post(f"/projects/{project.id}/judge/runs", {"model": "/nonexistent", "label_steps": "true"})
    assert refused.status_code == 422 and "this project does not label steps" in refused.text
    r = client.post(f"/api/projects/{project.id}/judge-runs", json={
        "generator": {"backend": "hf", "model": "/nonexistent"}, "label_steps": True})
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "label_steps", r.text
    r = client.post(f"/api/projects/{project.id}/judge-runs", json={
        "generator": {"backend": "hf", "model": "/nonexistent"}, "label_steps": 1})
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "label_steps"  # strict: 1 is no true


def test_the_step_gate_refuses_then_allows(db, make_user, make_project, token_for, api, browser) -> None:
    lead, annotator, project = _project(db, make_user, make_project)
    _evidence(db, project, annotator, GATE_MIN_PROMPTS - 1)
    client, ann = api(token_for(db, lead)), api(token_for(db, annotator))
    db.commit()
    pid = project.id
    assert ann.put(f"/api/projects/{pid}/ai-step-labels", json={"enabled": True}).status_code == 403
    r = client.put(f"/api/projects/{pid}/ai-step-labels", json={"enabled": True})
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "enabled"
    assert "AI step labels cannot be allowed yet" in r.json()["detail"][0]["message"]
    page = browser()
    page.login(lead.email)
    html = page.get(f"/projects/{pid}/judge").text
    assert 'id="allow-ai-step-labels" disabled' in html
    assert f"labelled the steps of {GATE_MIN_PROMPTS - 1} of the {GATE_MIN_PROMPTS} prompts" in html
    assert '<dd id="judge-step-agreement">1.00</dd>' in html and "Neutral steps left out" in html
    assert 'name="label_steps"' in html  # the run form offers step labels in a project that has them
    refused = page.post(f"/projects/{pid}/judge/ai-step-labels", {"enabled": "yes"})
    assert refused.status_code == 422 and "AI step labels cannot be allowed yet" in refused.text
    # The pair switch is a separate decision: the step gate leaves it as it was.
    assert client.get(f"/api/projects/{pid}/judge-agreement").json()["ai_labels_enabled"] is False

    db.expire_all()
    _evidence(db, project, annotator, 1, start=GATE_MIN_PROMPTS)
    db.commit()
    ok = client.put(f"/api/projects/{pid}/ai-step-labels", json={"enabled": True})
    assert ok.status_code == 200, ok.text
    assert ok.json()["ai_step_labels_enabled"] is True and ok.json()["n_prompts"] == GATE_MIN_PROMPTS
    assert '<strong id="ai-step-labels">Yes</strong>' in page.get(f"/projects/{pid}/judge").text
    assert page.post(f"/projects/{pid}/judge/ai-step-labels", {"enabled": "no"}).status_code == 303
    assert client.get(f"/api/projects/{pid}/judge-agreement/steps").json()["ai_step_labels_enabled"] is False


def test_a_judge_that_disagrees_on_steps_is_not_let_through(db, make_user, make_project) -> None:
    lead, annotator, project = _project(db, make_user, make_project)
    _evidence(db, project, annotator, GATE_MIN_PROMPTS, agrees=False)
    report = judge_steps.judge_step_agreement(db, project)
    assert report.n_prompts == GATE_MIN_PROMPTS and report.step_agreement == 0.0
    # p = 0.2 on a correct step and 0.9 on a wrong one: ((0.2 − 1)² + (0.9 − 0)²) / 2 = (0.64 + 0.81) / 2.
    assert report.brier == pytest.approx(0.725) and report.wrong_step_recall == 0.0
    with pytest.raises(Exception, match="agrees with humans on 0% of steps"):
        judge_steps.set_ai_step_labels(db, project, lead, True)


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_steps_exports_hold_judge_step_labels_only_once_allowed(db, make_user, make_project, token_for, api, app,
                                                                tmp_path: Path) -> None:
    lead, annotator, project = _project(db, make_user, make_project)
    run = _evidence(db, project, annotator, GATE_MIN_PROMPTS, ai_only=1)
    client = api(token_for(db, lead))
    db.commit()
    pid = project.id
    # The pair switch does not let step labels in: only the step switch does.
    db.refresh(project)
    project.settings = dict(project.settings or {}) | {"ai_labels_for_training": True}
    db.commit()

    before = _export(client, app, pid, kind="steps", format="jsonl")
    assert before["filters"]["source"] == ["human", "imported"] and before["row_count"] == GATE_MIN_PROMPTS
    rows = _rows(_download(client, before, tmp_path / "before") / "steps.jsonl")
    assert all(r["source"] == "human" and r["judge_p"] is None and len(r["ranking_ids"]) == 1 for r in rows)
    named = client.post(f"/api/projects/{pid}/exports", json={"kind": "steps", "format": "jsonl",
                                                              "filters": {"source": ["ai"]}})
    assert named.status_code == 422 and named.json()["detail"][0]["field"] == "filters.source"

    assert client.put(f"/api/projects/{pid}/ai-step-labels", json={"enabled": True}).status_code == 200
    after = _export(client, app, pid, kind="steps", format="jsonl")
    assert "source" not in after["filters"] and after["row_count"] == GATE_MIN_PROMPTS + 1
    rows = _rows(_download(client, after, tmp_path / "after") / "steps.jsonl")
    mixed = [r for r in rows if r["source"] == "mixed"]
    assert len(mixed) == GATE_MIN_PROMPTS
    for row in mixed:
        # Human [+1, −1] and the judge's hard [+1, −1] (p 0.9, 0.2): two votes each, the judge's p beside them.
        assert row["step_labels"] == [1, -1] and row["votes"] == [2, 2] and row["judge_p"] == [0.9, 0.2]
        assert f"judge-run-{run.id}" in row["annotators"] and len(row["ranking_ids"]) == 2
    (ai_only,) = [r for r in rows if r["source"] == "ai"]
    assert ai_only["annotators"] == [f"judge-run-{run.id}"] and ai_only["labels"] == [True, False]
    card = (tmp_path / "after" / "README.md").read_text(encoding="utf-8")
    assert "`judge_p`" in card
