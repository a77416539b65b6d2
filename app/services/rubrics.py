"""Versioned rubrics: every save is a new immutable version; saving on a stale version is a conflict."""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.errors import Conflict, Invalid, NotFound
from app.models import Project, Rubric, User
from app.services import audit

MAX_TEXT = 100_000
MAX_CRITERIA = 30


def clean_criteria(criteria: list[str]) -> list[str]:
    out = []
    for i, item in enumerate(criteria):
        if not isinstance(item, str):
            raise Invalid("each criterion must be text", field=f"criteria[{i}]")
        item = item.strip()
        if len(item) > 300:
            raise Invalid("must be at most 300 characters", field=f"criteria[{i}]")
        if item:
            out.append(item)
    if len(out) > MAX_CRITERIA:
        raise Invalid(f"at most {MAX_CRITERIA} criteria", field="criteria")
    return out


def current(db: Session, project: Project) -> Rubric | None:
    return db.get(Rubric, project.current_rubric_id) if project.current_rubric_id else None


def create_version(db: Session, project: Project, author: User, *, text: str, criteria: list[str],
                   base_version: int | None, note: str = "", check_permission: bool = True) -> Rubric:
    """Save a new version on top of `base_version`; Conflict if someone saved since (no silent overwrite)."""
    from app.services import projects

    if check_permission:
        projects.require_project_role(db, project, author, projects.CAN_MANAGE, "edit the rubric")
    text = text.replace("\r\n", "\n").strip()
    if not text:
        raise Invalid("must not be empty", field="text")
    if len(text) > MAX_TEXT:
        raise Invalid(f"must be at most {MAX_TEXT} characters", field="text")
    criteria = clean_criteria(criteria)
    # Lock the project row (Postgres) so two saves on the same base serialise; SQLite holds a write lock.
    db.execute(select(Project.id).where(Project.id == project.id).with_for_update())
    db.refresh(project, ["current_rubric_id"])
    latest = db.scalar(select(func.max(Rubric.version)).where(Rubric.project_id == project.id)) or 0
    cur = current(db, project)
    cur_version = cur.version if cur else None
    if latest and base_version != cur_version:
        raise Conflict(
            f"the rubric changed since you started editing (you edited version {base_version}, "
            f"the current version is {cur_version}); reload and apply your changes again",
            field="base_version",
        )
    rubric = Rubric(project_id=project.id, version=latest + 1, text=text, criteria=criteria,
                    note=note.strip()[:500], author_id=author.id)
    db.add(rubric)
    try:
        with db.begin_nested():
            db.flush()
    except IntegrityError:
        raise Conflict("another version was saved at the same moment; reload and try again",
                       field="base_version") from None
    project.current_rubric_id = rubric.id
    db.flush()
    audit.record(db, author, "rubric.create", project_id=project.id, object_type="rubric",
                 object_id=rubric.id, version=rubric.version)
    return rubric


def list_versions(db: Session, project: Project) -> list[Rubric]:
    return list(db.scalars(select(Rubric).where(Rubric.project_id == project.id).order_by(Rubric.version.desc())))


def get_version(db: Session, project: Project, version: int) -> Rubric:
    rubric = db.scalar(select(Rubric).where(Rubric.project_id == project.id, Rubric.version == version))
    if rubric is None:
        raise NotFound("no such rubric version")
    return rubric


@dataclass(frozen=True)
class DiffLine:
    kind: str  # "add" | "del" | "ctx" | "hunk"
    text: str


def diff(old: Rubric | None, new: Rubric) -> list[DiffLine]:
    """A unified diff of the text and criteria of two versions, as lines the template escapes."""
    def lines(r: Rubric | None) -> list[str]:
        if r is None:
            return []
        return r.text.split("\n") + ["", "Criteria:"] + [f"- {c}" for c in r.criteria]

    out = []
    for line in difflib.unified_diff(lines(old), lines(new), lineterm="", n=2):
        if line.startswith(("---", "+++")):
            continue
        kind = {"@": "hunk", "+": "add", "-": "del"}.get(line[:1], "ctx")
        out.append(DiffLine(kind, line[1:] if kind != "hunk" else line))
    return out
