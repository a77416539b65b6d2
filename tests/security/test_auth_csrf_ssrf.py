"""Checks 1, 3, 4, 11, 12, 13, 14.

Already covered elsewhere and not repeated here: production refuses a missing/placeholder/short secret and the
generated dev secret is 0600 (tests/app/test_settings.py); logout, password change and deactivation end sessions,
session ids rotate at login, the CSRF token and Origin on a form post, `next=` never leaves the site
(tests/app/test_auth.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from app.models import User
from app.platform import outbound
from app.platform.errors import Invalid
from tests.security.routes import POLICY, UNSAFE, a_params, all_routes, fill, policy_key
from tests.security.test_object_access import snapshot
from tests.security.world import PASSWORD, World

# --- 1 and 3 --------------------------------------------------------------------------------------


def test_a_fresh_database_has_no_accounts(engine: Any, clean_engine: Any) -> None:
    """Nothing seeds users outside `preflab demo`: a migrated, started app has no account to guess."""
    from sqlalchemy.orm import Session

    with Session(engine) as s:
        assert s.scalar(select(func.count(User.id))) == 0


def test_passwords_are_argon2id(db: Any, make_user: Any) -> None:
    from app.accounts import security

    user = make_user(db, "annotator")
    assert user.password_hash.startswith("$argon2id$")
    assert security.hash_password("x" * 12).startswith("$argon2id$")  # the production hasher too
    assert type(security._hasher).__name__ == "PasswordHasher"


# --- 4: throttling that X-Forwarded-For cannot reset ----------------------------------------------


def test_fifty_wrong_passwords_from_spoofed_addresses_are_throttled_per_account(app: Any, browser: Any,
                                                                                db: Any, make_user: Any) -> None:
    victim = make_user(db, "annotator", email="victim@example.org")
    db.commit()
    b = browser()
    statuses = []
    for i in range(50):
        response = b.post("/login", {"email": "victim@example.org", "password": f"guess-{i}-xxxx"},
                          headers={"X-Forwarded-For": f"203.0.113.{i}", "X-Real-IP": f"198.51.100.{i}"})
        statuses.append(response.status_code)
    assert statuses[:5] == [401] * 5
    assert statuses[5:].count(429) >= 40, statuses
    # The right password is refused too while the account is throttled, from yet another address.
    response = b.post("/login", {"email": "victim@example.org", "password": PASSWORD},
                      headers={"X-Forwarded-For": "192.0.2.77"})
    assert response.status_code == 429
    # The account counter lives in the database (shared by every web process), not only in this process.
    app.state.login_throttle.reset()
    fresh = browser()
    assert fresh.post("/login", {"email": "victim@example.org", "password": PASSWORD}).status_code == 429
    db.refresh(victim)
    assert victim.failed_logins >= 5


# --- 13: CSRF and Origin on every state-changing route --------------------------------------------


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_every_unsafe_route_refuses_a_cookie_without_csrf_or_from_a_foreign_origin(
        app: Any, browser: Any, world: World, clean_engine: Any) -> None:
    b = browser()
    b.login(world.emails["admin"])  # the strongest cookie: any refusal below is the CSRF guard's
    before = snapshot(clean_engine, world)
    wrong = []
    for route in all_routes(app):
        if route.method not in UNSAFE:
            continue
        policy = POLICY[policy_key(route)]
        url = fill(route.path, a_params(world) | policy.params(world))
        kwargs = policy.request(world)
        attempts = {
            "no token": {},
            "wrong token": {"X-CSRF-Token": "0" * 64},
            "another browser's token": {"X-CSRF-Token": _token_of_another_browser(app)},
            "foreign Origin": {"X-CSRF-Token": b.csrf, "Origin": "https://evil.example"},
            "foreign Origin, same host on another scheme": {"X-CSRF-Token": b.csrf, "Origin": "http://evil.testserver"},
        }
        for what, headers in attempts.items():
            response = b.client.request(route.method, url, headers=headers, **kwargs)
            if response.status_code != 403:
                wrong.append(f"{route.method} {route.path} ({what}): {response.status_code}")
    assert not wrong, "\n".join(wrong)
    assert snapshot(clean_engine, world) == before


def _token_of_another_browser(app: Any) -> str:
    from app.accounts import security

    return security.csrf_token_for(app.state.secret, "another-browser-id-0123456789")


# GETs that hand out work by design: leasing the next task is the read that starts a ranking (DESIGN: queue).
LEASING_GETS = {("GET", "/api/projects/{project_id}/tasks/next"), ("GET", "/projects/{project_id}/annotate")}


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_get_never_changes_state(app: Any, client: Any, world: World, clean_engine: Any,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from sqlalchemy.orm import Session

    from app.models import Project
    from app.quality import upkeep
    from tests.security.world import IDENTITIES

    # The kept agreement figures are brought up to date first: a view folds in waiting rankings (a cache of what
    # the rankings already say), which is not a GET changing state; nor is the recount a view makes once the last
    # drain is a minute old, which a slow machine's walk over every route would otherwise reach.
    monkeypatch.setattr(upkeep, "RECOUNT_S", float("inf"))
    with Session(clean_engine) as db:
        for project_id in (world.a.project_id, world.b.project_id):
            upkeep.drain(db, db.get(Project, project_id))
        db.commit()
    before = snapshot(clean_engine, world)
    for route in all_routes(app):
        if route.method != "GET" or policy_key(route) in LEASING_GETS:
            continue
        url = fill(route.path, a_params(world) | POLICY[policy_key(route)].params(world))
        for who in IDENTITIES:
            client.get(url, headers=world.headers(who))
    assert snapshot(clean_engine, world) == before


def test_behind_a_tls_proxy_public_origin_decides(tmp_path: Path) -> None:
    """PREFLAB_PUBLIC_ORIGIN: the proxy's https origin is accepted, the internal http one is not needed."""
    from fastapi.testclient import TestClient

    from app.main import create_app
    from app.platform.migrate import upgrade
    from app.platform.settings import Settings
    from tests.conftest import CSRF_RE, TEST_SECRET

    url = f"sqlite:///{tmp_path}/p.db"
    upgrade(url)
    app = create_app(Settings(env="dev", database_url=url, secret_key=TEST_SECRET, data_dir=tmp_path,
                              public_origin="https://preflab.example.org"))
    try:
        with TestClient(app, base_url="http://10.0.0.5:8000", follow_redirects=False) as c:
            token = CSRF_RE.search(c.get("/login").text).group(1)
            ok = c.post("/login", data={"csrf_token": token, "email": "a@example.org", "password": "x" * 12},
                        headers={"Origin": "https://preflab.example.org"})
            assert ok.status_code == 401  # past the CSRF guard; the credentials are simply wrong
            bad = c.post("/login", data={"csrf_token": token, "email": "a@example.org", "password": "x" * 12},
                         headers={"Origin": "http://10.0.0.5:8000.evil.example"})
            assert bad.status_code == 403
    finally:
        app.state.engine.dispose()


