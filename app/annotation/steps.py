"""Process supervision: a project's step option, completions split into steps, and the step labels of a ranking.

A project that labels steps splits each completion into steps when it enters the project (import, sampling, a
revision) and stores them on the completion; annotators then label every step +1 correct, 0 neutral or −1 wrong
(PRM800K), or stop at the first wrong one. A completion keeps the steps it was labelled on: changing the separator
re-splits only completions nobody has labelled a step of yet.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Container, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, exists, insert, select, update
from sqlalchemy.orm import Session

from app.accounts import permissions
from app.models import STEP_VALUES, Completion, Project, Prompt, StepLabel, User
from app.platform import audit
from app.platform.errors import Invalid

MAX_STEPS = 100
"""At most this many steps per completion: the rest of a longer one is kept, joined, as its last step."""
MAX_SEPARATOR_CHARS = 200
LINES = None
"""The default separator: one step per non-empty line."""

_STEPS = select(Completion.id, Completion.text, Completion.steps).where(Completion.id.in_(bindparam("ids",
                                                                                                   expanding=True)))
_SET_STEPS = (update(Completion.__table__).where(Completion.__table__.c.id == bindparam("cid"))
              .values(steps=bindparam("new_steps")))
_INSERT_LABELS = insert(StepLabel.__table__)


@dataclass(frozen=True)
class StepOptions:
    enabled: bool = False
    """Annotators label each step of each completion besides ranking them."""
    separator: str | None = LINES
    """A regular expression that ends a step; None: one step per non-empty line."""

    def as_dict(self) -> dict[str, Any]:
        return {"step_labels": self.enabled, "step_separator": self.separator}


def options(project: Project) -> StepOptions:
    settings = project.settings or {}
    return StepOptions(bool(settings.get("step_labels", False)), settings.get("step_separator") or LINES)


def check_separator(separator: str | None) -> str | None:
    """The separator as stored (None for lines), or Invalid naming `step_separator`."""
    if separator is None or not separator.strip():
        return LINES
    if len(separator) > MAX_SEPARATOR_CHARS:
        raise Invalid(f"must be at most {MAX_SEPARATOR_CHARS} characters", field="step_separator")
    try:
        pattern = re.compile(separator)
    except re.error as exc:
        raise Invalid(f"is not a valid regular expression: {exc}", field="step_separator") from None
    if pattern.fullmatch(""):
        raise Invalid("must not match the empty string (it would split between every character)",
                      field="step_separator")
    return separator


def split(text: str, separator: str | None = LINES) -> list[str]:
    """The steps of `text`: its non-empty lines, or the non-blank pieces between matches of `separator`, each
    stripped; at most MAX_STEPS (the rest joined into the last). A text with no content is one empty step."""
    pieces = text.splitlines() if separator is None else _between(re.compile(separator), text)
    steps = [piece.strip() for piece in pieces if piece.strip()]
    if len(steps) > MAX_STEPS:
        steps = steps[: MAX_STEPS - 1] + ["\n".join(steps[MAX_STEPS - 1:])]
    return steps or [text.strip()]


JOINERS = ("\n", "\n\n", " ", "")
"""Tried in turn to join imported steps into a completion's text that the separator splits back into them."""


def join(steps: list[str], separator: str | None = LINES) -> str:
    """A completion's text made of `steps`: joined so that split() gives the same steps back where any joiner
    does (one per line by default); else by lines. Imported labelled steps are stored as given either way, and
    a labelled completion is never split again."""
    for joiner in JOINERS if separator is not None else ("\n",):
        text = joiner.join(steps)
        if split(text, separator) == steps:
            return text
    return "\n".join(steps)


def _between(pattern: re.Pattern[str], text: str) -> list[str]:
    """The text between matches (groups in the pattern add nothing, unlike re.split)."""
    pieces, start = [], 0
    for match in pattern.finditer(text):  # a lookahead may match empty: "split before each 'Step n:'"
        pieces.append(text[start:match.start()])
        start = match.end()
    return pieces + [text[start:]]


def steps_for(project: Project, text: str) -> list[str] | None:
    """The steps to store with a new completion of `project`: None when the project does not label steps."""
    opts = options(project)
    return split(text, opts.separator) if opts.enabled else None


def set_options(db: Session, project: Project, actor: User, *, enabled: bool, separator: str | None) -> StepOptions:
    """Turn step labels on or off and set the separator; completions without a step label are split (again)."""
    permissions.require(db, actor, project, "steps.configure")
    new = StepOptions(bool(enabled), check_separator(separator))
    old = options(project)
    project.settings = dict(project.settings or {}) | new.as_dict()
    resplit = 0
    if new.enabled and (not old.enabled or new.separator != old.separator):
        resplit = resplit_unlabelled(db, project, new.separator)
    audit.record(db, actor, "steps.configure", project_id=project.id, object_type="project", object_id=project.id,
                 enabled=new.enabled, separator=new.separator, resplit=resplit)
    return new


