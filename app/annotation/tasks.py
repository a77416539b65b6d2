"""The annotator's side of a project: the one-query project lookup the hot path starts with, a task as the
annotator sees it (prompt, completions in their display order, the rubric), and its draft: the unsent ranking,
kept on the server per assignment so that a lease resumed on another device resumes with it."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import and_, bindparam, delete, or_, select
from sqlalchemy.orm import Session

from app.accounts import permissions, security, users
from app.annotation import queue, rankings, steps
from app.models import (
    ApiToken,
    Assignment,
    AssignmentDraft,
    Project,
    ProjectMember,
    Prompt,
    Rubric,
    User,
    utcnow,
)
from app.platform.db import RowLoader, core
from app.platform.direct_sql import direct
from app.platform.errors import Conflict, NotFound
from app.projects import rubrics
from app.schemas import CompletionView, DraftIn, DraftOut, PromptView, RubricView, TaskOut

# Built once with bind parameters (annotation hot path: see app.annotation.queue).
_PROJECT_ROLE_RUBRIC = (select(Project, ProjectMember.role, Rubric)
                        .outerjoin(ProjectMember, and_(ProjectMember.project_id == Project.id,
                                                       ProjectMember.user_id == bindparam("user_id")))
                        .outerjoin(Rubric, Rubric.id == Project.current_rubric_id)
                        .where(Project.id == bindparam("project_id")))


# An API call's token, its user and the project with the caller's role and its current rubric, in one direct
# statement (the annotation hot path's two lookups); the instances are built from its row (`RowLoader`).
_USERS, _PROJECTS, _RUBRICS = RowLoader(User), RowLoader(Project), RowLoader(Rubric)
_USER_AT = 3  # after the token's id, revoked_at and last_used_at
_PROJECT_AT = _USER_AT + len(_USERS.columns)
_ROLE_AT = _PROJECT_AT + len(_PROJECTS.columns)
_TOKEN_PROJECT_ROLE_RUBRIC = direct(
    select(ApiToken.id, ApiToken.revoked_at, ApiToken.last_used_at, *_USERS.columns, *_PROJECTS.columns,
           ProjectMember.role, *_RUBRICS.columns)
    .select_from(ApiToken).join(User, users.TOKEN_USER_JOIN)
    .outerjoin(Project, Project.id == bindparam("project_id"))
    .outerjoin(ProjectMember, and_(ProjectMember.project_id == Project.id, ProjectMember.user_id == User.id))
    .outerjoin(Rubric, Rubric.id == Project.current_rubric_id)
    .where(ApiToken.token_hash == bindparam("token_hash")))


def token_caller_project(db: Session, token: str, project_id: int) -> tuple[User | None, Project | None]:
    """(the token's user, the project as `annotator_project` gives it) in one query; (None, None) for a token that
    is unknown or revoked (the caller answers 401 before anything about the project)."""
    row = core(db).execute(_TOKEN_PROJECT_ROLE_RUBRIC,
                           {"token_hash": security.token_hash(token), "project_id": project_id}).first()
    found = None if row is None else users.TokenRow(row[0], row[1], row[2], _USERS.load(db, row, _USER_AT))
    user = users.accept_token(db, found)
    if user is None:
        return None, None
    project = _PROJECTS.load(db, row, _PROJECT_AT)
    rubric = _RUBRICS.load(db, row, _ROLE_AT + 1)
    return user, _annotatable(db, user, None if project is None else (project, row[_ROLE_AT], rubric))


def annotator_project(db: Session, project_id: int, user: User) -> Project:
    """The project, 404 unless the caller may see it and 403 unless they may annotate: one query, not four.

    The current rubric comes in the same query, so `rubrics.current` later finds it in the session's identity map.
    """
    return _annotatable(db, user, db.execute(_PROJECT_ROLE_RUBRIC, {"project_id": project_id, "user_id": user.id})
                        .first())


def _annotatable(db: Session, user: User, row: Any) -> Project:
    """The project of a (Project, role, Rubric) row; 404 for no row (no such project), 403 unless the user may
    annotate in it."""
    if row is None:
        raise NotFound("no such project")
    project, role, rubric = row
    permissions.check_role(user.role, role, "annotate")
    # The identity map holds objects weakly: pin the rubric for the request, or it is collected and re-read.
    db.info.setdefault("pinned", []).append(rubric)
    return project


def task_view(db: Session, project: Project, assignment: Assignment) -> TaskOut:
    prompt = queue.task_shown(db, assignment.prompt_id, project.completions_per_prompt)
    completions = {cid: text for cid, text, _ in prompt.completions}
    order = queue.display_order(list(completions), assignment.annotator_id, prompt.prompt_id, assignment.round)
    turns = _chat_turns(prompt.completions)
    rubric = rubrics.current(db, project)
    labelled = steps.options(project).enabled
    split = steps.task_steps(db, project, order) if labelled else {}
    return TaskOut(
        assignment_id=assignment.id,
        prompt=PromptView(id=prompt.prompt_id, text=None if prompt.messages else prompt.text,
                          messages=prompt.messages),
        completions=[CompletionView(id=cid, text=completions[cid], messages=turns.get(cid), steps=split.get(cid))
                     for cid in order],
        rubric=RubricView(version=rubric.version, text=rubric.text, criteria=rubric.criteria) if rubric else None,
        lease_expires_at=assignment.leased_until, flags=list(project.flags or []),
        skip_reasons=list(project.skip_reasons or []), allow_ties=project.allow_ties,
        allow_partial=project.allow_partial, step_labels=labelled,
    )


def _chat_turns(shown: list[tuple[int, str, Any]]) -> dict[int, list[dict[str, str]]]:
    """Completion id → its chat turns, for the responses imported as multi-turn chats."""
    return {cid: meta["messages"] for cid, _, meta in shown if isinstance(meta, dict) and meta.get("messages")}


def prompt_of(db: Session, assignment: Assignment) -> Prompt | None:
    """The whole prompt row (the page shows its metadata too)."""
    return db.get(Prompt, assignment.prompt_id)


# --- drafts ------------------------------------------------------------------------------------------------------
# Statements built once, like the rest of the hot path: the page reads a draft per task (rankings.submit clears it).
# Those two are Core statements on the table, not the ORM entity: about 40 µs each on SQLite instead of 90–170 µs.
_DRAFTS = AssignmentDraft.__table__

_TASK = (select(Assignment.project_id, Assignment.prompt_id, Assignment.annotator_id, Assignment.state,
                Assignment.leased_until).where(Assignment.id == bindparam("assignment_id")))
# Locked for a save: two saves of one task, or a save and the task's submit, take turns (submit locks it too).
_TASK_LOCKED = _TASK.with_for_update()
_DRAFT = select(AssignmentDraft).where(AssignmentDraft.assignment_id == bindparam("assignment_id"))
_NOW = bindparam("now", type_=Assignment.leased_until.type)
# The caller's drafts whose lease ended (submitted elsewhere, or ran out): they go with the lease. Driven by the
# drafts table, which holds about one row per annotator at work, not by the annotator's whole history.
_STALE_DRAFTS = (delete(AssignmentDraft).where(AssignmentDraft.assignment_id.in_(
    select(AssignmentDraft.assignment_id).join(Assignment, Assignment.id == AssignmentDraft.assignment_id)
    .where(Assignment.annotator_id == bindparam("annotator_id"),
           or_(Assignment.state != "leased", Assignment.leased_until <= _NOW))))
    .execution_options(synchronize_session=False))
_PAGE_DRAFT = select(_DRAFTS).where(_DRAFTS.c.assignment_id == bindparam("assignment_id"))


def _own_lease(db: Session, user: User, assignment_id: int, *, lock: bool = False) -> tuple[Project, Any]:
    """(project, task row) of the caller's own task while its lease runs; 404 for anyone else's task, one they
    submitted or one whose lease ran out (whatever the caller's role: a draft is its annotator's alone)."""
    task = db.execute(_TASK_LOCKED if lock else _TASK, {"assignment_id": assignment_id}).first()
    if task is None or task.annotator_id != user.id or task.state != "leased" or task.leased_until <= utcnow():
        raise NotFound("no such task of yours with a running lease")
    return annotator_project(db, task.project_id, user), task


def draft_of(db: Session, assignment: Assignment) -> DraftOut | None:
    """The saved draft of a task the caller holds (the ranking page gives it to the browser with the task)."""
    row = db.execute(_PAGE_DRAFT, {"assignment_id": assignment.id}).first()
    return None if row is None else DraftOut(**row._asdict())


def get_draft(db: Session, user: User, assignment_id: int) -> AssignmentDraft | None:
    """The caller's draft of their task; None when none was saved, 404 when the task is not theirs or not leased."""
    _own_lease(db, user, assignment_id)
    return db.scalars(_DRAFT, {"assignment_id": assignment_id}).first()


def save_draft(db: Session, user: User, assignment_id: int, body: DraftIn) -> AssignmentDraft:
    """Store the ranking so far, checked against the task (its completions, the project's flags and ties).

    The newer edit wins: a draft edited before the stored one is refused (409), so a late retry from one device
    never overwrites what was done since on another.
    """
    project, task = _own_lease(db, user, assignment_id, lock=True)
    allowed = set(queue.task_completion_ids(db, task.prompt_id, project.completions_per_prompt))
    tiers = rankings.tier_items(body.tiers, allowed, allow_ties=project.allow_ties)
    # The same rules as a submitted ranking's flags.
    flags = rankings.validate_flags(body.flags, allowed, set(project.flags or []))
    opts = steps.options(project)
    shown = steps.task_steps(db, project, allowed) if opts.enabled and body.step_labels else {}
    step_labels = steps.validate(body.step_labels, shown, enabled=opts.enabled, draft=True)
    now = utcnow()
    edited = now if body.edited_at is None else min(_as_utc(body.edited_at), now)
    draft = db.scalars(_DRAFT, {"assignment_id": assignment_id}).first()
    if draft is None:
        draft = AssignmentDraft(assignment_id=assignment_id)
        db.add(draft)
    elif draft.edited_at > edited:
        raise Conflict(f"a newer draft of this task was saved (edited {draft.edited_at:%Y-%m-%d %H:%M:%S} UTC), "
                       "perhaps on another device; reload the task to see it", field="edited_at")
    draft.tiers, draft.flags, draft.seconds_spent = tiers, flags, body.seconds_spent
    draft.step_labels = {str(cid): labels for cid, labels in step_labels.items()}
    draft.edited_at, draft.saved_at = edited, now
    db.execute(_STALE_DRAFTS, {"annotator_id": user.id, "now": now})
    db.flush()
    return draft


def _as_utc(moment: datetime) -> datetime:
    """A client's time without a zone is read as UTC."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
