"""Agreement and annotator quality: the JSON report, gold tasks, and the lead's dashboard page."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated

from fastapi import APIRouter, Form, Query, Request, Response
from fastapi.responses import RedirectResponse

from app import permissions
from app.deps import CurrentUser, PageUser, SessionDep
from app.errors import DomainError
from app.forms import GoldFromMetadataForm
from app.schemas import AgreementOut, GoldIn, GoldOut
from app.services import agreement, gold, projects
from app.web import render

router = APIRouter()

RubricVersionQuery = Annotated[int | None, Query(ge=1, description="Only rankings made under this rubric version.")]


def _readable_project(db, project_id: int, user):  # type: ignore[no-untyped-def]
    project = projects.get_visible(db, project_id, user)  # 404 for non-members
    permissions.require(db, user, project, "agreement.see")
    return project


@router.get("/api/projects/{project_id}/agreement", tags=["agreement"],
            summary="Agreement between annotators and per-annotator quality (leads, engineers, admins)",
            responses={403: {"description": "Annotators may not see the figures"},
                       404: {"description": "No such project, or not a member"},
                       422: {"description": "No such rubric version"}})
def get_agreement(project_id: int, db: SessionDep, user: CurrentUser,
                  rubric_version: RubricVersionQuery = None) -> AgreementOut:
    project = _readable_project(db, project_id, user)
    report = agreement.project_report(db, project, rubric_version=rubric_version)
    return AgreementOut.model_validate(asdict(report))


@router.put("/api/projects/{project_id}/prompts/{prompt_id}/gold", tags=["agreement"],
            summary="Mark a prompt as a gold task with its known correct order (leads and admins)",
            responses={422: {"description": "Bad tiers: `detail` names the field"}})
def put_gold(project_id: int, prompt_id: int, body: GoldIn, db: SessionDep, user: CurrentUser) -> GoldOut:
    project = projects.get_visible(db, project_id, user)
    prompt = gold.set_gold(db, project, prompt_id, body.tiers, user)
    return GoldOut(prompt_id=prompt.id, gold_tiers=prompt.gold_tiers)


@router.delete("/api/projects/{project_id}/prompts/{prompt_id}/gold", tags=["agreement"], status_code=204,
               summary="Turn a gold task back into an ordinary prompt (leads and admins)")
def delete_gold(project_id: int, prompt_id: int, db: SessionDep, user: CurrentUser) -> Response:
    project = projects.get_visible(db, project_id, user)
    gold.clear_gold(db, project, prompt_id, user)
    return Response(status_code=204)


@router.get("/projects/{project_id}/agreement", include_in_schema=False)
def agreement_page(request: Request, project_id: int, db: SessionDep, user: PageUser,
                   rubric_version: Annotated[str | None, Query()] = None,
                   marked: Annotated[int | None, Query()] = None) -> Response:
    project = _readable_project(db, project_id, user)
    # The selector submits "" for "all versions"; anything else that is not a number is treated the same.
    version = int(rubric_version) if rubric_version and rubric_version.isdigit() else None
    ctx: dict = {"project": project, "marked": marked,
                 "can_set_gold": permissions.may(db, user, project, "gold.manage")}
    try:
        ctx["report"] = agreement.project_report(db, project, rubric_version=version)
    except DomainError as exc:
        ctx["error"] = exc
        ctx["report"] = agreement.project_report(db, project)
        return render(request, "agreement.html", ctx, status_code=exc.status_code)
    return render(request, "agreement.html", ctx)


@router.post("/projects/{project_id}/agreement/gold-from-metadata", include_in_schema=False)
def mark_gold_from_metadata(project_id: int, db: SessionDep, user: PageUser,
                            form: Annotated[GoldFromMetadataForm, Form()]) -> Response:
    project = projects.get_visible(db, project_id, user)
    count = gold.gold_from_metadata(db, project, limit=form.count, actor=user)
    return RedirectResponse(f"/projects/{project.id}/agreement?marked={count}", status_code=303)
