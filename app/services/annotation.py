"""The annotator's side of a project: the one-query project lookup the hot path starts with, and a task as the
annotator sees it (prompt, completions in their display order, the rubric)."""

from __future__ import annotations

from sqlalchemy import and_, bindparam, select
from sqlalchemy.orm import Session

from app import permissions
from app.errors import NotFound
from app.models import Assignment, Project, ProjectMember, Prompt, Rubric, User
from app.schemas import CompletionView, PromptView, RubricView, TaskOut
from app.services import queue, rubrics

# Built once with bind parameters (annotation hot path: see app.services.queue).
_PROJECT_ROLE_RUBRIC = (select(Project, ProjectMember.role, Rubric)
                        .outerjoin(ProjectMember, and_(ProjectMember.project_id == Project.id,
                                                       ProjectMember.user_id == bindparam("user_id")))
                        .outerjoin(Rubric, Rubric.id == Project.current_rubric_id)
                        .where(Project.id == bindparam("project_id")))
_PROMPT_TEXT = select(Prompt.id, Prompt.text, Prompt.messages).where(Prompt.id == bindparam("prompt_id"))


def annotator_project(db: Session, project_id: int, user: User) -> Project:
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


def task_view(db: Session, project: Project, assignment: Assignment) -> TaskOut:
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


def prompt_of(db: Session, assignment: Assignment) -> Prompt | None:
    """The whole prompt row (the page shows its metadata too)."""
    return db.get(Prompt, assignment.prompt_id)
