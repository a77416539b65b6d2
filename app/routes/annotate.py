"""Annotation: the task queue and ranking submission, as JSON API and as the ranking page (same services)."""

from __future__ import annotations

import uuid
from contextlib import contextmanager
from datetime import UTC, datetime

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response
from sqlalchemy import and_, bindparam, select
from sqlalchemy.orm import Session

from app import permissions
from app.deps import PageUser, SessionDep, api_user, get_db, optional_user
from app.errors import DomainError, Invalid, NotFound
from app.models import Assignment, Project, ProjectMember, Prompt, Rubric, User
from app.schemas import CompletionView, PromptView, RankingIn, RankingOut, RubricView, TaskOut
from app.services import queue, rankings, rubrics
from app.services.pairs import expand_tiers
from app.web import render

router = APIRouter()

RESPONSE_LETTERS = "ABCDEFGHIJKLMNOP"


# Built once with bind parameters (annotation hot path: see app.services.queue).
_PROJECT_ROLE_RUBRIC = (select(Project, ProjectMember.role, Rubric)
                        .outerjoin(ProjectMember, and_(ProjectMember.project_id == Project.id,
                                                       ProjectMember.user_id == bindparam("user_id")))
                        .outerjoin(Rubric, Rubric.id == Project.current_rubric_id)
                        .where(Project.id == bindparam("project_id")))
_PROMPT_TEXT = select(Prompt.id, Prompt.text, Prompt.messages).where(Prompt.id == bindparam("prompt_id"))


def _annotator_project(db: Session, project_id: int, user: User) -> Project:
    """The project, 404 unless the caller may see it and 403 unless they may annotate: one query, not four.

    The current rubric comes in the same query, so `rubrics.current` later finds it in the session's identity map.
    """
    row = db.execute(_PROJECT_ROLE_RUBRIC, {"project_id": project_id, "user_id": user.id}).first()
    if row is None:
        raise NotFound("no such project")
    permissions.check_role(user.role, row.role, "annotate")
    # The identity map holds objects weakly: pin the rubric for the request, or it is collected and re-read.
    db.info.setdefault("pinned", []).append(row.Rubric)
    return row.Project


# The hot API handlers are plain `def`s that open the transaction and authenticate inside their own thread: one
# threadpool hop per request instead of five (one per sync dependency and the generator's exit). It also keeps a
# request's whole transaction on one thread, so a request holding SQLite's write lock never waits for a free thread
# behind requests that wait for that lock.
_transaction = contextmanager(get_db)


def _api_caller(request: Request, db: Session) -> User:
    return api_user(optional_user(request, db))


def _task_view(db, project: Project, assignment: Assignment) -> TaskOut:  # type: ignore[no-untyped-def]
    prompt = db.execute(_PROMPT_TEXT, {"prompt_id": assignment.prompt_id}).one()
    completions = queue.task_completion_texts(db, prompt.id, project.completions_per_prompt)
    order = queue.display_order(list(completions), assignment.annotator_id, prompt.id, assignment.round)
    rubric = rubrics.current(db, project)
    return TaskOut(
        assignment_id=assignment.id,
        prompt=PromptView(id=prompt.id, text=None if prompt.messages else prompt.text, messages=prompt.messages),
        completions=[CompletionView(id=cid, text=completions[cid]) for cid in order],
        rubric=RubricView(version=rubric.version, text=rubric.text, criteria=rubric.criteria) if rubric else None,
        lease_expires_at=assignment.leased_until, flags=list(project.flags or []),
        skip_reasons=list(project.skip_reasons or []), allow_ties=project.allow_ties,
        allow_partial=project.allow_partial,
    )


@router.get("/api/projects/{project_id}/tasks/next", tags=["annotation"], response_model=TaskOut,
            summary="Lease the next prompt to rank (204 when nothing is left for you)",
            responses={204: {"description": "Nothing left for this annotator"}})
def next_task(project_id: int, request: Request) -> Response:
    with _transaction(request) as db:
        user = _api_caller(request, db)
        project = _annotator_project(db, project_id, user)
        assignment = queue.next_task(db, project, user)
        if assignment is None:
            return Response(status_code=204)
        task = _task_view(db, project, assignment)
    return Response(task.model_dump_json(), media_type="application/json")


@router.post("/api/projects/{project_id}/rankings", tags=["annotation"], status_code=201, response_model=RankingOut,
             summary="Submit a ranking (idempotent per submission_id: a retry answers 200 with the first result)",
             responses={200: {"model": RankingOut, "description": "This submission_id was already recorded"}})
