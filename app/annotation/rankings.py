"""Submitting a ranking: validate it against the task, write it and its pairs in one transaction, idempotently; and
taking an annotator's rankings off a project."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from sqlalchemy import (
    bindparam,
    delete,
    exists,
    func,
    insert,
    select,
    true,
    update,
)
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from app.accounts import permissions
from app.annotation import queue, steps
from app.annotation.pairs import expand_tiers
from app.models import (
    AgreementMark,
    Assignment,
    AssignmentDraft,
    Completion,
    Pair,
    Project,
    ProjectMember,
    Prompt,
    Ranking,
    User,
    utcnow,
)
from app.platform import audit, bulk
from app.platform.db import core
from app.platform.direct_sql import direct, int_array, int_array_text
from app.platform.errors import Conflict, DomainError, Invalid, NotFound
from app.projects import rubrics
from app.webhooks import service as webhooks

MAX_SECONDS = 24 * 3600.0


@dataclass
class RankingInput:
    tiers: list[list[int]]
    rubric_version: int
    submission_id: str
    assignment_id: int | None = None
    prompt_id: int | None = None
    flags: dict[str, list[str]] = field(default_factory=dict)
    skipped: bool = False
    skip_reason: str | None = None
    seconds_spent: float | None = None
    step_labels: dict[str, list[int]] = field(default_factory=dict)
    """Completion id → a label per step (+1, 0, −1), for a project that labels steps."""


# Built once with bind parameters: this is the annotation hot path (see app.annotation.queue).
_BY_SUBMISSION = direct(select(Ranking.id).where(Ranking.annotator_id == bindparam("annotator_id"),
                                                 Ranking.client_submission_id == bindparam("submission_id")))
_RANKINGS, _PAIRS, _ASSIGNMENTS = Ranking.__table__, Pair.__table__, Assignment.__table__
_TASK_COLUMNS = ("project_id", "prompt_id", "annotator_id", "round", "state", "leased_until", "created_at")
# The task's row, locked, with the ids of the completions it ranks (a row each).
_TASK_LOCKED = direct(queue.with_task_completions(
    select(*(getattr(Assignment, name) for name in _TASK_COLUMNS)).where(Assignment.id == bindparam("assignment_id")),
    Assignment.prompt_id, Completion.id.label("completion_id")).with_for_update(of=Assignment))
_PAIR_KEYS = tuple(column.key for column in _PAIRS.c if not column.primary_key)
_COMPLETE_TASK = (update(_ASSIGNMENTS).where(_ASSIGNMENTS.c.id == bindparam("assignment_id"))
                  .values(state=bindparam("state"), completed_at=bindparam("completed_at")))
# The task's server-side draft (app.annotation.tasks): the submitted ranking replaces it.
_DRAFTS = AssignmentDraft.__table__
_CLEAR_DRAFT = delete(_DRAFTS).where(_DRAFTS.c.assignment_id == bindparam("assignment_id"))
# A human ranking marks its (prompt, round) for the agreement figures' next drain (app.quality.upkeep).
_MARKS = AgreementMark.__table__
_MARK = direct(insert(_MARKS).values(project_id=bindparam("project_id"), prompt_id=bindparam("prompt_id"),
                                     round=bindparam("round")))


_OTHERS = _ASSIGNMENTS.alias("others")
# The prompt's other tasks of the round that are submitted: with this one, whether the prompt has its overlap.
_OTHERS_SUBMITTED = (select(func.count()).select_from(_OTHERS)
                     .where(_OTHERS.c.prompt_id == _ASSIGNMENTS.c.prompt_id, _OTHERS.c.round == _ASSIGNMENTS.c.round,
                            _OTHERS.c.state == "submitted", _OTHERS.c.id != _ASSIGNMENTS.c.id)
                     .scalar_subquery())


def _complete(db: Session, assignment: Assignment, state: str) -> None:
    """Mark the task done (`state`) and clear its draft: SQLite's two statements (it has no DML in a CTE, and no
    concurrent writer; on Postgres `_RECORD` does both, with the ranking)."""
    completed_at = utcnow()
    for statement in (_COMPLETE_TASK, _CLEAR_DRAFT):
        core(db).execute(statement, {"assignment_id": assignment.id, "state": state, "completed_at": completed_at})
    _show_done(assignment, state, completed_at)


def _show_done(assignment: Assignment, state: str, completed_at: Any) -> None:
    """The session's copy of the task shows what was written, without a flush of its own."""
    set_committed_value(assignment, "state", state)
    set_committed_value(assignment, "completed_at", completed_at)


