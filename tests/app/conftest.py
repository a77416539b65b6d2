"""Fixtures for the app tests that need a real server."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import uvicorn


@pytest.fixture
def server_url(app: object) -> Iterator[str]:
    """The test app behind a real uvicorn server on a free port, in a thread (requests run truly concurrently)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))  # type: ignore[arg-type]
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    for _ in range(500):
        if server.started:
            break
        threading.Event().wait(0.01)
    assert server.started, "uvicorn did not start"
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)
    sock.close()


@pytest.fixture
def project(db: Any, make_project: Callable[..., Any]) -> Any:
    """A committed K=4 project, for the import and export tests."""
    project = make_project(db, k=4)
    db.commit()
    return project


@pytest.fixture
def lead(db: Any, project: Any) -> Any:
    """The lead who created `project`."""
    from app.models import User

    return db.get(User, project.created_by_id)
