"""Several server processes on one port, each with a listening socket of its own (SO_REUSEPORT).

uvicorn's `--workers` shares one listening socket between its processes. Whichever process accepts first takes a
burst of connections, and Linux wakes the process that accepted last: `bench_annotation.py` found all 32 of its
keep-alive connections on one process of two in 5 runs of 7, the other idle, and connections that reconnected went
back to the busier one (26 / 6). With a socket per process the kernel spreads new connections over the listening
processes by a hash of their addresses, whoever is awake. A process still starting is not listening yet and gets
none: `ConnectionTurnover` (app.web.rendering) lets connections move later.
"""

from __future__ import annotations

import socket
import sys
from typing import Any


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _listener(family: socket.AddressFamily, address: tuple[Any, ...]) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(address)
    sock.set_inheritable(True)
    return sock


class PerProcessSocket(socket.socket):
    """Bound in the supervising process (so a port in use fails at once, with the usual error), never listened on
    there: each worker process it is handed to unpickles a socket of its own, bound to the same address, and
    listens on that."""

    def __reduce__(self) -> tuple[Any, ...]:
        return _listener, (self.family, self.getsockname())


def bind(host: str, port: int) -> PerProcessSocket:
    """The supervisor's socket for `host:port`. A port something else holds fails here (OSError), as a plain bind
    would: the address is first bound without SO_REUSEPORT, so this never joins another server's group."""
    family = _family(host)
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, port))
        address = probe.getsockname()  # port 0 becomes the port the kernel chose
    plain = _listener(family, address)
    sock = PerProcessSocket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP, fileno=plain.detach())
    sock.set_inheritable(True)
    return sock


def run_workers(app: str, *, host: str, port: int, workers: int, **options: Any) -> None:
    """uvicorn's process supervisor (worker restarts, signals, `SIGTTIN`/`SIGTTOU`) with a socket per worker on
    Linux; `options` are uvicorn.Config's."""
    from uvicorn import Config
    from uvicorn.supervisors import Multiprocess

    config = Config(app, host=host, port=port, workers=workers, **options)
    # Elsewhere SO_REUSEPORT is missing (Windows) or does not spread connections (macOS, the BSDs): share one.
    sock = bind(host, port) if sys.platform.startswith("linux") else config.bind_socket()
    try:
        Multiprocess(config, sockets=[sock]).run()
    finally:
        sock.close()
