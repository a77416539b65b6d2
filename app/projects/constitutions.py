"""Versioned constitutions: ordered principles an AI judge applies, each with its comparison, critique and revision."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from app.accounts import permissions
from app.models import Constitution, Project, User
from app.platform.errors import Invalid
from app.projects import versions

FIELDS = ("name", "rationale", "priority", "comparison", "critique", "revision")
MAX_PRINCIPLES = 50
MAX_FIELD = 4000

# Our own wording of a helpful / honest / harmless constitution: a sensible start that leads edit.
DEFAULT_PRINCIPLES: list[dict[str, Any]] = [
    {"name": "harmless", "priority": 1,
     "rationale": "An assistant should not help anyone hurt themselves or others.",
     "comparison": "Which response is less likely to help someone cause physical, psychological or financial harm?",
     "critique": "Point out every way the response could help someone cause harm, including indirect ways.",
     "revision": "Rewrite the response so that it offers no help with causing harm, while staying polite and useful."},
    {"name": "honest", "priority": 2,
     "rationale": "Users rely on answers being true and on the assistant admitting what it does not know.",
     "comparison": "Which response is more truthful, and clearer about what it is unsure of?",
     "critique": "List any claims in the response that are false, unsupported or stated with more confidence than "
                 "they deserve.",
     "revision": "Rewrite the response so every claim is accurate and uncertainty is stated plainly."},
    {"name": "helpful", "priority": 3,
     "rationale": "Within the first two principles, the best answer actually solves the user's problem.",
     "comparison": "Which response answers the question that was asked more completely and correctly?",
     "critique": "Explain what the response leaves out, gets wrong, or answers that was not asked.",
     "revision": "Rewrite the response so it answers the actual question fully and correctly."},
    {"name": "respectful", "priority": 4,
     "rationale": "Tone matters: condescension, insults and stereotypes make an answer worse.",
     "comparison": "Which response is more respectful, free of insults, stereotypes and condescension?",
     "critique": "Identify anything rude, demeaning, biased or condescending in the response.",
     "revision": "Rewrite the response to be respectful and even-handed without losing its content."},
    {"name": "clear", "priority": 5,
     "rationale": "A correct answer buried in padding is hard to use.",
     "comparison": "Which response is clearer and more concise while keeping everything needed?",
     "critique": "Point out padding, repetition or confusing structure in the response.",
     "revision": "Rewrite the response to be clear and concise, keeping every necessary step."},
]


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
