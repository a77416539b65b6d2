"""Versioned constitutions: ordered principles an AI judge applies, each with its comparison, critique and revision."""

from __future__ import annotations

import tomllib
from importlib import resources
from typing import Any

from sqlalchemy.orm import Session

from app.accounts import permissions
from app.models import Constitution, Project, User
from app.platform.errors import Invalid
from app.projects import versions

FIELDS = ("name", "rationale", "priority", "comparison", "critique", "revision")
MAX_PRINCIPLES = 50
MAX_FIELD = 4000



def clean_principles(principles: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Validated principles, ordered by priority then position; errors name `principles[i].field`."""
    if not isinstance(principles, list) or not principles:
        raise Invalid("give at least one principle", field="principles")
    if len(principles) > MAX_PRINCIPLES:
        raise Invalid(f"at most {MAX_PRINCIPLES} principles", field="principles")
    out, names = [], set()
    for i, raw in enumerate(principles):
        where = f"principles[{i}]"
        if not isinstance(raw, dict):
            raise Invalid("must be an object", field=where)
        unknown = set(raw) - set(FIELDS)
        if unknown:
            raise Invalid(f"unknown field {sorted(unknown)[0]!r}", field=f"{where}.{sorted(unknown)[0]}")
        item: dict[str, Any] = {}
        for key in ("name", "rationale", "comparison", "critique", "revision"):
            value = raw.get(key, "")
            if not isinstance(value, str):
                raise Invalid("must be text", field=f"{where}.{key}")
            value = value.replace("\r\n", "\n").strip()
            if len(value) > MAX_FIELD:
                raise Invalid(f"must be at most {MAX_FIELD} characters", field=f"{where}.{key}")
            item[key] = value
        for required in ("name", "comparison"):
            if not item[required]:
                raise Invalid("must not be empty", field=f"{where}.{required}")
        if item["name"].lower() in names:
            raise Invalid(f"duplicate principle name {item['name']!r}", field=f"{where}.name")
        names.add(item["name"].lower())
        priority = raw.get("priority", i + 1)
        if not isinstance(priority, int) or isinstance(priority, bool) or not 0 <= priority <= 1000:
            raise Invalid("must be a whole number from 0 to 1000", field=f"{where}.priority")
        item["priority"] = priority
        out.append(item)
    return sorted(out, key=lambda p: p["priority"])


def _default_principles() -> list[dict[str, Any]]:
    """The constitution a new project starts from (default_constitution.toml beside this module: prose is easier
    to read and edit as data), checked as a lead's edit is."""
    with resources.files("app.projects").joinpath("default_constitution.toml").open("rb") as f:
        return clean_principles(tomllib.load(f)["principles"])


DEFAULT_PRINCIPLES: list[dict[str, Any]] = _default_principles()


def find(db: Session, constitution_id: int) -> Constitution | None:
    """One constitution version by its id (a judge run or a revision job names the version it applies), or None."""
    return db.get(Constitution, constitution_id)


def current(db: Session, project: Project) -> Constitution | None:
    return versions.current(db, project, Constitution)


def create_version(db: Session, project: Project, author: User, *, principles: list[dict[str, Any]],
                   base_version: int | None, note: str = "", check_permission: bool = True) -> Constitution:

    if check_permission:
        permissions.require(db, author, project, "constitution.edit")
    return versions.save(db, project, author, Constitution, base_version=base_version,
                         principles=clean_principles(principles), note=note.strip()[:500])


def ensure_default(db: Session, project: Project, author: User) -> Constitution:
    """The project's current constitution, creating version 1 from the default principles if it has none."""
    existing = current(db, project)
    if existing is not None:
        return existing
    return create_version(db, project, author, principles=DEFAULT_PRINCIPLES, base_version=None,
                          note="default helpful / honest / harmless constitution", check_permission=False)


def list_versions(db: Session, project: Project) -> list[Constitution]:
    return versions.list_versions(db, project, Constitution)


def get_version(db: Session, project: Project, version: int, *, field: str | None = None) -> Constitution:
    return versions.get_version(db, project, Constitution, version, field=field)


def as_lines(constitution: Constitution | None) -> list[str]:
    """The constitution as text lines, for the history diff."""
    if constitution is None:
        return []
    lines: list[str] = []
    for p in constitution.principles:
        lines += [f"## {p['name']} (priority {p['priority']})", f"rationale: {p['rationale']}",
                  f"comparison: {p['comparison']}", f"critique: {p['critique']}", f"revision: {p['revision']}", ""]
    return lines