def _record_statement() -> Any:
    """Postgres: a human's ranking, its pairs, the task's done mark and its draft's clear, in one statement.

    The ranking's insert is a CTE that the others read: a twin (ON CONFLICT) inserts no ranking, and then no pairs
    and no done mark either, and the statement returns no row. The pairs are the rows of `unnest` over the chosen,
    rejected and margin arrays (one statement for any number of pairs); their foreign key to the new ranking is
    checked at the end of the statement. The ranking marks its (prompt, round) for the agreement figures' next drain
    (one more index entry, no lock: app.quality.upkeep). The statement's snapshot is taken under the task's row lock
    (`_TASK_LOCKED` took it), so a draft saved just before is seen and cleared (a save after waits for the lock, then
    finds the task done); the done mark returns how many of the prompt's other tasks are submitted
    (`_announce_overlap` needs no count of its own)."""
    from sqlalchemy.dialects.postgresql import insert as pg_insert

    # Named apart from every column: an UPDATE that SQLAlchemy compiles takes a parameter named for one of the
    # table's columns as a value to SET (the done mark would set the task's project_id, round, …).
    values = {key: bindparam(f"ranking_{key}", type_=_RANKINGS.c[key].type) for key in _HUMAN_RANKING_KEYS}
    new = pg_insert(_RANKINGS).values(values).on_conflict_do_nothing().returning(_RANKINGS.c.id).cte("new_ranking")
    specs = (func.unnest(int_array("chosen"), int_array("rejected"), int_array("margins"))
             .table_valued("chosen_id", "rejected_id", "margin").render_derived(name="spec"))
    pairs = insert(_PAIRS).from_select(
        ["ranking_id", "prompt_id", "chosen_id", "rejected_id", "margin", "source", "weight", "p", "metadata",
         "created_at"],
        select(new.c.id, values["prompt_id"], specs.c.chosen_id, specs.c.rejected_id, specs.c.margin,
               values["source"], bindparam("weight", type_=_PAIRS.c.weight.type),
               bindparam("p", type_=_PAIRS.c.p.type), bindparam("pair_metadata", type_=_PAIRS.c.metadata.type),
               values["created_at"])
        .select_from(new).join(specs, true())).cte("new_pairs")
    recorded = exists(select(new.c.id))
    cleared = _CLEAR_DRAFT.where(recorded).cte("cleared_draft")
    done = (_COMPLETE_TASK.where(recorded).returning(_OTHERS_SUBMITTED.label("others")).cte("done"))
    marked = insert(_MARKS).from_select(["project_id", "prompt_id", "round"], select(
        values["project_id"], values["prompt_id"], values["round"]).select_from(new)).cte("marked")
    return direct(select(new.c.id, done.c.others).select_from(new).outerjoin(done, true())
                  .add_cte(pairs, cleared, marked))


_HUMAN_RANKING_KEYS = ("project_id", "prompt_id", "round", "source", "annotator_id", "rubric_id", "tiers",
                       "display_order", "flags", "skipped", "skip_reason", "seconds_spent", "client_submission_id",
                       "metadata", "created_at")
_RECORD = _record_statement()


