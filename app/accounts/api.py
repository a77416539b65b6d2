"""JSON API: the caller's own account, and user administration (admins only)."""

from __future__ import annotations

from fastapi import APIRouter

from app.accounts import users
from app.schemas import UserIn, UserOut, UserPatch
from app.web.deps import AdminUser, CurrentUser, Id, SessionDep

router = APIRouter(prefix="/api", tags=["users"])


@router.get("/me", summary="The authenticated user")
def me(user: CurrentUser) -> UserOut:
    return UserOut.from_model(user)


@router.get("/users", summary="All users (admin)")
def list_users(db: SessionDep, admin: AdminUser) -> list[UserOut]:
    return [UserOut.from_model(u) for u in users.list_users(db)]


@router.post("/users", status_code=201, summary="Create a user (admin)")
def create_user(body: UserIn, db: SessionDep, admin: AdminUser) -> UserOut:
    user = users.create_user(db, body.email, body.password, body.role, name=body.name, actor=admin)
    return UserOut.from_model(user)


@router.get("/users/{user_id}", summary="One user (admin)")
def get_user(user_id: Id, db: SessionDep, admin: AdminUser) -> UserOut:
    return UserOut.from_model(users.get_user(db, user_id))


@router.patch("/users/{user_id}", summary="Change a user's name, role or active flag (admin)")
def update_user(user_id: Id, body: UserPatch, db: SessionDep, admin: AdminUser) -> UserOut:
    user = users.update_user(db, users.get_user(db, user_id), actor=admin, name=body.name, role=body.role,
                             active=body.active)
    return UserOut.from_model(user)
