"""The annotation queue: lease a prompt to an annotator without ever exceeding its overlap.

Over-assignment is prevented by the database, not by this process: on Postgres the candidate prompt row is
locked with `FOR UPDATE SKIP LOCKED` (concurrent callers move on to the next prompt) and its load is
re-counted under the lock; on SQLite every transaction starts with `BEGIN IMMEDIATE` (see app.db), so
writers are serialised.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Select, and_, exists, func, or_, select
from sqlalchemy.orm import Session

from app.errors import NotFound
from app.models import Assignment, Completion, Project, Prompt, Ranking, User, utcnow

GOLD_RATE_DEFAULT = 0.1
"""Share of tasks drawn from gold prompts, when the annotator has unseen ones."""


def _active_load(prompt_id, round_: int, now: datetime):  # type: ignore[no-untyped-def]
    """Assignments that occupy one unit of a prompt's overlap: submitted, or leased and not yet expired."""
    return (
        select(func.count(Assignment.id))
        .where(Assignment.prompt_id == prompt_id, Assignment.round == round_,
               or_(Assignment.state == "submitted",
                   and_(Assignment.state == "leased", Assignment.leased_until > now)))
        .scalar_subquery()
    )


def _candidates(project: Project, annotator: User, now: datetime, *, gold: bool | None):  # type: ignore[no-untyped-def]
    round_ = project.current_round
    completions = _rankable_count()
    mine_done = exists().where(Assignment.prompt_id == Prompt.id, Assignment.annotator_id == annotator.id,
                               Assignment.round == round_, Assignment.state.in_(("submitted", "skipped")))
    ranked = exists().where(Ranking.prompt_id == Prompt.id, Ranking.annotator_id == annotator.id,
                            Ranking.round == round_)
    query = select(Prompt.id).where(
        Prompt.project_id == project.id,
        completions >= project.completions_per_prompt,
        ~mine_done,
        ~ranked,
    )
    if gold is True:
        # Gold prompts test every annotator, so they are not capped by the overlap.
        query = query.where(Prompt.gold_tiers.is_not(None))
    else:
        if gold is False:
            query = query.where(Prompt.gold_tiers.is_(None))
        query = query.where(or_(Prompt.gold_tiers.is_not(None), _active_load(Prompt.id, round_, now) < project.overlap))
    return query


def _own_active(db: Session, project: Project, annotator: User, now: datetime) -> Assignment | None:
    return db.scalar(
        select(Assignment).where(Assignment.project_id == project.id, Assignment.annotator_id == annotator.id,
                                 Assignment.round == project.current_round, Assignment.state == "leased",
                                 Assignment.leased_until > now)
        .order_by(Assignment.id).limit(1)
    )


# Where the scan for a non-gold prompt starts, per (project, round, overlap): a prompt id below which every prompt
# was found full. Only a starting point, never a correctness rule: when the scan from it finds nothing, the whole
# project is scanned again, and the floor is recomputed from the start every FLOOR_FULL_S seconds, so prompts that
# reopen below it (expired leases, skips) come back. Without it every request walks over all filled prompts.
FLOOR_STEP_S = 0.5
FLOOR_FULL_S = 5.0
_floors: dict[tuple[int, int, int], tuple[int, float, float]] = {}
_floors_lock = threading.Lock()


def _scan_floor(db: Session, project: Project, now: datetime) -> int:
    key = (project.id, project.current_round, project.overlap)
    clock = time.monotonic()
    with _floors_lock:
        floor, full_at, step_at = _floors.get(key, (0, -FLOOR_FULL_S, -FLOOR_STEP_S))
    if clock - full_at >= FLOOR_FULL_S:
        start, full_at = 0, clock
    elif clock - step_at >= FLOOR_STEP_S:
        start = floor
    else:
        return floor
    open_prompt = db.scalar(
        select(Prompt.id).where(Prompt.project_id == project.id, Prompt.id >= start, Prompt.gold_tiers.is_(None),
                                _active_load(Prompt.id, project.current_round, now) < project.overlap)
        .order_by(Prompt.id).limit(1))
    floor = open_prompt if open_prompt is not None else start
    with _floors_lock:
        _floors[key] = (floor, full_at, clock)
    return floor


