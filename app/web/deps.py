"""Request dependencies: the transaction, the caller, and the CSRF guard, as `Annotated` aliases."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Annotated
from urllib.parse import quote, urlsplit

from fastapi import Depends, HTTPException, Path, Request
from sqlalchemy.orm import Session

from app.accounts import permissions, security, users
from app.models import User
from app.platform.crypto import Keyring
from app.platform.db import session_scope
from app.web.cookies import CSRF_FIELD, CSRF_HEADER, SESSION_COOKIE, browser_id

UNSAFE_METHODS = {"POST", "PUT", "PATCH", "DELETE"}

MAX_ID = 2**31 - 1
"""The largest id the database holds (a Postgres `integer`; SQLite's are wider). Ids in paths and bodies are
1..MAX_ID, so a larger one is a 422 naming the field, not a 404 or a database error."""

Id = Annotated[int, Path(ge=1, le=MAX_ID)]
"""An object id in a path: `def get_job(job_id: Id, ...)`."""


@dataclass(frozen=True)
class UserView:
    id: int
    email: str
    name: str
    role: str


def get_db(request: Request) -> Iterator[Session]:
    """The request's transaction: committed when the handler returns, rolled back on any exception."""
    with session_scope(request.app.state.session_factory) as session:
        yield session


# scope="function": commit before the response is sent, so a failed commit is never reported as success.
SessionDep = Annotated[Session, Depends(get_db, scope="function")]


class Turns:
    """At most `n` requests of one kind at a time in this process; the others wait for a turn in the event loop,
    holding no thread and no database connection."""

    def __init__(self, n: int) -> None:
        self.n = n
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary())

    def semaphore(self) -> asyncio.Semaphore:
        # One per event loop: a semaphore belongs to the loop it first waited in (a test client may run several).
        loop = asyncio.get_running_loop()
        sem = self._by_loop.get(loop)
        if sem is None:
            sem = self._by_loop[loop] = asyncio.Semaphore(self.n)
        return sem


FIGURE_VIEWS = Turns(1)
"""Views of the agreement figures (page and API) that one server process computes at once. Leads reloading the page
take turns, so however many there are they take at most one request's share of the process from the annotators;
a lead's view waits for the views ahead of it (docs/benchmarks.md: 1.6 s beside 32 annotators without pause)."""


async def figures_turn() -> AsyncIterator[None]:
    async with FIGURE_VIEWS.semaphore():
        yield


# Declared before the session and the caller: a view waiting for its turn holds no connection and runs no query.
FiguresTurn = Annotated[None, Depends(figures_turn, scope="function")]


def get_keyring(request: Request) -> Keyring:
    """The keys that encrypt model-endpoint API keys at rest (app/platform/crypto.py)."""
    return request.app.state.keyring


KeyringDep = Annotated[Keyring, Depends(get_keyring)]


class LoginRequired(Exception):
    """Raised for pages; the app turns it into a redirect to /login?next=…"""

    def __init__(self, next_url: str) -> None:
        self.next_url = next_url


def bearer_token(request: Request) -> str | None:
    """The API token the request sends (`Authorization: Bearer …`), if any."""
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def token_caller(request: Request, user: User | None) -> User:
    """The caller whose token a route looked up itself (with what else it needed, in one query); 401 for none."""
    if user is None:
        raise HTTPException(401, "invalid or revoked API token", headers={"WWW-Authenticate": "Bearer"})
    _remember(request, user, "token")
    return user


def optional_user(request: Request, db: SessionDep) -> User | None:
    token = bearer_token(request)
    if token is not None:
        return token_caller(request, users.user_for_token(db, token))
    user = users.user_for_session(db, request.cookies.get(SESSION_COOKIE))
    _remember(request, user, "session")
    return user


def _remember(request: Request, user: User | None, auth: str) -> None:
    request.state.auth = auth if user else None
    # Templates get a plain snapshot: error pages render after the session rolled back and closed.
    request.state.user = UserView(id=user.id, email=user.email, name=user.name, role=user.role) if user else None


def api_user(user: Annotated[User | None, Depends(optional_user)]) -> User:
    if user is None:
        raise HTTPException(401, "authentication required: log in or send `Authorization: Bearer <token>`",
                            headers={"WWW-Authenticate": "Bearer"})
    return user


def page_user(request: Request, user: Annotated[User | None, Depends(optional_user)]) -> User:
    if user is None:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        raise LoginRequired(quote(target, safe="/?=&"))
    return user


def _account_action(action: str, caller: Callable[..., User] = api_user):
    """403 unless the account's role allows `action` (app.accounts.permissions); the caller found as `caller` finds
    it (for pages, `page_user`: a visitor who is not logged in is sent to the login page first)."""
    def check(user: User = Depends(caller)) -> User:  # a default, not Annotated: `caller` is no module global
        permissions.require_account(user, action)
        return user

    check.account_action = action  # type: ignore[attr-defined]  # app.web.openapi documents its 403
    return check


async def csrf_guard(request: Request) -> None:
    """Every state-changing request from a browser must carry the CSRF token and, if sent, a same-site Origin.

    Requests authenticated by a Bearer token are exempt: browsers never attach those on their own. So are API
    requests with no session cookie either: they carry no credentials to abuse, and get 401 (pages keep the check,
    the login form included).
    """
    if request.method not in UNSAFE_METHODS or bearer_token(request) is not None:
        return
    if request.url.path.startswith("/api/") and SESSION_COOKIE not in request.cookies:
        return  # no credentials at all: nothing a forged request could ride on, and the route answers 401
    origin = request.headers.get("origin")
    if origin and origin != "null":
        expected = request.app.state.settings.public_origin or f"{request.url.scheme}://{request.url.netloc}"
        if urlsplit(origin).netloc != urlsplit(expected).netloc:
            raise HTTPException(403, "cross-site request refused (Origin does not match)")
    submitted = request.headers.get(CSRF_HEADER)
    if submitted is None and request.headers.get("content-type", "").startswith(
        ("application/x-www-form-urlencoded", "multipart/form-data")
    ):
        form = await request.form()
        value = form.get(CSRF_FIELD)
        submitted = value if isinstance(value, str) else None
    if not security.csrf_valid(request.app.state.secret, browser_id(request), submitted):
        raise HTTPException(403, "missing or invalid CSRF token; reload the page and try again")


CurrentUser = Annotated[User, Depends(api_user)]
OptionalUser = Annotated[User | None, Depends(optional_user)]
PageUser = Annotated[User, Depends(page_user)]
AdminUser = Annotated[User, Depends(_account_action("users.manage"))]
AdminPageUser = Annotated[User, Depends(_account_action("users.manage", page_user))]
EndpointAdmin = Annotated[User, Depends(_account_action("endpoints.manage"))]
EndpointAdminPage = Annotated[User, Depends(_account_action("endpoints.manage", page_user))]
ClusterAdmin = Annotated[User, Depends(_account_action("clusters.manage"))]
ClusterAdminPage = Annotated[User, Depends(_account_action("clusters.manage", page_user))]
