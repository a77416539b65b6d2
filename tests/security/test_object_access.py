"""Checks 5, 6, 7: object-level access, mass assignment, and internal field names in filters.

5. A lead of project A uses project B's ids on every `{id}` route (GET/POST/PUT/PATCH/DELETE): 404, nothing changes.
6. Every JSON request model forbids unknown fields, so role, is_admin, project or ids cannot ride along.
7. Filter parameters naming internal fields (`password_hash`, relationships) are refused; filters are allowlisted.
"""

from __future__ import annotations

import hashlib
import inspect
import typing
from typing import Any

import pydantic
from sqlalchemy import text

from app.models import Base
from tests.security.routes import POLICY, Policy, all_routes, fill, policy_key
from tests.security.world import World

NESTED_IDS = ("prompt_id", "revision_id", "user_id")


def snapshot(engine: Any, world: World) -> str:
    """A digest of every row of every table (API tokens by id and revocation: their last-use time may move)."""
    digest = hashlib.sha256()
    with engine.connect() as conn:
        for table in Base.metadata.sorted_tables:
            if table.name == "api_tokens":
                rows = conn.execute(text("SELECT id, revoked_at FROM api_tokens ORDER BY id")).all()
            else:
                order = ", ".join(c.name for c in table.primary_key.columns) or "1"
                rows = conn.execute(text(f"SELECT * FROM {table.name} ORDER BY {order}")).all()
            digest.update(f"{table.name}:{rows!r}".encode())
    return digest.hexdigest()


def _cross_project_calls(app: Any, w: World) -> list[tuple[str, str, str, Policy]]:
    """(method, url, what, policy) for every object-scoped route: all of B's ids, then A's project with B's ids."""
    calls = []
    for route in all_routes(app):
        policy = POLICY[policy_key(route)]
        if not policy.object_scoped or "{" not in route.path:
            continue
        b = w.b.params() | {"user_id": w.user_ids["outsider"], "token_id": w.outsider_token_id}
        b |= {k: v for k, v in policy.params(w).items() if k != "run_id"}
        if "run_id" in policy.params(w):
            b["run_id"] = w.b.running_run_id
        calls.append((route.method, fill(route.path, b), "B's ids", policy))
        if "{project_id}" in route.path and any("{" + k + "}" in route.path for k in NESTED_IDS):
            mixed = b | {"project_id": w.a.project_id}
            calls.append((route.method, fill(route.path, mixed), "A's project, B's object", policy))
    return calls


def test_bs_ids_used_by_as_lead_are_404_and_change_nothing(app: Any, client: Any, world: World,
                                                            clean_engine: Any) -> None:
    before = snapshot(clean_engine, world)
    wrong = []
    for method, url, what, policy in _cross_project_calls(app, world):
        response = client.request(method, url, headers=world.headers("lead"), **policy.request(world))
        if response.status_code != 404:
            wrong.append(f"{method} {url} ({what}): {response.status_code} {response.text[:150]!r}")
    assert not wrong, "cross-project ids not refused with 404:\n" + "\n".join(wrong)
    assert snapshot(clean_engine, world) == before, "a refused cross-project request changed the database"
    from app.models import Export

    session = app.state.session_factory()
    try:
        export_b = session.get(Export, world.b.export_id)
        assert export_b is not None and export_b.deleted_at is None
        from pathlib import Path

        assert (Path(export_b.path) / "pairs.jsonl").is_file(), "B's export files were touched"
    finally:
        session.close()


# --- 6: mass assignment ------------------------------------------------------------------------


def _models_in(annotation: Any) -> list[type[pydantic.BaseModel]]:
    found: list[type[pydantic.BaseModel]] = []
    if inspect.isclass(annotation) and issubclass(annotation, pydantic.BaseModel):
        found.append(annotation)
        for f in annotation.model_fields.values():
            found += _models_in(f.annotation)
    for arg in typing.get_args(annotation):
        found += _models_in(arg)
    return found


def _request_models(app: Any) -> dict[str, type[pydantic.BaseModel]]:
    models: dict[str, type[pydantic.BaseModel]] = {}
    for route in all_routes(app):
        if route.endpoint is None:
            continue
        hints = typing.get_type_hints(route.endpoint, include_extras=True)
        hints.pop("return", None)
        for hint in hints.values():
            base = typing.get_args(hint)[0] if typing.get_origin(hint) is typing.Annotated else hint
            for model in _models_in(base):
                models[f"{model.__module__}.{model.__qualname__}"] = model
    return models


