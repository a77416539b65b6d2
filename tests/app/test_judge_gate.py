"""The AI-labels gate: "allow" waits for evidence (prompts judged beside humans, agreement) and the server refuses
it too; calibration is drawn as a reliability diagram; a project without a judge model says how to get one."""

from __future__ import annotations

import pytest

from app.judge import judging
from app.models import Completion, JudgeRun, Pair, Prompt, Ranking
from app.projects import projects
from app.quality import judge_agreement
from app.quality.judge_agreement import GATE_MIN_PROMPTS, CalibrationBin


def _evidence(db, project, annotator, n: int, *, judge_agrees: bool = True,  # type: ignore[no-untyped-def]
              start: int = 0) -> None:
    """n prompts of two completions, ranked a > b by a human and by a judge run (p = 0.9 for its choice)."""
    run = JudgeRun(project_id=project.id, name="test", state="succeeded")
    db.add(run)
    db.flush()
    for i in range(start, start + n):
        prompt = Prompt(project_id=project.id, text=f"q{i}", text_hash=f"{i:064d}",
                        completions=[Completion(text="a"), Completion(text="b")])
        db.add(prompt)
        db.flush()
        a, b = (c.id for c in prompt.completions)
        db.add(Ranking(project_id=project.id, prompt_id=prompt.id, source="human", annotator_id=annotator.id,
                       tiers=[[a], [b]], display_order=[a, b]))
        chosen, rejected = (a, b) if judge_agrees else (b, a)
        ai = Ranking(project_id=project.id, prompt_id=prompt.id, source="ai", judge_run_id=run.id,
                     tiers=[[chosen], [rejected]], display_order=[])
        db.add(ai)
        db.flush()
        db.add(Pair(ranking_id=ai.id, prompt_id=prompt.id, chosen_id=chosen, rejected_id=rejected, source="ai", p=0.9))
    db.flush()


def _project(db, make_user, make_project):  # type: ignore[no-untyped-def]
    lead = make_user(db, "lead")
    project = make_project(db, k=2, lead=lead)
    annotator = make_user(db, "annotator")
    projects.add_member(db, project, lead, email=annotator.email, role="annotator")
    return lead, annotator, project


def test_allow_is_disabled_and_refused_until_the_evidence_exists(db, make_user, make_project, token_for, api,
                                                                 browser) -> None:
    lead, annotator, project = _project(db, make_user, make_project)
    _evidence(db, project, annotator, GATE_MIN_PROMPTS - 1)
    token = token_for(db, lead)
    db.commit()
    pid = project.id

    page = browser()
    page.login(lead.email)
    html = page.get(f"/projects/{pid}/judge").text
    assert '<button type="submit" id="allow-ai-labels" disabled' in html
    assert f"ranked {GATE_MIN_PROMPTS - 1} of the {GATE_MIN_PROMPTS} prompts in common" in html
    # The server refuses it too, on the page and in the API, naming what is missing.
    refused = page.post(f"/projects/{pid}/judge/ai-labels", {"enabled": "yes"})
    assert refused.status_code == 422 and "AI labels cannot be allowed yet" in refused.text
    assert "<strong>Allow AI labels for training</strong>" in refused.text  # the field's label, not "enabled"
    r = api(token).put(f"/api/projects/{pid}/ai-labels", json={"enabled": True})
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "enabled"
    report = api(token).get(f"/api/projects/{pid}/judge-agreement").json()
    assert report["ai_labels_enabled"] is False and len(report["gate_missing"]) == 1

    db.expire_all()
    _evidence(db, project, annotator, 1, start=GATE_MIN_PROMPTS)
    db.commit()
    html = page.get(f"/projects/{pid}/judge").text
    assert 'id="allow-ai-labels" disabled' not in html and 'id="gate-missing"' not in html
    ok = api(token).put(f"/api/projects/{pid}/ai-labels", json={"enabled": True})
    assert ok.status_code == 200 and ok.json()["ai_labels_enabled"] is True and ok.json()["gate_missing"] == []
    # Stopping is always possible.
    assert page.post(f"/projects/{pid}/judge/ai-labels", {"enabled": "no"}).status_code == 303
    assert '<strong id="ai-labels">No</strong>' in page.get(f"/projects/{pid}/judge").text


def test_a_judge_that_disagrees_with_humans_is_not_let_through(db, make_user, make_project) -> None:
    lead, annotator, project = _project(db, make_user, make_project)
    _evidence(db, project, annotator, GATE_MIN_PROMPTS, judge_agrees=False)
    report = judge_agreement.judge_agreement(db, project)
    assert report.n_prompts == GATE_MIN_PROMPTS and report.pair_agreement == 0.0
    assert report.gate_missing == ["the judge agrees with humans on 0% of pairs, under the 60% needed: revise the "
                                   "constitution or try a stronger judge model"]
    with pytest.raises(Exception, match="cannot be allowed yet"):
        judging.set_ai_labels(db, project, lead, True)


def test_reliability_bins_fold_the_judges_calibration() -> None:
    # Bin 0.0–0.2 (mean p 0.1, 4 pairs, humans for chosen 0.25) favours `rejected` with confidence 0.9 and is
    # right 0.75 of the time; it merges with bin 0.8–1.0 (mean p 0.9, 6 pairs, 0.5): confidence 0.9 over 10 pairs,
    # accuracy (4·0.75 + 6·0.5)/10 = 0.6. Bin 0.6–0.8: confidence 0.7, accuracy 1. Empty bins are left out.
    bins = [CalibrationBin(0.0, 0.2, 4, 0.25, 0.1), CalibrationBin(0.2, 0.4, 0, None),
            CalibrationBin(0.4, 0.6, 0, None), CalibrationBin(0.6, 0.8, 2, 1.0, 0.7),
            CalibrationBin(0.8, 1.0, 6, 0.5, 0.9)]
    out = judge_agreement.reliability_bins(bins)
    assert [(round(b["mean_confidence"], 6), round(b["accuracy"], 6), b["pairs"]) for b in out] == [
        (0.7, 1.0, 2), (0.9, 0.6, 10)]


def test_calibration_is_a_reliability_diagram_and_no_model_says_how_to_get_one(db, make_user, make_project,
                                                                               browser) -> None:
    lead, annotator, project = _project(db, make_user, make_project)
    admin = make_user(db, "admin")
    db.commit()
    page = browser()
    page.login(lead.email)
    html = page.get(f"/projects/{project.id}/judge").text
    assert 'id="no-calibration"' in html and 'id="no-judge-model"' in html
    assert "ask an admin to add a model endpoint" in html and 'href="/admin/endpoints"' not in html
    as_admin = browser()
    as_admin.login(admin.email)
    assert '<a href="/admin/endpoints">add a model endpoint</a>' in as_admin.get(f"/projects/{project.id}/judge").text

    _evidence(db, project, annotator, 3)
    db.commit()
    html = page.get(f"/projects/{project.id}/judge").text
    assert 'data-metric="calibration"' in html and "confidence 0.9: accuracy 1 over 3 pairs" in html
