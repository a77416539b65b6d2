"""The rows behind the agreement figures, a page at a time, equal what the whole-project computation shows
(tests/support/agreement_rows_oracle.py, the code before paging) on a small project, and on the same project
treated as large (its disagreements' order from the rollup), without reading every ranking of the project.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from app.quality import rollups
from app.quality import rows as agreement_rows
from tests.app.test_agreement_scale import KINDS, _campaign, _same
from tests.support import agreement_rows_oracle as oracle


def _plain(rows: list[Any]) -> list[dict[str, Any]]:
    return [dataclasses.asdict(r) for r in rows]


def _all_disagreements(db, project, lead, version, limit: int) -> tuple[list[Any], int]:  # type: ignore[no-untyped-def]
    """Every page, followed by its next link, concatenated."""
    items, page, total = [], 1, None
    while page is not None:
        found = agreement_rows.disagreements(db, project, lead, rubric_version=version, page=page, limit=limit)
        assert not found.pending
        assert total is None or found.total == total
        total = found.total
        assert len(found.items) <= limit
        items += found.items
        page = found.next_page
    return items, total or 0


def _all_rankings(db, project, who: int, view: str, version, limit: int):  # type: ignore[no-untyped-def]
    rows, before, page, total = [], None, 1, None
    while True:
        found = agreement_rows.annotator_rankings(db, project, who, view=view, rubric_version=version, limit=limit,
                                                  before=before, page=page)
        assert total is None or found.total == total
        total = found.total
        assert len(found.rows) <= limit
        rows += found.rows
        if found.next_before is not None:
            before = found.next_before
        elif found.next_page is not None:
            page = found.next_page
        else:
            return rows, total


def _no_whole_project_reads(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("read every ranking of the project")

    monkeypatch.setattr(agreement_rows, "human_rankings", refuse)


@pytest.mark.parametrize("version", [None, 1, 3])
def test_paged_disagreements_equal_the_whole_list_small_and_large(
        db, make_user, make_project, monkeypatch, version) -> None:
    project, lead = _campaign(db, make_user, make_project, n_prompts=30, seed=23)
    expected, expected_total = oracle.disagreements(db, project, rubric_version=version, limit=10_000)
    assert expected_total > 8  # several pages of 4

    small, total = _all_disagreements(db, project, lead, version, limit=4)
    assert total == expected_total
    _same(_plain(small), _plain(expected))

    monkeypatch.setattr(rollups, "LIVE_LIMIT", 10)  # the same project counts as large
    pending = agreement_rows.disagreements(db, project, lead, rubric_version=version)
    assert pending.pending and pending.items == [] and "Computing" in pending.fresh.describe()
    rollups.store(db, project.id, rollups.compute(db, project))
    db.flush()
    _no_whole_project_reads(monkeypatch)
    large, total = _all_disagreements(db, project, lead, version, limit=4)
    assert total == expected_total
    _same(_plain(large), _plain(expected))
    first = agreement_rows.disagreements(db, project, lead, rubric_version=version, limit=4)
    assert first.fresh is not None and first.fresh.method == "rollup" and first.next_page == 2


def test_a_rollup_stored_before_it_kept_disagreements_is_recomputed(db, make_user, make_project, monkeypatch) -> None:
    from sqlalchemy import select

    from app.models import Job, ProjectRollup

    project, lead = _campaign(db, make_user, make_project, n_prompts=12, seed=23)
    monkeypatch.setattr(rollups, "LIVE_LIMIT", 10)
    rollups.store(db, project.id, rollups.compute(db, project))
    row = db.get(ProjectRollup, project.id)
    row.reports = {k: v for k, v in row.reports.items() if not k.startswith("disagreements_")}
    db.flush()

    found = agreement_rows.disagreements(db, project, lead)

    assert found.pending and found.fresh.refreshing
    again = agreement_rows.disagreements(db, project, lead)
    assert again.pending and again.fresh.refreshing
    queued = db.scalars(select(Job.id).where(Job.project_id == project.id, Job.kind == rollups.KIND)).all()
    assert len(queued) == 1


def test_the_rollup_keeps_the_worst_and_counts_them_all(db, make_user, make_project, monkeypatch) -> None:
    project, lead = _campaign(db, make_user, make_project, n_prompts=30, seed=23)
    expected, expected_total = oracle.disagreements(db, project, limit=10_000)
    monkeypatch.setattr(rollups, "LIVE_LIMIT", 10)
    monkeypatch.setattr(rollups, "DISAGREEMENTS_KEPT", 5)
    rollups.store(db, project.id, rollups.compute(db, project))
    db.flush()

    listed, total = _all_disagreements(db, project, lead, None, limit=3)

    assert total == expected_total and len(listed) == 5
    _same(_plain(listed), _plain(expected[:5]))


@pytest.mark.parametrize("version", [None, 2])
def test_an_annotators_pages_equal_the_whole_list_without_reading_the_project(
        db, make_user, make_project, monkeypatch, version) -> None:
    project, _ = _campaign(db, make_user, make_project, n_prompts=30, seed=29)
    from app.models import User

    people = [db.query(User).filter_by(email=f"a{i}@example.org").one() for i in range(len(KINDS))]
    _no_whole_project_reads(monkeypatch)  # the oracle has its own (it reads the whole project, as it always did)
    checked = 0
    for person in people:
        for view in ("all", "gold-misses"):
            expected = _oracle_rankings(db, project, person.id, view, version)
            rows, total = _all_rankings(db, project, person.id, view, version, limit=3)
            assert total == expected.total, (person.email, view)
            _same(_plain(rows), _plain(expected.rows), f"{person.email} {view}")
            checked += len(rows)
    assert checked > 30


def _oracle_rankings(db, project, who: int, view: str, version):  # type: ignore[no-untyped-def]
    return oracle.annotator_rankings(db, project, who, view=view, rubric_version=version, limit=10_000)


def test_the_pages_link_to_the_next_and_refuse_what_the_route_refuses(
        app, db, make_user, make_project, browser) -> None:
    project, lead = _campaign(db, make_user, make_project, n_prompts=30, seed=23)
    from app.models import User

    careful = db.query(User).filter_by(email="a0@example.org").one()
    _, total = oracle.disagreements(db, project, limit=10_000)
    db.commit()  # SQLite: the pages' logins write
    b = browser()
    b.login(lead.email)

    first = b.get(f"/projects/{project.id}/agreement/prompts")
    assert first.status_code == 200
    if total > agreement_rows.LIMIT:
        assert 'id="next-page"' in first.text and "?page=2" in first.text
    theirs = b.get(f"/projects/{project.id}/agreement/annotators/{careful.id}")
    assert theirs.status_code == 200
    older = b.get(f"/projects/{project.id}/agreement/annotators/{careful.id}", params={"before": 10**9})
    assert older.status_code == 200 and "Newest first" in older.text
    assert b.get(f"/projects/{project.id}/agreement/prompts", params={"page": 0}).status_code == 422
    assert b.get(f"/projects/{project.id}/agreement/prompts", params={"rubric_version": 9}).status_code == 422

    annotator = browser()
    annotator.login(careful.email)
    assert annotator.get(f"/projects/{project.id}/agreement/prompts").status_code == 403
