"""The kept agreement figures equal a recomputation from every ranking, to 1e-9, after any sequence of what changes
them: rankings submitted, skipped and resubmitted, rankings changed, annotators removed with their rankings (and their
ids reused), new rubric versions, gold orders set and cleared, a new round; drained all at once or a few marks at a
time (new rankings folded into a group's kept state, any other change computing it anew), and rebuilt. Hypothesis writes the
sequences; the recomputation is `agreement.project_reports`, the one streamed pass over every ranking (itself checked
against the whole-list oracle in test_agreement_scale.py).
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select, update

from app.annotation import rankings
from app.models import AgreementTotal, Completion, Prompt, Ranking, utcnow
from app.platform.errors import DomainError
from app.projects import projects, rubrics
from app.quality import agreement, gold, kept_report, upkeep
from app.quality.agreement import human_rankings
from tests.app.test_agreement_scale import _same

ANNOTATORS, PROMPTS, K = 4, 2, 3
T0 = datetime(2026, 3, 2, 8, tzinfo=UTC)

submits = st.tuples(st.just("submit"), st.integers(0, ANNOTATORS - 1), st.integers(0, PROMPTS - 1),
                    st.integers(0, 10**6), st.sampled_from(["strict", "tie", "partial", "skip"]),
                    st.one_of(st.none(), st.floats(0.5, 90.0)), st.integers(0, 60 * 24 * 5),
                    st.sampled_from([False, False, True]))
drains = st.tuples(st.just("drain"), st.sampled_from([1, 2, upkeep.DRAIN_BATCH]))
others = st.one_of(
    st.tuples(st.just("resubmit")),
    st.tuples(st.just("edit"), st.integers(0, 10**6)),
    st.tuples(st.just("remove"), st.integers(0, ANNOTATORS - 1)),
    st.tuples(st.just("rubric")),
    st.tuples(st.just("gold"), st.integers(0, PROMPTS - 1), st.booleans()),
    st.tuples(st.just("round")),
    drains,
)
# Six in ten operations submit (one_of would weigh each kind alike, whatever the repeats): groups fill up.
operations = st.lists(st.integers(0, 9).flatmap(lambda i: submits if i < 6 else others), min_size=8, max_size=40)


class Campaign:
    """A project of PROMPTS prompts of K completions and ANNOTATORS annotators, driven through the services."""

    def __init__(self, db: Any, make_user: Any, make_project: Any) -> None:
        self.db = db
        self.lead = make_user(db, "lead")
        self.project = make_project(db, k=K, overlap=ANNOTATORS + 1, lead=self.lead)
        self.project.allow_partial = True
        self.people = []
        for _ in range(ANNOTATORS):
            person = make_user(db, "annotator")
            projects.add_member(db, self.project, self.lead, email=person.email, role="annotator")
            self.people.append(person)
        self.prompts = []
        for i in range(PROMPTS):
            prompt = Prompt(project_id=self.project.id, text=f"question {i}", text_hash=f"{i:064d}",
                            completions=[Completion(text=f"answer {i}{x}") for x in "abc"])
            db.add(prompt)
            db.flush()
            self.prompts.append((prompt.id, [c.id for c in prompt.completions]))
        self.last: tuple[Any, Any] | None = None
        self.submission = 0
        self.drained: Counter[str] = Counter()

    def run(self, op: tuple[Any, ...]) -> None:
        getattr(self, f"_{op[0]}")(*op[1:])

    def _submit(self, who: int, which: int, seed: int, shape: str, seconds: float | None, minutes: int,
                then_drain: bool = False) -> None:
        """A ranking submitted, and drained at once when `then_drain` (so groups gain rankings between drains: the
        path that folds them into the kept state)."""
        self._rank(who, which, seed, shape, seconds, minutes)
        if then_drain:
            self._drain(upkeep.DRAIN_BATCH)

    def _rank(self, who: int, which: int, seed: int, shape: str, seconds: float | None, minutes: int) -> None:
        prompt_id, ids = self.prompts[which]
        order = random.Random(seed).sample(ids, K)
        tiers = {"strict": [[c] for c in order], "tie": [[order[0]], order[1:]],
                 "partial": [[order[0]], [order[1]]], "skip": []}[shape]
        self.submission += 1
        body = rankings.RankingInput(tiers=tiers, rubric_version=rubrics.current(self.db, self.project).version,
                                     submission_id=f"s{self.submission}", prompt_id=prompt_id,
                                     skipped=shape == "skip", skip_reason="unsure" if shape == "skip" else None)
        try:
            ranking, created = rankings.submit(self.db, self.project, self.people[who], body)
        except DomainError:
            return  # already ranked in this round: refused, nothing written
        assert created
        # When and how long, as a campaign spread over days would have them (the submit takes the server's clock).
        self.db.execute(update(Ranking).where(Ranking.id == ranking.id).values(
            created_at=T0 + timedelta(minutes=minutes), seconds_spent=seconds))
        self.last = (self.people[who], body)

    def _resubmit(self) -> None:
        """The same submission again: answered with the first ranking, nothing written (unless the annotator was
        removed since: then it is a new ranking, or refused under a newer rubric)."""
        if self.last is None:
            return
        person, body = self.last
        try:
            rankings.submit(self.db, self.project, person, body)
        except DomainError:
            pass

    def _edit(self, seed: int) -> None:
        """A ranking's tiers changed through the ORM (as an admin's repair would): its group is computed anew."""
        ranked = self.db.scalars(select(Ranking).where(Ranking.project_id == self.project.id,
                                                       Ranking.skipped.is_(False)).order_by(Ranking.id)).all()
        if not ranked:
            return
        ranking = ranked[seed % len(ranked)]
        ranking.tiers = [list(tier) for tier in reversed(ranking.tiers)]
        self.db.flush()

    def _remove(self, who: int) -> None:
        try:
            rankings.remove_annotator(self.db, self.project, self.lead, self.people[who].id)
        except DomainError:
            return  # removed already, with nothing ranked since
        projects.add_member(self.db, self.project, self.lead, email=self.people[who].email, role="annotator")

    def _rubric(self) -> None:
        version = rubrics.current(self.db, self.project).version + 1
        rubrics.create_version(self.db, self.project, self.lead, text=f"Rubric v{version}", criteria=["Correctness"],
                               base_version=version - 1)

    def _gold(self, which: int, on: bool) -> None:
        prompt_id, ids = self.prompts[which]
        if on:
            gold.set_gold(self.db, self.project, prompt_id, [[ids[which % K]], [c for c in ids if c != ids[which % K]]],
                          self.lead)
        else:
            gold.clear_gold(self.db, self.project, prompt_id, self.lead)

    def _round(self) -> None:
        self.project.current_round += 1
        self.db.flush()

    def _drain(self, limit: int) -> None:
        self._drain_once(limit)  # once even with no marks: the counts
        while upkeep.waiting(self.db, self.project.id, 1):
            self._drain_once(limit)
        self.check()

    def _drain_once(self, limit: int) -> None:
        drained = upkeep.drain(self.db, self.project, limit=limit)
        assert drained is not None
        self.drained.update(extended=drained.extended, computed=drained.computed)

    def check(self) -> None:
        """Every scope's kept report and disagreements equal the recomputation from every ranking."""
        db, project = self.db, self.project
        versions = agreement.rubric_versions(db, project)
        state = upkeep.lock(db, project.id)
        expected = agreement.project_reports(db, project, versions=versions)
        for version in [None, *versions]:
            _same(kept_report.report(db, project, version, versions, state), expected[version], f"v{version}")
            listed, total = upkeep.disagreements(db, project.id, version, 0, 10_000)
            assert total == len(listed)
            _same(listed, _disagreements(db, project, version), f"disagreements v{version}")
        for seconds in db.scalars(select(AgreementTotal.seconds).where(AgreementTotal.project_id == project.id)):
            assert all(n > 0 for n in (seconds or {}).values()), "a histogram kept a tenth no ranking has"


