"""The web plumbing every page shares: templates, the browser id cookie behind CSRF, security headers, limits."""

from __future__ import annotations

import random
import secrets
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import nh3
from fastapi import Request
from fastapi.templating import Jinja2Templates
from markdown_it import MarkdownIt
from markupsafe import Markup
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.accounts import security
from app.platform.middleware import HttpMiddleware
from app.web.cookies import BROWSER_COOKIE, CSRF_FIELD, CSRF_HEADER, SESSION_COOKIE, browser_id

__all__ = ["BROWSER_COOKIE", "CSRF_FIELD", "CSRF_HEADER", "SESSION_COOKIE", "browser_id"]  # also importable here

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES_DIR = ROOT / "templates"
STATIC_DIR = Path(__file__).resolve().parents[1] / "static"


CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'"
)

_md = MarkdownIt("commonmark", {"html": False, "linkify": False}).enable("table")
_ALLOWED_TAGS = {"p", "br", "strong", "em", "code", "pre", "ul", "ol", "li", "blockquote", "h1", "h2", "h3",
                 "h4", "h5", "h6", "hr", "a", "table", "thead", "tbody", "tr", "th", "td", "del"}


def render_markdown(text: str | None) -> Markup:
    """Markdown → HTML through an allowlist sanitiser: raw HTML is off and only http(s)/mailto links survive."""
    html = _md.render(text or "")
    # `start` keeps a list that begins at "4." numbered from 4, as its author wrote it.
    clean = nh3.clean(html, tags=_ALLOWED_TAGS, attributes={"a": {"href", "title"}, "ol": {"start"}},
                      url_schemes={"http", "https", "mailto"}, link_rel="noopener noreferrer nofollow")
    return Markup(clean)  # noqa: S704 - sanitised above; the only Markup built from user text


def safe_next(target: str | None, default: str = "/projects") -> str:
    """A same-site path for `next=` redirects; anything that could leave the site becomes `default`."""
    if not target:
        return default
    from urllib.parse import unquote

    decoded = unquote(unquote(target))
    if not decoded.startswith("/") or decoded.startswith("//") or "\\" in decoded or any(
        ord(c) < 32 for c in decoded
    ):
        return default
    parts = urlsplit(decoded)
    if parts.scheme or parts.netloc:
        return default
    return target if target.startswith("/") and not target.startswith("//") else default


def csrf_token(request: Request) -> str:
    """The form token of this request's browser, computed once per request (a page with a form per row, such as the
    project's 200 members, asks once per row)."""
    token = getattr(request.state, "csrf", None)
    if token is None:  # the browser id is fixed for the request (BrowserIdAndHeadersMiddleware)
        token = request.state.csrf = security.csrf_token_for(request.app.state.secret, browser_id(request))
    return token


templates = Jinja2Templates(directory=str(TEMPLATES_DIR))
templates.env.autoescape = True  # all templates, whatever their extension
# Templates are code shipped with the app: read once per process, not stat'ed on every include (an include in a
# loop, e.g. a form per member row, checked the file's mtime each time: 11 % of the project page's CPU).
templates.env.auto_reload = False
templates.env.filters["markdown"] = render_markdown
templates.env.globals["csrf_token"] = csrf_token
templates.env.globals["CSRF_FIELD"] = CSRF_FIELD


def render_fragment(name: str, context: dict[str, Any]) -> Markup:
    """A template rendered on its own (autoescaped like every page), to be cached and placed in a page as is."""
    html = templates.env.get_template(name).render(context)
    return Markup(html)  # noqa: S704 - the autoescaped output of our own template, not user text


def prerendered(html: str) -> Markup:
    """A render_fragment result back from a cache (which keeps plain strings)."""
    return Markup(html)  # noqa: S704 - only ever render_fragment's output (see app.quality.routes)


