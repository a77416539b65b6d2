"""Start-up configuration: production refuses a missing or placeholder secret; URLs are normalised."""

from __future__ import annotations

import os
import stat

import pytest

from app.platform.settings import Settings, SettingsError, load_settings


def test_production_without_secret_refuses_to_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PREFLAB_ENV", "production")
    monkeypatch.delenv("PREFLAB_SECRET_KEY", raising=False)
    with pytest.raises(SettingsError, match="PREFLAB_SECRET_KEY"):
        load_settings()


@pytest.mark.parametrize("secret", ["changeme", "secret", "short-but-not-placeholder"])
def test_production_with_placeholder_or_short_secret_refuses(monkeypatch: pytest.MonkeyPatch, secret: str) -> None:
    monkeypatch.setenv("PREFLAB_ENV", "production")
    monkeypatch.setenv("PREFLAB_SECRET_KEY", secret)
    with pytest.raises(SettingsError, match="PREFLAB_SECRET_KEY"):
        load_settings()


def test_bad_value_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PREFLAB_ENV", "staging")
    with pytest.raises(SettingsError, match="PREFLAB_ENV"):
        load_settings()
    monkeypatch.setenv("PREFLAB_ENV", "dev")
    monkeypatch.setenv("PREFLAB_DATABASE_URL", "mysql://x@y/z")
    with pytest.raises(SettingsError, match="PREFLAB_DATABASE_URL"):
        load_settings()


def test_plain_postgres_url_is_mapped_to_psycopg3() -> None:
    assert Settings(database_url="postgresql://u@h:5432/db").database_url == "postgresql+psycopg://u@h:5432/db"
    assert Settings(database_url="postgres://u@h/db").database_url == "postgresql+psycopg://u@h/db"


def test_dev_secret_is_generated_once_with_owner_only_permissions(tmp_path) -> None:  # type: ignore[no-untyped-def]
    settings = Settings(env="dev", data_dir=tmp_path)
    first = settings.resolved_secret()
    assert len(first) >= 40 and first == settings.resolved_secret()
    mode = stat.S_IMODE(os.stat(tmp_path / "secret_key").st_mode)
    assert mode == 0o600


def test_production_cookies_are_secure() -> None:
    assert Settings(env="production", secret_key="x" * 40).cookies_secure
    assert not Settings(env="dev").cookies_secure


def test_the_postgres_pool_keeps_the_configured_connections(monkeypatch: pytest.MonkeyPatch) -> None:
    from app.platform.db import make_engine

    monkeypatch.setenv("PREFLAB_DATABASE_POOL_SIZE", "0")
    with pytest.raises(SettingsError, match="PREFLAB_DATABASE_POOL_SIZE"):
        load_settings()
    monkeypatch.setenv("PREFLAB_DATABASE_POOL_SIZE", "32")
    settings = load_settings()
    # No connection is opened here: the pool only records its size until the first checkout.
    engine = make_engine("postgresql+psycopg://u@127.0.0.1:1/db", settings.database_pool_size)
    assert engine.pool.size() == 32
    engine.dispose()


def test_prepared_statements_setting_is_a_validated_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_settings().database_prepared_statements is True
    monkeypatch.setenv("PREFLAB_DATABASE_PREPARED_STATEMENTS", "off")  # as PgBouncer's docs would say it
    assert load_settings().database_prepared_statements is False
    monkeypatch.setenv("PREFLAB_DATABASE_PREPARED_STATEMENTS", "sometimes")
    with pytest.raises(SettingsError, match="PREFLAB_DATABASE_PREPARED_STATEMENTS"):
        load_settings()


def test_a_relative_data_dir_is_made_absolute(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """`make demo` passes data/: trainer processes run in other working directories, so every path the server
    stores or hands them must not depend on where it was started (a demo reward run once failed on data/runs/…)."""
    monkeypatch.chdir(tmp_path)
    settings = Settings(data_dir="data")
    assert settings.data_dir == tmp_path / "data" and settings.data_dir.is_absolute()


def test_server_processes_share_the_default_request_threads(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("PREFLAB_REQUEST_THREADS", raising=False)
    assert [load_settings().threads_per_process(n) for n in (1, 2, 3, 4, 8)] == [8, 4, 3, 2, 2]
    monkeypatch.setenv("PREFLAB_REQUEST_THREADS", "6")  # set by the operator: each process runs that many
    assert [load_settings().threads_per_process(n) for n in (1, 2, 4)] == [6, 6, 6]
    assert Settings(request_threads=8).threads_per_process(2) == 8


def test_request_threads_size_the_servers_thread_pool_and_are_validated(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import anyio.to_thread
    from fastapi.testclient import TestClient

    from app.main import create_app

    monkeypatch.setenv("PREFLAB_REQUEST_THREADS", "0")
    with pytest.raises(SettingsError, match="PREFLAB_REQUEST_THREADS"):
        load_settings()

    async def threads() -> int:
        return int(anyio.to_thread.current_default_thread_limiter().total_tokens)

    settings = Settings(env="dev", database_url=f"sqlite:///{tmp_path}/t.db", secret_key="x" * 40,
                        data_dir=tmp_path, request_threads=3)
    with TestClient(create_app(settings)) as client:  # the lifespan runs: the server's loop is up
        assert client.portal.call(threads) == 3
        assert client.get("/healthz").status_code == 200
