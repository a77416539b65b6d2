"""Versioned rubrics: every save is a new immutable version; saving on a stale version is a conflict."""

from __future__ import annotations

from sqlalchemy.orm import Session

from app.accounts import permissions
from app.models import Project, Rubric, User
from app.platform.errors import Invalid
from app.projects import versions

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
    return versions.current(db, project, Rubric)


def create_version(db: Session, project: Project, author: User, *, text: str, criteria: list[str],
                   base_version: int | None, note: str = "", check_permission: bool = True) -> Rubric:
    """Save a new version on top of `base_version`; Conflict if someone saved since (no silent overwrite)."""

    if check_permission:
        permissions.require(db, author, project, "rubric.edit")
    text = text.replace("\r\n", "\n").strip()
    if not text:
        raise Invalid("must not be empty", field="text")
    if len(text) > MAX_TEXT:
        raise Invalid(f"must be at most {MAX_TEXT} characters", field="text")
    criteria = clean_criteria(criteria)
    return versions.save(db, project, author, Rubric, base_version=base_version, text=text, criteria=criteria,
                         note=note.strip()[:500])


def list_versions(db: Session, project: Project) -> list[Rubric]:
    return versions.list_versions(db, project, Rubric)


def get_version(db: Session, project: Project, version: int) -> Rubric:
    return versions.get_version(db, project, Rubric, version)


def as_lines(text: str, criteria: list[str]) -> list[str]:
    """A rubric as the lines a diff compares: its text, then its criteria as a list."""
    return text.replace("\r\n", "\n").split("\n") + ["", "Criteria:"] + [f"- {c}" for c in criteria]


def diff(old: Rubric | None, new: Rubric) -> list[versions.DiffLine]:
    """A unified diff of the text and criteria of two versions, as lines the template escapes."""
    return versions.diff_lines(as_lines(old.text, old.criteria) if old else [], as_lines(new.text, new.criteria))


def diff_draft(theirs: Rubric, text: str, criteria: list[str]) -> list[versions.DiffLine]:
    """An edit conflict: the version someone else saved against the user's draft, text and criteria both, so a
    change to the criteria alone shows too. Empty when the two are the same."""
    return versions.diff_lines(as_lines(theirs.text, theirs.criteria),
                               as_lines(text.strip(), [c.strip() for c in criteria if c.strip()]))
