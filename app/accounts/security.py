"""Passwords (argon2id), random tokens stored as sha256, CSRF tokens bound to the browser, login throttling."""

from __future__ import annotations

import functools
import hashlib
import hmac
import secrets
import threading
import time
from collections import defaultdict, deque

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

_hasher = PasswordHasher()  # argon2id with the library's current recommended parameters


@functools.cache
def _dummy_hash() -> str:
    """A valid hash of a random password, checked when the account does not exist, so a login for an unknown
    email costs the same time as one for a known email (no user enumeration by timing). Made on first use:
    argon2 is memory-hard, and paying for it at import slowed every process start (CLI, worker, server)."""
    return _hasher.hash(secrets.token_urlsafe(16))

MIN_PASSWORD_LENGTH = 10


def hash_password(password: str) -> str:
    return _hasher.hash(password)


def verify_password(password_hash: str | None, password: str) -> bool:
    try:
        return _hasher.verify(password_hash or _dummy_hash(), password) and password_hash is not None
    except (VerificationError, InvalidHashError):
        return False


def password_problem(password: str) -> str | None:
    """Why a new password is refused, or None."""
    if len(password) < MIN_PASSWORD_LENGTH:
        return f"must be at least {MIN_PASSWORD_LENGTH} characters"
    if len(password) > 1024:
        return "must be at most 1024 characters"
    return None


def new_token(prefix: str) -> str:
    return f"{prefix}_{secrets.token_urlsafe(32)}"


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def csrf_token_for(secret: str, browser_id: str) -> str:
    """The CSRF token for one browser: an HMAC of its random cookie id, so it can't be forged without the key."""
    return hmac.new(secret.encode(), f"csrf:{browser_id}".encode(), hashlib.sha256).hexdigest()


def csrf_valid(secret: str, browser_id: str | None, submitted: str | None) -> bool:
    if not browser_id or not submitted:
        return False
    return hmac.compare_digest(csrf_token_for(secret, browser_id), submitted)


class LoginThrottle:
    """Failed logins per account and per client address in a sliding window; in-process.

    The account counter also lives in the database (User.failed_logins), so several web
    processes together still slow an attack on one account; this adds the per-client limit.
    """

    def __init__(self, max_failures: int = 5, window_s: float = 900.0) -> None:
        self.max_failures = max_failures
        self.window_s = window_s
        self._events: dict[str, deque[float]] = defaultdict(deque)
        self._lock = threading.Lock()

    def _prune(self, key: str, now: float) -> deque[float]:
        events = self._events[key]
        while events and now - events[0] > self.window_s:
            events.popleft()
        return events

    def retry_after(self, *keys: str) -> float:
        """Seconds to wait before another attempt is allowed (0 when allowed)."""
        now = time.monotonic()
        wait = 0.0
        with self._lock:
            for key in keys:
                events = self._prune(key, now)
                if len(events) >= self.max_failures:
                    # Backoff doubles with every failure past the limit, capped at the window.
                    extra = len(events) - self.max_failures
                    delay = min(self.window_s, 2.0 ** min(extra, 10))
                    wait = max(wait, events[-1] + delay - now)
        return max(0.0, wait)

    def failed(self, *keys: str) -> None:
        now = time.monotonic()
        with self._lock:
            for key in keys:
                self._prune(key, now).append(now)

    def succeeded(self, *keys: str) -> None:
        with self._lock:
            for key in keys:
                self._events.pop(key, None)

    def reset(self) -> None:
        with self._lock:
            self._events.clear()
