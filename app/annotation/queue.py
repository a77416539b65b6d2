"""The annotation queue: lease a prompt to an annotator without ever exceeding its overlap.

Over-assignment is prevented by the database, not by this process: on Postgres the candidate prompt row is
locked with `FOR UPDATE SKIP LOCKED` (concurrent callers move on to the next prompt) and its load is
re-counted under the lock; on SQLite every transaction starts with `BEGIN IMMEDIATE` (see app.platform.db), so
writers are serialised. A prompt's cap is the project's overlap, plus its `extra_overlap` while the project's
`disagreement` extras are live for the current round (`extra_on`).
"""

from __future__ import annotations

import functools
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import (
    ARRAY,
    BindParameter,
    Integer,
    Select,
    and_,
    any_,
    bindparam,
    cast,
    delete,
    exists,
    func,
    insert,
    literal,
    or_,
    select,
    update,
)
from sqlalchemy.orm import Session

from app.models import Assignment, AssignmentDraft, Completion, Project, Prompt, Ranking, User, utcnow
from app.platform.db import core
from app.platform.direct_sql import direct, int_array, int_array_text
from app.platform.errors import NotFound

GOLD_RATE_DEFAULT = 0.1
"""Share of tasks drawn from gold prompts, when the annotator has unseen ones."""


def _active_load(prompt_id, round_, now):
    """Assignments that occupy one unit of a prompt's overlap: submitted, or leased and not yet expired."""
    return (
        select(func.count(Assignment.id))
        .where(Assignment.prompt_id == prompt_id, Assignment.round == round_,
               or_(Assignment.state == "submitted",
                   and_(Assignment.state == "leased", Assignment.leased_until > now)))
        .scalar_subquery()
    )


# The hot path's statements are built once with bind parameters: building a SQLAlchemy expression and its cache key
# costs more CPU than the database spends running it. Every one of them takes these parameters by name.
_PROJECT: BindParameter[int]
_ANNOTATOR: BindParameter[int]
_ROUND: BindParameter[int]
_K: BindParameter[int]
_OVERLAP: BindParameter[int]
_FLOOR: BindParameter[int]
_EXTRA: BindParameter[int]
_PROJECT, _ANNOTATOR, _ROUND, _NOW = (bindparam("project_id"), bindparam("annotator_id"), bindparam("round"),
                                      bindparam("now", type_=Assignment.leased_until.type))
_K, _OVERLAP, _FLOOR, _EXTRA = bindparam("k"), bindparam("overlap"), bindparam("floor"), bindparam("extra")
# Bound as Postgres's text form of an int array, made once per window (see `_array_literal`).
_WINDOW = int_array("window")


def extra_on(project: Project) -> bool:
    """Whether the prompts' `extra_overlap` counts: the project is on `disagreement` and its last priorities job gave
    extras for the current round (a new round, or another selection, caps every prompt at the overlap again)."""
    settings = project.settings or {}
    extras = settings.get("extra_overlap") or {}
    return (settings.get("selection") == "disagreement" and extras.get("round") == project.current_round
            and bool(extras.get("prompts")))


def cap_of(project: Project, extra_overlap: int) -> int:
    """The rankings a (non-gold) prompt with this `extra_overlap` may hold this round."""
    return project.overlap + (extra_overlap if extra_on(project) else 0)


def _cap():
    """A prompt's cap in SQL: the overlap, plus its extra while extras are live (`extra` = 1, else 0)."""
    return _OVERLAP + Prompt.extra_overlap * _EXTRA


def _params(project: Project, annotator: User, now: datetime, floor: int = 0) -> dict[str, Any]:
    return {"project_id": project.id, "annotator_id": annotator.id, "round": project.current_round, "now": now,
            "k": project.completions_per_prompt, "overlap": project.overlap, "floor": floor,
            "extra": int(extra_on(project))}


ROUTED = "routed"
"""The scan of prompts a judge run routed to humans (`selection.route_to_humans`): negative queue ranks."""


