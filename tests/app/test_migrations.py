"""The Alembic migrations build exactly the models' schema, both ways, on SQLite and Postgres."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect

from app.migrate import current_head, downgrade, upgrade
from app.models import Base
from tests.conftest import _reset_postgres, pg_url


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
