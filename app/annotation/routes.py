"""Annotation: the task queue and ranking submission, as JSON API and as the ranking page (same services)."""

from __future__ import annotations

import uuid
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Form, HTTPException, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response
from pydantic import ValidationError
from sqlalchemy.orm import Session

from app.annotation import queue, rankings
from app.annotation import tasks as annotation
from app.annotation.pairs import expand_tiers
from app.platform.errors import DomainError
from app.projects import rubrics
from app.schemas import DRAFT_MAX_BYTES, DraftIn, DraftOut, RankingIn, RankingOut, TaskOut
from app.web.deps import Id, PageUser, SessionDep, api_user, bearer_token, get_db, optional_user, token_caller
from app.web.forms import RankingForm
from app.web.openapi import NEEDS_CALLER
from app.web.rendering import render

router = APIRouter()

RESPONSE_LETTERS = "ABCDEFGHIJKLMNOP"


# The hot API handlers are plain `def`s that open the transaction and authenticate inside their own thread: one
# threadpool hop per request instead of five (one per sync dependency and the generator's exit). It also keeps a
# request's whole transaction on one thread, so a request holding SQLite's write lock never waits for a free thread
# behind requests that wait for that lock.
_transaction = contextmanager(get_db)


def _api_caller(request: Request, db: Session) -> Any:
    return api_user(optional_user(request, db))


def _caller_project(request: Request, db: Session, project_id: int) -> tuple[Any, Any]:
    """(caller, project to annotate): for a token in one query, for a browser session as on every other route."""
    token = bearer_token(request)
    if token is None:
        user = _api_caller(request, db)
        return user, annotation.annotator_project(db, project_id, user)
    user, project = annotation.token_caller_project(db, token, project_id)
    return token_caller(request, user), project


@router.get("/api/projects/{project_id}/tasks/next", tags=["annotation"], response_model=TaskOut,
            summary="Lease the next prompt to rank (204 when nothing is left for you)",
            responses={204: {"description": "Nothing left for this annotator"}, **NEEDS_CALLER})
def next_task(project_id: Id, request: Request) -> Response:
    with _transaction(request) as db:
        user, project = _caller_project(request, db, project_id)
        assignment = queue.next_task(db, project, user)
        if assignment is None:
            return Response(status_code=204)
        task = annotation.task_view(db, project, assignment)
    return Response(task.model_dump_json(), media_type="application/json")


@router.post("/api/projects/{project_id}/rankings", tags=["annotation"], status_code=201, response_model=RankingOut,
             summary="Submit a ranking (idempotent per submission_id: a retry answers 200 with the first result)",
             responses={200: {"model": RankingOut, "description": "This submission_id was already recorded"},
                        **NEEDS_CALLER})
def submit_ranking(project_id: Id, body: RankingIn, request: Request) -> Response:
    with _transaction(request) as db:
        user, project = _caller_project(request, db, project_id)
        ranking, created = rankings.submit(db, project, user, rankings.RankingInput(**body.model_dump()))
        # A new ranking's pairs are exactly its expanded tiers; only a repeat needs to count what was stored.
        pairs_created = len(expand_tiers(ranking.tiers)) if created else rankings.pair_count(db, ranking)
        out = RankingOut(ranking_id=ranking.id, pairs_created=pairs_created, created=created)
    return Response(out.model_dump_json(), status_code=201 if created else 200, media_type="application/json")


async def _small_body(request: Request) -> None:
    """413 for a draft over DRAFT_MAX_BYTES, before it is parsed (async: no threadpool hop for it)."""
    if len(await request.body()) > DRAFT_MAX_BYTES:
        raise HTTPException(413, [{"field": "body", "message": f"a draft is at most {DRAFT_MAX_BYTES} bytes"}])


_NOT_YOURS = {404: {"description": "Not your task, already submitted, or its lease ran out"}, **NEEDS_CALLER}


@router.get("/api/assignments/{assignment_id}/draft", tags=["annotation"], response_model=DraftOut,
            summary="Your saved draft of a task you hold (204 when none is saved)",
            responses={204: {"description": "No draft saved for this task"}, **_NOT_YOURS})
