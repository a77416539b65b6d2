"""Fixtures for the security suite: the seeded two-project world on each backend."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.security.world import World, seed


def _worker_seen(data_dir: Any) -> None:
    """A worker heartbeat that stays fresh however long the suite runs, so /healthz/ready answers 200, not 503."""
    import os
    import time

    from app.platform.observability import WORKERS_DIR, record_worker_heartbeat

    record_worker_heartbeat(data_dir, "security-suite")
    later = time.time() + 24 * 3600
    os.utime(data_dir / WORKERS_DIR / "security-suite", (later, later))


@pytest.fixture
def reseed(app: Any, clean_engine: Any) -> Callable[[], World]:
    """Empty every table and seed the world again (for calls that change state)."""
    from tests.conftest import _empty_tables

    def make() -> World:
        _empty_tables(clean_engine)
        app.state.login_throttle.reset()
        _worker_seen(app.state.settings.data_dir)
        session = app.state.session_factory()
        try:
            return seed(session, app.state.settings.data_dir)
        finally:
            session.close()

    return make


@pytest.fixture
def world(reseed: Callable[[], World]) -> World:
    return reseed()


@pytest.fixture
def client(app: Any) -> Any:
    from fastapi.testclient import TestClient

    with TestClient(app, base_url="http://testserver", follow_redirects=False) as c:
        yield c
