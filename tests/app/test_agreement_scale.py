"""The agreement figures at campaign scale equal today's computation: the report built one (prompt, round) at a
time from a streamed query, and the figures kept up to date as rankings arrive (app.quality.upkeep), against the
whole-list computation (tests/support/agreement_oracle.py) on a project small enough to compute both ways, on SQLite
and Postgres.

The fixture is a small campaign with everything the figures react to: careful, sloppy and fast position-biased
annotators, ties, partial rankings, skips, rankings without a display order or a time, gold tasks (one with a tied
gold order), three rubric versions over ten days, a second round, and AI and imported rankings that must not count.
"""

from __future__ import annotations

import dataclasses
import math
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from app.models import AGREEMENT_FORMULA, Completion, JudgeRun, Prompt, Ranking
from app.projects import projects, rubrics
from app.quality import agreement, gold, rollups, upkeep
from tests.support.agreement_oracle import oracle_report

KINDS = ["careful"] * 5 + ["sloppy", "fast", "fast"]


def _same(a: Any, b: Any, path: str = "report") -> None:
    """Deep equality; floats to 1e-9 relative (the sums are the same terms added in another order)."""
    if dataclasses.is_dataclass(a):
        assert type(a) is type(b), path
        for f in dataclasses.fields(a):
            _same(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}")
    elif isinstance(a, dict) and isinstance(b, dict):
        assert a.keys() == b.keys(), f"{path}: {sorted(a)} != {sorted(b)}"
        for k in a:
            _same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), f"{path}: {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12), f"{path}: {a} != {b}"
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def _tiers(rng: random.Random, kind: str, truth: list[int], shown: list[int]) -> list[list[int]]:
    if kind == "fast":
        return [[shown[0]]] + [[c] for c in rng.sample(shown[1:], len(shown) - 1)]
    order = rng.sample(truth, len(truth)) if kind == "sloppy" else list(truth)
    if kind == "careful" and rng.random() < 0.2:
        order[1], order[2] = order[2], order[1]
    tiers = [[c] for c in order]
    roll = rng.random()
    if roll < 0.15:
        tiers[1:3] = [tiers[1] + tiers[2]]  # a tie
    elif roll < 0.25:
        tiers = tiers[:-1]  # a partial ranking
    return tiers


