"""A fresh, migrated Postgres database for a benchmark run (dropped and created again each time)."""

from __future__ import annotations


def fresh_database(url: str) -> str:
    """Drop and recreate the database named by `url`, migrate it to head, and return the normalised URL."""
    from sqlalchemy import create_engine, text

    from app.migrate import upgrade
    from app.settings import Settings

    url = Settings(database_url=url).database_url
    base, _, name = url.rpartition("/")
    admin = create_engine(f"{base}/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    upgrade(url)
    return url
