"""The AI judge: start judge runs, read human–AI agreement, and the lead's decision on AI labels."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import RedirectResponse, Response
from sqlalchemy import select

from app import permissions
from app.deps import CurrentUser, PageUser, SessionDep
from app.errors import DomainError, Invalid
from app.models import Completion, JudgeRun
from app.schemas import (
    AILabelsIn,
    JobAccepted,
    JudgeAgreementOut,
    JudgeRunAccepted,
    JudgeRunIn,
    RevisionDecisionIn,
    RevisionJobIn,
    RevisionOut,
    generator_from_form,
)
from app.services import constitutions, endpoints, judging, projects, revisions
from app.web import render

router = APIRouter()


@router.post("/api/projects/{project_id}/judge-runs", status_code=202, tags=["judge"],
             summary="Run the AI judge over the project's prompts (a background job)")
def create_judge_run(project_id: int, body: JudgeRunIn, db: SessionDep, user: CurrentUser) -> JudgeRunAccepted:
    project = projects.get_visible(db, project_id, user)
    run, job = judging.request_judge_run(
        db, project, user, constitution_version=body.constitution_version, generator=body.generator.model_dump(),
        mode=body.mode, principles=body.principles, prompt_ids=body.prompt_ids, seed=body.seed,
        low_confidence=body.low_confidence, route_low_confidence=body.route_low_confidence)
    return JudgeRunAccepted(judge_run_id=run.id, job_id=job.id)


@router.get("/api/projects/{project_id}/judge-agreement", tags=["judge"],
            summary="Human–AI agreement, calibration and judge position bias")
def judge_agreement(project_id: int, db: SessionDep, user: CurrentUser,
                    constitution_version: Annotated[int | None, Query(ge=1)] = None,
                    judge_run_id: Annotated[int | None, Query(ge=1)] = None) -> JudgeAgreementOut:
    project = projects.get_visible(db, project_id, user)
    report = judging.judge_agreement(db, project, constitution_version=constitution_version, judge_run_id=judge_run_id)
    return JudgeAgreementOut(**report.as_dict())


@router.put("/api/projects/{project_id}/ai-labels", tags=["judge"],
            summary="The lead's decision: may AI labels be used for training?")
def set_ai_labels(project_id: int, body: AILabelsIn, db: SessionDep, user: CurrentUser) -> JudgeAgreementOut:
    project = projects.get_visible(db, project_id, user)
    judging.set_ai_labels(db, project, user, body.enabled)
    return JudgeAgreementOut(**judging.judge_agreement(db, project).as_dict())


# --- pages --------------------------------------------------------------------------------------

def _context(db, project, user) -> dict:  # type: ignore[no-untyped-def]
    runs = list(db.scalars(select(JudgeRun).where(JudgeRun.project_id == project.id).order_by(JudgeRun.id.desc())))
    return {"project": project, "runs": runs, "report": judging.judge_agreement(db, project),
            "constitution": constitutions.current(db, project), "form": {},
            "can_judge": permissions.may(db, user, project, "judge.start"),
            "can_manage": permissions.may(db, user, project, "labels.decide"),
            "endpoints": endpoints.list_endpoints(db)}


@router.get("/projects/{project_id}/judge", include_in_schema=False)
def judge_page(request: Request, project_id: int, db: SessionDep, user: PageUser) -> Response:
    project = projects.get_visible(db, project_id, user)
    return render(request, "judge.html", _context(db, project, user))


@router.post("/projects/{project_id}/judge/runs", include_in_schema=False)
def start_from_page(request: Request, project_id: int, db: SessionDep, user: PageUser,
                    backend: Annotated[str, Form()] = "hf", model: Annotated[str, Form(max_length=1000)] = "",
                    endpoint_id: Annotated[str, Form(max_length=20)] = "",
                    base_url: Annotated[str, Form(max_length=1000)] = "",
                    api_key: Annotated[str, Form(max_length=500)] = "",
                    mode: Annotated[str, Form()] = "logprob", principles: Annotated[str, Form()] = "sample",
                    seed: Annotated[int, Form(ge=0)] = 0) -> Response:
    project = projects.get_visible(db, project_id, user)
    raw = {"backend": backend, "model": model, "endpoint_id": endpoint_id}
    try:
        generator = generator_from_form(backend, model, base_url, api_key, endpoint_id)
        if mode not in ("logprob", "cot"):
            raise Invalid("must be logprob or cot", field="mode")
        if principles not in ("sample", "all"):
            raise Invalid("must be sample or all", field="principles")
        with db.begin_nested():
            judging.request_judge_run(db, project, user, constitution_version=None, generator=generator, mode=mode,
                                      principles=principles, prompt_ids=None, seed=seed, low_confidence=0.6,
                                      route_low_confidence=False)
    except DomainError as exc:
        return render(request, "judge.html", _context(db, project, user) | {"error": exc, "form": raw},
                      status_code=exc.status_code)
    return RedirectResponse(f"/projects/{project.id}/jobs", status_code=303)


@router.post("/projects/{project_id}/judge/ai-labels", include_in_schema=False)
def ai_labels_from_page(project_id: int, db: SessionDep, user: PageUser,
                        enabled: Annotated[str, Form()] = "") -> Response:
    project = projects.get_visible(db, project_id, user)
    judging.set_ai_labels(db, project, user, enabled == "yes")
    return RedirectResponse(f"/projects/{project.id}/judge", status_code=303)


# --- supervised CAI stage: critique → revision --------------------------------------------------

def _revision_out(revision, original) -> RevisionOut:  # type: ignore[no-untyped-def]
    meta = revision.meta or {}
    return RevisionOut(id=revision.id, prompt_id=revision.prompt_id, original_id=meta.get("original_id"),
                       original=original.text if original else None, critique=meta.get("critique", ""),
                       revision=revision.text, principle=meta.get("principle"),
                       constitution_version=meta.get("constitution_version"), status=meta.get("status", "pending"))


@router.post("/api/projects/{project_id}/revision-jobs", status_code=202, tags=["judge"],
             summary="Critique and revise completions under the constitution (supervised CAI stage)")
def create_revision_job(project_id: int, body: RevisionJobIn, db: SessionDep, user: CurrentUser) -> JobAccepted:
    project = projects.get_visible(db, project_id, user)
    job = revisions.request_revisions(db, project, user, generator=body.generator.model_dump(),
                                      constitution_version=body.constitution_version, prompt_ids=body.prompt_ids,
                                      limit=body.limit, seed=body.seed)
    return JobAccepted(job_id=job.id)


@router.get("/api/projects/{project_id}/revisions", tags=["judge"], summary="Revisions with their critique")
def list_revisions(project_id: int, db: SessionDep, user: CurrentUser,
                   status: Annotated[Literal["pending", "accepted", "rejected"] | None, Query()] = None
                   ) -> list[RevisionOut]:
    project = projects.get_visible(db, project_id, user)
    return [_revision_out(r, o) for r, o in revisions.list_revisions(db, project, status)]


@router.post("/api/projects/{project_id}/revisions/{revision_id}/decision", tags=["judge"],
             summary="Accept (it becomes an SFT row in exports) or reject a revision")
def decide_revision(project_id: int, revision_id: int, body: RevisionDecisionIn, db: SessionDep,
                    user: CurrentUser) -> RevisionOut:
    project = projects.get_visible(db, project_id, user)
    revision = revisions.decide(db, project, user, revision_id, body.accept)
    original = db.get(Completion, int((revision.meta or {}).get("original_id", 0)))
    return _revision_out(revision, original)


@router.get("/projects/{project_id}/revisions", include_in_schema=False)
def revisions_page(request: Request, project_id: int, db: SessionDep, user: PageUser) -> Response:
    project = projects.get_visible(db, project_id, user)
    return render(request, "revisions.html", {
        "project": project, "items": revisions.list_revisions(db, project), "form": {},
        "can_manage": permissions.may(db, user, project, "labels.decide"),
        "can_revise": permissions.may(db, user, project, "revisions.start")})


@router.post("/projects/{project_id}/revisions/start", include_in_schema=False)
def start_revisions_from_page(request: Request, project_id: int, db: SessionDep, user: PageUser,
                              model: Annotated[str, Form(max_length=1000)] = "",
                              limit: Annotated[int, Form(ge=1, le=10_000)] = 20) -> Response:
    project = projects.get_visible(db, project_id, user)
    try:
        with db.begin_nested():
            revisions.request_revisions(db, project, user, generator=generator_from_form("hf", model),
                                        constitution_version=None, prompt_ids=None, limit=limit)
    except DomainError as exc:
        return render(request, "revisions.html", {
            "project": project, "items": revisions.list_revisions(db, project), "error": exc,
            "form": {"model": model}, "can_manage": permissions.may(db, user, project, "labels.decide"),
            "can_revise": True}, status_code=exc.status_code)
    return RedirectResponse(f"/projects/{project.id}/jobs", status_code=303)


@router.post("/projects/{project_id}/revisions/{revision_id}/decision", include_in_schema=False)
def decide_from_page(project_id: int, revision_id: int, db: SessionDep, user: PageUser,
                     accept: Annotated[str, Form()] = "") -> Response:
    project = projects.get_visible(db, project_id, user)
    revisions.decide(db, project, user, revision_id, accept == "yes")
    return RedirectResponse(f"/projects/{project.id}/revisions#r{revision_id}", status_code=303)
