"""Connections balanced across `preflab serve --workers N` (app/web/balance.py): a process serving more clients than
its share ends the connections of the extra ones, which reconnect and are placed anew by the kernel."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from app.web.balance import ACTIVE_S, CHECK_S, SLOTS, Board, ConnectionBalance, board_file, excess
from tests.app.test_serving import _tcp_sockets, _workers_of
from tests.support.server import Server, wait_for


def test_a_process_lets_go_of_what_it_has_beyond_its_share() -> None:
    assert excess(20, [20, 12]) == 4
    assert excess(12, [20, 12]) == 0
    assert excess(17, [17, 16]) == 0  # 33 over two: 17 is the share rounded up
    assert excess(11, [11, 11, 10]) == 0
    assert excess(14, [14, 8, 8]) == 4
    assert excess(32, [32]) == 0  # one process: nowhere to move to
    assert excess(20, None) == 0  # a process is still starting


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_processes_take_a_slot_each_and_a_restarted_one_takes_a_dead_ones() -> None:
    with board_file() as path:
        assert os.environ["PREFLAB_CONNECTION_BOARD"] == path
        first, second = Board(path), Board(path, pid=os.getppid())
        assert (first.slot, second.slot) == (0, 1)
        assert first.post(20, 1.0) is None  # counts mean something once a process has counted for ACTIVE_S
        assert second.post(12, 1.0) is None
        settled = 1.0 + ACTIVE_S - CHECK_S
        assert first.post(20, settled) is None  # the second is still settling
        settled = 1.0 + ACTIVE_S
        assert second.post(12, settled) == [20, 12]  # the first's count from 2.5 is fresh at 3.0
        assert first.post(20, settled) == [20, 12]
        gone = Board(path, pid=_dead_pid())
        assert gone.slot == 2
        gone.post(5, settled)
        assert first.post(20, settled) == [20, 12]  # a process that is gone does not count
        # One that posted nothing for ACTIVE_S serves no one (it would have posted while it did).
        assert first.post(20, settled + ACTIVE_S) == [20, 0]
        assert Board(path, pid=_dead_pid()).slot == 2  # and its slot is taken by the next one to start
        assert Board(path).slot == 0  # the same process again: its own slot
    assert not Path(path).exists() and "PREFLAB_CONNECTION_BOARD" not in os.environ


def test_the_board_says_when_it_is_full() -> None:
    with board_file() as path:
        with open(path, "r+b") as file:  # every slot held by a live process
            file.write(struct.pack("<qqdd", os.getppid(), 0, 0.0, 0.0) * SLOTS)
        with pytest.raises(RuntimeError, match=f"more than {SLOTS} server processes"):
            Board(path)


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def _ok(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def _request(app: ConnectionBalance, client: tuple[str, int]) -> bool:
    """Whether the response to this client's request ends its connection."""
    headers: list[Any] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            headers.extend(message["headers"])

    scope = {"type": "http", "client": client, "path": "/", "headers": []}
    asyncio.run(app(scope, None, send))  # type: ignore[arg-type]
    return (b"connection", b"close") in headers


def test_the_busier_process_ends_the_connections_of_its_extra_clients() -> None:
    clock = _Clock()
    with board_file() as path:
        busy = ConnectionBalance(_ok, board=Board(path), clock=clock)
        quiet = ConnectionBalance(_ok, board=Board(path, pid=os.getppid()), clock=clock)
        on_busy = [("127.0.0.1", 40000 + i) for i in range(20)]
        on_quiet = [("127.0.0.1", 50000 + i) for i in range(12)]
        # Each process counts its clients for ACTIVE_S before any acts on the counts (its first post counts one).
        while clock.now < 100.0 + ACTIVE_S:
            assert not any(_request(busy, c) for c in on_busy) and not any(_request(quiet, c) for c in on_quiet)
            clock.now += CHECK_S
        assert not any(_request(quiet, c) for c in on_quiet)  # posts its 12
        assert not any(_request(busy, c) for c in on_busy)  # 4 too many: once is not enough to act
        clock.now += CHECK_S
        assert not any(_request(quiet, c) for c in on_quiet)
        closed = [c for c in on_busy if _request(busy, c)]
        # 32 clients over two processes: 16 each, so 4 of the busy one's 20 are let go, once each.
        assert len(closed) == 4
        assert not any(_request(busy, c) for c in on_busy if c not in closed)
        # They reconnect from new ports to the quiet one: nobody is over its share, nothing more closes.
        moved = [("127.0.0.1", 60000 + i) for i in range(4)]
        assert not any(_request(quiet, c) for c in moved)
        clock.now += ACTIVE_S  # the closed connections' entries are gone by now in any case
        for _ in range(3):
            assert not any(_request(busy, c) for c in on_busy if c not in closed)
            assert not any(_request(quiet, c) for c in on_quiet + moved)
            clock.now += CHECK_S