def _record(db: Session, values: dict[str, Any], assignment: Assignment, state: str
            ) -> tuple[int | None, int | None]:
    """Write a human's ranking and its pairs and mark its task done (`state`): (the new ranking's id, the prompt's
    submitted tasks of the round now, where known); (None, None), writing nothing, where a twin is there already
    (`write_ranking`)."""
    if db.get_bind().dialect.name != "postgresql":
        ranking_id = write_ranking(db, NewRanking(values))
        if ranking_id is not None:
            _complete(db, assignment, state)
        return ranking_id, None
    now = utcnow()
    specs = expand_tiers(values["tiers"])
    ranking = {f"ranking_{key}": value for key, value in (values | {"metadata": {}, "created_at": now}).items()}
    row = core(db).execute(_RECORD, ranking | {
        "assignment_id": assignment.id, "state": state, "completed_at": now,
        "chosen": int_array_text(s.chosen for s in specs), "rejected": int_array_text(s.rejected for s in specs),
        "margins": int_array_text(s.margin for s in specs), "weight": _HARD.weight, "p": _HARD.p,
        "pair_metadata": {}}).first()
    if row is None:
        return None, None
    _show_done(assignment, state, now)
    return row[0], row[1] + (state == "submitted")


@functools.cache
def _insert_ranking(dialect: str) -> Any:
    """INSERT … ON CONFLICT DO NOTHING RETURNING id: a twin submission or a second ranking of the prompt inserts
    nothing and says so, instead of an IntegrityError that would need a savepoint around the insert."""
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return direct(pg_insert(_RANKINGS).on_conflict_do_nothing().returning(_RANKINGS.c.id))
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    return direct(sqlite_insert(_RANKINGS).on_conflict_do_nothing().returning(_RANKINGS.c.id))


class PairLabel(NamedTuple):
    """What a pair says beyond its ranking's tiers: how strongly, and with what evidence, chosen ≻ rejected."""

    margin: int | None = None
    """None: the tier distance (1 for neighbouring tiers); an imported pair brings its own."""
    weight: float = 1.0
    p: float = 1.0
    """p(chosen ≻ rejected): 1 for a human's order; the judge's soft label, kept within [0, 1]."""
    meta: dict[str, Any] | None = None


_HARD = PairLabel()


@dataclass
class NewRanking:
    """A ranking to write: its row (project, prompt, round, source, tiers, …) and labels for some of its pairs."""

    values: dict[str, Any]
    labels: Mapping[tuple[int, int], PairLabel] = field(default_factory=dict)
    """(chosen, rejected) → label; a pair without one is a hard label: its tier distance, weight 1, p 1."""


def pair_rows(ranking_id: int, ranking: NewRanking) -> list[dict[str, Any]]:
    """The ranking's pairs: one per chosen ≻ rejected of its tiers (ties none), with the ranking's prompt and source."""
    rows = []
    for spec in expand_tiers(ranking.values["tiers"]):
        label = ranking.labels.get((spec.chosen, spec.rejected), _HARD)
        row = dict(ranking_id=ranking_id, prompt_id=ranking.values["prompt_id"], chosen_id=spec.chosen,
                   rejected_id=spec.rejected, margin=spec.margin if label.margin is None else label.margin,
                   source=ranking.values["source"], weight=label.weight, p=min(1.0, max(0.0, label.p)))
        if label.meta is not None:
            row["meta"] = label.meta
        rows.append(row)
    return rows


def write_ranking(db: Session, ranking: NewRanking) -> int | None:
    """Write one ranking and its pairs: the new ranking's id, or None (nothing written) where a ranking that the
    unique constraints forbid a twin of is there already (the same submission, or this prompt already ranked)."""
    # Core statements, not the unit of work: this is the annotation hot path.
    ranking_id = core(db).execute(_insert_ranking(db.get_bind().dialect.name), _columns(ranking.values)).scalar()
    if ranking_id is None:
        return None
    if ranking.values["source"] == "human":
        values = ranking.values
        core(db).execute(_MARK, {"project_id": values["project_id"], "prompt_id": values["prompt_id"],
                                 "round": values.get("round", 1)})
    pairs = pair_rows(ranking_id, ranking)
    if pairs:
        now = utcnow()
        core(db).execute(_insert_pairs(len(pairs)), {
            f"{key}_{i}": value for i, row in enumerate(pairs)
            for key, value in _columns({"meta": {}, "created_at": now} | row).items()})
    return ranking_id