def _disagreements(db: Any, project: Any, version: int | None) -> list[tuple[float, int, int]]:
    """Every (prompt, round) whose comparisons' mean agreement is below 1, least first, from every ranking."""
    tally = agreement.tally_rankings(human_rankings(db, project, version), {}, project.current_round)
    per_group: dict[tuple[int, int], list[float]] = defaultdict(list)
    for c in agreement.compare_annotators(tally).each:
        per_group[(c.prompt_id, c.round)].append(c.agreement)
    # Means equal in exact arithmetic tie (then by prompt and round), whatever order their floats were added in.
    return sorted(((sum(v) / len(v), p, r) for (p, r), v in per_group.items() if sum(v) / len(v) < 1),
                  key=lambda x: (round(x[0], 12), x[1], x[2]))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(ops=operations)
def test_kept_figures_equal_a_recomputation_after_any_sequence_of_changes(db, make_user, make_project, ops) -> None:
    nested = db.begin_nested()  # each example on its own project, rolled back after
    try:
        campaign = Campaign(db, make_user, make_project)
        for op in ops:
            campaign.run(op)
        campaign._drain(upkeep.DRAIN_BATCH)
        event(f"groups extended: {'some' if campaign.drained['extended'] else 'none'}")
        event(f"groups computed anew: {'some' if campaign.drained['computed'] else 'none'}")
        upkeep.rebuild(db, campaign.project)
        campaign.check()
    finally:
        nested.rollback()
        db.expunge_all()  # the next example's rows reuse these ids (SQLite)


