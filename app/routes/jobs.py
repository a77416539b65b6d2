"""Jobs: the sampling request, job status and cancel, as JSON API and pages with live progress."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import RedirectResponse, Response

from app import permissions
from app.deps import CurrentUser, PageUser, SessionDep
from app.errors import DomainError, Invalid
from app.models import Job
from app.schemas import JobAccepted, JobOut, JobProgress, SamplingJobIn, generator_from_form
from app.services import endpoints, jobs, projects, sampling
from app.web import render

router = APIRouter()


def job_out(job: Job) -> JobOut:
    result = dict(job.result or {})
    return JobOut(id=job.id, kind=job.kind, state=job.state,  # type: ignore[arg-type]
                  progress=JobProgress(done=int(result.get("done", 0)), total=int(result.get("total", 0))),
                  message=result.get("message"), error=job.error, attempts=job.attempts, project_id=job.project_id,
                  created_at=job.created_at, started_at=job.started_at, finished_at=job.finished_at,
                  result={k: v for k, v in result.items() if k not in ("done", "total", "message")}
                  if job.state == "succeeded" else None)


@router.post("/api/projects/{project_id}/sampling-jobs", status_code=202, tags=["jobs"],
             summary="Sample completions for the project's prompts (a background job)")
def create_sampling_job(project_id: int, body: SamplingJobIn, db: SessionDep, user: CurrentUser) -> JobAccepted:
    project = projects.get_visible(db, project_id, user)
    job = sampling.request_sampling(db, project, user, generator=body.generator.model_dump(), k=body.k,
                                    prompt_ids=body.prompt_ids, seed=body.seed,
                                    resample_duplicates=body.resample_duplicates)
    return JobAccepted(job_id=job.id)


@router.get("/api/projects/{project_id}/jobs", tags=["jobs"], summary="The project's recent jobs")
def list_jobs(project_id: int, db: SessionDep, user: CurrentUser) -> list[JobOut]:
    project = projects.get_visible(db, project_id, user)
    return [job_out(j) for j in jobs.list_for_project(db, project)]


@router.get("/api/jobs/{job_id}", tags=["jobs"], summary="A job's state and progress")
def get_job(job_id: int, db: SessionDep, user: CurrentUser) -> JobOut:
    return job_out(jobs.get_visible(db, job_id, user))


@router.post("/api/jobs/{job_id}/cancel", tags=["jobs"], summary="Cancel a queued or running job")
def cancel_job(job_id: int, db: SessionDep, user: CurrentUser) -> JobOut:
    job = jobs.get_visible(db, job_id, user)
    _require_manage(db, job, user)
    return job_out(jobs.cancel(db, job, user))


def _require_manage(db, job: Job, user) -> None:  # type: ignore[no-untyped-def]
    if job.project_id is not None:
        project = projects.get_visible(db, job.project_id, user)
        permissions.require(db, user, project, "sampling.start", doing="cancel jobs")


# --- pages --------------------------------------------------------------------------------------

def _jobs_context(db, project, user) -> dict:  # type: ignore[no-untyped-def]
    items = jobs.list_for_project(db, project)
    return {"project": project, "jobs": items, "can_sample": permissions.may(db, user, project, "sampling.start"),
            "active": any(j.state in ("queued", "running") for j in items), "form": {},
            "endpoints": endpoints.list_endpoints(db)}


@router.get("/projects/{project_id}/jobs", include_in_schema=False)
def jobs_page(request: Request, project_id: int, db: SessionDep, user: PageUser) -> Response:
    project = projects.get_visible(db, project_id, user)
    return render(request, "jobs.html", _jobs_context(db, project, user), block="job_table")


@router.post("/projects/{project_id}/jobs/sample", include_in_schema=False)
def sample_from_page(request: Request, project_id: int, db: SessionDep, user: PageUser,
                     backend: Annotated[str, Form()] = "hf", model: Annotated[str, Form(max_length=1000)] = "",
                     endpoint_id: Annotated[str, Form(max_length=20)] = "",
                     base_url: Annotated[str, Form(max_length=1000)] = "",
                     api_key: Annotated[str, Form(max_length=500)] = "",
                     temperature: Annotated[str, Form()] = "1.0", top_p: Annotated[str, Form()] = "1.0",
                     max_new_tokens: Annotated[str, Form()] = "256", seed: Annotated[str, Form()] = "",
                     resample_duplicates: Annotated[str, Form()] = "0") -> Response:
    project = projects.get_visible(db, project_id, user)
    raw = {"backend": backend, "model": model, "endpoint_id": endpoint_id, "temperature": temperature,
           "top_p": top_p, "max_new_tokens": max_new_tokens}
    try:
        spec = generator_from_form(backend, model, base_url, api_key, endpoint_id, temperature=temperature,
                                   top_p=top_p, max_new_tokens=max_new_tokens)
        try:
            seed_value = int(seed) if seed.strip() else None
            tries = int(resample_duplicates or 0)
        except ValueError:
            raise Invalid("must be a whole number", field="seed") from None
        with db.begin_nested():
            sampling.request_sampling(db, project, user, generator=spec, k=None, prompt_ids=None,
                                      seed=seed_value, resample_duplicates=max(0, min(tries, 5)))
    except DomainError as exc:
        ctx = _jobs_context(db, project, user) | {"error": exc, "form": raw}
        return render(request, "jobs.html", ctx, status_code=exc.status_code)
    return RedirectResponse(f"/projects/{project.id}/jobs", status_code=303)


@router.get("/jobs/{job_id}", include_in_schema=False)
def job_page(request: Request, job_id: int, db: SessionDep, user: PageUser) -> Response:
    job = jobs.get_visible(db, job_id, user)
    project = projects.get_visible(db, job.project_id, user) if job.project_id else None
    ctx = {"job": job, "out": job_out(job), "project": project,
           "log": jobs.log_tail(request.app.state.settings.data_dir, job.id),
           "can_cancel": project is not None and permissions.may(db, user, project, "sampling.start")}
    return render(request, "job.html", ctx, block="job_status")


@router.post("/jobs/{job_id}/cancel", include_in_schema=False)
def cancel_from_page(job_id: int, db: SessionDep, user: PageUser) -> Response:
    job = jobs.get_visible(db, job_id, user)
    _require_manage(db, job, user)
    if job.state not in jobs.TERMINAL:
        jobs.cancel(db, job, user)
    return RedirectResponse(f"/jobs/{job.id}", status_code=303)
