"""Running Alembic from code (`preflab migrate`, the demo, the tests) and telling where a database stands:
behind, current, or from a newer preflab."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from alembic import command
from alembic.config import Config
from sqlalchemy import make_url

if TYPE_CHECKING:
    from alembic.script import ScriptDirectory
    from sqlalchemy import Connection, Engine

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"


def alembic_config(database_url: str) -> Config:
    cfg = Config(str(MIGRATIONS_DIR / "alembic.ini"))
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return cfg


def upgrade(database_url: str, revision: str = "head") -> None:
    _sqlite_parent(database_url)
    command.upgrade(alembic_config(database_url), revision)


def _sqlite_parent(database_url: str) -> None:
    """A new SQLite file's folder, made as the app's engine makes it: with PREFLAB_DATA_DIR set elsewhere, the
    default ./data/ may not exist yet, and SQLite's "unable to open database file" would not say so."""
    if database_url.startswith("sqlite"):
        database = make_url(database_url).database
        if database and database != ":memory:":
            Path(database).parent.mkdir(parents=True, exist_ok=True)


def downgrade(database_url: str, revision: str = "base") -> None:
    command.downgrade(alembic_config(database_url), revision)


def current_head() -> str:
    head = _script().get_current_head()
    assert head is not None
    return head


class SchemaTooNew(RuntimeError):
    """The database was upgraded by a newer preflab: this code does not know its revision and must not run on it."""


@dataclass(frozen=True)
class SchemaStatus:
    """Where a database stands against the migrations this code ships."""

    current: str | None
    """The database's Alembic revision; None for a database without a schema yet."""
    head: str
    behind: int
    """Revisions `preflab migrate` would apply (0 when current)."""
    known: bool
    """False when the database's revision is not one of ours: a newer preflab upgraded it."""

    def describe(self) -> str:
        if not self.known:
            return (f"the database is at revision {self.current}, newer than this version of preflab knows "
                    f"(its newest is {self.head}): a newer preflab upgraded it. Run that version, or restore a "
                    "backup made before the upgrade")
        if self.behind == 0:
            return f"the database is current (revision {self.head})"
        at = f"at revision {self.current}" if self.current else "empty (no schema yet)"
        plural = "s" if self.behind != 1 else ""
        return f"the database is {at}, {self.behind} revision{plural} behind {self.head}: run `preflab migrate`"


def _script() -> ScriptDirectory:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config("sqlite://"))


def revisions() -> list[str]:
    """Every revision this code ships, oldest first."""
    return [rev.revision for rev in reversed(list(_script().walk_revisions()))]


def database_revision(conn: Connection) -> str | None:
    from alembic.runtime.migration import MigrationContext

    return MigrationContext.configure(conn).get_current_revision()


def status_of(revision: str | None) -> SchemaStatus:
    """How `revision` (a database's) compares with this code's head, without touching any database."""
    known = revisions()
    head = known[-1]
    if revision is not None and revision not in known:
        return SchemaStatus(revision, head, 0, known=False)
    behind = len(known) - (known.index(revision) + 1 if revision else 0)
    return SchemaStatus(revision, head, behind, known=True)


def schema_status(engine: Engine) -> SchemaStatus:
    """Where the database behind `engine` stands; reads the alembic_version table and changes nothing."""
    with engine.connect() as conn:
        return status_of(database_revision(conn))


def refuse_newer(engine: Engine) -> None:
    """Raise SchemaTooNew when the database's revision is newer than this code: writing to a schema we do not
    know could corrupt what the newer version stored."""
    status = schema_status(engine)
    if not status.known:
        raise SchemaTooNew(status.describe())
