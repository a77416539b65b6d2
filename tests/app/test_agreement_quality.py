"""The agreement page points at problems: flags with thresholds, the rows behind each figure, and the trend.

The fixture: six prompts of K = 4 completions (a < b < c < d by id), ranked by three annotators:

    careful1, careful2   a > b > c > d, 30 s each; shown first: a, b, c, d, a, b (rotating) → first on top 2/6
    fast                 d > c > b > a, 0.2 s each; shown d, c, b, a and ranks in that order → first on top 6/6

P1 and P2 are gold with the order [a], [b, c, d]: three pairs each, so the careful get 6/6 and fast 0/6.
Per prompt the careful pair agrees fully (1) and each against fast not at all (0): mean agreement 1/3.
"""

from __future__ import annotations

import re

import pytest

from app.models import Completion, Prompt, Ranking
from app.projects import projects
from app.quality import agreement, gold
from app.quality import flags as agreement_flags
from app.quality import rows as agreement_rows
from app.quality.flags import THRESHOLDS
from app.quality.report import AgreementReport


def _setup(db, make_user, make_project, *, n_prompts: int = 6):  # type: ignore[no-untyped-def]
    lead = make_user(db, "lead")
    project = make_project(db, k=4, overlap=3, lead=lead)
    people = {}
    for who in ("careful1", "careful2", "fast"):
        people[who] = make_user(db, "annotator", email=f"{who}@example.org")
        projects.add_member(db, project, lead, email=people[who].email, role="annotator")
    prompts = []
    for i in range(n_prompts):
        prompt = Prompt(project_id=project.id, text=f"question {i}", text_hash=f"{i:064d}",
                        completions=[Completion(text=f"answer {i}{x}") for x in "abcd"])
        db.add(prompt)
        db.flush()
        prompts.append(prompt)
        ids = [c.id for c in prompt.completions]
        rotated = ids[i % 4:] + ids[:i % 4]
        for who in ("careful1", "careful2"):
            db.add(Ranking(project_id=project.id, prompt_id=prompt.id, source="human", annotator_id=people[who].id,
                           rubric_id=project.current_rubric_id, tiers=[[c] for c in ids], display_order=rotated,
                           seconds_spent=30.0))
        shown = ids[::-1]
        db.add(Ranking(project_id=project.id, prompt_id=prompt.id, source="human", annotator_id=people["fast"].id,
                       rubric_id=project.current_rubric_id, tiers=[[c] for c in shown], display_order=shown,
                       seconds_spent=0.2))
    for prompt in prompts[:2]:
        ids = [c.id for c in prompt.completions]
        gold.set_gold(db, project, prompt.id, [[ids[0]], ids[1:]], lead)
    db.flush()
    return project, lead, people, prompts


def test_the_fast_position_biased_gold_missing_annotator_is_flagged_and_the_careful_are_not(
        db, make_user, make_project) -> None:
    project, _, people, _ = _setup(db, make_user, make_project)
    report = agreement.project_report(db, project)
    by = {a.email: a for a in report.annotators}

    assert report.median_seconds == 30.0  # 12 rankings at 30 s, 6 at 0.2 s
    assert [f.kind for f in by["fast@example.org"].flags] == ["too_fast", "position_bias", "low_gold"]
    assert by["careful1@example.org"].flags == [] and by["careful2@example.org"].flags == []
    fast = by["fast@example.org"]
    assert (fast.position_rate, fast.position_expected, fast.position_rankings) == (1.0, 0.25, 6)
    assert (fast.gold_agreed, fast.gold_pairs) == (0, 6)
    assert by["careful1@example.org"].position_rate == pytest.approx(2 / 6)  # 8 points above 1/4: not bias
    words = {f.kind: f for f in fast.flags}
    assert "0.2 s" in words["too_fast"].why and "30.0 s" in words["too_fast"].why
    assert "100% of 6 rankings" in words["position_bias"].why and "25%" in words["position_bias"].why
    assert "0% of 6" in words["low_gold"].why and words["low_gold"].action
    # One annotator in three ranking in reverse drags α below 0: the project is flagged too.
    assert report.krippendorff_alpha < 0 and [f.kind for f in report.flags] == ["negative_alpha"]


def test_too_few_rankings_raise_no_flag(db, make_user, make_project) -> None:
    # Four prompts: fewer than min_rankings (5), so speed and position say nothing yet; gold still counts
    # (two gold prompts of three pairs each ≥ gold_min_pairs).
    assert THRESHOLDS.min_rankings == 5
    project, _, _, _ = _setup(db, make_user, make_project, n_prompts=4)
    fast = next(a for a in agreement.project_report(db, project).annotators if a.email == "fast@example.org")
    assert [f.kind for f in fast.flags] == ["low_gold"]


def test_negative_alpha_is_a_project_flag() -> None:
    # Two annotators in opposite orders on five prompts of four: α is well below 0.
    report = AgreementReport(
        project_id=1, rubric_version=None, rubric_versions=[1], overlap=2, total_prompts=5, prompts_at_overlap=5,
        human_rankings=10, skipped=0, shared_prompts=5, comparisons=5, mean_agreement=0.0, mean_kendall_tau=-1.0,
        krippendorff_alpha=agreement.ranking_alpha(
            [(p, "x", [[1], [2], [3], [4]]) for p in range(5)] + [(p, "y", [[4], [3], [2], [1]]) for p in range(5)]),
        gold_prompts=0)
    assert report.krippendorff_alpha < 0
    flags = agreement_flags.project_flags(report)
    assert [f.kind for f in flags] == ["negative_alpha"] and "more than if they ranked at random" in flags[0].why
    few = agreement_flags.project_flags(AgreementReport(**{**report.__dict__, "comparisons": 2}))
    assert few == []


