"""A minimal HTTP/1.1 keep-alive client for the load generators.

The load generator shares the machine's two cores with the server it measures, so every millisecond it spends
is taken from the server: httpx costs about 5 ms of CPU per request here, this about 0.3 ms. It speaks only what
the annotation API answers (fixed Content-Length or chunked bodies, keep-alive) and raises `StaleConnection`
when the server closed the connection before answering, which is safe to resend for idempotent calls.
"""

from __future__ import annotations

import asyncio
import json as _json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit


class StaleConnection(ConnectionError):
    """The connection closed before a response arrived (an idle keep-alive connection the server dropped)."""


class ProtocolError(RuntimeError):
    """The server answered something this client does not parse."""


@dataclass
class Response:
    status_code: int
    content: bytes

    def json(self) -> Any:
        return _json.loads(self.content)


class KeepAliveClient:
    """One connection, one request at a time (as one browser tab of one annotator)."""

    def __init__(self, base: str, headers: dict[str, str] | None = None, timeout: float = 30.0) -> None:
        parts = urlsplit(base)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"base must be an http:// URL, got {base!r}")
        self.host, self.port, self.timeout = parts.hostname, parts.port or 80, timeout
        fixed = {"Host": f"{self.host}:{self.port}", **(headers or {})}
        self._head = "".join(f"{k}: {v}\r\n" for k, v in fixed.items())
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def request(self, method: str, path: str, json: Any = None) -> Response:
        return await asyncio.wait_for(self._request(method, path, json), self.timeout)

    async def _request(self, method: str, path: str, json: Any) -> Response:
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        assert self._reader is not None
        body = b"" if json is None else _json.dumps(json).encode()
        head = f"{method} {path} HTTP/1.1\r\n{self._head}"
        if json is not None:
            head += "Content-Type: application/json\r\n"
        if body or method in ("POST", "PUT", "PATCH"):
            head += f"Content-Length: {len(body)}\r\n"
        try:
            self._writer.write(head.encode() + b"\r\n" + body)
            status_line = await self._reader.readline()
            if not status_line:
                raise StaleConnection("closed before the response")
            try:
                status = int(status_line.split(b" ", 2)[1])
            except (IndexError, ValueError):
                raise ProtocolError(f"bad status line {status_line[:80]!r}") from None
            headers: dict[bytes, bytes] = {}
            while (line := await self._reader.readline()) not in (b"\r\n", b"\n", b""):
                name, _, value = line.partition(b":")
                headers[name.strip().lower()] = value.strip()
            if b"content-length" in headers:
                content = await self._reader.readexactly(int(headers[b"content-length"]))
            elif headers.get(b"transfer-encoding", b"").lower() == b"chunked":
                content = await self._chunked()
            elif status in (204, 304) or status < 200:
                content = b""
            else:
                content = await self._reader.read()
                headers[b"connection"] = b"close"
        except (ConnectionError, asyncio.IncompleteReadError) as exc:
            self.close()
            if isinstance(exc, StaleConnection):
                raise
            raise StaleConnection(str(exc) or type(exc).__name__) from exc
        except BaseException:
            self.close()  # a timeout or cancellation leaves the connection mid-response
            raise
        if headers.get(b"connection", b"").lower() == b"close":
            self.close()
        return Response(status, content)

    async def _chunked(self) -> bytes:
        assert self._reader is not None
        out = bytearray()
        while True:
            size = int((await self._reader.readline()).split(b";")[0], 16)
            if size == 0:
                while (await self._reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return bytes(out)
            out += await self._reader.readexactly(size)
            await self._reader.readexactly(2)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None

    async def __aenter__(self) -> KeepAliveClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()