def _campaign(db, make_user, make_project, *, n_prompts: int = 40, seed: int = 7):  # type: ignore[no-untyped-def]
    rng = random.Random(seed)
    lead = make_user(db, "lead")
    project = make_project(db, k=4, overlap=3, lead=lead)
    project.allow_partial = True
    rubric_ids = [project.current_rubric_id]
    for v in (2, 3):
        rubric_ids.append(rubrics.create_version(db, project, lead, text=f"Rubric v{v}", criteria=["Correctness"],
                                                 base_version=v - 1).id)
    people = []
    for i, _ in enumerate(KINDS):
        person = make_user(db, "annotator", email=f"a{i}@example.org")
        projects.add_member(db, project, lead, email=person.email, role="annotator")
        people.append(person)
    judge = JudgeRun(project_id=project.id, name="judge", state="succeeded")
    db.add(judge)
    t0 = datetime(2026, 3, 1, 9, tzinfo=UTC)
    for i in range(n_prompts):
        prompt = Prompt(project_id=project.id, text=f"question {i}", text_hash=f"{i:064d}",
                        completions=[Completion(text=f"answer {i}{x}") for x in "abcd"])
        db.add(prompt)
        db.flush()
        ids = [c.id for c in prompt.completions]
        truth = rng.sample(ids, 4)
        if i % 8 == 0:
            gold.set_gold(db, project, prompt.id, [[truth[0]], truth[1:]] if i % 16 else [[c] for c in truth], lead)
        for round_ in (1, 2) if i % 10 == 3 else (1,):
            for who in rng.sample(range(len(people)), 3):
                shown = rng.sample(ids, 4) if rng.random() > 0.05 else []
                skipped = rng.random() < 0.05
                at = t0 + timedelta(days=10 * i / n_prompts, minutes=rng.uniform(0, 300))
                db.add(Ranking(project_id=project.id, prompt_id=prompt.id, round=round_, source="human",
                               annotator_id=people[who].id, rubric_id=rubric_ids[min(2, 3 * i // n_prompts)],
                               tiers=[] if skipped else _tiers(rng, KINDS[who], truth, shown or ids),
                               display_order=shown, skipped=skipped,
                               seconds_spent=None if rng.random() < 0.05 else
                               (1.0 if KINDS[who] == "fast" else rng.uniform(10, 60)),
                               created_at=at))
        db.flush()
        db.add(Ranking(project_id=project.id, prompt_id=prompt.id, source="ai", judge_run_id=judge.id,
                       tiers=[[c] for c in truth], display_order=ids))
        if i % 5 == 0:
            db.add(Ranking(project_id=project.id, prompt_id=prompt.id, source="imported", tiers=[[ids[1]], [ids[0]]]))
    project.current_round = 2
    db.flush()
    return project, lead


@pytest.mark.parametrize("version", [None, 1, 2, 3])
def test_the_streamed_report_equals_the_whole_list_computation_for_every_metric(
        db, make_user, make_project, version) -> None:
    project, _ = _campaign(db, make_user, make_project)
    report = agreement.project_report(db, project, rubric_version=version)
    expected = oracle_report(db, project, rubric_version=version)

    _same(report, expected)
    # The fixture exercises what the comparison is for: every figure has something in it.
    assert report.comparisons > 20 and report.krippendorff_alpha is not None and report.mean_kendall_tau is not None
    assert any(a.gold_pairs for a in report.annotators) and any(a.position_rankings for a in report.annotators)
    if version is None:
        assert len(report.by_rubric_version) == 3 and len(report.trend) > 3
        kinds = {f.kind for a in report.annotators for f in a.flags}
        assert {"too_fast", "position_bias"} <= kinds


def test_every_scope_from_one_pass_equals_each_scope_computed_alone(db, make_user, make_project) -> None:
    project, _ = _campaign(db, make_user, make_project, n_prompts=24, seed=3)
    together = agreement.project_reports(db, project)

    assert set(together) == {None, 1, 2, 3}
    for version, report in together.items():
        _same(report, oracle_report(db, project, rubric_version=version))


@pytest.mark.parametrize("version", [None, 2])
def test_the_kept_figures_equal_the_computation_and_say_how_fresh_they_are(
        db, make_user, make_project, version) -> None:
    project, lead = _campaign(db, make_user, make_project, n_prompts=24, seed=5)

    shown, fresh = rollups.current_report(db, project, lead, rubric_version=version)  # the view folds them in

    assert fresh.method == "kept" and fresh.as_of is not None and fresh.waiting == 0
    assert fresh.rankings == oracle_report(db, project).human_rankings
    assert "Kept up to date as rankings arrive" in fresh.describe() and "s ago" in fresh.describe()
    _same(shown, oracle_report(db, project, rubric_version=version))


def test_many_waiting_changes_are_folded_in_by_a_job_and_the_api_says_so_meanwhile(
        app, db, make_user, make_project, api, token_for, monkeypatch) -> None:
    from app.models import Job
    from app.worker import Worker

    project, lead = _campaign(db, make_user, make_project, n_prompts=12, seed=11)
    token = token_for(db, lead)
    db.commit()
    monkeypatch.setattr(upkeep, "INLINE_MARKS", 10)  # more changes wait than a view folds in itself
    client = api(token)

    pending = client.get(f"/api/projects/{project.id}/agreement")
    assert pending.status_code == 503 and pending.headers["Retry-After"]
    assert "Adding the first 11+ changes" in pending.json()["detail"][0]["message"]
    again = client.get(f"/api/projects/{project.id}/agreement")
    assert again.status_code == 503
    db.commit()
    assert db.query(Job).filter_by(project_id=project.id, kind=upkeep.KIND).count() == 1  # one drain queued
    db.commit()  # SQLite: the test's read ends before the worker writes
    assert Worker(app.state.settings, session_factory=app.state.session_factory, heartbeat_s=0.2).run_one()
    ready = client.get(f"/api/projects/{project.id}/agreement")

    assert ready.status_code == 200, ready.text
    body = ready.json()
    assert body["computed"] == "kept" and body["age_seconds"] is not None and body["as_of"]
    expected = oracle_report(db, project)
    assert body["human_rankings"] == expected.human_rankings and body["comparisons"] == expected.comparisons
    assert body["krippendorff_alpha"] == pytest.approx(expected.krippendorff_alpha, rel=1e-9)
    assert [a["email"] for a in body["annotators"]] == [a.email for a in expected.annotators]


def test_states_of_older_formulas_are_rebuilt_once_by_a_job(
        app, db, make_user, make_project, browser) -> None:
    from app.models import AgreementState, Job
    from app.worker import Worker

    project, lead = _campaign(db, make_user, make_project, n_prompts=8, seed=2)
    rollups.current_report(db, project, lead)
    db.get(AgreementState, project.id).formula = 0  # as the upgrade leaves every project it found
    db.commit()
    b = browser()
    b.login(lead.email)

    for _ in range(2):
        pending = b.get(f"/projects/{project.id}/agreement")
        assert pending.status_code == 200 and 'id="agreement-pending"' in pending.text
        assert "Computing the figures from every ranking, once" in pending.text
    db.commit()
    jobs = db.query(Job).filter_by(project_id=project.id, kind=upkeep.KIND).all()
    assert [j.payload["agreement"] for j in jobs] == ["rebuild"]
    db.commit()  # SQLite: the test's read ends before the worker writes
    assert Worker(app.state.settings, session_factory=app.state.session_factory, heartbeat_s=0.2).run_one()
    page = b.get(f"/projects/{project.id}/agreement")

    assert 'data-method="kept"' in page.text
    assert f'id="human-rankings">{oracle_report(db, project).human_rankings}<' in page.text
    db.commit()
    assert db.get(AgreementState, project.id).formula == AGREEMENT_FORMULA


def test_a_small_project_reads_the_kept_figures_and_says_so(app, db, make_user, make_project, browser) -> None:
    project, lead = _campaign(db, make_user, make_project, n_prompts=6, seed=2)
    db.commit()
    b = browser()
    b.login(lead.email)

    page = b.get(f"/projects/{project.id}/agreement")

    assert page.status_code == 200
    assert 'data-method="kept"' in page.text and "Kept up to date as rankings arrive" in page.text


def test_a_large_projects_page_shows_the_rollups_counts_with_their_age(
        app, db, make_user, make_project, browser, monkeypatch) -> None:
    from app.worker import Worker

    project, lead = _campaign(db, make_user, make_project, n_prompts=12, seed=13)
    db.commit()
    monkeypatch.setattr(rollups, "COUNT_LIVE_LIMIT", 10)
    b = browser()
    b.login(lead.email)

    before = b.get(f"/projects/{project.id}")  # no rollup yet: counted on the view, and a rollup queued
    assert before.status_code == 200 and 'id="counts-as-of"' not in before.text
    assert Worker(app.state.settings, session_factory=app.state.session_factory, heartbeat_s=0.2).run_one()
    after = b.get(f"/projects/{project.id}")

    assert 'id="counts-as-of"' in after.text and "s ago" in after.text
    exact = projects.counts(db, project)
    assert f'<dd id="count-rankings">{exact.rankings}</dd>' in after.text
    assert f'<dd id="count-pairs">{exact.pairs}</dd>' in after.text


def test_a_large_projects_judge_figures_come_from_the_rollup_and_equal_the_computation(
        app, db, make_user, make_project, browser, monkeypatch) -> None:
    from sqlalchemy import select

    from app.annotation.pairs import expand_tiers
    from app.models import Pair
    from app.quality import judge_agreement

    project, lead = _campaign(db, make_user, make_project, n_prompts=16, seed=17)
    for r in db.scalars(select(Ranking).where(Ranking.project_id == project.id, Ranking.source == "ai")):
        db.add_all([Pair(ranking_id=r.id, prompt_id=r.prompt_id, chosen_id=s.chosen, rejected_id=s.rejected,
                         margin=s.margin, source="ai", p=0.6 + 0.1 * (s.margin % 3)) for s in expand_tiers(r.tiers)])
    db.flush()
    monkeypatch.setattr(rollups, "LIVE_LIMIT", 10)
    rollups.store(db, project.id, rollups.compute(db, project))
    db.commit()

    report, fresh = rollups.judge_report(db, project, lead)

    assert fresh.method == "rollup"
    expected = judge_agreement.judge_agreement(db, project)
    assert expected.n_pairs > 0 and expected.n_prompts == 16
    assert report.as_dict() == expected.as_dict()
    db.commit()  # SQLite: the page's login writes
    b = browser()
    b.login(lead.email)
    page = b.get(f"/projects/{project.id}/judge")
    assert page.status_code == 200 and 'id="judge-freshness"' in page.text
    assert f'<dd id="judge-prompts">{expected.n_prompts}</dd>' in page.text