def test_the_trend_over_time_and_by_rubric_version(db, make_user, make_project) -> None:
    project, _, _, _ = _setup(db, make_user, make_project)
    report = agreement.project_report(db, project)
    assert report.trend_unit == "hour" and len(report.trend) == 1  # everything was ranked just now
    point = report.trend[0]
    assert (point.rankings, point.median_seconds) == (18, 30.0)
    assert point.agreement == pytest.approx(1 / 3) and point.gold_accuracy == pytest.approx(12 / 18)
    assert [(v.label, v.rankings) for v in report.by_rubric_version] == [("v1", 18)]


def test_the_rows_behind_the_figures(db, make_user, make_project) -> None:
    project, lead, people, prompts = _setup(db, make_user, make_project)
    found = agreement_rows.disagreements(db, project, lead)
    items, total = found.items, found.total
    assert total == 6 and [d.agreement for d in items] == [pytest.approx(1 / 3)] * 6
    orders = dict(items[0].rankings)
    assert orders["careful1@example.org"] == "A > B > C > D" and orders["fast@example.org"] == "D > C > B > A"

    misses = agreement_rows.annotator_rankings(db, project, people["fast"].id, view="gold-misses")
    assert misses.total == 2 and {r.letters.prompt_id for r in misses.rows} == {prompts[0].id, prompts[1].id}
    row = misses.rows[0]
    assert (row.gold_score, row.gold, row.first_shown, row.first_shown_on_top) == ((0, 3), "A > B = C = D", "D", True)
    assert agreement_rows.annotator_rankings(db, project, people["careful1"].id, view="gold-misses").rows == []
    everything = agreement_rows.annotator_rankings(db, project, people["careful1"].id)
    assert everything.total == 6 and everything.rows[0].agreement == pytest.approx(0.5)  # 1 with careful2, 0 with fast


def _row_of(html: str, email: str) -> str:
    match = re.search(r"<tr>\s*<th scope=\"row\" class=\"agr-who\"><a [^>]*>" + re.escape(email) + r".*?</tr>",
                      html, re.S)
    assert match, email
    return match.group(0)


def test_the_page_colours_what_to_act_on_and_links_every_figure(db, make_user, make_project, browser) -> None:
    project, lead, people, _ = _setup(db, make_user, make_project)
    outsider = make_user(db, "annotator")
    db.commit()
    page = browser()
    page.login(lead.email)
    html = page.get(f"/projects/{project.id}/agreement").text

    assert "Needs your attention" in html and 'data-flag="too_fast"' in html
    assert "too little time to read every answer" in html and "What to do:" in html
    fast_row, careful_row = _row_of(html, "fast@example.org"), _row_of(html, "careful1@example.org")
    assert fast_row.count("agr-flagged") == 3 and "Too fast" in fast_row and "Position-biased" in fast_row
    assert "agr-flagged" not in careful_row and "agr-flag-tag" not in careful_row  # fine figures stay neutral
    fast_id = people["fast"].id
    assert f'href="/projects/{project.id}/agreement/annotators/{fast_id}?view=gold-misses"' in fast_row
    assert f'href="/projects/{project.id}/agreement/prompts"' in html
    # Gold: what is set, what has been ranked, and per annotator how many they ranked.
    assert 'id="gold-prompts">2<' in html and 'id="gold-ranked">2<' in html and "2 gold ranked, 6 pairs" in fast_row
    assert 'data-metric="trend"' in html and 'data-metric="by_rubric_version"' in html

    prompts_page = page.get(f"/projects/{project.id}/agreement/prompts")
    assert prompts_page.status_code == 200 and "D &gt; C &gt; B &gt; A" in prompts_page.text
    misses = page.get(f"/projects/{project.id}/agreement/annotators/{fast_id}", params={"view": "gold-misses"})
    assert misses.status_code == 200 and misses.text.count("0 / 3 pairs right") == 2
    assert page.get(f"/projects/{project.id}/agreement/annotators/{outsider.id}").status_code == 404
    assert page.get(f"/projects/{project.id}/agreement/annotators/{fast_id}",
                    params={"view": "bogus"}).status_code == 422

    annotator = browser()
    annotator.login(people["careful1"].email)
    assert annotator.get(f"/projects/{project.id}/agreement/prompts").status_code == 403
    assert annotator.get(f"/projects/{project.id}/agreement/annotators/{fast_id}").status_code == 403


def test_the_api_carries_the_flags(db, make_user, make_project, token_for, api) -> None:
    project, lead, _, _ = _setup(db, make_user, make_project)
    token = token_for(db, lead)
    db.commit()
    body = api(token).get(f"/api/projects/{project.id}/agreement").json()
    by = {a["email"]: a for a in body["annotators"]}
    assert [f["kind"] for f in by["fast@example.org"]["flags"]] == ["too_fast", "position_bias", "low_gold"]
    assert body["gold_prompts_ranked"] == 2 and body["median_seconds"] == 30.0 and body["trend"]
