"""Agreement on step labels: hand-computed figures, and the API and page that show them."""

from __future__ import annotations

import pytest

from app.services import step_agreement
from tests.app.test_steps_export import GOOD, _label_everything, _seed


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
