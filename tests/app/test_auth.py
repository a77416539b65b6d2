"""Logging in and out, CSRF, sessions that die with logout/password change/deactivation, tokens, throttling."""

from __future__ import annotations

from sqlalchemy import select

from app.models import User, UserSession
from tests.conftest import PASSWORD


def test_login_sets_a_hardened_session_cookie_and_logout_kills_it(db, make_user, browser) -> None:
    user = make_user(db, "lead")
    db.commit()
    b = browser()
    b.get("/login")
    response = b.post("/login", {"email": user.email.upper(), "password": PASSWORD, "next": "/account"})
    assert response.status_code == 303 and response.headers["location"] == "/account"
    cookie = next(c for c in response.headers.get_list("set-cookie") if c.startswith("preflab_session="))
    assert "HttpOnly" in cookie and "SameSite=lax" in cookie.replace("Lax", "lax")
    stolen = b.client.cookies.get("preflab_session")
    assert b.get("/account").status_code == 200

    assert b.post("/logout").status_code == 303
    assert b.get("/account").status_code == 303  # back to the login page
    b.client.cookies.set("preflab_session", stolen)
    assert b.get("/account").status_code == 303  # the old cookie is dead on the server


def test_wrong_password_and_unknown_email_get_the_same_generic_message(db, make_user, browser) -> None:
    user = make_user(db, "annotator")
    db.commit()
    b = browser()
    wrong = b.post("/login", {"email": user.email, "password": "not the password"})
    unknown = b.post("/login", {"email": "nobody@example.org", "password": "not the password"})
    assert wrong.status_code == unknown.status_code == 401
    assert "Email or password is not right" in wrong.text and "Email or password is not right" in unknown.text


def test_session_id_rotates_at_login(db, make_user, browser) -> None:
    user = make_user(db, "annotator")
    db.commit()
    b = browser()
    b.login(user.email)
    first = b.client.cookies.get("preflab_session")
    b.login(user.email)
    assert b.client.cookies.get("preflab_session") != first
    db.expire_all()
    rows = db.scalars(select(UserSession).where(UserSession.user_id == user.id)).all()
    assert sum(r.revoked_at is None for r in rows) == 1


def test_form_post_without_or_with_wrong_csrf_token_is_refused(db, make_user, browser) -> None:
    lead = make_user(db, "lead")
    db.commit()
    b = browser()
    b.login(lead.email)
    form = {"name": "p", "completions_per_prompt": "4", "overlap": "1", "rubric": "r"}
    assert b.post("/projects", form, csrf=False).status_code == 403
    assert b.post("/projects", form | {"csrf_token": "0" * 64}, csrf=False).status_code == 403
    # The login form is protected too (login CSRF).
    assert b.post("/login", {"email": lead.email, "password": PASSWORD}, csrf=False).status_code == 403
    assert b.post("/projects", form).status_code == 303


def test_foreign_origin_is_refused_even_with_a_valid_token(db, make_user, browser) -> None:
    lead = make_user(db, "lead")
    db.commit()
    b = browser()
    b.login(lead.email)
    response = b.post("/projects", {"name": "p", "completions_per_prompt": "4", "overlap": "1", "rubric": "r"},
                      headers={"Origin": "https://evil.example"})
    assert response.status_code == 403


def test_json_api_with_session_cookie_needs_the_csrf_header(db, make_user, browser) -> None:
    lead = make_user(db, "lead")
    db.commit()
    b = browser()
    b.login(lead.email)
    body = {"name": "p", "completions_per_prompt": 3, "overlap": 1, "rubric": {"text": "t", "criteria": []}}
    assert b.client.post("/api/projects", json=body).status_code == 403
    assert b.client.post("/api/projects", json=body, headers={"X-CSRF-Token": b.csrf}).status_code == 201


def test_password_change_and_deactivation_end_existing_sessions(db, make_user, browser) -> None:
    admin = make_user(db, "admin")
    user = make_user(db, "annotator")
    db.commit()
    other_browser = browser()
    other_browser.login(user.email)
    b = browser()
    b.login(user.email)
    r = b.post("/account/password", {"current_password": PASSWORD, "new_password": "a brand new password"})
    assert r.status_code == 303
    assert b.get("/account").status_code == 200  # this browser was logged in again
    assert other_browser.get("/account").status_code == 303  # the other one is out

    admin_b = browser()
    admin_b.login(admin.email)
    assert admin_b.post(f"/admin/users/{user.id}", {"role": "annotator"}).status_code == 303  # active unchecked
    assert b.get("/account").status_code == 303
    assert b.post("/login", {"email": user.email, "password": "a brand new password"}).status_code == 401


