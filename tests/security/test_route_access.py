"""Check 2: every route, HTMX partials included, called anonymously and as each role → only allowed pairs succeed.

The routes come from walking the app's router, so a route added tomorrow without an entry in
`tests/security/routes.py::POLICY` fails `test_every_route_has_an_access_policy`.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.security.routes import POLICY, UNSAFE, a_params, all_routes, fill, outcome, policy_key
from tests.security.world import IDENTITIES


def test_every_route_has_an_access_policy(app: Any) -> None:
    keys = {policy_key(r) for r in all_routes(app)}
    assert not keys - set(POLICY), f"routes without an access policy in tests/security/routes.py: {sorted(keys - set(POLICY))}"
    assert not set(POLICY) - keys, f"policies for routes that no longer exist: {sorted(set(POLICY) - keys)}"


# Access rules are the same on both backends; the matrix runs once (on SQLite) to keep the suite fast.
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_only_allowed_roles_get_through_on_every_route(app: Any, client: Any, world: Any, reseed: Any) -> None:
    wrong: list[str] = []
    w = world
    dirty = False
    for route in all_routes(app):
        key = policy_key(route)
        policy = POLICY[key]
        for who in IDENTITIES:
            if route.method in UNSAFE and dirty:
                w = reseed()  # a fresh world after every accepted write, so one role's change never decides the next
                dirty = False
            url = fill(route.path, a_params(w) | policy.params(w))
            variants = [{}]
            if route.method == "GET" and not route.path.startswith(("/api", "/openapi", "/docs", "/healthz")):
                variants.append({"HX-Request": "true"})  # the HTMX partial of the same page
            for extra in variants:
                response = client.request(route.method, url, headers=w.headers(who) | extra, **policy.request(w))
                got = outcome(response)
                dirty = dirty or (route.method in UNSAFE and got == "ok")
                want = "ok" if who in policy.allowed else "refused"
                if got != want:
                    hx = " (HTMX)" if extra else ""
                    wrong.append(f"{route.method} {route.path}{hx} as {who}: {response.status_code} "
                                 f"{response.text[:120]!r}, expected {want}")
    assert not wrong, "\n".join(wrong)
