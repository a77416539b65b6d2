"""Immutable, numbered versions of a project document (rubrics, constitutions) with optimistic concurrency."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.errors import Conflict, NotFound
from app.models import Constitution, Project, Rubric, User
from app.services import audit

V = TypeVar("V", Rubric, Constitution)

_CURRENT = {Rubric: "current_rubric_id", Constitution: "current_constitution_id"}
_NAME = {Rubric: "rubric", Constitution: "constitution"}


def current(db: Session, project: Project, model: type[V]) -> V | None:
    current_id = getattr(project, _CURRENT[model])
    return db.get(model, current_id) if current_id else None


def save(db: Session, project: Project, author: User, model: type[V], *, base_version: int | None,
         **fields: Any) -> V:
    """Version n+1 on top of `base_version`; Conflict when it is no longer current (never a silent overwrite)."""
    name, pointer = _NAME[model], _CURRENT[model]
    # Lock the project row (Postgres) so two saves on the same base serialise; SQLite holds a write lock.
    db.execute(select(Project.id).where(Project.id == project.id).with_for_update())
    db.refresh(project, [pointer])
    latest = db.scalar(select(func.max(model.version)).where(model.project_id == project.id)) or 0
    cur = current(db, project, model)
    cur_version = cur.version if cur else None
    if latest and base_version != cur_version:
        raise Conflict(f"the {name} changed since you started editing (you edited version {base_version}, "
                       f"the current version is {cur_version}); reload and apply your changes again",
                       field="base_version")
    row = model(project_id=project.id, version=latest + 1, author_id=author.id, **fields)
    db.add(row)
    try:
        with db.begin_nested():
            db.flush()
    except IntegrityError:
        raise Conflict("another version was saved at the same moment; reload and try again",
                       field="base_version") from None
    setattr(project, pointer, row.id)
    db.flush()
    audit.record(db, author, f"{name}.create", project_id=project.id, object_type=name, object_id=row.id,
                 version=row.version)
    return row


def list_versions(db: Session, project: Project, model: type[V]) -> list[V]:
    return list(db.scalars(select(model).where(model.project_id == project.id).order_by(model.version.desc())))


def get_version(db: Session, project: Project, model: type[V], version: int) -> V:
    row = db.scalar(select(model).where(model.project_id == project.id, model.version == version))
    if row is None:
        raise NotFound(f"no such {_NAME[model]} version")
    return row


@dataclass(frozen=True)
class DiffLine:
    kind: str  # "add" | "del" | "ctx" | "hunk"
    text: str


def diff_lines(old: list[str], new: list[str]) -> list[DiffLine]:
    """A unified diff as typed lines; the template escapes the text."""
    out = []
    for line in difflib.unified_diff(old, new, lineterm="", n=2):
        if line.startswith(("---", "+++")):
            continue
        kind = {"@": "hunk", "+": "add", "-": "del"}.get(line[:1], "ctx")
        out.append(DiffLine(kind, line[1:] if kind != "hunk" else line))
    return out