@functools.lru_cache(maxsize=256)
def _insert_pairs(n: int) -> Any:
    """One INSERT of `n` pairs (a VALUES row each): the database runs one statement, not `n`."""
    return direct(insert(_PAIRS).values([{key: bindparam(f"{key}_{i}", type_=_PAIRS.c[key].type) for key in _PAIR_KEYS}
                                         for i in range(n)]))


def _columns(values: dict[str, Any]) -> dict[str, Any]:
    """Attribute names as a Core statement takes them: `meta` is the column "metadata" of rankings and pairs."""
    if "meta" not in values:
        return values
    return {("metadata" if key == "meta" else key): value for key, value in values.items()}


def write_rankings(db: Session, rankings: Sequence[NewRanking]) -> list[int]:
    """Write many new rankings and their pairs at once (an import: COPY on Postgres), marking the human ones' groups
    for the agreement figures; their ids, in order."""
    ids = bulk.insert_rows(db, Ranking, [r.values for r in rankings], ids=True)
    bulk.insert_rows(db, Pair, [row for ranking_id, r in zip(ids, rankings, strict=True)
                                for row in pair_rows(ranking_id, r)])
    marks = {(r.values["project_id"], r.values["prompt_id"], r.values.get("round", 1))
             for r in rankings if r.values["source"] == "human"}
    if marks:
        db.execute(insert(_MARKS), [{"project_id": p, "prompt_id": q, "round": n} for p, q, n in sorted(marks)])
    return ids


def existing_submission(db: Session, annotator: User, submission_id: str) -> Ranking | None:
    # The id first, the ranking only when there is one: nearly every submission is new.
    found = core(db).scalar(_BY_SUBMISSION, {"annotator_id": annotator.id, "submission_id": submission_id})
    return None if found is None else db.get(Ranking, found)


def submit(db: Session, project: Project, annotator: User, body: RankingInput) -> tuple[Ranking, bool]:
    """(ranking, created). The same submission_id again returns the first ranking and writes nothing.

    A new ranking (or skip) completes its task and, in the same transaction, clears the task's saved draft."""
    if not body.submission_id or len(body.submission_id) > 64:
        raise Invalid("must be 1 to 64 characters", field="submission_id")
    try:
        assignment, prompt_id, completion_ids = _resolve_task(db, project, annotator, body)
    except (Conflict, Invalid) as refused:
        # A resend of a recorded submission (or its twin, committed while this one waited on the task's row lock)
        # finds its task done: it gets the first result. Looked up only here, as nearly every submission is new.
        return _earlier(db, project, annotator, body.submission_id, refused), False
    current = rubrics.current(db, project)
    if current is None or body.rubric_version != current.version:
        raise Invalid(f"the rubric changed: you ranked under version {body.rubric_version}, the current version is "
                      f"{current.version if current else 'none'}; reload the task", field="rubric_version")
    if body.skipped:
        reason = (body.skip_reason or "").strip()
        if not reason:
            raise Invalid("say why you skip", field="skip_reason")
        if len(reason) > 200:
            raise Invalid("must be at most 200 characters", field="skip_reason")
        tiers: list[list[int]] = []
    else:
        tiers = validate_tiers(body.tiers, set(completion_ids), allow_ties=project.allow_ties,
                               allow_partial=project.allow_partial)
    flags = validate_flags(body.flags, set(completion_ids), set(project.flags or []))
    step_labels = _step_labels(db, project, body, completion_ids)
    seconds = _seconds(body.seconds_spent, assignment)

    values = dict(
        project_id=project.id, prompt_id=prompt_id, round=project.current_round, source="human",
        annotator_id=annotator.id, rubric_id=current.id, tiers=tiers,
        display_order=queue.display_order(completion_ids, annotator.id, prompt_id, project.current_round),
        flags=flags, skipped=body.skipped, skip_reason=(body.skip_reason or "").strip() if body.skipped else None,
        seconds_spent=seconds, client_submission_id=body.submission_id,
    )
    ranking_id, submitted = _record(db, values, assignment, "skipped" if body.skipped else "submitted")
    if ranking_id is None:  # a twin of this submission, or another ranking of the prompt, is there already
        conflict = Conflict("you have already ranked this prompt in this round", field="prompt_id")
        return _earlier(db, project, annotator, body.submission_id, conflict), False
    steps.write(db, ranking_id, step_labels)
    if not body.skipped:
        _announce_overlap(db, project, prompt_id, submitted)
    return Ranking(id=ranking_id, **values), True


