"""Pages: log in, log out, and the user's own account (password, API tokens)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import RedirectResponse, Response

from app.accounts import users
from app.platform import audit
from app.platform.errors import DomainError, Invalid, TooManyAttempts
from app.web.deps import Id, OptionalUser, PageUser, SessionDep
from app.web.forms import LoginForm, PasswordForm, TokenForm
from app.web.rendering import SESSION_COOKIE, client_ip, render, safe_next

router = APIRouter(include_in_schema=False)

GENERIC_LOGIN_ERROR = "Email or password is not right, or the account is disabled."


@router.get("/")
def home(user: OptionalUser) -> RedirectResponse:
    return RedirectResponse("/projects" if user else "/login", status_code=303)


@router.get("/login")
def login_page(request: Request, user: OptionalUser, next: str = "") -> Response:
    if user is not None:
        return RedirectResponse(safe_next(next), status_code=303)
    return render(request, "login.html", {"next": safe_next(next), "email": ""})


@router.post("/login")
def login(request: Request, db: SessionDep, form: Annotated[LoginForm, Form()]) -> Response:
    email, password, next = form.email, form.password, form.next
    throttle = request.app.state.login_throttle
    email_key, ip_key = f"acct:{email.strip().lower()}", f"ip:{client_ip(request)}"
    account = users.get_by_email(db, email) if email else None
    wait = max(throttle.retry_after(email_key, ip_key), users.account_retry_after(account))
    if wait > 0:
        exc = TooManyAttempts(f"Too many failed attempts. Try again in {int(wait) + 1} seconds.", wait)
        return render(request, "login.html", {"error": exc.message, "next": safe_next(next), "email": email},
                      status_code=429)
    user = users.authenticate(db, email, password)
    if user is None:
        throttle.failed(email_key, ip_key)
        audit.record(db, None, "login.failed", ip=client_ip(request), email=email.strip().lower()[:320])
        return render(request, "login.html", {"error": GENERIC_LOGIN_ERROR, "next": safe_next(next), "email": email},
                      status_code=401)
    throttle.succeeded(email_key)
    settings = request.app.state.settings
    old = request.cookies.get(SESSION_COOKIE)
    users.end_session(db, old)  # the id rotates at every login (no session fixation)
    token = users.start_session(db, user, hours=settings.session_hours, ip=client_ip(request),
                                user_agent=request.headers.get("user-agent", ""))
    audit.record(db, user, "login", ip=client_ip(request))
    response = RedirectResponse(safe_next(next), status_code=303)
    response.set_cookie(SESSION_COOKIE, token, max_age=settings.session_hours * 3600, httponly=True,
                        samesite="lax", secure=settings.cookies_secure, path="/")
    return response


@router.post("/logout")
def logout(request: Request, db: SessionDep) -> Response:
    users.end_session(db, request.cookies.get(SESSION_COOKIE))
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response


@router.get("/account")
def account(request: Request, db: SessionDep, user: PageUser) -> Response:
    return render(request, "account.html", {"tokens": users.list_tokens(db, user)})


@router.post("/account/password")
def change_password(request: Request, db: SessionDep, user: PageUser,
                    form: Annotated[PasswordForm, Form()]) -> Response:
    from app.accounts import security

    try:
        if not security.verify_password(user.password_hash, form.current_password):
            raise Invalid("not right", field="current_password")
        users.set_password(db, user, form.new_password, actor=user)
    except DomainError as exc:
        return render(request, "account.html", {"tokens": users.list_tokens(db, user), "error": form.error(exc)},
                      status_code=422)
    # Every session was revoked with the password change; log this browser in again.
    settings = request.app.state.settings
    token = users.start_session(db, user, hours=settings.session_hours, ip=client_ip(request))
    response = RedirectResponse("/account?changed=1", status_code=303)
    response.set_cookie(SESSION_COOKIE, token, max_age=settings.session_hours * 3600, httponly=True,
                        samesite="lax", secure=settings.cookies_secure, path="/")
    return response


@router.post("/account/tokens")
def create_token(request: Request, db: SessionDep, user: PageUser, form: Annotated[TokenForm, Form()]) -> Response:
    _, token = users.create_token(db, user, form.name)
    return render(request, "account.html", {"tokens": users.list_tokens(db, user), "new_token": token},
                  status_code=201)


@router.post("/account/tokens/{token_id}/revoke")
def revoke_token(token_id: Id, db: SessionDep, user: PageUser) -> Response:
    users.revoke_token(db, user, token_id)
    return RedirectResponse("/account", status_code=303)