def next_task(db: Session, project: Project, annotator: User, *, now: datetime | None = None,
              rng: random.Random | None = None) -> Assignment | None:
    """The caller's current lease, or a new one on a prompt that still needs rankings; None when nothing is left."""
    now = now or utcnow()
    lease = timedelta(minutes=project.lease_minutes)
    current = _own_active(db, project, annotator, now)
    if current is not None:
        current.leased_until = now + lease  # opening the task again renews its lease
        return current
    gold_rate = float((project.settings or {}).get("gold_rate", GOLD_RATE_DEFAULT))
    prefer_gold = (rng or random).random() < gold_rate
    order = [True, False] if prefer_gold else [False, True]
    postgres = db.get_bind().dialect.name == "postgresql"
    round_ = project.current_round
    # The caller's own expired or released lease on the candidate, fetched with it (evaluated for one row only).
    mine = (select(Assignment.id).where(Assignment.prompt_id == Prompt.id, Assignment.annotator_id == annotator.id,
                                        Assignment.round == round_).scalar_subquery())
    # First pass skips prompts other requests hold locked (no waiting); if that finds nothing, a second pass waits
    # for those locks: with overlap > 1 a locked prompt may still have room once its holder commits.
    for skip_locked in (True, False) if postgres else (False,):
        for gold in order:
            floors = [0] if gold else [_scan_floor(db, project, now), 0]
            for floor in dict.fromkeys(floors):
                skip: list[int] = []
                while True:
                    query = _candidates(project, annotator, now, gold=gold).with_only_columns(Prompt.id, mine)
                    if floor:
                        query = query.where(Prompt.id >= floor)
                    if skip:
                        query = query.where(Prompt.id.not_in(skip))
                    query = query.order_by(Prompt.id).limit(1)
                    if postgres:
                        query = query.with_for_update(of=Prompt, skip_locked=skip_locked)
                    row = db.execute(query).first()
                    if row is None:
                        break
                    prompt_id, existing_id = row
                    # Re-count under the row lock: a lease committed after our snapshot may have filled the prompt.
                    if not gold and db.scalar(select(_active_load(prompt_id, round_, now))) >= project.overlap:
                        skip.append(prompt_id)
                        continue
                    return _lease(db, project, annotator, prompt_id, now + lease, existing_id)
    return None


def _lease(db: Session, project: Project, annotator: User, prompt_id: int, until: datetime,
           existing_id: int | None) -> Assignment:
    if existing_id is not None:  # the annotator's own expired or released lease on this prompt comes back
        existing = db.get(Assignment, existing_id)
        assert existing is not None
        existing.state = "leased"
        existing.leased_until = until
        db.flush()
        return existing
    assignment = Assignment(project_id=project.id, prompt_id=prompt_id, annotator_id=annotator.id,
                            round=project.current_round, state="leased", leased_until=until)
    db.add(assignment)
    db.flush()
    return assignment


def release(db: Session, assignment: Assignment) -> None:
    """Give a leased task back to the pool (the annotator may get it again later)."""
    if assignment.state == "leased":
        assignment.state = "released"
        assignment.leased_until = utcnow()


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
    """Rankings still wanted: Σ over ready prompts of max(0, overlap − rankings so far)."""


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
    ready = select(Prompt.id, submitted.label("n")).where(Prompt.project_id == project.id,
                                                          Prompt.gold_tiers.is_(None),
                                                          completions >= project.completions_per_prompt).subquery()
    left_in_project = int(db.scalar(select(func.coalesce(func.sum(project.overlap - ready.c.n), 0))
                                    .where(ready.c.n < project.overlap)) or 0)
    left_for_you = int(db.scalar(select(func.count()).select_from(
        _candidates(project, annotator, now, gold=None).subquery())) or 0)
    return left_for_you, left_in_project


def _task_completions(prompt_id: int, k: int, *columns: Any) -> Select[Any]:
    return (select(*columns).where(Completion.prompt_id == prompt_id, Completion.source != "revision")
            .order_by(Completion.id.desc()).limit(k))


def task_completion_ids(db: Session, prompt_id: int, k: int) -> list[int]:
    """The completions a task ranks: the prompt's K most recent, so a new round ranks the newest policy's answers."""
    return sorted(db.scalars(_task_completions(prompt_id, k, Completion.id)))


def task_completion_texts(db: Session, prompt_id: int, k: int) -> dict[int, str]:
    """`task_completion_ids` with their texts, in one query (the ranking page and the next-task API show them)."""
    return dict(sorted(db.execute(_task_completions(prompt_id, k, Completion.id, Completion.text)).tuples()))


def _rankable_count():  # type: ignore[no-untyped-def]
    """A prompt's completions that can be ranked (CAI revisions are SFT material, never ranked)."""
    return (select(func.count(Completion.id))
            .where(Completion.prompt_id == Prompt.id, Completion.source != "revision").scalar_subquery())
