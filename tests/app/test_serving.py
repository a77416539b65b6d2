"""`preflab serve --workers N`: every process takes connections, and the server ends keep-alive connections now
and then so that they can move."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.platform.settings import Settings
from app.web.serving import bind
from tests.conftest import TEST_SECRET
from tests.support.server import Server, wait_for


def _tcp_sockets(port: int, state: str) -> set[str]:
    """Inodes of this machine's TCP sockets on local `port` in `state` (01 established, 0A listening)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == state:
                inodes.add(fields[9])
    return inodes


def _held_by(pid: int, inodes: set[str]) -> int:
    links = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
    return sum(1 for link in links if link.startswith("socket:[") and link[8:-1] in inodes)


def _workers_of(pid: int) -> list[int]:
    """The uvicorn worker processes under the supervisor `pid` (not multiprocessing's resource tracker)."""
    children = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    return [c for c in children if b"resource_tracker" not in Path(f"/proc/{c}/cmdline").read_bytes()]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the sockets from /proc")
def test_a_burst_of_connections_reaches_every_server_process(database_url, tmp_path) -> None:
    """32 clients that connect at once and keep their connections: both processes of `--workers 2` hold some (one
    listening socket shared by both gave all 32 to one process, which did all the work while the other idled)."""
    if not database_url.startswith("postgresql"):
        pytest.skip(reason="several server processes need Postgres")
    server = Server(database_url, tmp_path, workers=2, PREFLAB_KEEPALIVE_REQUESTS="0")
    clients: list[httpx.Client] = []
    try:
        server.start()
        # Each process listens on its own socket once its start-up is done.
        wait_for("both processes to listen", lambda: len(_tcp_sockets(server.port, "0A")) == 2, 90, every=0.05,
                 detail=server.output)
        clients = [httpx.Client(base_url=server.base, timeout=30) for _ in range(32)]
        for client in clients:
            client.get("/healthz/live").raise_for_status()  # one connection each, kept open
        established = _tcp_sockets(server.port, "01")
        assert server.proc is not None
        held = sorted(_held_by(pid, established) for pid in _workers_of(server.proc.pid))
        assert len(held) == 2 and sum(held) == 32, held
        # By a hash of each connection's address: 16 each on average; fewer than 4 on one side is a 1 in 10⁵ draw.
        assert held[0] >= 4, held
        # The processes share the default's 8 request threads (their settings come from the environment).
        for pid in _workers_of(server.proc.pid):
            assert b"PREFLAB_REQUEST_THREADS=4" in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        # A port that something already listens on fails at once, as a plain bind does.
        with pytest.raises(OSError):
            bind("127.0.0.1", server.port)
    finally:
        for client in clients:
            client.close()
        server.stop()


def test_the_server_ends_about_one_keep_alive_connection_in_n(tmp_path) -> None:
    """PREFLAB_KEEPALIVE_REQUESTS=N: about one response in N says `Connection: close` (1: every one); 0: none."""
    url = f"sqlite:///{tmp_path}/serving.db"

    def closing(every: int, requests: int) -> int:
        settings = Settings(database_url=url, data_dir=tmp_path, secret_key=TEST_SECRET, keepalive_requests=every)
        with TestClient(create_app(settings)) as client:
            return sum(client.get("/healthz/live").headers.get("connection") == "close" for _ in range(requests))

    assert closing(1, 20) == 20
    assert closing(0, 200) == 0
    # 1,000 draws at 1 in 10: 100 expected, outside 50–150 far less than once in a million.
    assert 50 <= closing(10, 1000) <= 150
    with pytest.raises(ValueError, match="keepalive_requests"):
        Settings(database_url=url, keepalive_requests=-1)


@pytest.mark.parametrize("workers", [1, 2])
def test_no_access_log_holds_in_every_server_process(database_url, tmp_path, workers) -> None:
    """`--no-access-log` leaves out the line per request, with `--workers N` too (each process builds the app after
    uvicorn set up its logging, and the app's log set-up had turned the lines back on); without it, a request's
    line carries its id."""
    if workers > 1 and not database_url.startswith("postgresql"):
        pytest.skip(reason="several server processes need Postgres")

    def served(name: str, *options: str) -> Server:
        server = Server(database_url, tmp_path / name, workers=workers, options=options,
                        PREFLAB_WORKER_HEARTBEAT_MAX_AGE_S="0")
        try:
            server.start()
            for i in range(4):  # with several processes, whichever takes the connection
                with httpx.Client(base_url=server.base) as client:
                    client.get("/healthz/live", headers={"X-Request-ID": f"probe-{name}-{i}"}).raise_for_status()
            if not options:
                wait_for("the access lines", lambda: server.log.read_text().count(f"probe-{name}-") == 4, 30,
                         detail=server.output)
        finally:
            server.stop()
        return server

    logged = served("logged").log.read_text()
    line = next(x for x in logged.splitlines() if "probe-logged-0" in x)
    assert '"GET /healthz/live HTTP/1.1" 200' in line and "[request_id=probe-logged-0]" in line
    quiet = served("quiet", "--no-access-log").log.read_text()  # stopped: what it wrote is all there
    assert "uvicorn.access" not in quiet and "probe-quiet-" not in quiet