def test_every_request_body_model_forbids_unknown_fields(app: Any) -> None:
    models = _request_models(app)
    assert len(models) >= 10, f"found too few request models to trust the walk: {sorted(models)}"
    lax = sorted(name for name, m in models.items() if m.model_config.get("extra") != "forbid")
    assert not lax, f"request models that silently accept unknown fields (mass assignment): {lax}"


def test_every_input_model_in_schemas_forbids_unknown_fields() -> None:
    from app import schemas

    inputs = [obj for name, obj in vars(schemas).items()
              if inspect.isclass(obj) and issubclass(obj, pydantic.BaseModel) and name.endswith(("In", "Patch"))]
    assert inputs
    assert [m.__name__ for m in inputs if m.model_config.get("extra") != "forbid"] == []


def test_users_cannot_assign_roles_projects_or_ids(client: Any, world: World, clean_engine: Any) -> None:
    before = snapshot(clean_engine, world)
    me = world.user_ids["annotator"]
    h = world.headers
    # A non-admin changing themselves or anyone: refused by role, whatever the body.
    for body in ({"role": "admin"}, {"is_admin": True}, {"active": True}):
        assert client.patch(f"/api/users/{me}", json=body, headers=h("annotator")).status_code == 403
    # Even an admin's request cannot carry fields the model does not name.
    for body in ({"is_admin": True}, {"password_hash": "x"}, {"project_id": world.b.project_id}, {"id": 1},
                 {"email": "evil@example.org"}):
        response = client.patch(f"/api/users/{world.user_ids['victim']}", json=body, headers=h("admin"))
        assert response.status_code == 422, (body, response.text)
        assert next(iter(body)) in response.text
    # An admin may not change their own role through the API either.
    response = client.patch(f"/api/users/{world.user_ids['admin']}", json={"role": "lead"}, headers=h("admin"))
    assert response.status_code == 422 and "role" in response.text
    # Project creation and exports do not accept owner, id or path fields.
    response = client.post("/api/projects", headers=h("lead"), json={
        "name": "X", "completions_per_prompt": 2, "rubric": {"text": "r"}, "created_by_id": world.user_ids["admin"]})
    assert response.status_code == 422 and "created_by_id" in response.text
    response = client.post(f"/api/projects/{world.a.project_id}/exports", headers=h("lead"),
                           json={"format": "jsonl", "path": "/etc", "project_id": world.b.project_id})
    assert response.status_code == 422, response.text
    assert snapshot(clean_engine, world) == before


# --- 7: filters and sort keys ------------------------------------------------------------------


SORT_LIKE = {"sort", "order", "order_by", "sort_by", "orderby", "fields", "include", "expand", "filter", "where"}


def test_no_route_takes_a_free_form_sort_or_field_parameter(app: Any) -> None:
    """Sorting and field selection are not user-controlled anywhere; a route adding one must allowlist it here."""
    offenders = []
    for route in all_routes(app):
        if route.endpoint is None:
            continue
        for name in inspect.signature(route.endpoint).parameters:
            if name.lower() in SORT_LIKE:
                offenders.append(f"{route.method} {route.path}: {name}")
    assert offenders == []


def test_export_filters_naming_internal_fields_are_refused(client: Any, world: World, clean_engine: Any) -> None:
    before = snapshot(clean_engine, world)
    url = f"/api/projects/{world.a.project_id}/exports"
    for name in ("password_hash", "annotator.password_hash", "created_by", "ranking__annotator__password_hash",
                 "user", "__class__", "id"):
        response = client.post(url, headers=world.headers("lead"), json={"format": "jsonl", "filters": {name: "x"}})
        assert response.status_code in (400, 422), (name, response.text)
        assert "unknown filter" in response.text and name in response.text
    # Values of known filters are validated too (no expression smuggled into a version list).
    response = client.post(url, headers=world.headers("lead"),
                           json={"format": "jsonl", "filters": {"rubric_versions": "1) OR 1=1 --"}})
    assert response.status_code in (400, 422), response.text
    assert snapshot(clean_engine, world) == before