def test_api_token_authenticates_and_revoked_or_bogus_tokens_do_not(db, make_user, token_for, api) -> None:
    user = make_user(db, "engineer")
    token = token_for(db, user)
    db.commit()
    assert api(token).get("/api/me").json()["email"] == user.email
    assert api("pfl_bogus").get("/api/me").status_code == 401
    assert api(None).get("/api/me").status_code == 401
    from app.accounts import users
    from app.models import ApiToken

    row = db.scalar(select(ApiToken).where(ApiToken.user_id == user.id))
    users.revoke_token(db, user, row.id)
    db.commit()
    assert api(token).get("/api/me").status_code == 401


def test_tokens_and_passwords_are_stored_hashed(db, make_user, token_for) -> None:
    user = make_user(db, "engineer")
    token = token_for(db, user)
    db.commit()
    stored = db.scalar(select(User).where(User.id == user.id))
    assert stored.password_hash.startswith("$argon2id$") and PASSWORD not in stored.password_hash
    from app.models import ApiToken

    row = db.scalar(select(ApiToken).where(ApiToken.user_id == user.id))
    assert token not in (row.token_hash, row.prefix) and len(row.token_hash) == 64


def test_repeated_failures_are_throttled_even_with_the_right_password(db, make_user, browser) -> None:
    user = make_user(db, "annotator")
    db.commit()
    b = browser()
    for _ in range(5):
        assert b.post("/login", {"email": user.email, "password": "wrong password"}).status_code == 401
    blocked = b.post("/login", {"email": user.email, "password": PASSWORD})
    assert blocked.status_code == 429 and "Too many failed attempts" in blocked.text
    # A spoofed X-Forwarded-For does not reset the throttle (proxy headers are not trusted by default).
    spoofed = b.post("/login", {"email": user.email, "password": PASSWORD}, headers={"X-Forwarded-For": "1.2.3.4"})
    assert spoofed.status_code == 429


def test_next_parameter_never_leaves_the_site(db, make_user, browser) -> None:
    user = make_user(db, "annotator")
    db.commit()
    for target in ["//evil.com", "/\\evil.com", "https:evil.com", "%2f%2fevil.com", "https://evil.com/x"]:
        b = browser()
        b.get("/login")
        r = b.post("/login", {"email": user.email, "password": PASSWORD, "next": target})
        assert r.status_code == 303 and r.headers["location"] == "/projects", target


def test_admin_only_routes(db, make_user, token_for, api) -> None:
    admin, lead = make_user(db, "admin"), make_user(db, "lead")
    admin_token, lead_token = token_for(db, admin), token_for(db, lead)
    db.commit()
    assert api(lead_token).get("/api/users").status_code == 403
    assert api(lead_token).post("/api/users", json={"email": "x@example.org", "password": "p" * 12,
                                                    "role": "admin"}).status_code == 403
    assert api(admin_token).get("/api/users").status_code == 200
    created = api(admin_token).post("/api/users", json={"email": "New@Example.org", "password": "p" * 12,
                                                        "role": "annotator"})
    assert created.status_code == 201 and created.json()["email"] == "new@example.org"
    assert api(admin_token).get("/api/users/99999").status_code == 404


def test_user_input_errors_name_the_field(db, make_user, token_for, api) -> None:
    admin = make_user(db, "admin")
    token = token_for(db, admin)
    db.commit()
    client = api(token)
    r = client.post("/api/users", json={"email": "x@example.org", "password": "short", "role": "annotator"})
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "password"
    r = client.post("/api/users", json={"email": "x@example.org", "password": "p" * 12, "role": "god"})
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "role"
    r = client.post("/api/users", json={"email": "not-an-email", "password": "p" * 12, "role": "lead"})
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "email"
    # Mass assignment: unknown fields are refused, not ignored.
    r = client.patch(f"/api/users/{admin.id}", json={"password_hash": "x"})
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "password_hash"


def test_cli_user_add_and_token_create(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from typer.testing import CliRunner

    from app.cli import cli

    monkeypatch.setenv("PREFLAB_DATABASE_URL", f"sqlite:///{tmp_path}/cli.db")
    monkeypatch.setenv("PREFLAB_DATA_DIR", str(tmp_path))
    runner = CliRunner()
    assert runner.invoke(cli, ["migrate"]).exit_code == 0
    added = runner.invoke(cli, ["user", "add", "eng@example.org", "--role", "engineer", "--password-stdin"],
                          input="a long enough password\n")
    assert added.exit_code == 0, added.output
    bad = runner.invoke(cli, ["user", "add", "x@example.org", "--role", "wizard", "--password-stdin"],
                        input="a long enough password\n")
    assert bad.exit_code == 1 and "role" in bad.output
    token = runner.invoke(cli, ["token", "create", "eng@example.org"])
    assert token.exit_code == 0 and token.output.strip().startswith("pfl_")
