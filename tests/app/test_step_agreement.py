"""Agreement on step labels: hand-computed figures, and the API and page that show them."""

from __future__ import annotations

import pytest

from app.quality import step_agreement
from tests.app.test_steps_export import BAD, GOOD, _label_everything, _seed


def test_figures_by_hand() -> None:
    # Completion 1: A [1, 1, -1], B [1, -1] (stopped at its first error). Completion 2: A [1], B [1]; 3: only A.
    labelled = {1: {"A": [1, 1, -1], "B": [1, -1]}, 2: {"A": [1], "B": [1]}, 3: {"A": [-1]}}
    report = step_agreement.summarise(labelled)
    # Steps with two coders: (1,0) agree, (1,1) disagree, (2,0) agree → 2/3; step (1,2) has one coder only.
    assert report.compared_steps == 3 and report.step_agreement == pytest.approx(2 / 3)
    # First errors: completion 1 at 2 vs 1 (differ), completion 2 none vs none (same) → 1/2.
    assert report.first_error_agreement == pytest.approx(0.5)
    assert (report.labelled_completions, report.shared_completions) == (3, 2)
    # Ordinal α on the units (1,0): {1, 1}, (1,1): {1, -1}, (2,0): {1, 1}: coincidences o(1,1) = 4, o(1,-1) =
    # o(-1,1) = 1; n_1 = 5, n_-1 = 1, n = 6; δ²(−1, 1) = (6 − 3)² = 9 (no 0 values between them).
    # D_o ∝ (n − 1)·Σ o δ² = 5·(2·9) = 90; D_e ∝ Σ n_c n_k δ² = 2·5·1·9 = 90 → α = 1 − 90/90 = 0.
    assert report.krippendorff_alpha == pytest.approx(0.0)


def test_perfect_agreement_is_one() -> None:
    report = step_agreement.summarise({1: {"A": [1, 0, -1], "B": [1, 0, -1]}, 2: {"A": [1, 1], "B": [1, 1]}})
    assert report.step_agreement == 1.0 and report.first_error_agreement == 1.0
    assert report.krippendorff_alpha == pytest.approx(1.0)


def test_the_api_and_the_quality_page_report_step_agreement(db, make_user, make_project, token_for, api,
                                                            app) -> None:
    from tests.conftest import Browser

    lead, engineer, project, people = _seed(db, make_user, make_project)
    _label_everything(db, api, token_for, project, people,
                      lambda n, text: ([1, 1, 1] if n == 0 else [1, 0, 1]) if text == GOOD else [-1])
    pid, lead_email = project.id, lead.email
    client = api(token_for(db, engineer))
    annotator = api(token_for(db, people[0]))
    db.commit()
    out = client.get(f"/api/projects/{pid}/agreement/steps").json()
    # Per prompt: GOOD's 3 steps (agree, disagree, agree) and BAD's 1 step (agree); two prompts alike.
    assert out["compared_steps"] == 8 and out["step_agreement"] == pytest.approx(6 / 8)
    assert out["first_error_agreement"] == 1.0 and out["shared_completions"] == 4
    assert annotator.get(f"/api/projects/{pid}/agreement/steps").status_code == 403
    browser = Browser(app)
    browser.login(lead_email)
    page = browser.get(f"/projects/{pid}/agreement")
    assert page.status_code == 200 and 'id="step-agreement"' in page.text and "75.0%" in page.text


def test_gold_step_scores_by_hand() -> None:
    # Gold: completion 1 [1, 1, -1], completion 2 [1]. A: [1, 1, -1] and [1]: all agree. B: [1, -1] on 1 (step 1
    # wrong, and the first error one step early; step 2 not compared), nothing on 2.
    labelled = {1: {"A": [1, 1, -1], "B": [1, -1]}, 2: {"A": [1]}}
    scores = step_agreement.gold_scores(labelled, {1: [1, 1, -1], 2: [1]})
    assert scores == {"A": (2, 4, 4, 2), "B": (1, 2, 1, 0)}


def test_gold_step_labels_give_each_annotator_a_step_accuracy(db, make_user, make_project, token_for, api,
                                                             app) -> None:
    from sqlalchemy import select

    from app.models import Completion, Prompt
    from tests.conftest import Browser

    lead, engineer, project, people = _seed(db, make_user, make_project)
    gold_prompt = db.scalars(select(Prompt).where(Prompt.project_id == project.id).order_by(Prompt.id)).first()
    ids = dict(db.execute(select(Completion.text, Completion.id).where(Completion.prompt_id == gold_prompt.id)).all())
    lead_client = api(token_for(db, lead))
    db.commit()
    url = f"/api/projects/{project.id}/prompts/{gold_prompt.id}/gold"
    known = {str(ids[GOOD]): [1, 1, 1], str(ids[BAD]): [1, -1]}
    response = lead_client.put(url, json={"tiers": [[ids[GOOD]], [ids[BAD]]], "step_labels": known})
    assert response.status_code == 200, response.text
    assert response.json()["gold_step_labels"] == known
    _label_everything(db, api, token_for, project, people,
                      lambda n, text: ([1, 1, 1] if n == 0 else [1, 0, 1]) if text == GOOD else [-1])
    engineer_client = api(token_for(db, engineer))
    db.commit()
    out = engineer_client.get(f"/api/projects/{project.id}/agreement/steps").json()
    # On the gold prompt: GOOD 3/3 (annotator 0) or 2/3 (annotator 1), first errors alike (none); BAD's one step
    # compared is −1 against the known +1, and the first error comes a step early.
    by_user = {a["user_id"]: a for a in out["annotators"]}
    first, second = by_user[people[0].id], by_user[people[1].id]
    assert (first["gold_steps"], first["gold_steps_agreed"], first["gold_step_accuracy"]) == (4, 3, 0.75)
    assert (second["gold_steps_agreed"], second["gold_first_error_accuracy"]) == (2, 0.5)
    assert out["gold_completions"] == 2
    browser = Browser(app)
    browser.login(lead.email)
    page = browser.get(f"/projects/{project.id}/agreement")
    assert page.status_code == 200 and "Gold steps" in page.text and "4 steps of 2 responses" in page.text


def test_bad_gold_step_labels_are_a_422_naming_the_field_and_change_nothing(db, make_user, make_project,
                                                                            token_for, api) -> None:
    from sqlalchemy import select

    from app.models import Completion, Prompt

    lead, _, project, _ = _seed(db, make_user, make_project)
    prompts = db.scalars(select(Prompt).where(Prompt.project_id == project.id).order_by(Prompt.id)).all()
    ids = dict(db.execute(select(Completion.text, Completion.id).where(Completion.prompt_id == prompts[0].id)).all())
    other = db.scalar(select(Completion.id).where(Completion.prompt_id == prompts[1].id))
    client = api(token_for(db, lead))
    db.commit()
    url = f"/api/projects/{project.id}/prompts/{prompts[0].id}/gold"
    tiers = [[ids[GOOD]], [ids[BAD]]]
    for labels, field in (({str(ids[GOOD]): [1, 1]}, f"step_labels.{ids[GOOD]}"),
                          ({str(other): [1]}, f"step_labels.{other}"),
                          ({str(ids[BAD]): [2, 1]}, f"step_labels.{ids[BAD]}.0"),
                          ({"x": [1]}, "step_labels.x.[key]")):
        response = client.put(url, json={"tiers": tiers, "step_labels": labels})
        assert response.status_code == 422, (labels, response.text)
        assert response.json()["detail"][0]["field"] == field, response.text
    db.expire_all()
    assert db.get(Prompt, prompts[0].id).gold_tiers is None