def test_requests_that_are_not_http_pass_through() -> None:
    with board_file() as path:
        app = ConnectionBalance(_ok, board=Board(path))
        sent: list[Any] = []

        async def send(message: Any) -> None:
            sent.append(message)

        asyncio.run(app({"type": "lifespan"}, None, send))  # type: ignore[arg-type]
        assert app.seen == {} and sent


# --- a real server ----------------------------------------------------------------------------------------------

class _KeepAlive:
    """One HTTP/1.1 keep-alive connection, reopened when the server ends it: its local port says which process
    holds it."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.reconnects = 0

    @property
    def local_port(self) -> int:
        return int(self.sock.getsockname()[1])

    def get(self) -> None:
        self.sock.sendall(b"GET /healthz/live HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(65536)
            assert chunk, "the server closed the connection before answering"
            head += chunk
        header, _, body = head.partition(b"\r\n\r\n")
        lines = header.decode().lower().split("\r\n")
        assert lines[0].startswith("http/1.1 200"), lines[0]
        length = int(next(line.split(":", 1)[1] for line in lines if line.startswith("content-length")))
        while len(body) < length:
            body += self.sock.recv(65536)
        if "connection: close" in lines:
            self.sock.close()
            self.sock = socket.create_connection(("127.0.0.1", self.port))
            self.reconnects += 1

    def close(self) -> None:
        self.sock.close()


def _owners(server_port: int, workers: list[int]) -> dict[int, int]:
    """Client port → the worker process holding the server's end of that connection."""
    by_inode: dict[str, int] = {}
    for pid in workers:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                link = os.readlink(fd)
            except FileNotFoundError:  # closed since it was listed
                continue
            if link.startswith("socket:["):
                by_inode[link[8:-1]] = pid
    owners = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == server_port and fields[9] in by_inode:
                owners[int(fields[2].rsplit(":", 1)[1], 16)] = by_inode[fields[9]]
    return owners


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the sockets from /proc")
def test_connections_on_one_process_spread_until_each_holds_its_share(database_url, tmp_path) -> None:
    """24 keep-alive clients on one process of `--workers 2` and 8 on the other, all sending requests: within
    seconds each process holds 16 (± 1 while a connection moves)."""
    if not database_url.startswith("postgresql"):
        pytest.skip(reason="several server processes need Postgres")
    server = Server(database_url, tmp_path, workers=2, PREFLAB_KEEPALIVE_REQUESTS="0")
    clients: list[_KeepAlive] = []
    try:
        server.start()
        wait_for("both processes to listen", lambda: len(_tcp_sockets(server.port, "0A")) == 2, 90, every=0.05,
                 detail=server.output)
        assert server.proc is not None
        workers = _workers_of(server.proc.pid)
        busy = workers[0]
        # Open connections until 24 are on one process and 8 on the other, closing the rest.
        spare: list[_KeepAlive] = []
        while len(clients) < 32:
            client = _KeepAlive(server.port)
            client.get()
            owners = _owners(server.port, workers)
            placed = sum(1 for c in clients if owners.get(c.local_port) == owners.get(client.local_port))
            (clients if placed < (24 if owners.get(client.local_port) == busy else 8) else spare).append(client)
        for client in spare:
            client.close()
        owners = _owners(server.port, workers)
        assert sorted(sum(1 for c in clients if owners.get(c.local_port) == pid) for pid in workers) == [8, 24]

        def split() -> list[int]:
            for client in clients:
                client.get()
            owners = _owners(server.port, workers)
            return sorted(sum(1 for c in clients if owners.get(c.local_port) == pid) for pid in workers)

        wait_for("each process to hold its share", lambda: split() in ([16, 16], [15, 17]), 60, every=0.05,
                 detail=server.output)
        assert 8 <= sum(c.reconnects for c in clients)  # at least the 8 the busy process had too many
    finally:
        for client in clients:
            client.close()
        server.stop()