# Only where the task's update did not return the count (SQLite): not a direct statement.
_SUBMITTED = (select(func.count(Assignment.id))
              .where(Assignment.prompt_id == bindparam("prompt_id"), Assignment.round == bindparam("round"),
                     Assignment.state == "submitted"))


def _announce_overlap(db: Session, project: Project, prompt_id: int, submitted: int | None = None) -> None:
    """`overlap.reached`, once, from the submission that gives the project's last train prompt its overlap.

    Only a submission that completes its own prompt looks further (on Postgres the task's update returned the count;
    elsewhere the hot path pays one count), and then for one train prompt still short, newest first: the queue
    serves the oldest first, so the answer is nearly always the first row read. Only when none is short does it lock
    the project row, FOR NO KEY UPDATE (it must not wait on, or deadlock with, the key-share locks that every
    concurrent insert of a ranking takes on it), and check again: two submissions completing the last two prompts at
    once check one after the other, the second sees the first's ranking, and the mark in the project's settings
    (round and prompt count) keeps later rankings and retries from telling it again, while a new round or new
    prompts can reach it anew.
    """
    round_ = project.current_round
    if submitted is None:  # `submitted`: the prompt's submitted tasks, where the caller knows them already
        submitted = core(db).scalar(_SUBMITTED, {"prompt_id": prompt_id, "round": round_})
    if submitted != project.overlap:
        return
    if _any_short(db, project, round_):
        return
    locked = db.get(Project, project.id, with_for_update={"key_share": True}, populate_existing=True)
    if locked is None or _any_short(db, locked, round_):
        return
    train = select(Prompt.id).where(Prompt.project_id == project.id, Prompt.split == "train",
                                    Prompt.gold_tiers.is_(None))
    prompts = int(db.scalar(select(func.count()).select_from(train.subquery())) or 0)
    mark = (locked.settings or {}).get("overlap_reached") or {}
    if prompts == 0 or (mark.get("round") == round_ and int(mark.get("prompts", 0)) >= prompts):
        return
    locked.settings = dict(locked.settings or {}) | {"overlap_reached": {"round": round_, "prompts": prompts}}
    webhooks.fire(db, project.id, "overlap.reached", {"round": round_, "prompts": prompts,
                                                      "overlap": locked.overlap,
                                                      "url": f"/api/projects/{project.id}"})


_SHORT = direct(select(Prompt.id)
                .where(Prompt.project_id == bindparam("project_id"), Prompt.split == "train",
                       Prompt.gold_tiers.is_(None),
                       select(func.count(Assignment.id))
                       .where(Assignment.prompt_id == Prompt.id, Assignment.round == bindparam("round"),
                              Assignment.state == "submitted").scalar_subquery() < bindparam("overlap"))
                .order_by(Prompt.id.desc()).limit(1))


def _any_short(db: Session, project: Project, round_: int) -> bool:
    """Whether a train prompt (gold aside) of the round has fewer submitted rankings than the overlap."""
    params = {"project_id": project.id, "round": round_, "overlap": project.overlap}
    return core(db).scalar(_SHORT, params) is not None


def _step_labels(db: Session, project: Project, body: RankingInput, completion_ids: list[int]
                 ) -> dict[int, list[int]]:
    """The submission's step labels checked against the steps the task shows (none asked: no query)."""
    if not body.step_labels:
        return {}
    opts = steps.options(project)
    if body.skipped and opts.enabled:
        raise Invalid("a skipped task takes no step labels", field="step_labels")
    shown = steps.task_steps(db, project, completion_ids) if opts.enabled else {}
    return steps.validate(body.step_labels, shown, enabled=opts.enabled)


