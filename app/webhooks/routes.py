"""Webhooks: a project's lead adds and removes the URLs told of its events, and reads each delivery's log."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Form, Request, Response
from fastapi.responses import RedirectResponse

from app.accounts import permissions
from app.projects import projects
from app.schemas import WebhookCreated, WebhookDeliveryOut, WebhookIn, WebhookOut
from app.web.deps import CurrentUser, Id, KeyringDep, PageUser, SessionDep
from app.web.form_pages import ProjectPage
from app.web.forms import WebhookForm
from app.web.rendering import render
from app.webhooks import service as webhooks

router = APIRouter(tags=["webhooks"])


@router.post("/api/projects/{project_id}/webhooks", status_code=201,
             summary="Register a webhook (lead); the answer carries its signing secret, shown only this once")
def create_webhook(project_id: Id, body: WebhookIn, db: SessionDep, user: CurrentUser,
                   keyring: KeyringDep) -> WebhookCreated:
    project = projects.get_visible(db, project_id, user)
    created = webhooks.create(db, user, keyring, project, url=body.url, events=body.events,
                              allow_private=body.allow_private)
    return WebhookCreated(**WebhookOut.from_model(created.hook).model_dump(), secret=created.secret)


@router.get("/api/projects/{project_id}/webhooks", summary="The project's webhooks (secrets never shown)")
def list_webhooks(project_id: Id, db: SessionDep, user: CurrentUser) -> list[WebhookOut]:
    project = projects.get_visible(db, project_id, user)
    return [WebhookOut.from_model(h) for h in webhooks.list_hooks(db, user, project)]


@router.delete("/api/projects/{project_id}/webhooks/{webhook_id}", status_code=204,
               summary="Remove a webhook and its delivery log")
def delete_webhook(project_id: Id, webhook_id: Id, db: SessionDep, user: CurrentUser) -> Response:
    project = projects.get_visible(db, project_id, user)
    webhooks.delete(db, user, project, webhooks.get(db, user, project, webhook_id))
    return Response(status_code=204)


@router.get("/api/projects/{project_id}/webhooks/{webhook_id}/deliveries",
            summary="A webhook's deliveries, newest first: state, status code, error and every attempt")
def list_deliveries(project_id: Id, webhook_id: Id, db: SessionDep, user: CurrentUser) -> list[WebhookDeliveryOut]:
    project = projects.get_visible(db, project_id, user)
    hook = webhooks.get(db, user, project, webhook_id)
    return [WebhookDeliveryOut.from_model(d) for d in webhooks.list_deliveries(db, user, project, hook)]


# --- the project's webhooks page ----------------------------------------------------------------------------


def _page_context(db, project, user) -> dict[str, Any]:
    hooks = webhooks.list_hooks(db, user, project)
    return {"project": project, "hooks": hooks, "events": webhooks.EVENTS, "form": {"events": ["export.ready"]},
            "deliveries": {h.id: webhooks.list_deliveries(db, user, project, h, limit=10) for h in hooks},
            "may_allow_private": permissions.may(db, user, project, "webhooks.allow_private"), "created": None}


WEBHOOKS_PAGE = ProjectPage("webhooks.html", _page_context)


@router.get("/projects/{project_id}/webhooks", include_in_schema=False)
def webhooks_page(request: Request, project_id: Id, db: SessionDep, user: PageUser) -> Response:
    return WEBHOOKS_PAGE.show(request, db, user, project_id)


@router.post("/projects/{project_id}/webhooks", include_in_schema=False)
def add_from_page(request: Request, project_id: Id, body: Annotated[WebhookForm, Form()], db: SessionDep,
                  user: PageUser, keyring: KeyringDep) -> Response:
    """Adds the hook and shows the page with its secret, this once (a redirect would lose it); a refusal shows
    the page again with the error, as every form does."""
    made: list[webhooks.Created] = []

    def add(db, project, user, hook: WebhookIn):
        made.append(webhooks.create(db, user, keyring, project, url=hook.url, events=hook.events,
                                    allow_private=hook.allow_private))

    answer = WEBHOOKS_PAGE.submit(request, db, user, project_id, body, add, redirect="/projects/{project_id}/webhooks")
    if not made:
        return answer
    project = projects.get_visible(db, project_id, user)
    return render(request, "webhooks.html", _page_context(db, project, user) | {"created": made[0]},
                  status_code=201)


@router.post("/projects/{project_id}/webhooks/{webhook_id}/delete", include_in_schema=False)
def delete_from_page(project_id: Id, webhook_id: Id, db: SessionDep, user: PageUser) -> Response:
    project = projects.get_visible(db, project_id, user)
    webhooks.delete(db, user, project, webhooks.get(db, user, project, webhook_id))
    return RedirectResponse(f"/projects/{project.id}/webhooks", status_code=303)
