"""The rows behind the agreement figures, a page at a time, equal what the whole-project computation shows
(tests/support/agreement_rows_oracle.py, the code before paging), without reading every ranking of the project:
the disagreements' order comes from the kept groups' index, each page's rankings from its prompts.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from app.quality import agreement, upkeep
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

    for name in ("human_rankings", "project_reports", "_stream_rankings"):
        monkeypatch.setattr(agreement, name, refuse)


@pytest.mark.parametrize("version", [None, 1, 3])
def test_paged_disagreements_equal_the_whole_list(db, make_user, make_project, monkeypatch, version) -> None:
    project, lead = _campaign(db, make_user, make_project, n_prompts=30, seed=23)
    expected, expected_total = oracle.disagreements(db, project, rubric_version=version, limit=10_000)
    assert expected_total > 8  # several pages of 4
    _no_whole_project_reads(monkeypatch)

    listed, total = _all_disagreements(db, project, lead, version, limit=4)

    assert total == expected_total
    _same(_plain(listed), _plain(expected))
    first = agreement_rows.disagreements(db, project, lead, rubric_version=version, limit=4)
    assert first.fresh is not None and first.fresh.method == "kept" and first.next_page == 2


def test_the_disagreements_wait_for_a_rebuild_of_older_formulas(db, make_user, make_project) -> None:
    from app.models import AgreementState, Job

    project, lead = _campaign(db, make_user, make_project, n_prompts=12, seed=23)
    agreement_rows.disagreements(db, project, lead)
    db.get(AgreementState, project.id).formula = 0
    db.flush()

    found = agreement_rows.disagreements(db, project, lead)
    again = agreement_rows.disagreements(db, project, lead)

    assert found.pending and found.items == [] and found.fresh.refreshing and again.pending
    assert db.query(Job).filter_by(project_id=project.id, kind=upkeep.KIND).count() == 1
    upkeep.rebuild(db, project)
    rebuilt = agreement_rows.disagreements(db, project, lead)
    assert not rebuilt.pending and rebuilt.total == oracle.disagreements(db, project, limit=10_000)[1]


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