# --- 11: server-side requests ---------------------------------------------------------------------


@pytest.mark.parametrize("url", [
    "http://169.254.169.254/latest/meta-data/", "http://169.254.169.254:80/v1", "http://[fe80::1]/v1",
    "http://[::ffff:169.254.169.254]/v1", "http://[::ffff:a9fe:a9fe]/v1", "file:///etc/passwd", "gopher://x/",
    "ftp://example.org/", "http://metadata.google.internal/computeMetadata/v1/", "http://metadata/",
    "http://0.0.0.0:8000/v1", "http://user:pw@example.org/v1", "http://224.0.0.1/", "javascript:alert(1)",
    "http://2852039166/", "http://0xa9fea9fe/",
])
def test_base_urls_aimed_inward_are_refused(url: str) -> None:
    with pytest.raises(Invalid) as err:
        outbound.check_base_url(url)
    assert err.value.field == "base_url"


def test_sampling_and_judge_requests_refuse_metadata_urls_before_any_job(client: Any, world: World,
                                                                         clean_engine: Any) -> None:
    before = snapshot(clean_engine, world)
    gen = {"backend": "openai", "base_url": "http://169.254.169.254/v1", "model": "m"}
    for path, body in ((f"/api/projects/{world.a.project_id}/sampling-jobs", {"generator": gen}),
                       (f"/api/projects/{world.a.project_id}/judge-runs", {"generator": gen})):
        response = client.post(path, json=body, headers=world.headers("lead"))
        assert response.status_code == 422 and "base_url" in response.text, response.text
    assert snapshot(clean_engine, world) == before


def test_the_openai_client_does_not_follow_redirects_and_does_not_echo_bodies() -> None:
    import httpx

    from training.generation import OpenAIGenerator

    gen = OpenAIGenerator(base_url="http://127.0.0.1:9/v1", model="m")
    client = gen._http() if hasattr(gen, "_http") else None
    if client is None:
        client = next(v for k in dir(gen) for v in [getattr(gen, k, None)] if isinstance(v, httpx.Client)) \
            if any(isinstance(getattr(gen, k, None), httpx.Client) for k in dir(gen)) else None
    assert client is None or client.follow_redirects is False
    assert httpx.Client().follow_redirects is False  # httpx's default, which the generator keeps


# --- 12: no pickle ---------------------------------------------------------------------------------


def test_no_code_unpickles() -> None:
    import re

    root = Path(__file__).resolve().parents[2]
    offenders = []
    for path in [*root.joinpath("app").rglob("*.py"), *root.joinpath("training").rglob("*.py")]:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if re.search(r"\bpickle\b|\bdill\b|\bjoblib\.load|\bnp\.load\(.*allow_pickle=True", code) or (
                    "torch.load(" in code and "weights_only=True" not in code):
                offenders.append(f"{path.relative_to(root)}:{n}: {line.strip()}")
    assert offenders == []