def resplit_unlabelled(db: Session, project: Project, separator: str | None) -> int:
    """Store fresh steps on the project's completions that have no step label; how many changed. A gold task's
    known step labels count as labels: they name the steps they were given on."""
    labelled = exists().where(StepLabel.completion_id == Completion.id)
    rows = db.execute(select(Completion.id, Completion.text, Completion.steps).join(Prompt)
                      .where(Prompt.project_id == project.id, ~labelled)).all()
    gold = {int(cid) for known in db.scalars(select(Prompt.gold_step_labels).where(
        Prompt.project_id == project.id, Prompt.gold_step_labels.is_not(None))) for cid in known or {}}
    changes = [{"cid": cid, "new_steps": steps} for cid, text, old in rows
               if cid not in gold and (steps := split(text, separator)) != old]
    if changes:
        db.flush()
        db.execute(_SET_STEPS, changes)
    return len(changes)


def task_steps(db: Session, project: Project, completion_ids: Iterable[int]) -> dict[int, list[str]]:
    """Each completion's stored steps; one that entered before the option was on is split now and stored."""
    ids = list(completion_ids)
    if not ids:
        return {}
    separator = options(project).separator
    out: dict[int, list[str]] = {}
    missing = []
    for cid, text, steps in db.execute(_STEPS, {"ids": ids}):
        if steps is None:
            steps = split(text, separator)
            missing.append({"cid": cid, "new_steps": steps})
        out[cid] = list(steps)
    if missing:
        db.execute(_SET_STEPS, missing)
    return out


def _label_list(cid: int, raw: object, n_steps: int, *, draft: bool) -> list[Any]:
    field = f"step_labels.{cid}"
    if not isinstance(raw, list):
        raise Invalid("must be a list of step labels (1, 0 or -1)", field=field)
    allowed = "1, 0, -1 or null" if draft else "1, 0 or -1"
    for i, value in enumerate(raw):
        if draft and value is None:
            continue
        if isinstance(value, bool) or value not in STEP_VALUES:
            raise Invalid(f"step {i + 1} is {value!r}; a step label is {allowed}", field=field)
    if len(raw) > n_steps:
        raise Invalid(f"{len(raw)} labels for {n_steps} steps", field=field)
    if not draft and raw and len(raw) < n_steps and raw[-1] != -1:
        raise Invalid(f"{len(raw)} labels for {n_steps} steps: label every step, or stop at the first wrong one "
                      "(-1)", field=field)
    return list(raw)


def by_completion(raw: object, allowed: Container[int], *, field: str, values: str, of: str,
                  bad_key: Callable[[object], Invalid], entry_field: Callable[[object, int], str]
                  ) -> Iterator[tuple[object, int, Any]]:
    """(key, completion id, value) for each entry of a request field that maps completion ids (JSON keys, so
    strings) to values, each id one of `allowed`; or Invalid: "must map completion ids to <values>" on `field`,
    `bad_key(key)` for a key that is not a number, "completion N is not one of <of> completions" on
    `entry_field(key, N)`. Each caller keeps its own wording and field names."""
    if not isinstance(raw, dict):
        raise Invalid(f"must map completion ids to {values}", field=field)
    for key, value in raw.items():
        try:
            cid = int(key)
        except (TypeError, ValueError):
            raise bad_key(key) from None
        if cid not in allowed:
            raise Invalid(f"completion {cid} is not one of {of} completions", field=entry_field(key, cid))
        yield key, cid, value


def validate(raw: object, steps: Mapping[int, list[str]], *, enabled: bool, draft: bool = False
             ) -> dict[int, list[Any]]:
    """Step labels as {completion id: labels}, checked against the task's steps, or Invalid naming
    `step_labels`. A submitted list covers every step, or stops at the first −1; a draft may hold nulls."""
    if not raw:
        return {}
    if not enabled:
        raise Invalid("this project does not label steps", field="step_labels")
    out: dict[int, list[Any]] = {}
    entries = by_completion(
        raw, steps, field="step_labels", values="lists of step labels", of="this task's",
        bad_key=lambda key: Invalid(f"key {key!r} is not a completion id", field="step_labels"),
        entry_field=lambda key, cid: f"step_labels.{cid}")
    for _, cid, labels in entries:
        clean = _label_list(cid, labels, len(steps[cid]), draft=draft)
        if clean:
            out[cid] = clean
    return out


def write(db: Session, ranking_id: int, labels: Mapping[int, list[int]]) -> int:
    """Insert a ranking's step labels (one row per step); how many."""
    rows = [{"ranking_id": ranking_id, "completion_id": cid, "step_index": i, "label": label}
            for cid, values in labels.items() for i, label in enumerate(values)]
    if rows:
        db.execute(_INSERT_LABELS, rows)
    return len(rows)


def of_ranking(db: Session, ranking_id: int) -> dict[int, list[int]]:
    """A ranking's step labels, {completion id: labels in step order}."""
    out: dict[int, list[int]] = {}
    for cid, label in db.execute(select(StepLabel.completion_id, StepLabel.label)
                                 .where(StepLabel.ranking_id == ranking_id)
                                 .order_by(StepLabel.completion_id, StepLabel.step_index)):
        out.setdefault(cid, []).append(label)
    return out


def first_error(labels: list[int]) -> int | None:
    """The index of the first −1 step, or None when no step is wrong."""
    return next((i for i, label in enumerate(labels) if label == -1), None)
