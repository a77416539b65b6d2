"""The agreement page and API are rendered once per drain of the kept figures (app.web.fragments, per process): a
reload is a lookup, a new ranking is shown at once, the cache is read only after the permission check, and what is
the viewer's own (the gold form, the CSRF token, the freshness line) is not cached. And the judge's figures over
a large project: the API and the AI-labels gate read the rollup, with its freshness; 503 before the first.
"""

from __future__ import annotations

import re

import pytest
from sqlalchemy import select

from app.annotation.pairs import expand_tiers
from app.models import Pair, ProjectRollup, Ranking
from app.projects import projects
from app.quality import judge_agreement, rollups
from app.quality import routes as agreement_routes
from tests.app.test_agreement_scale import _campaign
from tests.support.agreement_oracle import oracle_report


def _large(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(rollups, "LIVE_LIMIT", 10)


def _large_with_rollup(db, make_user, make_project, monkeypatch, seed: int):  # type: ignore[no-untyped-def]
    """A 12-prompt campaign counted as large for the rollup (the counts, the judge), its rollup stored and
    committed: (project, lead)."""
    project, lead = _campaign(db, make_user, make_project, n_prompts=12, seed=seed)
    _large(monkeypatch)
    rollups.store(db, project.id, rollups.compute(db, project))
    db.commit()
    return project, lead


def _body(html: str) -> str:
    """The cached part of the page: from the attention card to the end of the annotators' card."""
    start = html.index('<section class="card agr-attention"')
    end = html.index("</details>\n</section>", start)
    return html[start:end]


def test_a_reload_is_a_lookup_and_a_new_ranking_is_shown_at_once(
        app, db, make_user, make_project, browser, monkeypatch) -> None:
    project, lead = _campaign(db, make_user, make_project, n_prompts=12, seed=31)
    db.commit()
    cache = app.state.fragments
    cache.clear()
    b = browser()
    b.login(lead.email)

    first = b.get(f"/projects/{project.id}/agreement")
    again = b.get(f"/projects/{project.id}/agreement")

    assert first.status_code == again.status_code == 200 and 'data-method="kept"' in again.text
    assert (cache.hits, cache.misses, len(cache)) == (1, 1, 1)
    assert _body(first.text) == _body(again.text)
    assert f'id="human-rankings">{oracle_report(db, project).human_rankings}<' in again.text
    db.commit()  # SQLite: the test's read ends before the server's next writes
    # Another scope is another entry; so is the full annotator list.
    b.get(f"/projects/{project.id}/agreement", params={"rubric_version": 2})
    b.get(f"/projects/{project.id}/agreement", params={"annotators": "all"})
    assert len(cache) == 3

    # One more ranking: the next view folds it in and shows it, without waiting for the old entry to leave.
    prompt_id = db.scalar(select(Ranking.prompt_id).where(Ranking.project_id == project.id).limit(1))
    someone = db.scalar(select(Ranking.annotator_id).where(Ranking.project_id == project.id,
                                                           Ranking.annotator_id.is_not(None)).limit(1))
    db.add(Ranking(project_id=project.id, prompt_id=prompt_id, round=2, source="human", annotator_id=someone,
                   rubric_id=project.current_rubric_id, tiers=[], skipped=True))
    db.commit()
    expected = oracle_report(db, project).human_rankings
    db.commit()
    after = b.get(f"/projects/{project.id}/agreement")
    assert f'id="human-rankings">{expected}<' in after.text and expected == \
        int(re.search(r'id="human-rankings">(\d+)<', first.text).group(1)) + 1


def test_the_cache_is_read_after_the_permission_check_and_keeps_the_viewers_parts_out(
        app, db, make_user, make_project, browser, api, token_for, monkeypatch) -> None:
    project, lead = _campaign(db, make_user, make_project, n_prompts=12, seed=37)
    engineer = make_user(db, "annotator", email="engineer@example.org")
    projects.add_member(db, project, lead, email=engineer.email, role="engineer")
    annotator = make_user(db, "annotator", email="member@example.org")
    projects.add_member(db, project, lead, email=annotator.email, role="annotator")
    outsider = make_user(db, "annotator", email="outsider@example.org")
    tokens = {who.email: token_for(db, who) for who in (lead, annotator, outsider)}
    db.commit()
    app.state.fragments.clear()
    as_lead, as_engineer = browser(), browser()  # (a commit above: SQLite's reads end before the logins write)
    as_lead.login(lead.email)
    as_engineer.login(engineer.email)

    lead_page = as_lead.get(f"/projects/{project.id}/agreement")
    engineer_page = as_engineer.get(f"/projects/{project.id}/agreement")  # from the cache

    assert lead_page.status_code == engineer_page.status_code == 200 and app.state.fragments.hits == 1
    assert _body(lead_page.text) == _body(engineer_page.text)
    # The gold form is the lead's alone, with the lead's own CSRF token: neither was cached.
    assert "Mark gold from metadata" in lead_page.text and "Mark gold from metadata" not in engineer_page.text
    assert 'name="csrf_token"' not in _body(lead_page.text)
    # With the figures in the cache, an annotator of the project is refused, and an outsider told nothing.
    member = browser()
    member.login(annotator.email)
    assert member.get(f"/projects/{project.id}/agreement").status_code == 403
    api(tokens[lead.email]).get(f"/api/projects/{project.id}/agreement")
    assert api(tokens[annotator.email]).get(f"/api/projects/{project.id}/agreement").status_code == 403
    assert api(tokens[outsider.email]).get(f"/api/projects/{project.id}/agreement").status_code == 404


def test_the_apis_cached_json_equals_the_computation_and_its_freshness_is_each_requests(
        app, db, make_user, make_project, api, token_for, monkeypatch) -> None:
    from app.schemas import AgreementOut

    project, lead = _campaign(db, make_user, make_project, n_prompts=12, seed=41)
    token = token_for(db, lead)
    db.commit()
    app.state.fragments.clear()
    client = api(token)

    first = client.get(f"/api/projects/{project.id}/agreement")
    second = client.get(f"/api/projects/{project.id}/agreement")

    assert first.status_code == second.status_code == 200 and app.state.fragments.hits == 1
    a, b = first.json(), second.json()
    AgreementOut.model_validate(b)  # the schema the OpenAPI document names
    assert b["computed"] == "kept" and b["age_seconds"] >= a["age_seconds"] and b["as_of"] == a["as_of"]
    assert {k: v for k, v in a.items() if k != "age_seconds"} == {k: v for k, v in b.items() if k != "age_seconds"}
    expected = oracle_report(db, project)
    assert b["human_rankings"] == expected.human_rankings and b["comparisons"] == expected.comparisons
    assert b["krippendorff_alpha"] == pytest.approx(expected.krippendorff_alpha, rel=1e-9)
    assert first.headers["content-type"].startswith("application/json")


def test_the_annotator_table_shows_the_flagged_first_and_links_to_all(
        app, db, make_user, make_project, browser, monkeypatch) -> None:
    project, lead = _campaign(db, make_user, make_project, n_prompts=12, seed=43)
    db.commit()
    monkeypatch.setattr(agreement_routes, "ANNOTATOR_ROWS", 3)
    b = browser()
    b.login(lead.email)

    few = b.get(f"/projects/{project.id}/agreement").text
    every = b.get(f"/projects/{project.id}/agreement", params={"annotators": "all"}).text

    rows = re.findall(r'<th scope="row" class="agr-who"><a [^>]*>([^<]+)</a>', few)
    assert len(rows) == 3 and 'id="annotators-shown"' in few and "annotators=all" in few
    assert len(re.findall(r'class="agr-who"', every)) == 8 and "Show fewer" in every
    flagged = re.findall(r'data-user="(\d+)"', few)
    assert flagged  # the fixture's fast annotators are flagged: they come first
    first_row = re.search(r'<th scope="row" class="agr-who"><a href="[^"]*/annotators/(\d+)', few).group(1)
    assert first_row in flagged


def _judge_pairs(db, project) -> None:  # type: ignore[no-untyped-def]
    for r in db.scalars(select(Ranking).where(Ranking.project_id == project.id, Ranking.source == "ai")):
        db.add_all([Pair(ranking_id=r.id, prompt_id=r.prompt_id, chosen_id=s.chosen, rejected_id=s.rejected,
                         margin=s.margin, source="ai", p=0.6 + 0.1 * (s.margin % 3)) for s in expand_tiers(r.tiers)])
    db.flush()


def test_the_judge_api_reads_a_large_projects_rollup_with_its_freshness(
        app, db, make_user, make_project, api, token_for, monkeypatch) -> None:
    from app.worker import Worker

    project, lead = _campaign(db, make_user, make_project, n_prompts=16, seed=17)
    _judge_pairs(db, project)
    token = token_for(db, lead)
    db.commit()
    client = api(token)
    small = client.get(f"/api/projects/{project.id}/judge-agreement").json()
    db.commit()
    assert small["computed"] == "live" and small["age_seconds"] == 0.0

    _large(monkeypatch)
    pending = client.get(f"/api/projects/{project.id}/judge-agreement")
    assert pending.status_code == 503 and pending.headers["Retry-After"] and "Computing" in pending.text
    assert Worker(app.state.settings, session_factory=app.state.session_factory, heartbeat_s=0.2).run_one()
    ready = client.get(f"/api/projects/{project.id}/judge-agreement")

    assert ready.status_code == 200, ready.text
    body = ready.json()
    assert body["computed"] == "rollup" and body["as_of"] and body["age_seconds"] is not None
    expected = judge_agreement.judge_agreement(db, project).as_dict()
    run_id = db.scalar(select(Ranking.judge_run_id).where(Ranking.project_id == project.id,
                                                          Ranking.source == "ai").limit(1))
    db.commit()
    assert {k: body[k] for k in expected} == expected and expected["n_pairs"] > 0
    # One judge run's figures are not in the rollup: computed on the request.
    one_run = client.get(f"/api/projects/{project.id}/judge-agreement", params={"judge_run_id": run_id}).json()
    assert one_run["computed"] == "live" and one_run["n_pairs"] == expected["n_pairs"]


def test_the_ai_labels_gate_decides_on_the_rollups_figures(
        app, db, make_user, make_project, api, token_for, monkeypatch) -> None:
    project, lead = _campaign(db, make_user, make_project, n_prompts=24, seed=19)
    _judge_pairs(db, project)
    annotator = db.scalar(select(Ranking.annotator_id).where(Ranking.project_id == project.id,
                                                             Ranking.annotator_id.is_not(None)).limit(1))
    from app.models import User

    member_token = token_for(db, db.get(User, annotator))
    token = token_for(db, lead)
    _large(monkeypatch)
    exact = judge_agreement.judge_agreement(db, project)
    assert exact.gate_missing == [] and exact.n_prompts == 24  # the evidence is there
    rollups.store(db, project.id, rollups.compute(db, project))
    db.commit()

    def refuse(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("the judge's figures were computed on the request")

    monkeypatch.setattr(judge_agreement, "judge_agreement", refuse)
    client = api(token)
    assert api(member_token).put(f"/api/projects/{project.id}/ai-labels", json={"enabled": True}).status_code == 403

    allowed = client.put(f"/api/projects/{project.id}/ai-labels", json={"enabled": True})

    assert allowed.status_code == 200, allowed.text
    body = allowed.json()
    assert body["ai_labels_enabled"] is True and body["computed"] == "rollup" and body["as_of"]
    assert body["n_prompts"] == exact.n_prompts and body["pair_agreement"] == exact.pair_agreement
    stopped = client.put(f"/api/projects/{project.id}/ai-labels", json={"enabled": False}).json()
    assert stopped["ai_labels_enabled"] is False


def test_the_gate_refuses_on_a_rollup_without_the_evidence(
        app, db, make_user, make_project, api, token_for, monkeypatch) -> None:
    project, lead = _campaign(db, make_user, make_project, n_prompts=12, seed=47)  # 12 prompts judged: under 20
    _judge_pairs(db, project)
    token = token_for(db, lead)
    _large(monkeypatch)
    rollups.store(db, project.id, rollups.compute(db, project))
    db.commit()

    refused = api(token).put(f"/api/projects/{project.id}/ai-labels", json={"enabled": True})

    assert refused.status_code == 422 and "AI labels cannot be allowed yet" in refused.text
    assert "12 of the 20 prompts" in refused.text


def test_agreement_views_never_count_the_rankings_and_the_project_page_counts_only_near_the_limit(
        app, db, make_user, make_project, browser, monkeypatch) -> None:
    # The agreement figures are read from the kept totals, whatever the project holds. The project page's counts
    # come from the rollup: one that covered over twice the limit says the project is large without a count of its
    # rankings (a millisecond of Postgres per view at 1M); nearer the limit each view counts. The capped count of the
    # marked groups' rankings (whether a view may drain them itself) reads at most a few thousand index entries.
    from sqlalchemy import event

    project, lead = _large_with_rollup(db, make_user, make_project, monkeypatch, seed=37)
    covered = db.get(ProjectRollup, project.id).rankings
    db.commit()  # SQLite: the test's read ends before the server's writes
    b = browser()
    b.login(lead.email)
    counts: list[str] = []

    def listener(_conn, _cursor, statement, *_args) -> None:  # type: ignore[no-untyped-def]
        if "count(" in statement and "FROM rankings" in statement and "agreement_marks" not in statement:
            counts.append(statement)

    def view(url: str, limit: int) -> int:
        monkeypatch.setattr(rollups, "COUNT_LIVE_LIMIT", limit)
        counts.clear()
        assert b.get(url).status_code == 200
        return len(counts)

    event.listen(app.state.engine, "before_cursor_execute", listener)
    try:
        for url in (f"/projects/{project.id}/agreement", f"/api/projects/{project.id}/agreement",
                    f"/projects/{project.id}/agreement/prompts"):
            assert view(url, 10) == 0
        assert view(f"/projects/{project.id}", covered // 2 - 1) == 0
        assert view(f"/projects/{project.id}", (covered + 1) // 2) == 1  # covered ≤ 2 × limit: counted; over
    finally:
        event.remove(app.state.engine, "before_cursor_execute", listener)
