"""Connections balanced across the processes of `preflab serve --workers N`.

Each process listens on a socket of its own (app.web.serving) and the kernel hands it new connections by a hash of
their addresses: with 32 keep-alive clients and two processes, a split of 20 / 12 or worse comes up in about one
start in five, and the busier process's clients wait about 1.7 times as long as the other's (p95 101 ms against
90 ms at an even split, `bench_annotation.py`). Keep-alive keeps a bad draw for as long as the clients keep sending.

So every process counts the clients it served in the last `ACTIVE_S` seconds (a client is a connection: its
address and port), and every `CHECK_S` seconds writes the count to its slot of a small file that all the processes
share (the board, made by the supervisor before it starts them: `board_file`), and reads the others'. A process
above its share (all of them divided by the processes, rounded up) ends the connections of as many of its clients
as it has too many (`Connection: close` on their next response, `app.web.rendering.closing_connection`), once it
found them too many at two checks running. They reconnect, and the kernel places them anew: in a few rounds no
process holds more than its share. Counts mean something once every process has counted for `ACTIVE_S`: nothing
moves in a process's first seconds.

Behind a proxy (`trust_proxy_headers`) a request's client is the user, not a connection, and the proxy spreads the
load: no board then.
"""

from __future__ import annotations

import fcntl
import math
import mmap
import os
import struct
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from app.web.rendering import closing_connection

BOARD_ENV = "PREFLAB_CONNECTION_BOARD"
"""The board's path, set in the environment by the supervisor for the processes it starts."""
ACTIVE_S = 2.0
"""A client that sent nothing for this long no longer counts (a client sends several requests a second under load,
an annotator one every few seconds: an idle connection costs the process nothing)."""
CHECK_S = 0.5
SLOTS = 256
# (pid, clients, when posted, since when it counts), times by time.monotonic: the same clock in every process
_SLOT = struct.Struct("<qqdd")


class Board:
    """One slot per server process in a shared file: its pid, how many clients it is serving, when it said so, and
    since when it has been counting."""

    def __init__(self, path: str | Path, pid: int | None = None) -> None:
        self.pid = pid or os.getpid()
        self.since = 0.0
        with open(path, "r+b") as file:
            self._map = mmap.mmap(file.fileno(), SLOTS * _SLOT.size)
            fcntl.flock(file, fcntl.LOCK_EX)  # processes starting at once take a slot each
            try:
                self.slot = self._claim()
            finally:
                fcntl.flock(file, fcntl.LOCK_UN)

    def _claim(self) -> int:
        """This process's slot: a free one, or one whose process is gone (a restarted worker takes over its slot)."""
        for slot, (pid, *_) in enumerate(_SLOT.iter_unpack(self._map)):
            if pid in (0, self.pid) or not _alive(pid):
                _SLOT.pack_into(self._map, slot * _SLOT.size, self.pid, 0, 0.0, 0.0)
                return slot
        raise RuntimeError(f"more than {SLOTS} server processes share one connection board")

    def post(self, clients: int, now: float) -> list[int] | None:
        """Write this process's count; every live process's (this one's included), or None while one of them has
        counted for less than `ACTIVE_S` (just started: its count is still short). A process posts while it serves
        requests: one that posted nothing for `ACTIVE_S` serves no one now, whatever it said then."""
        if not self.since:
            self.since = now
        _SLOT.pack_into(self._map, self.slot * _SLOT.size, self.pid, clients, now, self.since)
        counts = []
        for pid, count, at, since in _SLOT.iter_unpack(self._map):
            if not pid or (pid != self.pid and not _alive(pid)):
                continue
            if now - at >= ACTIVE_S:
                counts.append(0)
            elif now - since < ACTIVE_S:
                return None
            else:
                counts.append(count)
        return counts


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def excess(mine: int, counts: list[int] | None) -> int:
    """How many of its clients a process serving `mine` of them should let go, where the processes serve `counts`
    (None: not known yet)."""
    if counts is None or len(counts) < 2:
        return 0
    return max(0, mine - math.ceil(sum(counts) / len(counts)))


@contextmanager
def board_file() -> Iterator[str]:
    """A new board for the processes about to start, in the environment they inherit; removed afterwards."""
    fd, path = tempfile.mkstemp(prefix="preflab-connections-")
    try:
        os.ftruncate(fd, SLOTS * _SLOT.size)
        os.close(fd)
        os.environ[BOARD_ENV] = path
        yield path
    finally:
        os.environ.pop(BOARD_ENV, None)
        Path(path).unlink(missing_ok=True)


class ConnectionBalance:
    """Ends the connections of the clients this process has beyond its share of all the processes' clients."""

    def __init__(self, app: ASGIApp, *, board: Board, clock: Callable[[], float] = time.monotonic) -> None:
        self.app = app
        self.board = board
        self.clock = clock
        self.seen: dict[Any, float] = {}  # client → when it last sent a request (only the event loop touches it)
        self.leaving: set[Any] = set()
        self.next_check = 0.0
        self.over = 0  # the excess found at the last check

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        client = scope.get("client") if scope["type"] == "http" else None
        if client is None:
            await self.app(scope, receive, send)
            return
        client = tuple(client)
        now = self.clock()
        self.seen[client] = now
        if now >= self.next_check:
            self._check(now)
        if client not in self.leaving:
            await self.app(scope, receive, send)
            return
        # It reconnects from another port: a new client, wherever the kernel places it.
        self.leaving.discard(client)
        self.seen.pop(client, None)
        await self.app(scope, receive, closing_connection(send))

    def _check(self, now: float) -> None:
        self.next_check = now + CHECK_S
        self.seen = {client: at for client, at in self.seen.items() if now - at < ACTIVE_S}
        self.leaving &= self.seen.keys()
        over = excess(len(self.seen), self.board.post(len(self.seen), now)) - len(self.leaving)
        # Only an excess found twice running, and the smaller: a count posted just after a pause (every client
        # idle for ACTIVE_S) is short until the process has seen its clients again.
        act, self.over = min(over, self.over), over
        if act > 0:
            self.leaving.update([client for client in self.seen if client not in self.leaving][:act])


def board_from_environment() -> Board | None:
    """This server process's slot on the board its supervisor made; None for a single process. Taken out of the
    environment, so that nothing this process starts joins the board."""
    path = os.environ.pop(BOARD_ENV, None)
    return Board(path) if path else None
