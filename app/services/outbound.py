"""Checks on URLs the server itself will call (OpenAI-compatible generators and judges)."""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from app.errors import Invalid

# Cloud metadata endpoints and link-local space: never a model server, a classic SSRF target.
BLOCKED_HOSTS = {"metadata.google.internal", "metadata", "instance-data"}


def check_base_url(url: str, *, field: str = "base_url", resolve: bool = True) -> str:
    """The URL, normalised, or Invalid: http(s) only, no credentials, no link-local or metadata hosts."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https"):
        raise Invalid("must be an http:// or https:// URL", field=field)
    if not parts.hostname:
        raise Invalid("has no host", field=field)
    if parts.username or parts.password:
        raise Invalid("must not carry credentials; use api_key", field=field)
    host = parts.hostname.lower().rstrip(".")
    if host in BLOCKED_HOSTS:
        raise Invalid("points at a cloud metadata service", field=field)
    addresses: list[str] = []
    try:
        addresses = [str(ipaddress.ip_address(host))]
    except ValueError:
        if resolve:
            try:
                infos = socket.getaddrinfo(host, parts.port or 80, proto=socket.IPPROTO_TCP)
                addresses = [str(info[4][0]) for info in infos]
            except OSError:
                addresses = []  # unresolvable now; the job reports "unreachable" rather than refusing here
    for address in addresses:
        ip = ipaddress.ip_address(address.split("%")[0])
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped  # ::ffff:169.254.169.254 is 169.254.169.254
        if ip.is_link_local or ip.is_multicast or ip.is_unspecified or ip.is_reserved:
            raise Invalid(f"points at a link-local or reserved address ({ip})", field=field)
    return url.strip().rstrip("/")