@functools.cache
def _candidates_stmt(gold: bool | None, columns: str = "id", floor: bool = False,
                     lock: str | None = None, by_rank: bool | str = False, window: bool = False
                     ) -> Select[*tuple[Any, ...]]:
    """Prompts the annotator may get next, by id (or, `by_rank`, only prompts with a priority, by `queue_rank`: the
    floor then applies to the rank; `ROUTED`: only the prompts a judge run sent to humans, whose ranks are < 0).
    `columns`: "id", or "lease" (id, the caller's own earlier assignment on it, and its extra overlap); `lock`:
    None, "skip" (FOR UPDATE SKIP LOCKED) or "wait" (FOR UPDATE); `window`: only the prompt ids bound as `window`
    (Postgres: an array)."""
    mine_done = exists().where(Assignment.prompt_id == Prompt.id, Assignment.annotator_id == _ANNOTATOR,
                               Assignment.round == _ROUND, Assignment.state.in_(("submitted", "skipped")))
    ranked = exists().where(Ranking.prompt_id == Prompt.id, Ranking.annotator_id == _ANNOTATOR,
                            Ranking.round == _ROUND)
    if columns == "lease":
        # The caller's own expired or released lease on the candidate, fetched with it (evaluated for one row only).
        mine = (select(Assignment.id).where(Assignment.prompt_id == Prompt.id, Assignment.annotator_id == _ANNOTATOR,
                                            Assignment.round == _ROUND).scalar_subquery())
        query = select(Prompt.id, mine, Prompt.extra_overlap)
    else:
        query = select(Prompt.id)
    query = query.where(Prompt.project_id == _PROJECT, _rankable_count() >= _K, ~mine_done, ~ranked)
    if gold is True:
        # Gold prompts test every annotator, so they are not capped by the overlap.
        query = query.where(Prompt.gold_tiers.is_not(None))
    else:
        if gold is False:
            query = query.where(Prompt.gold_tiers.is_(None))
        query = query.where(or_(Prompt.gold_tiers.is_not(None), _active_load(Prompt.id, _ROUND, _NOW) < _cap()))
    key = Prompt.queue_rank if by_rank else Prompt.id
    if by_rank == ROUTED:
        query = query.where(Prompt.queue_rank < 0)
    elif by_rank:
        query = query.where(Prompt.queue_rank.is_not(None))
    if floor:
        query = query.where(key >= _FLOOR)
    if window:
        # Read through a sub-select, the window's ids are unknown to the planner as in a generic plan: with them
        # a custom plan estimated 28 open prompts among 256 and LIMIT 1 made it look cheaper than the generic one,
        # so Postgres planned this statement anew on every call (0.48 ms, against 0.02 ms to run the cached plan).
        # The CAST makes the sub-select one array value (`ANY (SELECT …)` alone would compare with its rows).
        query = query.where(Prompt.id == any_(cast(select(_WINDOW).scalar_subquery(), ARRAY(Integer))))
    if columns == "lease":
        query = query.order_by(key, Prompt.id).limit(1)
    if lock is not None:
        query = query.with_for_update(of=Prompt, skip_locked=lock == "skip")
    return direct(query)  # cached: one statement per combination of arguments


def _candidates(project: Project, annotator: User, now: datetime, *, gold: bool | None):
    """`_candidates_stmt` with this caller's values bound (for counting what is left)."""
    return _candidates_stmt(gold).params(_params(project, annotator, now))


_OWN_ACTIVE = direct(select(Assignment.id, Assignment.prompt_id, Assignment.leased_until, Assignment.created_at)
                     .where(Assignment.project_id == _PROJECT, Assignment.annotator_id == _ANNOTATOR,
                            Assignment.round == _ROUND, Assignment.state == "leased", Assignment.leased_until > _NOW)
                     .order_by(Assignment.id).limit(1))
