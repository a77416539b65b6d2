"""Jobs: the sampling request, job status and cancel, as JSON API and pages with live progress."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from app.accounts import permissions
from app.jobs import queue as jobs
from app.judge import endpoints, sampling
from app.projects import projects
from app.schemas import JobAccepted, JobOut, SamplingJobIn
from app.web.deps import CurrentUser, Id, PageUser, SessionDep
from app.web.form_pages import ProjectPage, default_model
from app.web.forms import SamplingForm
from app.web.rendering import render

router = APIRouter()


def _request_sampling(db, project, user, body: SamplingJobIn):
    """The API's and the page's sampling request: one mapping of the request model onto the service."""
    return sampling.request_sampling(db, project, user, generator=body.generator.model_dump(), k=body.k,
                                     prompt_ids=body.prompt_ids, seed=body.seed,
                                     resample_duplicates=body.resample_duplicates)


@router.post("/api/projects/{project_id}/sampling-jobs", status_code=202, tags=["jobs"],
             summary="Sample completions for the project's prompts (a background job)")
def create_sampling_job(project_id: Id, body: SamplingJobIn, db: SessionDep, user: CurrentUser) -> JobAccepted:
    project = projects.get_visible(db, project_id, user)
    return JobAccepted(job_id=_request_sampling(db, project, user, body).id)


@router.get("/api/projects/{project_id}/jobs", tags=["jobs"], summary="The project's recent jobs")
def list_jobs(project_id: Id, db: SessionDep, user: CurrentUser) -> list[JobOut]:
    project = projects.get_visible(db, project_id, user)
    return [JobOut.from_model(j) for j in jobs.list_for_project(db, project)]


@router.get("/api/jobs/{job_id}", tags=["jobs"], summary="A job's state and progress")
def get_job(job_id: Id, db: SessionDep, user: CurrentUser) -> JobOut:
    return JobOut.from_model(jobs.get_visible(db, job_id, user))


@router.post("/api/jobs/{job_id}/cancel", tags=["jobs"], summary="Cancel a queued or running job")
def cancel_job(job_id: Id, db: SessionDep, user: CurrentUser) -> JobOut:
    job = jobs.get_visible(db, job_id, user)
    _require_manage(db, job, user)
    return JobOut.from_model(jobs.cancel(db, job, user))


def _require_manage(db, job, user) -> None:
    if job.project_id is not None:
        project = projects.get_visible(db, job.project_id, user)
        permissions.require(db, user, project, "sampling.start", doing="cancel jobs")


# --- pages --------------------------------------------------------------------------------------

def _jobs_context(db, project, user) -> dict:
    items = jobs.list_for_project(db, project)
    return {"project": project, "jobs": items, "can_sample": permissions.may(db, user, project, "sampling.start"),
            "active": any(j.state in ("queued", "running") for j in items), "form": {},
            "endpoints": endpoints.list_endpoints(db)}


JOBS_PAGE = ProjectPage("jobs.html", _jobs_context, block="job_table", from_settings=default_model)


JOBS_PAGE.mount(router, "/projects/{project_id}/jobs", post_path="/projects/{project_id}/jobs/sample",
                form=SamplingForm, action=_request_sampling, redirect="/projects/{project_id}/jobs")


@router.get("/jobs/{job_id}", include_in_schema=False)
def job_page(request: Request, job_id: Id, db: SessionDep, user: PageUser) -> Response:
    job = jobs.get_visible(db, job_id, user)
    project = projects.get_visible(db, job.project_id, user) if job.project_id else None
    ctx = {"job": job, "out": JobOut.from_model(job), "project": project,
           "log": jobs.log_tail(request.app.state.settings.data_dir, job.id),
           "can_cancel": project is not None and permissions.may(db, user, project, "sampling.start")}
    return render(request, "job.html", ctx, block="job_status")


@router.post("/jobs/{job_id}/cancel", include_in_schema=False)
def cancel_from_page(job_id: Id, db: SessionDep, user: PageUser) -> Response:
    job = jobs.get_visible(db, job_id, user)
    _require_manage(db, job, user)
    if job.state not in jobs.TERMINAL:
        jobs.cancel(db, job, user)
    return RedirectResponse(f"/jobs/{job.id}", status_code=303)
