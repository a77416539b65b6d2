"""benchmarks/seed_campaign.py writes what the app itself writes (Postgres only: it seeds by COPY and SQL), so the
campaign bench's pages have real work: the pairs each ranking's tiers expand to, a completed task per human
ranking, the shown order the queue records, and figures the agreement page flags."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import select

from app.annotation import queue
from app.annotation.pairs import expand_tiers
from app.models import AgreementState, Assignment, Pair, Project, Prompt, Ranking, Rubric
from app.quality import agreement, kept_report

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


def test_the_seeded_campaign_is_what_the_app_would_have_written(clean_engine, database_url) -> None:
    if not database_url.startswith("postgresql"):
        pytest.skip(reason="the campaign seed writes by COPY: Postgres only")
    from seed_campaign import seed_campaign

    from app.platform.db import make_session_factory

    out = seed_campaign(database_url, 600, annotators=30, open_prompts=10)
    db = make_session_factory(clean_engine)()
    try:
        humans = list(db.scalars(select(Ranking).where(Ranking.source == "human")))
        pairs = Counter(db.scalars(select(Pair.ranking_id)))
        assert out["human_rankings"] == len(humans) == 600
        for r in humans:
            assert pairs[r.id] == len(expand_tiers(r.tiers))  # a skip has none, a tie one fewer
            assert r.display_order == queue.display_order(sorted(r.display_order), r.annotator_id, r.prompt_id, 1)
        ai = list(db.scalars(select(Ranking).where(Ranking.source == "ai")))
        assert ai and all(pairs[r.id] == 6 for r in ai)
        states = Counter(db.scalars(select(Assignment.state)))
        assert states["submitted"] + states["skipped"] == 600 and states["skipped"] == sum(r.skipped for r in humans)
        assert len(set(db.scalars(select(Rubric.version)))) == 3
        assert len({r.rubric_id for r in humans}) == 3
        assert db.scalar(select(Prompt.id).where(Prompt.gold_tiers.is_not(None))) is not None
        project = db.get(Project, out["project_id"])
        report = agreement.project_report(db, project)
        kept = kept_report.report(db, project, None, agreement.rubric_versions(db, project),
                                  db.get(AgreementState, project.id))
        assert kept.human_rankings == 600 and kept.comparisons == report.comparisons  # the kept figures, made once
        assert kept.mean_agreement == pytest.approx(report.mean_agreement, rel=1e-9)
        kinds = Counter(f.kind for a in report.annotators for f in a.flags)
        assert kinds["too_fast"] >= 1 and kinds["position_bias"] >= 1  # the fast, position-biased annotators
        assert report.mean_agreement is not None and 0.4 < report.mean_agreement < 0.95
    finally:
        db.close()
