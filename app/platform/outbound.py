"""Checks on URLs the server itself will call (OpenAI-compatible generators and judges).

Two tiers: cloud metadata services, link-local, multicast and reserved space are never a model server and are
always refused; private and loopback addresses (a vLLM box on the LAN, a server on localhost) are refused too
unless an admin marked that model endpoint as trusted (`allow_private`). The check runs when a job is asked
for, again when the worker starts it, and on every connection the worker's client opens (`address_guard`), so
a host whose DNS answer changes (DNS rebinding) is caught at connect time.

`PREFLAB_OUTBOUND_HOSTS=none` refuses every host before its name is resolved or an address compared: the web
process and the worker set it at start (`refuse_every_host`), for an install that must call out to nothing and for
fuzzing the API without any DNS traffic.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from urllib.parse import urlsplit

from app.platform.errors import Invalid

# Cloud metadata endpoints and link-local space: never a model server, a classic SSRF target.
BLOCKED_HOSTS = {"metadata.google.internal", "metadata", "instance-data"}
# Metadata services outside link-local space (AWS IPv6, Alibaba, Azure wire server): refused even when trusted.
BLOCKED_ADDRESSES = {ipaddress.ip_address(a) for a in ("fd00:ec2::254", "100.100.100.200", "168.63.129.16")}

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_refuse_all = False


def refuse_every_host(refuse: bool) -> None:
    """Set by the process from `Settings.outbound_hosts` at start: True refuses every URL without resolving it."""
    global _refuse_all
    _refuse_all = refuse


def _addresses(host: str, port: int | None, resolve: bool) -> list[IPAddress]:
    try:
        found = [ipaddress.ip_address(host)]
    except ValueError:
        if not resolve:
            return []
        try:
            infos = socket.getaddrinfo(host, port or 80, proto=socket.IPPROTO_TCP)
        except OSError:
            return []  # unresolvable now; the job reports "unreachable" rather than refusing here
        found = [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]
    out: list[IPAddress] = []
    for ip in found:
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped  # ::ffff:169.254.169.254 is 169.254.169.254
        out.append(ip)
    return out


def check_base_url(url: str, *, field: str = "base_url", resolve: bool = True, allow_private: bool = False) -> str:
    """The URL, normalised, or Invalid naming `field`.

    http(s) only, no credentials, never a metadata, link-local, multicast or reserved address; private and
    loopback addresses only with `allow_private` (an admin's explicit trust in that endpoint).
    """
    if _refuse_all:
        raise Invalid("outbound calls are switched off on this server (PREFLAB_OUTBOUND_HOSTS=none)", field=field)
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https"):
        raise Invalid("must be an http:// or https:// URL", field=field)
    if not parts.hostname:
        raise Invalid("has no host", field=field)
    if parts.username or parts.password:
        raise Invalid("must not carry credentials; use api_key", field=field)
    try:
        port = parts.port
    except ValueError:
        raise Invalid("has an invalid port", field=field) from None
    host = parts.hostname.lower().rstrip(".")
    if host in BLOCKED_HOSTS:
        raise Invalid("points at a cloud metadata service", field=field)
    for ip in _addresses(host, port, resolve):
        reason = _refusal(ip, allow_private)
        if reason:
            raise Invalid(reason, field=field)
    return url.strip().rstrip("/")


def _refusal(ip: IPAddress, allow_private: bool) -> str | None:
    if ip in BLOCKED_ADDRESSES:
        return f"points at a cloud metadata service ({ip})"
    # ::1 sits inside IPv6's reserved ::/8, so loopback is let through to the private tier below.
    if ip.is_link_local or ip.is_multicast or ip.is_unspecified or (ip.is_reserved and not ip.is_loopback):
        return f"points at a link-local or reserved address ({ip})"
    if not ip.is_global and not allow_private:
        return (f"points at a private or loopback address ({ip}); an admin must mark the model endpoint "
                "as a trusted private host")
    return None


def address_guard(allow_private: bool) -> Callable[[str], None]:
    """The same rules, applied to each address at the moment a client connects (`make_generator`'s
    `address_check`): a host whose DNS answer changes after `check_base_url` (DNS rebinding) is still refused."""

    def check(address: str) -> None:
        if _refuse_all:
            raise ValueError("outbound calls are switched off on this server (PREFLAB_OUTBOUND_HOSTS=none)")
        ip = ipaddress.ip_address(address.split("%")[0])
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        reason = _refusal(ip, allow_private)
        if reason:
            raise ValueError(reason)

    return check
