"""Pages: user and model-endpoint administration (admins only)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import RedirectResponse, Response

from app.deps import AdminPageUser, EndpointAdminPage, SessionDep
from app.errors import DomainError
from app.models import ROLES
from app.services import endpoints, users
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


# --- model endpoints --------------------------------------------------------------------------------------


def _endpoints_page(request: Request, db: SessionDep, error: DomainError | None = None, form: dict | None = None,
                    status_code: int = 200) -> Response:
    return render(request, "admin_endpoints.html", {"endpoints": endpoints.list_endpoints(db), "error": error,
                                                    "form": form or {}}, status_code=status_code)


@router.get("/admin/endpoints")
def endpoints_page(request: Request, db: SessionDep, admin: EndpointAdminPage) -> Response:
    return _endpoints_page(request, db)


@router.post("/admin/endpoints")
def create_endpoint(request: Request, db: SessionDep, admin: EndpointAdminPage,
                    name: Annotated[str, Form(max_length=100)], base_url: Annotated[str, Form(max_length=1000)],
                    model: Annotated[str, Form(max_length=300)], api_key: Annotated[str, Form(max_length=500)] = "",
                    allow_private: Annotated[str, Form()] = "") -> Response:
    try:
        with db.begin_nested():
            endpoints.create(db, admin, name=name, base_url=base_url, model=model, api_key=api_key or None,
                             allow_private=allow_private == "on")
    except DomainError as exc:
        form = {"name": name, "base_url": base_url, "model": model, "allow_private": allow_private == "on"}
        return _endpoints_page(request, db, exc, form, exc.status_code)  # the key is not echoed back
    return RedirectResponse("/admin/endpoints", status_code=303)


@router.post("/admin/endpoints/{endpoint_id}")
def update_endpoint(request: Request, endpoint_id: int, db: SessionDep, admin: EndpointAdminPage,
                    name: Annotated[str, Form(max_length=100)], base_url: Annotated[str, Form(max_length=1000)],
                    model: Annotated[str, Form(max_length=300)], api_key: Annotated[str, Form(max_length=500)] = "",
                    clear_api_key: Annotated[str, Form()] = "", allow_private: Annotated[str, Form()] = "") -> Response:
    endpoint = endpoints.get(db, endpoint_id)
    try:
        with db.begin_nested():
            endpoints.update(db, admin, endpoint, name=name, base_url=base_url, model=model, api_key=api_key or None,
                             clear_api_key=clear_api_key == "on", allow_private=allow_private == "on")
    except DomainError as exc:
        return _endpoints_page(request, db, exc, None, exc.status_code)
    return RedirectResponse("/admin/endpoints", status_code=303)


@router.post("/admin/endpoints/{endpoint_id}/delete")
def delete_endpoint(endpoint_id: int, db: SessionDep, admin: EndpointAdminPage) -> Response:
    endpoints.delete(db, admin, endpoints.get(db, endpoint_id))
    return RedirectResponse("/admin/endpoints", status_code=303)
