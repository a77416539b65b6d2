"""Immutable, numbered versions of a project document (rubrics, constitutions) with optimistic concurrency."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.models import Constitution, Project, Rubric, User
from app.platform import audit
from app.platform.errors import Conflict, Invalid, NotFound

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


def get_version(db: Session, project: Project, model: type[V], version: int, *, field: str | None = None) -> V:
    """The version, or 404 when the path named it; a request body's `field` naming a missing one is a 422 on it."""
    row = db.scalar(select(model).where(model.project_id == project.id, model.version == version))
    if row is None and field is not None:
        raise Invalid(f"no such {_NAME[model]} version", field=field)
    if row is None:
        raise NotFound(f"no such {_NAME[model]} version")
    return row


@dataclass(frozen=True)
class DiffLine:
    kind: str  # "add" | "del" | "ctx" | "hunk"
    text: str
    parts: tuple[tuple[str, str], ...] = ()
    """For a changed line paired with its counterpart: (kind, text) runs, kind "same" or "changed", so a page can
    mark the words that changed; empty for context, hunks and lines with no counterpart."""


_WORDS = re.compile(r"\s+|\w+|[^\w\s]")


def word_parts(old: str, new: str) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]:
    """The two lines as runs of unchanged and changed words (whitespace and punctuation are words too)."""
    a, b = _WORDS.findall(old), _WORDS.findall(new)
    left: list[tuple[str, str]] = []
    right: list[tuple[str, str]] = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag == "equal":
            left.append(("same", "".join(a[i1:i2])))
            right.append(("same", "".join(b[j1:j2])))
            continue
        if i2 > i1:
            left.append(("changed", "".join(a[i1:i2])))
        if j2 > j1:
            right.append(("changed", "".join(b[j1:j2])))
    return tuple(left), tuple(right)


def diff_lines(old: list[str], new: list[str]) -> list[DiffLine]:
    """A unified diff as typed lines; the template escapes the text. Within a change, the i-th removed line and
    the i-th added line are paired and carry their word-level `parts`."""
    out: list[DiffLine] = []
    for line in difflib.unified_diff(old, new, lineterm="", n=2):
        if line.startswith(("---", "+++")):
            continue
        kind = {"@": "hunk", "+": "add", "-": "del"}.get(line[:1], "ctx")
        out.append(DiffLine(kind, line[1:] if kind != "hunk" else line))
    return _pair_words(out)


def _pair_words(lines: list[DiffLine]) -> list[DiffLine]:
    out: list[DiffLine] = []
    i = 0
    while i < len(lines):
        if lines[i].kind != "del":
            out.append(lines[i])
            i += 1
            continue
        dels = []
        while i < len(lines) and lines[i].kind == "del":
            dels.append(lines[i])
            i += 1
        adds = []
        while i < len(lines) and lines[i].kind == "add":
            adds.append(lines[i])
            i += 1
        for k, d in enumerate(dels):
            out.append(DiffLine("del", d.text, word_parts(d.text, adds[k].text)[0]) if k < len(adds) else d)
        for k, a in enumerate(adds):
            out.append(DiffLine("add", a.text, word_parts(dels[k].text, a.text)[1]) if k < len(dels) else a)
    return out