def submit_ranking(project_id: int, body: RankingIn, request: Request) -> Response:
    with _transaction(request) as db:
        user = _api_caller(request, db)
        project = _annotator_project(db, project_id, user)
        ranking, created = rankings.submit(db, project, user, rankings.RankingInput(**body.model_dump()))
        # A new ranking's pairs are exactly its expanded tiers; only a repeat needs to count what was stored.
        pairs_created = len(expand_tiers(ranking.tiers)) if created else rankings.pair_count(db, ranking)
        out = RankingOut(ranking_id=ranking.id, pairs_created=pairs_created, created=created)
    return Response(out.model_dump_json(), status_code=201 if created else 200, media_type="application/json")


# --- the ranking page ----------------------------------------------------------------------------

def _page_context(db, project: Project, user: User, assignment: Assignment | None, **extra) -> dict:  # type: ignore[no-untyped-def]
    ctx = {"project": project, "rubric": rubrics.current(db, project),
           "progress": queue.progress(db, project, user), "letters": RESPONSE_LETTERS,
           "k": project.completions_per_prompt, "task": None}
    if assignment is not None:
        task = _task_view(db, project, assignment)
        ctx.update(task=task, prompt=db.get(Prompt, assignment.prompt_id), submission_id=uuid.uuid4().hex,
                   started_at=datetime.now(UTC).timestamp())
    ctx.update(extra)
    return ctx


@router.get("/projects/{project_id}/annotate", include_in_schema=False)
def annotate_page(request: Request, project_id: int, db: SessionDep, user: PageUser) -> Response:
    project = _annotator_project(db, project_id, user)
    assignment = queue.next_task(db, project, user)
    return render(request, "annotate.html", _page_context(db, project, user, assignment), block="task")


def _tiers_from_form(form, completion_ids: list[int]) -> list[list[int]]:  # type: ignore[no-untyped-def]
    """`rank_<id>` fields (1..K, equal numbers tie, blank = unranked) → tiers, best first."""
    by_rank: dict[int, list[int]] = {}
    for cid in completion_ids:
        raw = str(form.get(f"rank_{cid}", "")).strip()
        if not raw:
            continue
        if not raw.isdigit() or not 1 <= int(raw) <= len(completion_ids):
            raise Invalid(f"rank must be a number from 1 to {len(completion_ids)}", field=f"rank_{cid}")
        by_rank.setdefault(int(raw), []).append(cid)
    return [by_rank[r] for r in sorted(by_rank)]


@router.post("/projects/{project_id}/annotate", include_in_schema=False)
async def annotate_submit(request: Request, project_id: int, db: SessionDep, user: PageUser) -> Response:
    project = _annotator_project(db, project_id, user)
    form = await request.form()
    try:
        assignment_id = int(str(form.get("assignment_id", "")))
    except ValueError:
        raise Invalid("missing task", field="assignment_id") from None
    assignment = queue.get_own_assignment(db, project, user, assignment_id)
    completion_ids = queue.task_completion_ids(db, assignment.prompt_id, project.completions_per_prompt)
    skipped = form.get("action") == "skip"
    flags: dict[str, list[str]] = {}
    for cid in completion_ids:
        names = [str(v) for v in form.getlist(f"flag_{cid}")]
        if names:
            flags[str(cid)] = names
    try:
        seconds = float(str(form.get("seconds_spent") or "nan"))
    except ValueError:
        seconds = None
    try:
        with db.begin_nested():
            body = rankings.RankingInput(
                assignment_id=assignment.id, tiers=[] if skipped else _tiers_from_form(form, completion_ids),
                rubric_version=int(str(form.get("rubric_version") or 0)),
                submission_id=str(form.get("submission_id", ""))[:64], flags=flags, skipped=skipped,
                skip_reason=str(form.get("skip_reason") or "") if skipped else None, seconds_spent=seconds)
            ranking, _ = rankings.submit(db, project, user, body)
    except DomainError as exc:
        # The ranking stays on screen: HTMX shows this message and keeps the form; a plain POST re-renders it.
        if request.headers.get("hx-request") == "true":
            return JSONResponse({"detail": exc.detail()}, status_code=exc.status_code)
        prev = {cid: str(form.get(f"rank_{cid}", "")) for cid in completion_ids}
        ctx = _page_context(db, project, user, assignment, error=exc, prev_ranks=prev, prev_flags=flags)
        return render(request, "annotate.html", ctx, status_code=exc.status_code)
    if request.headers.get("hx-request") != "true":
        return RedirectResponse(f"/projects/{project.id}/annotate", status_code=303)
    following = queue.next_task(db, project, user)
    ctx = _page_context(db, project, user, following, just_submitted=ranking.id)
    return render(request, "annotate.html", ctx, block="task")