def test_the_fixture_reaches_every_figure(db, make_user, make_project) -> None:
    """One fixed sequence shows the property test's campaigns have something in every figure to compare."""
    campaign = Campaign(db, make_user, make_project)
    for i in range(40):
        campaign.run(("submit", i % ANNOTATORS, (i // ANNOTATORS) % PROMPTS, i, ["strict", "tie", "partial"][i % 3],
                      10.0 + i, 400 * i))
        if i == 20:
            campaign.run(("rubric",))
            campaign.run(("gold", 1, True))
            campaign.run(("round",))
    campaign._drain(upkeep.DRAIN_BATCH)
    versions = agreement.rubric_versions(db, campaign.project)
    report = kept_report.report(db, campaign.project, None, versions, upkeep.lock(db, campaign.project.id))
    assert report.comparisons > 10 and report.krippendorff_alpha is not None and report.mean_kendall_tau is not None
    assert report.gold_prompts_ranked == 1 and len(report.by_rubric_version) == 2 and len(report.trend) > 3
    assert any(a.position_rankings for a in report.annotators) and report.median_seconds is not None
    removed = rankings.remove_annotator(db, campaign.project, campaign.lead, campaign.people[0].id)
    assert removed > 0
    campaign._drain(upkeep.DRAIN_BATCH)
    after = kept_report.report(db, campaign.project, None, versions, upkeep.lock(db, campaign.project.id))
    assert after.human_rankings == report.human_rankings - removed
    assert campaign.people[0].id not in {a.user_id for a in after.annotators}


def test_a_lead_removes_an_annotator_and_the_next_view_counts_them_no_more(
        app, db, make_user, make_project, api, token_for) -> None:
    campaign = Campaign(db, make_user, make_project)
    for i in range(8):
        campaign.run(("submit", i % 2, (i // 2) % PROMPTS, i, "strict", 20.0, 30 * i))
    sloppy = campaign.people[0]
    lead, annotator = api(token_for(db, campaign.lead)), api(token_for(db, campaign.people[1]))
    pid = campaign.project.id
    db.commit()
    before = lead.get(f"/api/projects/{pid}/agreement").json()
    assert sloppy.id in {a["user_id"] for a in before["annotators"]}

    assert annotator.delete(f"/api/projects/{pid}/annotators/{sloppy.id}/rankings").status_code == 403
    assert lead.delete(f"/api/projects/{pid}/annotators/{10**6}/rankings").status_code == 404
    removed = lead.delete(f"/api/projects/{pid}/annotators/{sloppy.id}/rankings")

    assert removed.status_code == 200, removed.text
    assert removed.json() == {"user_id": sloppy.id, "rankings_removed": 2}
    after = lead.get(f"/api/projects/{pid}/agreement").json()
    assert after["human_rankings"] == before["human_rankings"] - 2
    assert sloppy.id not in {a["user_id"] for a in after["annotators"]} and after["comparisons"] == 0
    assert lead.delete(f"/api/projects/{pid}/annotators/{sloppy.id}/rankings").status_code == 404  # gone already


def test_the_rebuild_command_repairs_figures_that_went_wrong(db, app, make_user, make_project, monkeypatch,
                                                             database_url) -> None:
    from sqlalchemy import delete
    from typer.testing import CliRunner

    from app.cli import cli
    from app.models import AgreementTotal

    campaign = Campaign(db, make_user, make_project)
    for i in range(12):
        campaign.run(("submit", i % ANNOTATORS, (i // ANNOTATORS) % PROMPTS, i, "tie", 15.0 + i, 45 * i))
    campaign._drain(upkeep.DRAIN_BATCH)
    db.execute(delete(AgreementTotal).where(AgreementTotal.kind == "a"))  # as a bad hand edit would leave them
    db.commit()
    settings = app.state.settings
    monkeypatch.setenv("PREFLAB_DATABASE_URL", database_url)
    monkeypatch.setenv("PREFLAB_SECRET_KEY", settings.resolved_secret())
    monkeypatch.setenv("PREFLAB_DATA_DIR", str(settings.data_dir))

    result = CliRunner().invoke(cli, ["agreement", "rebuild", str(campaign.project.id)])

    assert result.exit_code == 0, result.output
    assert f"project {campaign.project.id}: " in result.output and "groups computed from every ranking" in result.output
    db.expire_all()
    campaign.check()
    db.commit()
    missing = CliRunner().invoke(cli, ["agreement", "rebuild", "no such project"])
    assert missing.exit_code == 1 and "no project 'no such project'" in missing.output


def test_a_drain_folds_new_rankings_in_and_computes_a_group_anew_after_any_other_change(
        db, make_user, make_project) -> None:
    """Only new rankings are folded into a group's kept state; a removal (its id then reused by the next ranking, as
    SQLite does), a changed ranking or a new gold order computes the group from all its rankings, and every way the
    figures equal the recomputation."""
    campaign = Campaign(db, make_user, make_project)

    def drained(limit: int = upkeep.DRAIN_BATCH) -> Counter[str]:
        campaign.drained.clear()
        campaign._drain(limit)
        return Counter(campaign.drained)

    for who in range(3):
        campaign.run(("submit", who, 0, who, "strict", 10.0 + who, 60 * who))
    assert drained() == Counter(computed=1)  # a new group
    campaign.run(("submit", 3, 0, 7, "tie", 12.5, 300))
    assert drained() == Counter(extended=1)
    campaign.run(("submit", 0, 1, 8, "strict", 11.0, 10))
    campaign.run(("submit", 1, 1, 9, "partial", 13.0, 20))
    assert drained(limit=1) == Counter(computed=1)  # prompt 1 is new; prompt 0 untouched
    campaign.run(("submit", 2, 1, 10, "skip", None, 30))
    assert drained() == Counter(extended=1)

    last = db.scalar(select(func.max(Ranking.id)).where(Ranking.project_id == campaign.project.id))
    campaign.run(("remove", 2))  # the annotator of the newest ranking: its id is free again on SQLite
    campaign.run(("submit", 2, 1, 11, "tie", 30.0, 40))
    reused = db.scalar(select(func.max(Ranking.id)).where(Ranking.project_id == campaign.project.id))
    assert (reused == last) == (db.get_bind().dialect.name == "sqlite")
    assert drained() == Counter(computed=2)  # both prompts lost annotator 2's ranking

    campaign.run(("edit", 0))
    assert drained() == Counter(computed=1)
    campaign.run(("gold", 0, True))
    assert drained() == Counter(computed=1)
    campaign.run(("rubric",))
    campaign.run(("submit", 2, 0, 12, "strict", 9.0, 50))
    assert drained() == Counter(extended=1, computed=1)  # all versions folded in; the new version is new there


def test_a_view_reads_the_kept_figures_and_folds_new_rankings_in_itself_only_once_no_worker_has_for_three_sweeps(
        app, db, make_user, make_project, api, token_for, monkeypatch) -> None:
    """While a worker sweeps (every PREFLAB_AGREEMENT_DRAIN_EVERY_S) a view shows the figures of its last drain with
    their age and drains nothing; once none has drained for VIEW_AFTER sweeps, the view folds in what waits. (The last
    drain's time is set, not waited for: 31 s and 91 s ago against a cadence of 30 s.)"""
    from app.models import AgreementState
    from app.platform.settings import get_settings

    monkeypatch.setenv("PREFLAB_AGREEMENT_DRAIN_EVERY_S", "30")
    get_settings.cache_clear()
    try:
        campaign = Campaign(db, make_user, make_project)
        for i in range(4):
            campaign.run(("submit", i, 0, i, "strict", 20.0, 30 * i))
        lead = api(token_for(db, campaign.lead))
        url = f"/api/projects/{campaign.project.id}/agreement"
        db.commit()
        assert lead.get(url).json()["human_rankings"] == 4  # the first view drains: nothing kept yet

        def drained_ago(seconds: float) -> None:
            db.get(AgreementState, campaign.project.id, populate_existing=True).as_of = (
                utcnow() - timedelta(seconds=seconds))
            db.commit()

        campaign.run(("submit", 0, 1, 9, "tie", 12.0, 200))
        drained_ago(31)
        recent = lead.get(url).json()
        assert recent["human_rankings"] == 4 and 31 <= recent["age_seconds"] < 90  # kept as of the last drain
        drained_ago(91)
        later = lead.get(url).json()
        assert later["human_rankings"] == 5 and later["age_seconds"] < 30
        db.commit()
        campaign.check()
    finally:
        get_settings.cache_clear()


def test_the_workers_sweeper_keeps_the_figures_up_to_date_with_nobody_looking(
        db, make_user, make_project, clean_engine) -> None:
    """Rankings submitted while no lead looks are folded into the kept figures by the worker's sweeper, with no view
    and no job: the totals then equal a recomputation from every ranking, and nothing waits."""
    from app.models import Job
    from app.platform.db import make_session_factory
    from app.quality.rollup_job import Sweeper

    campaign = Campaign(db, make_user, make_project)
    for who in range(ANNOTATORS):
        campaign.run(("submit", who, who % PROMPTS, who, "strict", 20.0, 30 * who))
    db.commit()
    pid = campaign.project.id
    assert upkeep.waiting(db, pid, 100) == ANNOTATORS and upkeep.rankings(db, pid) == 0
    db.rollback()  # the test's read ends: SQLite lets no one commit a write while a transaction reads

    done = Sweeper(make_session_factory(clean_engine), 2.0).sweep()

    assert done == {"projects": 1, "marks": ANNOTATORS, "groups": PROMPTS, "extended": 0}
    db.expire_all()
    assert upkeep.waiting(db, pid, 100) == 0 and upkeep.rankings(db, pid) == ANNOTATORS
    assert db.query(Job).count() == 0
    campaign.check()
    db.rollback()
    assert Sweeper(make_session_factory(clean_engine), 2.0).sweep()["projects"] == 0  # nothing waits: nothing read


def test_a_worker_run_until_idle_leaves_no_change_unfolded(db, make_user, make_project, database_url,
                                                           tmp_path) -> None:
    """`preflab worker --once` runs the queued jobs, then folds what waits into the figures before it exits."""
    import os
    import subprocess
    import sys

    from tests.conftest import TEST_SECRET

    campaign = Campaign(db, make_user, make_project)
    for who in range(2):
        campaign.run(("submit", who, 0, who, "tie", 12.0, 10 * who))
    db.commit()
    env = os.environ | {"PREFLAB_DATABASE_URL": database_url, "PREFLAB_DATA_DIR": str(tmp_path),
                        "PREFLAB_SECRET_KEY": TEST_SECRET, "PREFLAB_AGREEMENT_DRAIN_EVERY_S": "60"}
    done = subprocess.run([sys.executable, "-m", "app.cli", "worker", "--once"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    db.expire_all()
    assert upkeep.waiting(db, campaign.project.id, 10) == 0 and upkeep.rankings(db, campaign.project.id) == 2
    campaign.check()


def test_a_view_leaves_groups_of_many_rankings_to_the_drain_job(
        app, db, make_user, make_project, api, token_for, monkeypatch) -> None:
    """A change to a prompt with many rankings (here more than 3) is folded in by the worker, never by a view."""
    from app.models import Job
    from app.worker import Worker

    monkeypatch.setattr(upkeep, "INLINE_RANKINGS", 3)
    campaign = Campaign(db, make_user, make_project)
    campaign.run(("submit", 0, 0, 1, "strict", 20.0, 0))
    lead = api(token_for(db, campaign.lead))
    url = f"/api/projects/{campaign.project.id}/agreement"
    db.commit()
    assert lead.get(url).json()["human_rankings"] == 1  # one ranking: the view drains it
    for who in range(1, ANNOTATORS):
        campaign.run(("submit", who, 0, who, "tie", 20.0, 10 * who))
    db.commit()

    waiting = lead.get(url).json()

    assert waiting["human_rankings"] == 1
    db.commit()
    assert [j.payload["agreement"] for j in db.query(Job).filter_by(project_id=campaign.project.id,
                                                                    kind=upkeep.KIND)] == ["drain"]
    db.commit()  # SQLite: the test's read ends before the worker writes
    assert Worker(app.state.settings, session_factory=app.state.session_factory, heartbeat_s=0.2).run_one()
    assert lead.get(url).json()["human_rankings"] == ANNOTATORS
    db.commit()
    campaign.check()
