"""A live preflab server on SQLite in a background thread, and headless Chromium driven by Playwright.

Chromium is Debian's (/usr/bin/chromium, installed by `make test`); Playwright never downloads a browser.
"""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("PREFLAB_CHROMIUM", "/usr/bin/chromium")
IN_CI = os.environ.get("CI", "").lower() == "true"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    def __init__(self, tmp: Path) -> None:
        import uvicorn

        from app.main import create_app
        from app.platform.migrate import upgrade
        from app.platform.settings import Settings

        url = f"sqlite:///{tmp}/browser.db"
        upgrade(url)
        self.settings = Settings(env="dev", database_url=url, data_dir=tmp, secret_key="s" * 48)
        self.app = create_app(self.settings)
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> None:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("live server did not start")
            time.sleep(0.05)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.app.state.engine.dispose()

    def session(self):  # type: ignore[no-untyped-def]
        return self.app.state.session_factory()


@pytest.fixture
def live_server(tmp_path: Path) -> Iterator[LiveServer]:
    server = LiveServer(tmp_path)
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def chromium():  # type: ignore[no-untyped-def]
    if not Path(CHROMIUM).exists() and not shutil.which("chromium"):
        if IN_CI:
            pytest.fail(f"Chromium is required in CI ({CHROMIUM} not found)", pytrace=False)
        pytest.skip(reason="Chromium not installed (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM, headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                  "--no-first-run", "--disable-sync", "--disable-quic"],
        )
        yield browser
        browser.close()


@pytest.fixture
def page(chromium):  # type: ignore[no-untyped-def]
    context = chromium.new_context(viewport={"width": 1366, "height": 800})
    page = context.new_page()
    page.console_errors = []  # type: ignore[attr-defined]
    page.on("console", lambda m: m.type == "error" and page.console_errors.append(m.text))  # type: ignore[attr-defined]
    page.on("pageerror", lambda e: page.console_errors.append(str(e)))  # type: ignore[attr-defined]
    yield page
    context.close()


def settle(page) -> None:  # type: ignore[no-untyped-def]
    """Let the page run what it has queued (event handlers, violation reports) before a test looks: two animation
    frames and a task, an order the browser keeps, instead of a sleep that assumes its speed."""
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => setTimeout(r, 0))))")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.browser)