def get_draft(assignment_id: Id, request: Request) -> Response:
    with _transaction(request) as db:
        user = _api_caller(request, db)
        draft = annotation.get_draft(db, user, assignment_id)
        if draft is None:
            return Response(status_code=204)
        out = DraftOut.from_model(draft)
    return Response(out.model_dump_json(), media_type="application/json")


@router.put("/api/assignments/{assignment_id}/draft", tags=["annotation"], response_model=DraftOut,
            dependencies=[Depends(_small_body)],
            summary="Save the ranking so far of a task you hold, so another device resumes it (the ranking page "
                    "does this as you rank); cleared when the task is submitted or its lease runs out",
            responses={**_NOT_YOURS, 409: {"description": "A draft edited later is already saved"},
                       413: {"description": f"The draft is over {DRAFT_MAX_BYTES} bytes"}})
def put_draft(assignment_id: Id, body: DraftIn, request: Request) -> Response:
    with _transaction(request) as db:
        user = _api_caller(request, db)
        out = DraftOut.from_model(annotation.save_draft(db, user, assignment_id, body))
    return Response(out.model_dump_json(), media_type="application/json")


# --- the ranking page ----------------------------------------------------------------------------

def _page_context(db, project, user, assignment, **extra) -> dict:
    ctx = {"project": project, "rubric": rubrics.current(db, project),
           "progress": queue.progress(db, project, user), "letters": RESPONSE_LETTERS,
           "k": project.completions_per_prompt, "task": None}
    if assignment is not None:
        task = annotation.task_view(db, project, assignment)
        draft = annotation.draft_of(db, assignment)
        ctx.update(task=task, prompt=annotation.prompt_of(db, assignment), submission_id=uuid.uuid4().hex,
                   started_at=datetime.now(UTC).timestamp(),
                   draft=draft.model_dump(mode="json") if draft else None)
    ctx.update(extra)
    return ctx


@router.get("/projects/{project_id}/annotate", include_in_schema=False)
def annotate_page(request: Request, project_id: Id, db: SessionDep, user: PageUser) -> Response:
    project = annotation.annotator_project(db, project_id, user)
    assignment = queue.next_task(db, project, user)
    return render(request, "annotate.html", _page_context(db, project, user, assignment), block="task")


def _page_project(project_id: Id, db: SessionDep, user: PageUser) -> Any:
    return annotation.annotator_project(db, project_id, user)


# A dependency, so that a project the caller may not see (404) or not annotate (403) is refused before the form
# is read, whatever the form holds.
AnnotatorProject = Annotated[Any, Depends(_page_project)]


@router.post("/projects/{project_id}/annotate", include_in_schema=False)
def annotate_submit(request: Request, project: AnnotatorProject, db: SessionDep, user: PageUser,
                    form: Annotated[RankingForm, Form()]) -> Response:
    assignment = queue.get_own_assignment(db, project, user, form.assignment())
    completion_ids = queue.task_completion_ids(db, assignment.prompt_id, project.completions_per_prompt)
    try:
        with db.begin_nested():
            body = form.ranking(assignment.id, completion_ids)
            ranking, created = rankings.submit(db, project, user, rankings.RankingInput(**body.model_dump()))
    except (DomainError, ValidationError) as exc:
        # The ranking stays on screen: HTMX shows this message and keeps the form; a plain POST re-renders it.
        error = form.error(exc)
        if request.headers.get("hx-request") == "true":
            return JSONResponse({"detail": error.detail()}, status_code=error.status_code)
        ctx = _page_context(db, project, user, assignment, error=error, prev_ranks=form.ranks(completion_ids),
                            prev_flags=form.flags(completion_ids))
        return render(request, "annotate.html", ctx, status_code=error.status_code)
    if request.headers.get("hx-request") != "true":
        return RedirectResponse(f"/projects/{project.id}/annotate", status_code=303)
    following = queue.next_task(db, project, user)
    ctx = _page_context(db, project, user, following, just_submitted=ranking.id)
    return render(request, "annotate.html", ctx, block="task")
