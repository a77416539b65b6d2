"""What a browser carries for preflab: the cookie, header and form-field names, and the browser id read from them.

Below both the web plumbing (app/web/rendering.py) and the request dependencies (app/web/deps.py), which share these
names.
"""

from __future__ import annotations

from starlette.requests import Request

BROWSER_COOKIE = "preflab_bid"
"""A random id per browser, set by the web middleware; CSRF tokens are bound to it."""
SESSION_COOKIE = "preflab_session"
CSRF_HEADER = "x-csrf-token"
CSRF_FIELD = "csrf_token"


def browser_id(request: Request) -> str:
    """This browser's id: the one the middleware set on this request (a first visit), else its cookie."""
    return getattr(request.state, "browser_id", "") or request.cookies.get(BROWSER_COOKIE, "")
