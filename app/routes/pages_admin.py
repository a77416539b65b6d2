"""Pages: user administration (admins only)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import RedirectResponse, Response

from app.deps import AdminPageUser, SessionDep
from app.errors import DomainError
from app.models import ROLES
from app.services import users
from app.web import render

router = APIRouter(include_in_schema=False)


@router.get("/admin/users")
def users_page(request: Request, db: SessionDep, admin: AdminPageUser) -> Response:
    return render(request, "admin_users.html", {"users": users.list_users(db), "roles": ROLES, "form": {}})


@router.post("/admin/users")
def create_user(request: Request, db: SessionDep, admin: AdminPageUser,
                email: Annotated[str, Form(max_length=320)], password: Annotated[str, Form(max_length=1024)],
                role: Annotated[str, Form(max_length=20)], name: Annotated[str, Form(max_length=200)] = "") -> Response:
    try:
        with db.begin_nested():
            users.create_user(db, email, password, role, name=name, actor=admin)
    except DomainError as exc:
        return render(request, "admin_users.html",
                      {"users": users.list_users(db), "roles": ROLES, "error": exc,
                       "form": {"email": email, "role": role, "name": name}}, status_code=exc.status_code)
    return RedirectResponse("/admin/users", status_code=303)


@router.post("/admin/users/{user_id}")
def update_user(request: Request, user_id: int, db: SessionDep, admin: AdminPageUser,
                role: Annotated[str, Form(max_length=20)], active: Annotated[str, Form()] = "") -> Response:
    target = users.get_user(db, user_id)
    try:
        with db.begin_nested():
            users.update_user(db, target, actor=admin, role=role, active=active == "on")
    except DomainError as exc:
        return render(request, "admin_users.html",
                      {"users": users.list_users(db), "roles": ROLES, "error": exc, "form": {}},
                      status_code=exc.status_code)
    return RedirectResponse("/admin/users", status_code=303)