_LOAD_NOW = direct(select(_active_load(bindparam("prompt_id"), _ROUND, _NOW)))
_RENEW = direct(update(Assignment).where(Assignment.id == bindparam("assignment_id"))
                .values(state="leased", leased_until=bindparam("until", type_=Assignment.leased_until.type))
                .execution_options(synchronize_session=False))
_ASSIGNMENTS = Assignment.__table__
_LEASE = direct(insert(_ASSIGNMENTS).returning(_ASSIGNMENTS.c.id, _ASSIGNMENTS.c.created_at))
# A new lease, written only while the prompt's load (re-counted by this statement) is under its cap.
_LEASE_IF_ROOM_INSERT = (insert(_ASSIGNMENTS)
                         .from_select(["project_id", "prompt_id", "annotator_id", "round", "state", "leased_until",
                                       "created_at"],
                                      select(_PROJECT, bindparam("prompt_id", type_=Integer), _ANNOTATOR, _ROUND,
                                             literal("leased"), bindparam("until", type_=Assignment.leased_until.type),
                                             _NOW)
                                      .where(_active_load(bindparam("prompt_id"), _ROUND, _NOW) < bindparam("cap"))))
_LEASE_IF_ROOM = direct(_LEASE_IF_ROOM_INSERT.returning(_ASSIGNMENTS.c.id, _ASSIGNMENTS.c.created_at))
_DROP_DRAFT = (delete(AssignmentDraft).where(AssignmentDraft.assignment_id == bindparam("assignment_id"))
               .execution_options(synchronize_session=False))


def _assignment(project: Project, annotator: User, **values: Any) -> Assignment:
    """The session's view of a task written by a Core statement (not added to the session: nothing to flush)."""
    return Assignment(project_id=project.id, annotator_id=annotator.id, round=project.current_round, state="leased",
                      **values)


def _own_active(db: Session, project: Project, annotator: User, now: datetime) -> Assignment | None:
    row = core(db).execute(_OWN_ACTIVE, _params(project, annotator, now)).first()
    return None if row is None else _assignment(project, annotator, id=row.id, prompt_id=row.prompt_id,
                                                leased_until=row.leased_until, created_at=row.created_at)


# Where the scan for a non-gold prompt starts, per (project, round, overlap, by rank, extras live): a prompt id
# below which every prompt was found full. Only a starting point, never a correctness rule: when the scan from it
# finds nothing, the whole project is scanned again, and the floor is recomputed from the start every FLOOR_FULL_S
# seconds, so prompts that reopen below it (expired leases, skips, extra overlap) come back. Without it every
# request walks over all filled prompts. That recompute walks them once (at 1M rankings 100k+ rows: seconds while
# the annotators keep Postgres busy), and one request of the process waits for it, so it is rare: a lease lasts
# minutes, and a prompt that reopens below the floor waits at most FLOOR_FULL_S for its next annotator.
#
# Past the floor, filled prompts still lie between the open ones (a campaign's partly ranked prompts are spread
# over all of it), and every request would walk over them: at 1M rankings tens of thousands of rows, 100+ ms of
# Postgres per task. So on Postgres the by-id scan also keeps a window, read with the floor: the first WINDOW
# prompt ids from the floor that had room. A request looks among them first (index probes, under a millisecond)
# and walks from the floor only when none suits it. Also only a starting point: every candidate is checked again
# in full, and under its row lock.
FLOOR_STEP_S = 0.5
FLOOR_FULL_S = 30.0
WINDOW = 256
_floors: dict[tuple[int, int, int, bool, bool], tuple[int, float, float, tuple[int, ...]]] = {}
_floors_lock = threading.Lock()


def _floor_scan(key: Any, limit: int = 1) -> Select[*tuple[Any, ...]]:
    return (select(key).where(Prompt.project_id == _PROJECT, key >= _FLOOR, Prompt.gold_tiers.is_(None),
                              _active_load(Prompt.id, _ROUND, _NOW) < _cap())
            .order_by(key).limit(limit))


