"""Webhooks: a project's lead adds and removes the URLs told of its events, and reads each delivery's log."""

from __future__ import annotations

from fastapi import APIRouter, Response

from app.deps import CurrentUser, KeyringDep, SessionDep
from app.schemas import WebhookCreated, WebhookDeliveryOut, WebhookIn, WebhookOut
from app.services import projects, webhooks

router = APIRouter(tags=["webhooks"])


@router.post("/api/projects/{project_id}/webhooks", status_code=201,
             summary="Register a webhook (lead); the answer carries its signing secret, shown only this once")
def create_webhook(project_id: int, body: WebhookIn, db: SessionDep, user: CurrentUser,
                   keyring: KeyringDep) -> WebhookCreated:
    project = projects.get_visible(db, project_id, user)
    created = webhooks.create(db, user, keyring, project, url=body.url, events=body.events,
                              allow_private=body.allow_private)
    return WebhookCreated(**WebhookOut.from_model(created.hook).model_dump(), secret=created.secret)


@router.get("/api/projects/{project_id}/webhooks", summary="The project's webhooks (secrets never shown)")
def list_webhooks(project_id: int, db: SessionDep, user: CurrentUser) -> list[WebhookOut]:
    project = projects.get_visible(db, project_id, user)
    return [WebhookOut.from_model(h) for h in webhooks.list_hooks(db, user, project)]


@router.delete("/api/projects/{project_id}/webhooks/{webhook_id}", status_code=204,
               summary="Remove a webhook and its delivery log")
def delete_webhook(project_id: int, webhook_id: int, db: SessionDep, user: CurrentUser) -> Response:
    project = projects.get_visible(db, project_id, user)
    webhooks.delete(db, user, project, webhooks.get(db, user, project, webhook_id))
    return Response(status_code=204)


@router.get("/api/projects/{project_id}/webhooks/{webhook_id}/deliveries",
            summary="A webhook's deliveries, newest first: state, status code, error and every attempt")
def list_deliveries(project_id: int, webhook_id: int, db: SessionDep, user: CurrentUser) -> list[WebhookDeliveryOut]:
    project = projects.get_visible(db, project_id, user)
    hook = webhooks.get(db, user, project, webhook_id)
    return [WebhookDeliveryOut.from_model(d) for d in webhooks.list_deliveries(db, user, project, hook)]