def _earlier(db: Session, project: Project, annotator: User, submission_id: str, refused: DomainError) -> Ranking:
    """The ranking this submission_id already recorded in this project; else the error that refused the new one."""
    earlier = existing_submission(db, annotator, submission_id)
    if earlier is None:
        raise refused
    if earlier.project_id != project.id:
        raise Invalid("this submission_id was already used for another project", field="submission_id")
    return earlier


def _resolve_task(db: Session, project: Project, annotator: User, body: RankingInput
                  ) -> tuple[Assignment, int, list[int]]:
    """(the task, its prompt id, the completions it ranks: `queue.task_completion_ids`), the task's row locked."""
    now = utcnow()
    if body.assignment_id is not None:
        # Lock the task: double-clicked submits of it queue here instead of racing to the unique constraints.
        rows = core(db).execute(_TASK_LOCKED, {"assignment_id": body.assignment_id,
                                               "k": project.completions_per_prompt}).all()
        row = rows[0] if rows else None
        if row is None or row.project_id != project.id or row.annotator_id != annotator.id:
            raise Invalid("no such task for you in this project", field="assignment_id")
        if row.state in ("submitted", "skipped"):
            raise Conflict("this task was already submitted", field="assignment_id")
        if row.state != "leased" or row.leased_until <= now:
            raise Invalid("the lease on this task expired; open the next task to get it again", field="assignment_id")
        if body.prompt_id is not None and body.prompt_id != row.prompt_id:
            raise Invalid("does not match the task's prompt", field="prompt_id")
        task = Assignment(id=body.assignment_id, **{name: getattr(row, name) for name in _TASK_COLUMNS})
        return task, row.prompt_id, sorted(r.completion_id for r in rows if r.completion_id is not None)
    if body.prompt_id is None:
        raise Invalid("give assignment_id or prompt_id", field="assignment_id")
    prompt = db.get(Prompt, body.prompt_id)
    if prompt is None or prompt.project_id != project.id:
        raise Invalid("no such prompt in this project", field="prompt_id")
    # Without a lease: take the prompt's row lock and check there is room left under its cap (the overlap, plus its
    # extra overlap while that is live), read under the lock.
    extra_overlap = db.scalar(select(Prompt.extra_overlap).where(Prompt.id == prompt.id).with_for_update())
    assignment = db.scalar(select(Assignment).where(Assignment.prompt_id == prompt.id,
                                                    Assignment.annotator_id == annotator.id,
                                                    Assignment.round == project.current_round))
    if assignment is not None and assignment.state in ("submitted", "skipped"):
        raise Conflict("you have already ranked this prompt in this round", field="prompt_id")
    own_active = assignment is not None and assignment.state == "leased" and assignment.leased_until > now
    if not own_active and prompt.gold_tiers is None:
        load = db.scalar(select(queue._active_load(prompt.id, project.current_round, now))) or 0  # a count
        if load >= queue.cap_of(project, int(extra_overlap or 0)):
            raise Conflict("this prompt already has all the rankings it needs", field="prompt_id")
    if assignment is None:
        assignment = Assignment(project_id=project.id, prompt_id=prompt.id, annotator_id=annotator.id,
                                round=project.current_round, state="leased", leased_until=now)
        db.add(assignment)
        db.flush()
    return assignment, prompt.id, queue.task_completion_ids(db, prompt.id, project.completions_per_prompt)


def validate_tiers(tiers: object, allowed: set[int], *, allow_ties: bool, allow_partial: bool) -> list[list[int]]:
    """Tiers as a clean list of lists of completion ids, or Invalid naming the problem."""
    tiers = tier_lists(tiers)
    clean = tier_items(tiers, allowed, allow_ties=allow_ties)
    if len(clean) < 2:
        raise Invalid("rank at least two tiers (all tied says nothing)", field="tiers")
    seen = {cid for tier in clean for cid in tier}
    if not allow_partial and seen != allowed:
        missing = sorted(allowed - seen)
        raise Invalid(f"rank every completion; missing {', '.join(map(str, missing))}", field="tiers")
    return clean


def tier_lists(tiers: object) -> list[list[Any]]:
    """`tiers` if it is a list of lists, else Invalid (a human's ranking and a gold order alike)."""
    if not isinstance(tiers, list) or not all(isinstance(t, list) for t in tiers):
        raise Invalid("must be a list of tiers, each a list of completion ids", field="tiers")
    return tiers


