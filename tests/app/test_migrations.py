"""The Alembic migrations build exactly the models' schema, both ways, on SQLite and Postgres."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect

from app.models import Base
from app.platform.migrate import current_head, downgrade, upgrade
from tests.conftest import _reset_postgres, pg_url
from training.methods import KINDS


@pytest.fixture(params=["sqlite", "postgres"])
def empty_url(request: pytest.FixtureRequest, tmp_path) -> str:  # type: ignore[no-untyped-def]
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/roundtrip.db"
    base, _, name = pg_url().rpartition("/")
    scratch = f"{name.split('?')[0]}_migrations"  # beside the test database, so parallel CI runs don't collide
    url = f"{base}/{scratch}"
    admin = create_engine(pg_url(), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        from sqlalchemy import text

        exists = conn.execute(text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": scratch}).scalar()
        if not exists:
            conn.execute(text(f'CREATE DATABASE "{scratch}"'))
    admin.dispose()
    _reset_postgres(url)
    return url


def _drift(url: str) -> list:
    engine = create_engine(url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)
    engine.dispose()
    return diff


def test_upgrade_downgrade_upgrade_round_trip_without_drift(empty_url: str) -> None:
    upgrade(empty_url)
    assert _drift(empty_url) == []
    downgrade(empty_url, "base")
    engine = create_engine(empty_url)
    assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    engine.dispose()
    upgrade(empty_url)
    assert _drift(empty_url) == []
    engine = create_engine(empty_url)
    with engine.connect() as conn:
        assert MigrationContext.configure(conn).get_current_revision() == current_head()
        assert set(Base.metadata.tables) <= set(inspect(conn).get_table_names())
    engine.dispose()


def _contents(url: str) -> dict[str, list[tuple]]:
    """Every table's rows (all columns, by primary key), read by reflection: what a migration must not lose."""
    from sqlalchemy import MetaData, select

    engine = create_engine(url)
    meta = MetaData()
    meta.reflect(engine)
    with engine.connect() as conn:
        out = {name: [tuple(r) for r in conn.execute(select(table).order_by(*table.primary_key.columns))]
               for name, table in meta.tables.items() if name != "alembic_version"}
    engine.dispose()
    return out


@pytest.mark.parametrize("previous", ["0003", "0005"])
def test_upgrading_a_database_with_data_loses_nothing(empty_url: str, previous: str) -> None:
    """A database with projects, labels, pairs, jobs and exports at an earlier revision upgrades to head with every
    row and value intact (checked on the tables and columns that existed before)."""
    from app.accounts import users
    from app.annotation.pairs import expand_tiers
    from app.models import Completion, Export, Pair, Prompt, Ranking
    from app.platform.db import make_engine, make_session_factory, session_scope
    from app.projects import projects

    upgrade(empty_url)
    engine = make_engine(empty_url)
    with session_scope(make_session_factory(engine)) as db:
        lead = users.create_user(db, "lead@example.org", "correct horse battery staple", "lead")
        annotator = users.create_user(db, "ann@example.org", "correct horse battery staple", "annotator")
        users.create_token(db, annotator)
        project = projects.create_project(db, lead, name="kept", completions_per_prompt=3, overlap=1,
                                          rubric_text="Prefer correct answers.", criteria=["Correctness"])
        projects.add_member(db, project, lead, email=annotator.email, role="annotator")
        for i in range(3):
            prompt = Prompt(project_id=project.id, text=f"q{i} é ✓", text_hash=f"h{i}", split="train",
                            reference=str(i))
            db.add(prompt)
            db.flush()
            completions = [Completion(prompt_id=prompt.id, text=f"a{i}{j}", source="imported") for j in range(3)]
            db.add_all(completions)
            db.flush()
            tiers = [[completions[0].id], [completions[1].id, completions[2].id]]
            ranking = Ranking(project_id=project.id, prompt_id=prompt.id, source="human", annotator_id=annotator.id,
                              rubric_id=project.current_rubric_id, tiers=tiers, display_order=[c.id for c in completions],
                              flags={}, skipped=False, seconds_spent=12.5)
            db.add(ranking)
            db.flush()
            db.add_all([Pair(ranking_id=ranking.id, prompt_id=prompt.id, chosen_id=s.chosen, rejected_id=s.rejected,
                             margin=s.margin, source="human", weight=1.0, p=1.0) for s in expand_tiers(tiers)])
        db.add(Export(project_id=project.id, kind="pairs", format="jsonl", filters={"source": ["human"]},
                      row_count=6, row_counts={"source.human": 6}, sha256="0" * 64, files={"pairs.jsonl": "1" * 64}))
    engine.dispose()
    downgrade(empty_url, previous)
    before = _contents(empty_url)
    assert len(before["pairs"]) == 6 and len(before["rankings"]) == 3  # the data really is there to lose
    upgrade(empty_url)
    after = _contents(empty_url)
    assert _drift(empty_url) == []
    for name, rows in before.items():
        # Columns a later revision added come last in the reflected table; compare the ones that existed before.
        assert [r[:len(rows[0])] for r in after[name]] == rows if rows else after[name] == [], name


def test_the_latest_migration_allows_exactly_the_registrys_run_kinds(empty_url: str) -> None:
    # The model's check reads the training methods' registry; the database gets its check from a migration, so a
    # new method needs one that widens it (autogenerate does not compare check constraints).
    upgrade(empty_url)
    engine = create_engine(empty_url)
    checks = {c["name"]: c["sqltext"] for c in inspect(engine).get_check_constraints("training_runs")}
    engine.dispose()
    assert set(re.findall(r"'([^']+)'", checks["ck_training_runs_kind"])) == set(KINDS)


def test_a_new_sqlite_database_gets_its_folder(tmp_path: Path) -> None:
    # PREFLAB_DATA_DIR elsewhere, the default ./data/preflab.db: its folder does not exist yet.
    url = f"sqlite:///{tmp_path / 'not-yet' / 'preflab.db'}"
    upgrade(url)
    assert (tmp_path / "not-yet" / "preflab.db").is_file()