_FLOOR_SCAN = direct(_floor_scan(Prompt.id))
_WINDOW_SCAN = direct(_floor_scan(Prompt.id, WINDOW))
_RANK_FLOOR_SCAN = direct(_floor_scan(Prompt.queue_rank))  # NULL ranks fail `>= floor`: only prioritised prompts


def _scan_floor(db: Session, project: Project, now: datetime, by_rank: bool = False) -> tuple[int, tuple[int, ...]]:
    """(floor, window) of this scan: the window is empty for a scan by rank and on SQLite."""
    extra = extra_on(project)
    key = (project.id, project.current_round, project.overlap, by_rank, extra)
    clock = time.monotonic()
    with _floors_lock:
        floor, full_at, step_at, window = _floors.get(key, (0, -FLOOR_FULL_S, -FLOOR_STEP_S, ()))
        if clock - full_at >= FLOOR_FULL_S:
            start, full_at = 0, clock
        elif clock - step_at >= FLOOR_STEP_S:
            start = floor
        else:
            return floor, window
        if key in _floors:  # one request re-reads; the others go on with what is there meanwhile
            _floors[key] = (floor, full_at, clock, window)
    params = {"project_id": project.id, "floor": start, "round": project.current_round, "now": now,
              "overlap": project.overlap, "extra": int(extra)}
    if by_rank or db.get_bind().dialect.name != "postgresql":
        open_prompt, window = core(db).scalar(_RANK_FLOOR_SCAN if by_rank else _FLOOR_SCAN, params), ()
    else:
        window = tuple(core(db).scalars(_WINDOW_SCAN, params))
        open_prompt = window[0] if window else None
    floor = open_prompt if open_prompt is not None else start
    with _floors_lock:
        _floors[key] = (floor, full_at, clock, window)
    return floor, window


def next_task(db: Session, project: Project, annotator: User, *, now: datetime | None = None,
              rng: random.Random | None = None) -> Assignment | None:
    """The caller's current lease, or a new one on a prompt that still needs rankings; None when nothing is left."""
    now = now or utcnow()
    lease = timedelta(minutes=project.lease_minutes)
    current = _own_active(db, project, annotator, now)
    if current is not None:
        current.leased_until = now + lease  # opening the task again renews its lease
        core(db).execute(_RENEW, {"assignment_id": current.id, "until": current.leased_until})
        return current
    gold_rate = float((project.settings or {}).get("gold_rate", GOLD_RATE_DEFAULT))
    prefer_gold = (rng or random).random() < gold_rate
    order = [True, False] if prefer_gold else [False, True]
    postgres = db.get_bind().dialect.name == "postgresql"
    by_priority = (project.settings or {}).get("selection", "random") != "random"
    routed = bool(((project.settings or {}).get("routed") or {}).get("prompts"))
    # First pass skips prompts other requests hold locked (no waiting); if that finds nothing, a second pass waits
    # for those locks: with overlap > 1 a locked prompt may still have room once its holder commits.
    for lock in ("skip", "wait") if postgres else (None,):
        for gold in order:
            for scan in _scans(db, project, now, gold, by_priority, routed):
                leased = _lease_first_open(db, project, annotator, now, now + lease, gold, lock, scan)
                if leased is not None:
                    return leased
    return None


Scan = tuple[bool | str, int, tuple[int, ...]]
"""(by_rank, floor, window): one pass of the queue over candidate prompts (see `_candidates_stmt`)."""


def _scans(db: Session, project: Project, now: datetime, gold: bool, by_priority: bool,
           routed: bool = False) -> list[Scan]:
    """The scans to try in order: gold prompts by id; the rest in the window, from the floor, then from the start;
    under a priority selection the prioritised prompts by rank first (those a judge run routed to humans rank
    below 0, so they come first), then any prompt (new, unscored ones) by id; under `random`, routed ones first."""
    if gold:
        return [(False, 0, ())]
    scans: list[Scan] = []
    if by_priority:
        scans = [(True, _scan_floor(db, project, now, by_rank=True)[0], ()), (True, 0, ())]
    elif routed:
        scans = [(ROUTED, 0, ())]  # a handful of prompts: no floor cache
    floor, window = _scan_floor(db, project, now)
    if window:
        scans.append((False, 0, window))
    return list(dict.fromkeys([*scans, (False, floor, ()), (False, 0, ())]))