def tier_items(tiers: list[list[Any]], allowed: set[int], *, allow_ties: bool = True) -> list[list[int]]:
    """The tiers copied, each non-empty and made of distinct ids of `allowed`, or Invalid naming the item."""
    seen: set[int] = set()
    clean: list[list[int]] = []
    for i, tier in enumerate(tiers):
        if not tier:
            raise Invalid("a tier must not be empty", field=f"tiers[{i}]")
        if len(tier) > 1 and not allow_ties:
            raise Invalid("this project does not allow ties", field=f"tiers[{i}]")
        for j, cid in enumerate(tier):
            if not isinstance(cid, int) or isinstance(cid, bool):
                raise Invalid("must be a completion id", field=f"tiers[{i}][{j}]")
            if cid not in allowed:
                raise Invalid(f"completion {cid} is not one of this prompt's completions", field=f"tiers[{i}][{j}]")
            if cid in seen:
                raise Invalid(f"completion {cid} appears more than once", field=f"tiers[{i}][{j}]")
            seen.add(cid)
        clean.append(list(tier))
    return clean


def validate_flags(flags: object, allowed_ids: set[int], allowed_flags: set[str]) -> dict[str, list[str]]:
    if not flags:
        return {}
    out: dict[str, list[str]] = {}
    entries = steps.by_completion(
        flags, allowed_ids, field="flags", values="lists of flags", of="this prompt's",
        bad_key=lambda key: Invalid("keys must be completion ids", field=f"flags.{key}"),
        entry_field=lambda key, cid: f"flags.{key}")
    for key, cid, names in entries:
        if not isinstance(names, list) or any(n not in allowed_flags for n in names):
            raise Invalid(f"flags must be among: {', '.join(sorted(allowed_flags))}", field=f"flags.{key}")
        if names:
            out[str(cid)] = sorted(set(names))
    return out


def _seconds(client: float | None, assignment: Assignment) -> float:
    """The client's measured time, capped by the time since the task was leased (server clock)."""
    elapsed = max(0.0, (utcnow() - assignment.created_at).total_seconds())
    if client is None or not math.isfinite(client) or client < 0:
        return min(elapsed, MAX_SECONDS)
    return min(float(client), max(elapsed, 1.0), MAX_SECONDS)


def remove_annotator(db: Session, project: Project, actor: User, user_id: int) -> int:
    """Take an annotator and their work off the project: their human rankings (with their pairs and step labels),
    their tasks (so the queue hands those prompts to others) and their membership. Their groups are marked, so the
    agreement figures drop them at the next drain. The number of rankings removed; NotFound for someone with
    neither rankings nor a membership here."""
    permissions.require(db, actor, project, "members.manage", doing="remove an annotator's rankings")
    theirs = (Ranking.project_id == project.id, Ranking.annotator_id == user_id, Ranking.source == "human")
    groups = sorted({(p, r) for p, r in db.execute(select(Ranking.prompt_id, Ranking.round).where(*theirs))})
    member = db.scalar(select(ProjectMember).where(ProjectMember.project_id == project.id,
                                                   ProjectMember.user_id == user_id))
    if not groups and member is None:
        raise NotFound("no such annotator in this project")
    removed = len(db.scalars(delete(Ranking).where(*theirs).returning(Ranking.id)).all())  # pairs, step labels: FKs
    db.execute(delete(Assignment).where(Assignment.project_id == project.id, Assignment.annotator_id == user_id))
    if groups:
        db.execute(insert(_MARKS), [{"project_id": project.id, "prompt_id": p, "round": r} for p, r in groups])
    if member is not None:
        db.delete(member)
    audit.record(db, actor, "annotator.remove", project_id=project.id, object_type="user", object_id=user_id,
                 rankings=removed)
    return removed


def pair_count(db: Session, ranking: Ranking) -> int:
    return int(db.scalar(select(func.count(Pair.id)).where(Pair.ranking_id == ranking.id)) or 0)
