"""Outbound HTTP connections whose every address passes a caller's check at connect time (DNS rebinding)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

AddressCheck = Callable[[str], None]
"""Called with each IP address a client is about to connect to; raises ValueError to refuse it."""


class AddressRefused(Exception):
    """The server's host resolved to an address the caller's address check refuses."""


def checked_transport(check: AddressCheck, max_connections: int) -> Any:
    """An httpx transport that resolves each host itself, passes every address to `check` and connects to an
    address it checked, so DNS cannot answer one address to a URL check and another to the connection (DNS
    rebinding). No proxy from the environment: through a proxy the address connected to is the proxy's.
    A refused address raises `AddressRefused` out of the request (httpx does not wrap it)."""
    import socket

    import httpcore
    import httpx

    class CheckedBackend(httpcore.SyncBackend):
        def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                        socket_options: Any = None) -> Any:
            try:
                infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except OSError as exc:
                raise httpcore.ConnectError(f"{host} did not resolve: {exc}") from exc
            addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
            for address in addresses:
                try:
                    check(address)
                except ValueError as exc:
                    raise AddressRefused(f"refused to connect to {host} at {address}: {exc}") from None
            error: Exception | None = None
            for address in addresses:
                try:
                    return super().connect_tcp(address, port, timeout, local_address, socket_options)
                except httpcore.ConnectError as exc:
                    error = exc
            raise error or httpcore.ConnectError(f"{host} has no address")

    transport = httpx.HTTPTransport(trust_env=False, limits=httpx.Limits(max_connections=max_connections))
    # HTTPTransport takes no network backend, so its pool is rebuilt with the same TLS context around ours;
    # TLS still verifies the certificate against the URL's host name (httpcore's SNI is the origin host).
    transport._pool = httpcore.ConnectionPool(ssl_context=transport._pool._ssl_context, max_connections=max_connections,
                                              network_backend=CheckedBackend())
    return transport
