"""Pages: user and model-endpoint administration (admins only)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import RedirectResponse, Response

from app.accounts import users
from app.judge import endpoints
from app.platform.crypto import Keyring
from app.web.deps import AdminPageUser, EndpointAdminPage, Id, KeyringDep, SessionDep
from app.web.form_pages import FormPage
from app.web.forms import EndpointForm, EndpointUpdateForm, UserForm, UserUpdateForm

router = APIRouter(include_in_schema=False)


def _users(db: SessionDep) -> dict:
    return {"users": users.list_users(db), "roles": users.ROLES, "form": {}}


USERS_PAGE = FormPage("admin_users.html", _users, redirect="/admin/users")


@router.get("/admin/users")
def users_page(request: Request, db: SessionDep, admin: AdminPageUser) -> Response:
    return USERS_PAGE.show(request, db)


@router.post("/admin/users")
def create_user(request: Request, db: SessionDep, admin: AdminPageUser, form: Annotated[UserForm, Form()]) -> Response:
    return USERS_PAGE.submit(request, db, form,  # the password is not echoed back (UserForm.SECRET)
                             lambda body: users.create_user(db, body.email, body.password, body.role,
                                                            name=body.name, actor=admin))


@router.post("/admin/users/{user_id}")
def update_user(request: Request, user_id: Id, db: SessionDep, admin: AdminPageUser,
                form: Annotated[UserUpdateForm, Form()]) -> Response:
    target = users.get_user(db, user_id)
    return USERS_PAGE.submit(request, db, form,
                             lambda body: users.update_user(db, target, actor=admin, role=body.role,
                                                            active=body.active))


# --- model endpoints --------------------------------------------------------------------------------------


def _endpoints_page(keyring: Keyring) -> FormPage:
    """The page, with each endpoint's key status (stored, unreadable, none) for the request's keyring."""

    def context(db: SessionDep) -> dict:
        items = endpoints.list_endpoints(db)
        return {"endpoints": items, "key_status": {e.id: endpoints.key_status(e, keyring) for e in items},
                "form": {}}

    return FormPage("admin_endpoints.html", context, redirect="/admin/endpoints")


@router.get("/admin/endpoints")
def endpoints_page(request: Request, db: SessionDep, admin: EndpointAdminPage, keyring: KeyringDep) -> Response:
    return _endpoints_page(keyring).show(request, db)


@router.post("/admin/endpoints")
def create_endpoint(request: Request, db: SessionDep, admin: EndpointAdminPage, keyring: KeyringDep,
                    form: Annotated[EndpointForm, Form()]) -> Response:
    return _endpoints_page(keyring).submit(request, db, form,  # the key is not echoed back (EndpointForm.SECRET)
                                           lambda body: endpoints.create(db, admin, keyring, name=body.name,
                                                                         base_url=body.base_url, model=body.model,
                                                                         api_key=body.api_key,
                                                                         allow_private=body.allow_private))


@router.post("/admin/endpoints/{endpoint_id}")
def update_endpoint(request: Request, endpoint_id: Id, db: SessionDep, admin: EndpointAdminPage,
                    keyring: KeyringDep, form: Annotated[EndpointUpdateForm, Form()]) -> Response:
    endpoint = endpoints.get(db, endpoint_id)
    return _endpoints_page(keyring).submit(
        request, db, form, lambda body: endpoints.update(db, admin, keyring, endpoint, name=body.name,
                                                         base_url=body.base_url, model=body.model,
                                                         api_key=body.api_key, clear_api_key=body.clear_api_key,
                                                         allow_private=body.allow_private))


@router.post("/admin/endpoints/{endpoint_id}/delete")
def delete_endpoint(endpoint_id: Id, db: SessionDep, admin: EndpointAdminPage) -> Response:
    endpoints.delete(db, admin, endpoints.get(db, endpoint_id))
    return RedirectResponse("/admin/endpoints", status_code=303)