@functools.lru_cache(maxsize=64)
def _array_literal(ids: tuple[int, ...]) -> str:
    """`{1,2,3}`: a window as the statement binds it, made once per window (a 256-id window's list cost more than the
    rest of the statement's parameters, `int_array`)."""
    return int_array_text(ids)


def _lease_first_open(db: Session, project: Project, annotator: User, now: datetime, until: datetime, gold: bool,
                      lock: str | None, scan: Scan) -> Assignment | None:
    """A lease on the first prompt of this scan with room (its row locked), or None when the scan has none."""
    by_rank, floor, window = scan
    skip: list[int] = []
    params = _params(project, annotator, now, floor) | ({"window": _array_literal(window)} if window else {})
    while True:
        query = _candidates_stmt(gold, "lease", floor=bool(floor), lock=lock, by_rank=by_rank, window=bool(window))
        if skip:  # rare: prompts found full under their lock by this very call
            query = query.where(Prompt.id.not_in(skip))
        row = core(db).execute(query, params).first()
        if row is None:
            return None
        prompt_id, existing_id, extra_overlap = row
        if gold:  # not capped
            return _lease(db, project, annotator, prompt_id, until, existing_id)
        # Re-count under the row lock: a lease committed after our snapshot may have filled the prompt. For a new
        # lease the insert itself counts (one statement: it runs in a snapshot taken under the lock, as a count would).
        load = {"prompt_id": prompt_id, "round": project.current_round, "now": now,
                "cap": cap_of(project, extra_overlap)}
        if existing_id is None:
            leased = _lease_if_room(db, project, annotator, until, load)
            if leased is not None:
                return leased
        elif core(db).scalar(_LOAD_NOW, load) < load["cap"]:
            return _lease(db, project, annotator, prompt_id, until, existing_id)
        skip.append(prompt_id)


def _lease(db: Session, project: Project, annotator: User, prompt_id: int, until: datetime,
           existing_id: int | None) -> Assignment:
    if existing_id is not None:  # the annotator's own expired or released lease on this prompt comes back
        existing = db.get(Assignment, existing_id)
        assert existing is not None
        existing.state = "leased"
        existing.leased_until = until
        # A new lease starts clean: the draft of the one that ran out went with it.
        db.execute(_DROP_DRAFT, {"assignment_id": existing_id})
        db.flush()
        return existing
    row = core(db).execute(_LEASE, {"project_id": project.id, "prompt_id": prompt_id, "annotator_id": annotator.id,
                                    "round": project.current_round, "state": "leased",
                                    "leased_until": until}).one()
    return _assignment(project, annotator, id=row.id, prompt_id=prompt_id, leased_until=until,
                       created_at=row.created_at)


def _lease_if_room(db: Session, project: Project, annotator: User, until: datetime,
                   load: dict[str, Any]) -> Assignment | None:
    params = load | {"project_id": project.id, "annotator_id": annotator.id, "until": until}
    if db.get_bind().dialect.name == "postgresql":
        return _lease_shown(db, project, annotator, until, params)
    row = core(db).execute(_LEASE_IF_ROOM, params).first()
    if row is None:
        return None
    return _assignment(project, annotator, id=row.id, prompt_id=load["prompt_id"], leased_until=until,
                       created_at=row.created_at)


def _lease_shown(db: Session, project: Project, annotator: User, until: datetime,
                 params: dict[str, Any]) -> Assignment | None:
    """`_LEASE_IF_ROOM` and the task's prompt and completions in one statement (Postgres: the insert is a CTE the
    task's select reads); what the task shows is kept for `task_shown`, which then sends no query."""
    k = project.completions_per_prompt
    rows = core(db).execute(_LEASE_SHOWN, params | {"k": k}).all()
    if not rows:
        return None
    first = rows[0]
    db.info.setdefault("shown", {})[(first[2], k)] = _shown(rows, at=2)
    return _assignment(project, annotator, id=first[0], prompt_id=first[2], leased_until=until,
                       created_at=first[1])


