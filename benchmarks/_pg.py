"""A fresh, migrated Postgres database for a benchmark run (dropped and created again each time)."""

from __future__ import annotations


def fresh_database(url: str) -> str:
    """Drop and recreate the database named by `url`, migrate it to head, and return the normalised URL."""
    from sqlalchemy import create_engine, text

    from app.platform.migrate import upgrade
    from app.platform.settings import Settings

    url = Settings(database_url=url).database_url
    base, _, name = url.rpartition("/")
    admin = create_engine(f"{base}/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    upgrade(url)
    return url


def _admin(url: str):  # type: ignore[no-untyped-def]
    from sqlalchemy import create_engine

    base, _, name = url.rpartition("/")
    return create_engine(f"{base}/postgres", isolation_level="AUTOCOMMIT"), name


def template_comment(url: str, template: str) -> str | None:
    """The comment stored on database `template` (a seeded campaign's summary), or None if it does not exist."""
    from sqlalchemy import text

    admin, _ = _admin(url)
    with admin.connect() as conn:
        found = conn.execute(text("SELECT shobj_description(oid, 'pg_database') FROM pg_database"
                                  " WHERE datname = :n"), {"n": template}).first()
    admin.dispose()
    return None if found is None else (found[0] or "")


def save_as_template(url: str, template: str, comment: str) -> None:
    """Copy the database named by `url` to `template` (replacing it), with `comment` on the copy."""
    from sqlalchemy import text

    admin, name = _admin(url)
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{template}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{template}" TEMPLATE "{name}"'))
        conn.execute(text(f'COMMENT ON DATABASE "{template}" IS ' + "'" + comment.replace("'", "''") + "'"))
    admin.dispose()


def database_from_template(url: str, template: str) -> str:
    """Drop the database named by `url`, create it as a copy of `template`, and migrate it to head."""
    from sqlalchemy import text

    from app.platform.migrate import upgrade
    from app.platform.settings import Settings

    url = Settings(database_url=url).database_url
    admin, name = _admin(url)
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{template}"'))
    admin.dispose()
    upgrade(url)
    return url