def render(request: Request, name: str, context: dict[str, Any] | None = None, *, status_code: int = 200,
           block: str | None = None) -> Any:
    """Render a page, or only one named block of it for HTMX requests (one template serves both)."""
    ctx = {"request": request, "user": getattr(request.state, "user", None),
           "request_id": getattr(request.state, "request_id", None)}  # error pages ask to quote it
    ctx.update(context or {})
    if block is not None and request.headers.get("hx-request") == "true":
        template = templates.env.get_template(name)
        html = "".join(template.blocks[block](template.new_context(ctx)))
        from fastapi.responses import HTMLResponse

        return HTMLResponse(html, status_code=status_code)
    return templates.TemplateResponse(request, name, ctx, status_code=status_code)


class BrowserIdAndHeadersMiddleware(HttpMiddleware):
    """Gives every browser a random id cookie (the CSRF token is an HMAC of it) and adds security headers."""

    def __init__(self, app: ASGIApp, *, secure_cookies: bool, hsts: bool) -> None:
        super().__init__(app)
        self.secure = secure_cookies
        self.hsts = hsts

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope)
        existing = request.cookies.get(BROWSER_COOKIE)
        new_id = None if existing and 20 <= len(existing) <= 64 else secrets.token_urlsafe(24)
        scope.setdefault("state", {})
        scope["state"]["browser_id"] = new_id or existing

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                names = {k.lower() for k, _ in headers}
                extra = {
                    b"content-security-policy": CSP.encode(),
                    b"x-content-type-options": b"nosniff",
                    b"referrer-policy": b"same-origin",
                    b"x-frame-options": b"DENY",
                    b"cross-origin-opener-policy": b"same-origin",
                }
                if self.hsts:
                    extra[b"strict-transport-security"] = b"max-age=31536000; includeSubDomains"
                headers += [(k, v) for k, v in extra.items() if k not in names]
                if new_id:
                    cookie = f"{BROWSER_COOKIE}={new_id}; Path=/; HttpOnly; SameSite=Lax; Max-Age=31536000"
                    if self.secure:
                        cookie += "; Secure"
                    headers.append((b"set-cookie", cookie.encode()))
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, send_wrapper)


class BodyLimitMiddleware(HttpMiddleware):
    """Refuses request bodies over the limit with 413 before reading them into memory."""

    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        super().__init__(app)
        self.max_bytes = max_bytes

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._reject(send)
            return
        received = 0
        too_big = False
        replied = False

        async def limited_receive() -> Message:
            nonlocal received, too_big
            if too_big:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    # Stop reading: the app sees a disconnect (whatever it answers is replaced by the 413).
                    too_big = True
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal replied
            if too_big:
                if not replied:
                    replied = True
                    await self._reject(send)
                return
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception:
            if not too_big:
                raise
        if too_big and not replied:
            await self._reject(send)

    async def _reject(self, send: Send) -> None:
        limit_mb = self.max_bytes // (1024 * 1024)
        body = (b'{"detail":[{"field":"file","message":"the request is larger than the '
                + str(limit_mb).encode() + b' MiB limit (PREFLAB_MAX_UPLOAD_MB)"}]}')
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def client_ip(request: Request) -> str:
    if request.app.state.settings.trust_proxy_headers:
        forwarded = request.headers.get("x-forwarded-for", "")
        if forwarded:
            return forwarded.split(",")[-1].strip()[:64]  # the address our own proxy saw
    return request.client.host if request.client else ""


class ConnectionTurnover:
    """Ends about one keep-alive connection in `every` responses (`Connection: close`, chosen at random): its client
    reconnects (browsers do, unseen), and with `--workers` the kernel hands the new connection to any process
    (app.web.serving), so connections that all landed on one process drift apart again."""

    def __init__(self, app: ASGIApp, *, every: int) -> None:
        self.app = app
        self.every = every
        self._draw = random.Random().random

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self._draw() * self.every >= 1.0:
            await self.app(scope, receive, send)
            return
        await self.app(scope, receive, closing_connection(send))


def closing_connection(send: Send) -> Send:
    """`send` with `Connection: close` on the response: the server ends the keep-alive connection after it, and
    the client reconnects."""

    async def closing(message: Message) -> None:
        if message["type"] == "http.response.start":
            message["headers"] = [*message.get("headers", []), (b"connection", b"close")]
        await send(message)

    return closing