def get_own_assignment(db: Session, project: Project, annotator: User, assignment_id: int) -> Assignment:
    assignment = db.get(Assignment, assignment_id)
    if assignment is None or assignment.project_id != project.id or assignment.annotator_id != annotator.id:
        raise NotFound("no such task")
    return assignment


def display_order(completion_ids: list[int], annotator_id: int, prompt_id: int, round_: int) -> list[int]:
    """Completion ids shuffled per annotator, stably: a reload shows the same order, and it is recorded."""
    order = sorted(completion_ids)
    random.Random(f"{annotator_id}:{prompt_id}:{round_}").shuffle(order)
    return order


@dataclass(frozen=True)
class Progress:
    done_today: int
    done_total: int
    left_for_you: int
    left_in_project: int
    """Rankings still wanted: Σ over ready prompts of max(0, cap − rankings so far), the cap the overlap plus any
    live extra overlap."""


def progress(db: Session, project: Project, annotator: User, *, now: datetime | None = None) -> Progress:
    now = now or utcnow()
    start_of_day = datetime(now.year, now.month, now.day, tzinfo=UTC)
    mine = select(func.count(Ranking.id)).where(Ranking.project_id == project.id,
                                                Ranking.annotator_id == annotator.id, Ranking.skipped.is_(False))
    done_total = int(db.scalar(mine) or 0)
    done_today = int(db.scalar(mine.where(Ranking.created_at >= start_of_day)) or 0)
    key = (id(db.get_bind()), project.id, project.current_round, annotator.id)  # one app's database
    with _floors_lock:
        cached = _progress_cache.get(key)
    if cached is not None and cached[0] > time.monotonic():
        # The caller's own rankings since the counts were taken are subtracted exactly; others' show at expiry.
        _, left_for_you, left_in_project, done_then = cached
        mine_since = done_total - done_then
        return Progress(done_today, done_total, max(0, left_for_you - mine_since),
                        max(0, left_in_project - mine_since))
    left_for_you, left_in_project = _left(db, project, annotator, now)
    with _floors_lock:
        if len(_progress_cache) > PROGRESS_CACHE_MAX:
            _progress_cache.clear()
        _progress_cache[key] = (time.monotonic() + PROGRESS_TTL_S, left_for_you, left_in_project, done_total)
    return Progress(done_today, done_total, left_for_you, left_in_project)


PROGRESS_TTL_S = 5.0
"""How long the two project-wide counts of the progress bar are reused: each is a scan over the project's prompts
(60+ ms at a few thousand), and the ranking page shows them on every task."""
PROGRESS_CACHE_MAX = 10_000
_progress_cache: dict[tuple[int, int, int, int], tuple[float, int, int, int]] = {}


def _left(db: Session, project: Project, annotator: User, now: datetime) -> tuple[int, int]:
    """(tasks left for this annotator, rankings still wanted in the project)."""
    round_ = project.current_round
    completions = _rankable_count()
    submitted = (select(func.count(Assignment.id))
                 .where(Assignment.prompt_id == Prompt.id, Assignment.round == round_,
                        Assignment.state == "submitted").scalar_subquery())
    cap = project.overlap + Prompt.extra_overlap * int(extra_on(project))  # `_cap()` with this project's values
    ready = select(Prompt.id, submitted.label("n"), cap.label("cap")).where(
        Prompt.project_id == project.id, Prompt.gold_tiers.is_(None),
        completions >= project.completions_per_prompt).subquery()
    left_in_project = int(db.scalar(select(func.coalesce(func.sum(ready.c.cap - ready.c.n), 0))
                                    .where(ready.c.n < ready.c.cap)) or 0)
    left_for_you = int(db.scalar(select(func.count()).select_from(
        _candidates(project, annotator, now, gold=None).subquery())) or 0)
    return left_for_you, left_in_project


