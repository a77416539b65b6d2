"""`preflab serve` as its own process on a free port, a stand-in HTTP server in a thread, and waiting on a condition
with a deadline (never a sleep)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import REPO, TEST_SECRET


@contextmanager
def serve_in_thread(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """A local HTTP server answering with `handler` on a free port, for the block; yields its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what: str, condition: Callable[[], Any], timeout: float, every: float = 0.01,
             detail: Callable[[], str] = str) -> Any:
    """The condition's first truthy value; an AssertionError naming `what` (and `detail()`) after `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{detail()}")


def preflab_env(database_url: str, data_dir: Path, **extra: str) -> dict[str, str]:
    """The environment of a preflab process on this database and data directory: none of the caller's PREFLAB_*
    settings, the test secret and encryption key (a server and its workers share them), this checkout importable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFLAB_")}
    env.update(PREFLAB_DATABASE_URL=database_url, PREFLAB_DATA_DIR=str(data_dir), PREFLAB_ENV="dev",
               PREFLAB_SECRET_KEY=TEST_SECRET, PREFLAB_ENCRYPTION_KEY=os.environ["PREFLAB_ENCRYPTION_KEY"],
               PYTHONPATH=str(REPO), **extra)
    return env


class Server:
    """`preflab serve` as its own process; restartable on the same port. Its output goes to
    `data_dir/server-output.log`. Without a worker beside it, pass PREFLAB_WORKER_HEARTBEAT_MAX_AGE_S="0" in `env`
    so that readiness checks only the database and the migrations."""

    def __init__(self, database_url: str, data_dir: Path, start_deadline_s: float = 90.0, workers: int = 1,
                 probe: str = "/healthz/live", options: tuple[str, ...] = (), **env: str) -> None:
        self.options = options  # more `preflab serve` options
        self.workers = workers  # > 1: `--workers N` (Postgres), in a process group of its own, stopped as one
        self.probe = probe  # what `start` polls until it answers 200
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = data_dir / "server-output.log"
        self.env = preflab_env(database_url, data_dir, **env)
        self.start_deadline_s = start_deadline_s
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> float:
        """Start it and wait until it answers; the seconds that took."""
        t0 = time.monotonic()
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as output:  # the child keeps its own copy of the handle
            self.proc = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--port", str(self.port),
                                          "--workers", str(self.workers), *self.options], cwd=REPO, env=self.env,
                                         stdout=output, stderr=subprocess.STDOUT, start_new_session=self.workers > 1)
        wait_for(f"the server to answer {self.probe}", self._live, self.start_deadline_s, every=0.05,
                 detail=self.output)
        return time.monotonic() - t0

    def _live(self) -> bool:
        assert self.proc is not None and self.proc.poll() is None, f"the server exited:\n{self.output()}"
        try:
            return httpx.get(f"{self.base}{self.probe}", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    def ready(self) -> bool:
        try:
            return httpx.get(f"{self.base}/healthz/ready", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    def kill(self) -> None:
        self._signal(signal.SIGKILL)
        assert self.proc is not None and self.proc.wait(timeout=30) == -signal.SIGKILL

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.proc.wait(timeout=30)

    def _signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        if self.workers > 1:
            os.killpg(self.proc.pid, sig)  # the worker processes too
        else:
            self.proc.send_signal(sig)

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:] if self.log.exists() else ""
