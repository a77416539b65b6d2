"""Accounts: creating users, checking passwords, browser sessions and personal API tokens."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from sqlalchemy import bindparam, select, update
from sqlalchemy.orm import Session, joinedload

from app.accounts import security
from app.models import ROLES, ApiToken, User, UserSession, utcnow
from app.platform import audit
from app.platform.db import core, get_or_missing
from app.platform.direct_sql import direct
from app.platform.errors import Conflict, Invalid, NotFound

EMAIL_RE = re.compile(r"^[^@\s]{1,64}@[^@\s]{1,255}\.[^@\s]{1,63}$|^[^@\s]{1,64}@localhost$")


def normalise_email(email: str) -> str:
    email = email.strip().lower()
    if not EMAIL_RE.match(email):
        raise Invalid("not a valid email address", field="email")
    return email


def create_user(db: Session, email: str, password: str, role: str, *, name: str = "",
                actor: User | None = None) -> User:
    email = normalise_email(email)
    if role not in ROLES:
        raise Invalid(f"role must be one of {', '.join(ROLES)}", field="role")
    problem = security.password_problem(password)
    if problem:
        raise Invalid(f"password {problem}", field="password")
    if db.scalar(select(User.id).where(User.email == email)) is not None:
        raise Conflict(f"a user with email {email} already exists", field="email")
    user = User(email=email, name=name.strip()[:200] or email.split("@")[0], role=role,
                password_hash=security.hash_password(password))
    db.add(user)
    db.flush()
    audit.record(db, actor, "user.create", object_type="user", object_id=user.id, role=role)
    return user


def get_user(db: Session, user_id: int) -> User:
    return get_or_missing(db, User, user_id, "no such user")


def get_by_email(db: Session, email: str) -> User | None:
    return db.scalar(select(User).where(User.email == email.strip().lower()))


def list_users(db: Session) -> list[User]:
    return list(db.scalars(select(User).order_by(User.email)))


def update_user(db: Session, user: User, *, actor: User, name: str | None = None, role: str | None = None,
                active: bool | None = None) -> User:
    if role is not None:
        if role not in ROLES:
            raise Invalid(f"role must be one of {', '.join(ROLES)}", field="role")
        if user.id == actor.id and role != user.role:
            raise Invalid("you cannot change your own role", field="role")
        user.role = role
    if active is not None:
        if user.id == actor.id and not active:
            raise Invalid("you cannot deactivate yourself", field="active")
        user.active = active
        if not active:
            revoke_all_sessions(db, user)
    if name is not None:
        user.name = name.strip()[:200]
    audit.record(db, actor, "user.update", object_type="user", object_id=user.id,
                 role=role, active=active)
    return user


def set_password(db: Session, user: User, password: str, *, actor: User | None = None) -> None:
    problem = security.password_problem(password)
    if problem:
        raise Invalid(f"password {problem}", field="password")
    user.password_hash = security.hash_password(password)
    user.password_changed_at = utcnow()
    revoke_all_sessions(db, user)  # a changed password logs every browser out
    audit.record(db, actor, "user.password", object_type="user", object_id=user.id)


def authenticate(db: Session, email: str, password: str) -> User | None:
    """The user when the password matches an active account; counts failures on the account."""
    user = get_by_email(db, email) if email else None
    ok = security.verify_password(user.password_hash if user else None, password)
    if user is None:
        return None
    if not ok or not user.active:
        user.failed_logins += 1
        user.last_failed_login_at = utcnow()
        return None
    user.failed_logins = 0
    if security._hasher.check_needs_rehash(user.password_hash):
        user.password_hash = security.hash_password(password)
    return user


def account_retry_after(user: User | None, max_failures: int = 5) -> float:
    """Seconds an account must wait after repeated failures (shared by all web processes via the DB)."""
    if user is None or user.failed_logins < max_failures or user.last_failed_login_at is None:
        return 0.0
    delay = min(900.0, 2.0 ** min(user.failed_logins - max_failures, 10))
    wait = (user.last_failed_login_at + timedelta(seconds=delay) - utcnow()).total_seconds()
    return max(0.0, wait)


# --- browser sessions -------------------------------------------------------------------------

def start_session(db: Session, user: User, *, hours: int, ip: str = "", user_agent: str = "") -> str:
    """A new session; returns the cookie value (random, shown once). Every login gets a fresh id."""
    token = security.new_token("s")
    db.add(UserSession(token_hash=security.token_hash(token), user_id=user.id, ip=ip[:64],
                       user_agent=user_agent[:300], expires_at=utcnow() + timedelta(hours=hours)))
    return token


def user_for_session(db: Session, token: str | None) -> User | None:
    if not token:
        return None
    # The user in the same query: every page view asks this first.
    row = db.scalar(select(UserSession).where(UserSession.token_hash == security.token_hash(token))
                    .options(joinedload(UserSession.user)))
    if row is None or row.revoked_at is not None or row.expires_at <= utcnow():
        return None
    user = row.user
    if not user.active or user.password_changed_at > row.created_at:
        return None
    return user


def end_session(db: Session, token: str | None) -> None:
    if token:
        db.execute(update(UserSession).where(UserSession.token_hash == security.token_hash(token))
                   .values(revoked_at=utcnow()))


def revoke_all_sessions(db: Session, user: User) -> None:
    db.execute(update(UserSession).where(UserSession.user_id == user.id, UserSession.revoked_at.is_(None))
               .values(revoked_at=utcnow()))


# --- API tokens -------------------------------------------------------------------------------

def create_token(db: Session, user: User, name: str = "") -> tuple[ApiToken, str]:
    """A personal API token; the plain value is returned once and only its hash is kept."""
    token = security.new_token("pfl")
    row = ApiToken(user_id=user.id, name=name.strip()[:100], prefix=token[:12],
                   token_hash=security.token_hash(token))
    db.add(row)
    db.flush()
    audit.record(db, user, "token.create", object_type="api_token", object_id=row.id)
    return row, token


class TokenRow(NamedTuple):
    """A token and its user as `accept_token` reads them (a query may fetch them beside what else it needs)."""

    id: int
    revoked_at: datetime | None
    last_used_at: datetime | None
    User: User


TOKEN_USER_JOIN = User.id == ApiToken.user_id
# The user in the same query, built once: every API request authenticates, so this is one round trip instead of two
# and no SQL expression to build per request.
_TOKEN_USER = (select(ApiToken.id, ApiToken.revoked_at, ApiToken.last_used_at, User).join(User, TOKEN_USER_JOIN)
               .where(ApiToken.token_hash == bindparam("token_hash")))
_TOUCH_TOKEN = direct(update(ApiToken).where(ApiToken.id == bindparam("token_id"))
                      .values(last_used_at=bindparam("now", type_=ApiToken.last_used_at.type))
                      .execution_options(synchronize_session=False))


def user_for_token(db: Session, token: str) -> User | None:
    return accept_token(db, db.execute(_TOKEN_USER, {"token_hash": security.token_hash(token)}).first())


def accept_token(db: Session, found: Any) -> User | None:
    """The token's user, from a `TokenRow`-shaped row (None: no such token), or None if it was revoked or the
    account deactivated; its last use is recorded."""
    if found is None:
        return None
    if found.revoked_at is not None or not found.User.active:
        return None
    now = utcnow()
    # Touch at most once a minute: a script hammering the API should not write on every call.
    if found.last_used_at is None or now - found.last_used_at > timedelta(minutes=1):
        core(db).execute(_TOUCH_TOKEN, {"token_id": found.id, "now": now})
    return found.User


def revoke_token(db: Session, user: User, token_id: int) -> None:
    row = db.get(ApiToken, token_id)
    if row is None or row.user_id != user.id:
        raise NotFound("no such token")
    row.revoked_at = utcnow()


def list_tokens(db: Session, user: User) -> list[ApiToken]:
    return list(db.scalars(select(ApiToken).where(ApiToken.user_id == user.id).order_by(ApiToken.id)))