def _task_completions(*columns: Any) -> Select[*tuple[Any, ...]]:
    return (select(*columns).where(Completion.prompt_id == bindparam("prompt_id"), _RANKABLE)
            .order_by(Completion.id.desc()).limit(bindparam("k")))


_RANKABLE = Completion.source != "revision"
_TASK_IDS = direct(_task_completions(Completion.id))
_TASK_TEXTS = direct(_task_completions(Completion.id, Completion.text))


def with_task_completions(query: Select[*tuple[Any, ...]], prompt_id: Any, *columns: Any) -> Select[*tuple[Any, ...]]:
    """`query` (one row) joined to the completions `task_completion_ids` gives for the prompt `prompt_id` names, with
    their `columns`: a row per completion, or one row with NULLs when there is none; `k` binds K."""
    return (query.add_columns(*columns).outerjoin(Completion, and_(Completion.prompt_id == prompt_id, _RANKABLE))
            .order_by(Completion.id.desc()).limit(bindparam("k")))


# The prompt with them: what a task shows, in one query.
_TASK_SHOWN = direct(with_task_completions(select(Prompt.id, Prompt.text, Prompt.messages)
                                           .where(Prompt.id == bindparam("prompt_id")),
                                           Prompt.id, Completion.id, Completion.text, Completion.meta))


def task_completion_ids(db: Session, prompt_id: int, k: int) -> list[int]:
    """The completions a task ranks: the prompt's K most recent, so a new round ranks the newest policy's answers."""
    return sorted(core(db).scalars(_TASK_IDS, {"prompt_id": prompt_id, "k": k}))


def task_completion_texts(db: Session, prompt_id: int, k: int) -> dict[int, str]:
    """`task_completion_ids` with their texts, in one query (the ranking page and the next-task API show them)."""
    return dict(sorted((row[0], row[1]) for row in core(db).execute(_TASK_TEXTS, {"prompt_id": prompt_id, "k": k})))


@dataclass(frozen=True)
class Shown:
    """What a task shows: its prompt, and the completions of `task_completion_ids` with their metadata."""

    prompt_id: int
    text: str
    messages: list[dict[str, str]] | None
    completions: list[tuple[int, str, Any]]
    """(id, text, metadata) by id."""


def task_shown(db: Session, prompt_id: int, k: int) -> Shown:
    kept = db.info.get("shown", {}).pop((prompt_id, k), None)  # read with the lease just written
    if kept is not None:
        return kept
    return _shown(core(db).execute(_TASK_SHOWN, {"prompt_id": prompt_id, "k": k}).all())


def _shown(rows: Sequence[Any], at: int = 0) -> Shown:
    """A `Shown` from rows of `_TASK_SHOWN`'s columns, starting at column `at`."""
    first = rows[0]  # the prompt of a task exists: assignments reference it
    return Shown(first[at], first[at + 1], first[at + 2],
                 sorted((row[at + 3], row[at + 4], row[at + 5]) for row in rows if row[at + 3] is not None))


# Postgres: a new lease and what its task shows, in one statement (`_lease_shown`).
_LEASED = _LEASE_IF_ROOM_INSERT.returning(_ASSIGNMENTS.c.id, _ASSIGNMENTS.c.created_at,
                                          _ASSIGNMENTS.c.prompt_id).cte("leased")
_LEASE_SHOWN = direct(with_task_completions(
    select(_LEASED.c.id, _LEASED.c.created_at, Prompt.id, Prompt.text, Prompt.messages)
    .join_from(_LEASED, Prompt, Prompt.id == _LEASED.c.prompt_id),
    Prompt.id, Completion.id, Completion.text, Completion.meta))


def _rankable_count():
    """A prompt's completions that can be ranked (CAI revisions are SFT material, never ranked)."""
    return (select(func.count(Completion.id))
            .where(Completion.prompt_id == Prompt.id, Completion.source != "revision").scalar_subquery())
