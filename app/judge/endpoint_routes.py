"""JSON API: model endpoints (OpenAI-compatible servers). Admins manage them; everyone signed in may list them."""

from __future__ import annotations

from fastapi import APIRouter, Response

from app.accounts import permissions
from app.judge import endpoints
from app.schemas import ModelEndpointAdminOut, ModelEndpointIn, ModelEndpointOut, ModelEndpointPatch
from app.web.deps import CurrentUser, EndpointAdmin, Id, KeyringDep, SessionDep

router = APIRouter(prefix="/api", tags=["model endpoints"])


@router.get("/model-endpoints", summary="Model endpoints to pick from (admins also see URLs; keys never)")
def list_endpoints(db: SessionDep, user: CurrentUser,
                   keyring: KeyringDep) -> list[ModelEndpointAdminOut] | list[ModelEndpointOut]:
    items = endpoints.list_endpoints(db)
    if permissions.may_account(user, "endpoints.manage"):
        return [ModelEndpointAdminOut.from_model(e, endpoints.key_status(e, keyring)) for e in items]
    return [ModelEndpointOut(id=e.id, name=e.name, model=e.model) for e in items]


@router.post("/model-endpoints", status_code=201, summary="Add a model endpoint (admin)")
def create_endpoint(body: ModelEndpointIn, db: SessionDep, admin: EndpointAdmin,
                    keyring: KeyringDep) -> ModelEndpointAdminOut:
    endpoint = endpoints.create(db, admin, keyring, name=body.name, base_url=body.base_url, model=body.model,
                                api_key=body.api_key, allow_private=body.allow_private)
    return ModelEndpointAdminOut.from_model(endpoint, endpoints.key_status(endpoint, keyring))


@router.patch("/model-endpoints/{endpoint_id}", summary="Change a model endpoint (admin)")
def update_endpoint(endpoint_id: Id, body: ModelEndpointPatch, db: SessionDep,
                    admin: EndpointAdmin, keyring: KeyringDep) -> ModelEndpointAdminOut:
    endpoint = endpoints.update(db, admin, keyring, endpoints.get(db, endpoint_id), name=body.name,
                                base_url=body.base_url, model=body.model, api_key=body.api_key,
                                clear_api_key=body.clear_api_key, allow_private=body.allow_private)
    return ModelEndpointAdminOut.from_model(endpoint, endpoints.key_status(endpoint, keyring))


@router.delete("/model-endpoints/{endpoint_id}", status_code=204, summary="Remove a model endpoint (admin)")
def delete_endpoint(endpoint_id: Id, db: SessionDep, admin: EndpointAdmin) -> Response:
    endpoints.delete(db, admin, endpoints.get(db, endpoint_id))
    return Response(status_code=204)
