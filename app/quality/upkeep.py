"""A project's agreement figures kept up to date as rankings arrive: touched groups are marked with the change, a drain
brings each marked (prompt, round)'s partial state up to date and adds the difference to the running totals, and a
report is read from the totals, whatever the project holds (app.quality.partial holds the algebra).

Writing a human ranking (app.annotation.rankings, and the ORM's hook in app.models), removing an annotator's rankings
and setting or clearing a gold order insert an `agreement_marks` row in their own transaction: one index entry, no lock
a drain holds. A drain (one at a time per project: it locks the project's `agreement_states` row) reads a batch of
marks, brings those groups' states up to date from their rankings, writes their new states, adds new − old to the totals
of every scope (all versions, and the group's rubric versions) and key (the project, each annotator, the trend's hour,
day and week), recomputes the medians whose seconds changed, and deletes the marks it read. A group's state is a
function of its rankings alone, so a drain that runs twice over a group, or over one that changed again meanwhile,
leaves the totals right.

A drain brings each marked group's state up to date: when the group only gained rankings since its state was kept (the
state records the content hashes of the rankings it holds, the gold order's hash and what α needs), the new rankings are
folded in, each compared with the ones there (O(n) per new ranking, partial.extend); any other change (a ranking removed
or changed, a removed ranking's id reused, a gold order set or cleared) computes the group from all its rankings. Either
way the state equals partial.group_state of its rankings.

Who drains: each worker process's sweeper (app.quality.rollup_job.Sweeper), every PREFLAB_AGREEMENT_DRAIN_EVERY_S
(2 s), at a lower CPU priority (nice +10), for every project with marks waiting: the figures are that fresh whether or
not anyone looks, and a view reads the totals and nothing else. Where no worker keeps up (none running, or one
behind), a view of the figures drains itself once the last drain is VIEW_AFTER sweeps old, when few marks wait
(INLINE_MARKS, of groups holding at most INLINE_RANKINGS rankings: a few ms); more marks, or larger groups, and it
queues a `project_rollup` job with `{"agreement": "drain"}` that drains batch after batch. The page says as of when
its figures are. A state computed under older formulas (AGREEMENT_FORMULA) is rebuilt once by a job with
`{"agreement": "rebuild"}`, as `preflab agreement rebuild` does on demand: every state and total deleted and every
group drained again, in one transaction.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Integer, any_, bindparam, delete, func, insert, literal, select, tuple_, update
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session

from app.jobs import queue as jobs
from app.models import (
    AGREEMENT_FORMULA,
    AgreementGroup,
    AgreementMark,
    AgreementState,
    AgreementTotal,
    Job,
    Project,
    Prompt,
    Ranking,
    Rubric,
    User,
    utcnow,
)
from app.platform.settings import get_settings
from app.quality import kept_report, partial
from app.quality.buckets import median_of_tenths
from app.quality.partial import GroupState, State
from app.webhooks import service as webhooks

KIND = "project_rollup"
"""The job kind that drains and rebuilds (`{"agreement": "drain" | "rebuild"}`), beside the rollup of counts."""
DRAIN_BATCH = 2_000
"""Marks one drain transaction reads: a few hundred ms of work, so a drain job commits progress as it goes."""
INLINE_MARKS = 200
"""A view drains this many waiting marks itself (tens of ms at most); more, and it queues a drain job."""
INLINE_RANKINGS = 5_000
"""A view drains only when the marked groups hold at most this many rankings, all told (a gold order set on a prompt
that hundreds ranked computes it anew: the drain job does that, not a view)."""
RECOUNT_S = 60.0
"""A view drains (recounting the project's prompts and gold prompts) when the last drain is older than this."""
REBUILD_PROMPTS = 2_000
"""Prompts whose groups a rebuild recomputes at once."""
REBUILD_FLUSH = 25
"""Batches of prompts whose changes to the totals a rebuild sums before writing them (memory: a few tens of MB)."""

_MARKS, _GROUPS, _TOTALS = AgreementMark.__table__, AgreementGroup.__table__, AgreementTotal.__table__
FLAGGED = "annotator.flagged"
"""The webhook event a drain fires for each flag its figures raise that they did not before."""
TotalsKey = tuple[int, str, int]
"""(rubric version, 0 for all; kind "p" | "a" | "h" | "d" | "w"; key)."""


# --- marking ------------------------------------------------------------------------------------------------


def mark_prompts(db: Session, project: Project, prompt_ids: Iterable[int]) -> None:
    """Mark every round of these prompts that has human rankings (and the current one, so a drain follows even
    where none has): their gold order changed, so every ranking's gold score did."""
    ids = sorted(set(prompt_ids))
    if not ids:
        return
    ranked = (select(literal(project.id), Ranking.prompt_id, Ranking.round)
              .where(Ranking.prompt_id.in_(ids), Ranking.source == "human").distinct())
    db.execute(insert(_MARKS).from_select(["project_id", "prompt_id", "round"], ranked))
    db.execute(insert(_MARKS), [{"project_id": project.id, "prompt_id": pid, "round": project.current_round}
                                for pid in ids])


# --- draining ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Drained:
    """What one drain did (the rollup job adds these up in its result)."""

    marks: int
    """Marks read (and deleted)."""
    groups: int
    """(prompt, round) groups brought up to date."""
    seconds: float
    extended: int = 0
    """Scopes of those groups (all versions, a rubric version) whose new rankings were folded into the kept state."""
    computed: int = 0
    """Scopes computed from all their rankings: new ones, and ones with a ranking removed or changed, or a new gold
    order."""


def lock(db: Session, project_id: int, *, wait: bool = True) -> AgreementState | None:
    """The project's state row, locked for one drain (created where missing, at the current formulas); None when
    another transaction holds it and `wait` is False."""
    if db.get(AgreementState, project_id) is None:
        db.execute(_insert_ignore(db, AgreementState.__table__, ["project_id"]),
                   {"project_id": project_id, "formula": AGREEMENT_FORMULA, "seconds": 0.0, "sequence": 0,
                    "total_prompts": 0, "gold_prompts": 0})
    return db.get(AgreementState, project_id, populate_existing=True,
                  with_for_update={"skip_locked": True} if not wait else True)


def drain(db: Session, project: Project, *, limit: int = DRAIN_BATCH, wait: bool = True) -> Drained | None:
    """Fold up to `limit` waiting marks into the figures, and recount the project's prompts; None when another drain
    holds the project (`wait` False) or its states must be rebuilt first."""
    state = lock(db, project.id, wait=wait)
    if state is None or state.formula != AGREEMENT_FORMULA:
        return None
    started, t0 = utcnow(), time.perf_counter()
    marks = list(db.execute(select(AgreementMark.id, AgreementMark.prompt_id, AgreementMark.round)
                            .where(AgreementMark.project_id == project.id).order_by(AgreementMark.id).limit(limit)))
    groups = {(m.prompt_id, m.round) for m in marks}
    # The flags are compared before and after only where a webhook listens for new ones (two reports' work).
    before = _flag_view(db, project) if groups and webhooks.wanted(db, project.id, FLAGGED) else None
    tally: Counter[str] = Counter()
    if groups:
        _apply(db, project.id, _recompute(db, project, groups, tally=tally))
        db.execute(delete(_MARKS).where(_among(db, _MARKS.c.id, [m.id for m in marks])))
    counted = _recount(db, project, state)
    if before is not None:
        _announce(db, project, before, _flag_view(db, project))
    if groups or counted:
        state.sequence += 1
    state.as_of, state.seconds = started, time.perf_counter() - t0
    db.flush()
    return Drained(len(marks), len(groups), state.seconds, tally["extended"], tally["computed"])


def needs_rebuild(db: Session, project: Project) -> bool:
    """Whether the project's kept states were computed under older formulas (a drain refuses them until rebuilt)."""
    state = db.get(AgreementState, project.id)
    return state is not None and state.formula != AGREEMENT_FORMULA


def marked_projects(db: Session, limit: int = 100) -> list[int]:
    """Projects with changes waiting for a drain, the longest waiting first (the marks table holds only what no drain
    has read yet: a few thousand rows at most under load)."""
    return list(db.scalars(select(AgreementMark.project_id).group_by(AgreementMark.project_id)
                           .order_by(func.min(AgreementMark.id)).limit(limit)))


def waiting(db: Session, project_id: int, up_to: int) -> int:
    """Marks waiting for a drain, counted no further than `up_to` (as many index entries read)."""
    capped = select(AgreementMark.id).where(AgreementMark.project_id == project_id).limit(up_to)
    return int(db.scalar(select(func.count()).select_from(capped.subquery())) or 0)


def rankings(db: Session, project_id: int) -> int:
    """Human rankings the kept figures cover (all rubric versions): one primary-key read."""
    return int(db.scalar(select(AgreementTotal.rankings).where(
        AgreementTotal.project_id == project_id, AgreementTotal.version == 0, AgreementTotal.kind == "p",
        AgreementTotal.key == 0)) or 0)


def disagreements(db: Session, project_id: int, rubric_version: int | None, offset: int, limit: int
                  ) -> tuple[list[tuple[float, int, int]], int]:
    """One page of the (prompt, round) groups whose rankings disagree, least agreement first, as (agreement,
    prompt id, round), and how many there are: an index range read of the page, and the count kept in the totals."""
    v = rubric_version or 0
    page = [(float(a or 0.0), int(p), int(r)) for a, p, r in db.execute(
        select(AgreementGroup.agreement, AgreementGroup.prompt_id, AgreementGroup.round)
        .where(AgreementGroup.project_id == project_id, AgreementGroup.version == v, AgreementGroup.agreement < 1)
        .order_by(AgreementGroup.agreement, AgreementGroup.prompt_id, AgreementGroup.round)
        .offset(offset).limit(limit))]
    total = db.scalar(select(AgreementTotal.state["disagree"].as_integer()).where(
        AgreementTotal.project_id == project_id, AgreementTotal.version == v, AgreementTotal.kind == "p",
        AgreementTotal.key == 0))
    return page, int(total or 0)


def _recount(db: Session, project: Project, state: AgreementState) -> bool:
    """The project's prompts and gold prompts counted again; whether they changed."""
    prompts = int(db.scalar(select(func.count(Prompt.id)).where(Prompt.project_id == project.id)) or 0)
    gold = len(_gold(db, select(Prompt.id).where(Prompt.project_id == project.id).scalar_subquery()))
    changed = (prompts, gold) != (state.total_prompts, state.gold_prompts)
    state.total_prompts, state.gold_prompts = prompts, gold
    return changed


def _gold(db: Session, prompt_ids: Any) -> dict[int, Any]:
    """prompt id → gold tiers, for the gold prompts among `prompt_ids` (a list or a subquery)."""
    among = _among(db, Prompt.id, prompt_ids) if isinstance(prompt_ids, list) else Prompt.id.in_(prompt_ids)
    rows = db.execute(select(Prompt.id, Prompt.gold_tiers).where(among, Prompt.gold_tiers.is_not(None)))
    return {pid: tiers for pid, tiers in rows if tiers}  # JSON null reads back as None too


def _rankings(db: Session, prompt_ids: list[int]) -> Iterator[Any]:
    """The human rankings of these prompts, by (prompt, round, id), with what a group's state is computed from."""
    return iter(db.execute(
        select(Ranking.id, Ranking.prompt_id, Ranking.round, Ranking.annotator_id, Ranking.tiers,
               Ranking.display_order, Ranking.skipped, Ranking.seconds_spent, Ranking.created_at,
               Rubric.version.label("rubric_version"))
        .outerjoin(Rubric, Ranking.rubric_id == Rubric.id)
        .where(_among(db, Ranking.prompt_id, prompt_ids), Ranking.source == "human")
        .order_by(Ranking.prompt_id, Ranking.round, Ranking.id)))


GroupKey = tuple[int, int, int]
"""(prompt id, round, rubric version or 0 for all)."""


def new_states(rows: Iterable[Any], groups: set[tuple[int, int]], gold: dict[int, Any],
               old: dict[GroupKey, GroupState] | None = None, tally: Counter[str] | None = None
               ) -> dict[GroupKey, GroupState]:
    """Each group's state in every scope it has rankings in: all versions (0), and each rubric version (the same
    state when every ranking of the group is of that version, the usual case). A scope whose `old` state holds some
    of its rankings and nothing else has the others folded in (partial.extend: each new ranking compared with the
    ones there); any other is computed from all its rankings."""
    old, tally = old or {}, tally if tally is not None else Counter()
    by_group: dict[tuple[int, int], list[Any]] = defaultdict(list)
    for r in rows:
        if (r.prompt_id, r.round) in groups:
            by_group[(r.prompt_id, r.round)].append(r)
    out: dict[GroupKey, GroupState] = {}
    for (prompt_id, round_), found in by_group.items():
        whole = _state(found, gold.get(prompt_id), old.get((prompt_id, round_, 0)), tally)
        out[(prompt_id, round_, 0)] = whole
        by_version: dict[int, list[Any]] = defaultdict(list)
        for r in found:
            if r.rubric_version is not None:
                by_version[r.rubric_version].append(r)
        for version, mine in by_version.items():
            same = len(mine) == len(found)
            out[(prompt_id, round_, version)] = whole if same else _state(
                mine, gold.get(prompt_id), old.get((prompt_id, round_, version)), tally)
    return out


def _state(rows: list[Any], gold: Any | None, old: GroupState | None, tally: Counter[str]) -> GroupState:
    extended = partial.extend(old, rows, gold) if old is not None else None
    if extended is None:
        tally["computed"] += 1
        return partial.group_state(rows, gold)
    tally["extended" if extended is not old else "unchanged"] += 1
    return extended


def _recompute(db: Session, project: Project, groups: set[tuple[int, int]] | None,
               prompt_ids: list[int] | None = None, tally: Counter[str] | None = None) -> dict[int, State]:
    """Replace these groups' states (None: every group of `prompt_ids`) by ones that hold their rankings now; what
    that changes in each scope's totals."""
    prompt_ids = sorted({p for p, _ in groups or ()}) if prompt_ids is None else prompt_ids
    rows = list(_rankings(db, prompt_ids))
    if groups is None:
        groups = {(r.prompt_id, r.round) for r in rows}
    old = {(row.prompt_id, row.round, row.version): row for row in db.execute(
        select(AgreementGroup.prompt_id, AgreementGroup.round, AgreementGroup.version, AgreementGroup.state,
               AgreementGroup.agreement, AgreementGroup.shared, AgreementGroup.gold_ranked, AgreementGroup.folded)
        .where(_among(db, AgreementGroup.prompt_id, prompt_ids)))}
    replaced = {k: _kept_state(old, k) for k in old if (k[0], k[1]) in groups}
    new = new_states(rows, groups, _gold(db, prompt_ids), replaced, tally)
    deltas: dict[int, State] = defaultdict(dict)
    for version in {k[2] for k in new} | {k[2] for k in replaced}:
        deltas[version] = partial.difference([s for k, s in new.items() if k[2] == version],
                                             [s for k, s in replaced.items() if k[2] == version])
    _distinct_prompts(deltas, new, old, groups)
    _write_groups(db, project.id, groups, new)
    return deltas


def _kept_state(rows: dict[GroupKey, Any], key: GroupKey) -> GroupState:
    """A group's kept state in one scope; a rubric version's row with an empty state holds version 0's."""
    row = rows[key]
    held = rows[(key[0], key[1], 0)] if key[2] and not row.state else row
    return GroupState(held.state, row.agreement, row.shared, row.gold_ranked, held.folded)


def _distinct_prompts(deltas: dict[int, State], new: dict[GroupKey, GroupState], old: dict[GroupKey, Any],
                      groups: set[tuple[int, int]]) -> None:
    """Shared prompts and gold prompts ranked count prompts, not groups: a prompt counts while any of its rounds
    says so, so each touched prompt's say before and after is compared over all its rounds."""
    before: dict[tuple[int, int], list[bool]] = defaultdict(lambda: [False, False])
    after: dict[tuple[int, int], list[bool]] = defaultdict(lambda: [False, False])
    for (prompt_id, round_, version), row in old.items():
        for flags, seen in ((before, True), (after, (prompt_id, round_) not in groups)):
            if seen:
                flags[(prompt_id, version)][0] |= bool(row.shared)
                flags[(prompt_id, version)][1] |= bool(row.gold_ranked)
    for (prompt_id, _, version), state in new.items():
        after[(prompt_id, version)][0] |= state.shared
        after[(prompt_id, version)][1] |= state.gold_ranked
    for key in before.keys() | after.keys():
        change = {name: int(after[key][i]) - int(before[key][i]) for i, name in enumerate(("shared", "gold_ranked"))}
        partial.add(deltas[key[1]].setdefault("p", {}), {k: v for k, v in change.items() if v})


def _write_groups(db: Session, project_id: int, groups: set[tuple[int, int]],
                  new: dict[GroupKey, GroupState]) -> None:
    prompts = sorted({p for p, _ in groups})  # the primary key's first column: an index range per prompt
    pairs = sorted(groups)
    db.execute(delete(_GROUPS).where(_among(db, _GROUPS.c.prompt_id, prompts),
                                     _pairs_among(db, _GROUPS.c.prompt_id, _GROUPS.c.round, pairs)))
    rows = []
    for (p, r, v), s in new.items():
        same = v != 0 and s is new[(p, r, 0)]  # written once, in version 0's row
        rows.append({"prompt_id": p, "round": r, "version": v, "project_id": project_id,
                     "state": {} if same else s.parts, "agreement": s.agreement, "shared": s.shared,
                     "gold_ranked": s.gold_ranked, "folded": None if same else s.folded})
    if rows:
        db.execute(insert(_GROUPS), rows)


def _apply(db: Session, project_id: int, deltas: dict[int, State]) -> None:
    """Add each scope's delta to its totals and its histogram of seconds, and read the median off the histogram
    where it changed (rows created, and deleted once no ranking is left in them, the project's own kept)."""
    wanted = {(v, *_split(key)): part for v, delta in deltas.items() for key, part in delta.items()}
    if not wanted:
        return
    found = {(r.version, r.kind, r.key): r for r in db.execute(
        select(AgreementTotal.version, AgreementTotal.kind, AgreementTotal.key, AgreementTotal.state,
               AgreementTotal.seconds, AgreementTotal.median_seconds)
        .where(AgreementTotal.project_id == project_id,
               tuple_(AgreementTotal.version, AgreementTotal.kind, AgreementTotal.key).in_(sorted(wanted))))}
    inserts: list[dict[str, Any]] = []
    updates: list[dict[str, Any]] = []
    gone: list[TotalsKey] = []
    for key, part in wanted.items():
        row = found.get(key)
        total = dict(row.state) if row else {}
        seconds = dict(row.seconds or {}) if row else {}
        kept, tenths = {}, {}
        for name, n in part.items():
            if name.startswith("s."):  # the histogram has its own column
                tenths[name[2:]] = n
            else:
                kept[name] = n
        partial.add(total, kept)
        partial.add(seconds, tenths)
        values = {"project_id": project_id, "version": key[0], "kind": key[1], "key": key[2],
                  "rankings": int(total.get("n", 0)), "state": total, "seconds": seconds or None,
                  "median_seconds": _median(seconds) if tenths or row is None else row.median_seconds}
        if not total.get("n") and key[1] != "p":
            gone.append(key)
        else:
            (updates if row is not None else inserts).append(values)
    _write_totals(db, project_id, inserts, updates, gone)


def _median(seconds: dict[str, int]) -> float | None:
    """The median of a histogram of tenths (tenth → rankings), in seconds: the tenths at the middle one or two
    positions of the running count."""
    total = sum(seconds.values())
    positions, upto = ((total + 1) // 2, total // 2 + 1), 0
    middle: list[int] = []
    for t in sorted(int(k) for k in seconds):
        upto += seconds[str(t)]
        while len(middle) < 2 and upto >= positions[len(middle)]:
            middle.append(t)
        if len(middle) == 2:
            return median_of_tenths(middle)
    return None


def _split(key: str) -> tuple[str, int]:
    kind, _, number = key.partition(":")
    return kind, int(number or 0)


def _write_totals(db: Session, project_id: int, inserts: list[dict[str, Any]], updates: list[dict[str, Any]],
                  gone: list[TotalsKey]) -> None:
    if inserts:
        db.execute(insert(_TOTALS), inserts)
    if updates:
        db.execute(update(_TOTALS).where(_TOTALS.c.project_id == _bound("project_id"),
                                         _TOTALS.c.version == _bound("version"), _TOTALS.c.kind == _bound("kind"),
                                         _TOTALS.c.key == _bound("key"))
                   .values(rankings=_bound("rankings"), state=_bound("state"), seconds=_bound("seconds"),
                           median_seconds=_bound("median_seconds")),
                   [{f"b_{k}": v for k, v in row.items()} for row in updates])
    if gone:
        db.execute(delete(_TOTALS).where(_TOTALS.c.project_id == project_id,
                                         tuple_(_TOTALS.c.version, _TOTALS.c.kind, _TOTALS.c.key).in_(gone)))


def _bound(name: str) -> Any:
    return bindparam(f"b_{name}", type_=_TOTALS.c[name].type)


def _among(db: Session, column: Any, values: list[int]) -> Any:
    """`column IN values`; on Postgres `column = ANY(array)`: one parameter, so the statement's text is the same
    whatever the count, and the driver parses it once rather than a placeholder per value each drain."""
    if db.get_bind().dialect.name == "postgresql":
        return column == any_(bindparam(None, list(values), type_=ARRAY(Integer)))
    return column.in_(values)


def _pairs_among(db: Session, first: Any, second: Any, pairs: list[tuple[int, int]]) -> Any:
    """`(first, second) IN pairs`; on Postgres against two unnested arrays (as `_among`)."""
    if db.get_bind().dialect.name == "postgresql":
        arrays = [bindparam(None, [pair[i] for pair in pairs], type_=ARRAY(Integer)) for i in (0, 1)]
        return tuple_(first, second).in_(select(func.unnest(arrays[0]), func.unnest(arrays[1])))
    return tuple_(first, second).in_(pairs)


def _chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def _insert_ignore(db: Session, table: Any, keys: list[str]) -> Any:
    """INSERT … ON CONFLICT DO NOTHING, in the dialect's own construct (Postgres or SQLite)."""
    if db.get_bind().dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(table).on_conflict_do_nothing(index_elements=keys)
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    return sqlite_insert(table).on_conflict_do_nothing(index_elements=keys)


# --- the rebuild ---------------------------------------------------------------------------------------------


def rebuild(db: Session, project: Project) -> Drained:
    """Every state and total of the project computed again from its rankings, in the caller's transaction: the
    repair, and what runs once after an upgrade changes a formula. Marks already written are deleted first (their
    rankings are read by the pass that follows)."""
    state = lock(db, project.id)
    assert state is not None  # waited for
    started, t0 = utcnow(), time.perf_counter()
    before = (_flag_view(db, project) if state.formula == AGREEMENT_FORMULA and webhooks.wanted(db, project.id, FLAGGED)
              else None)
    db.execute(delete(_MARKS).where(_MARKS.c.project_id == project.id))
    for table in (_GROUPS, _TOTALS):
        db.execute(delete(table).where(table.c.project_id == project.id))
    ranked = select(Ranking.prompt_id).where(Ranking.project_id == project.id, Ranking.source == "human").distinct()
    prompt_ids = sorted(db.scalars(ranked))
    pending: dict[int, State] = defaultdict(lambda: defaultdict(dict))
    groups = 0
    for i, chunk in enumerate(_chunks(prompt_ids, REBUILD_PROMPTS)):
        # The totals' changes are summed here and written now and then: a key's histogram and totals row are
        # written a few times in all, not once per batch of prompts.
        for version, delta in _recompute(db, project, None, chunk).items():
            for key, part in delta.items():
                partial.add(pending[version][key], part)
        if (i + 1) % REBUILD_FLUSH == 0:
            _apply(db, project.id, pending)
            pending.clear()
    _apply(db, project.id, pending)
    groups = int(db.scalar(select(func.count()).select_from(_GROUPS).where(_GROUPS.c.project_id == project.id,
                                                                           _GROUPS.c.version == 0)) or 0)
    _recount(db, project, state)
    if before is not None:
        _announce(db, project, before, _flag_view(db, project))
    state.formula, state.sequence = AGREEMENT_FORMULA, state.sequence + 1
    state.as_of, state.seconds = started, time.perf_counter() - t0
    db.flush()
    return Drained(0, groups, state.seconds)


# --- jobs and views ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Kept:
    """Where a project's kept figures stand for a view."""

    state: AgreementState | None
    """None: the states are being rebuilt (after an upgrade that changed a formula); nothing to show yet."""
    waiting: int
    """Marks not drained yet (counted up to INLINE_MARKS + 1)."""
    refreshing: bool
    """A drain or rebuild job is queued or running."""


VIEW_AFTER = 3
"""A view folds waiting changes in itself only once the last drain is older than this many sweeps: while a worker
sweeps (every PREFLAB_AGREEMENT_DRAIN_EVERY_S) a view reads the totals and nothing else, and views take over only
where no worker keeps up (none running, or one busy)."""


def current(db: Session, project: Project, actor: User | None, *, every_s: float | None = None) -> Kept:
    """The project's kept state for a view. A worker's sweeper folds the waiting changes in every `every_s` (the
    setting when None); within VIEW_AFTER × `every_s` of the last drain a view reads nothing more and says nothing
    waits. Older than that (no worker keeping up), or the counts older than RECOUNT_S: drained here when few marks
    wait (of groups with few rankings), a drain job queued when more do. A rebuild is queued when the states are of
    older formulas."""
    state = db.get(AgreementState, project.id)
    if state is not None and state.formula != AGREEMENT_FORMULA:
        return Kept(None, 0, ensure_job(db, project, actor, "rebuild"))
    age = None if state is None or state.as_of is None else (utcnow() - state.as_of).total_seconds()
    every = drain_every_s() if every_s is None else every_s
    if age is not None and age < VIEW_AFTER * every:
        return Kept(state, 0, False)  # a worker drained moments ago: a view reads the totals and nothing else
    count = waiting(db, project.id, INLINE_MARKS + 1)
    if count > INLINE_MARKS:
        return Kept(state if age is not None else None, count, ensure_job(db, project, actor, "drain"))
    if age is None or age > RECOUNT_S or count:
        if count and _marked_rankings(db, project.id, INLINE_RANKINGS + 1) > INLINE_RANKINGS:
            return Kept(state if age is not None else None, count, ensure_job(db, project, actor, "drain"))
        drain(db, project, limit=INLINE_MARKS, wait=False)  # skipped while another drain holds the project
        state = db.get(AgreementState, project.id)
        count = waiting(db, project.id, INLINE_MARKS + 1) if count else 0
    return Kept(state, count, False)


def _marked_rankings(db: Session, project_id: int, up_to: int) -> int:
    """Human rankings of the groups a view's drain would read, counted no further than `up_to`."""
    marked = select(AgreementMark.prompt_id).where(AgreementMark.project_id == project_id).limit(INLINE_MARKS)
    ranked = (select(Ranking.id).where(Ranking.prompt_id.in_(marked.scalar_subquery()), Ranking.source == "human")
              .limit(up_to))
    return int(db.scalar(select(func.count()).select_from(ranked.subquery())) or 0)


def drain_every_s() -> float:
    """How often a worker folds the waiting changes in (PREFLAB_AGREEMENT_DRAIN_EVERY_S, 2 s): the figures are that
    fresh whether or not anyone looks, and a page reloaded by several leads costs them reads alone."""
    return float(get_settings().agreement_drain_every_s)


def ensure_job(db: Session, project: Project, actor: User | None, mode: str) -> bool:
    """A `project_rollup` job of this mode queued for the project unless one is queued or running; True."""
    pending = db.scalar(select(Job.id).where(Job.project_id == project.id, Job.kind == KIND,
                                             Job.state.in_(("queued", "running")),
                                             Job.payload["agreement"].as_string() == mode).limit(1))
    if pending is None:
        jobs.enqueue(db, KIND, {"agreement": mode, "requested_at": utcnow().isoformat()}, project=project,
                     actor=actor, max_attempts=1)
    return True


# --- flags raised by a drain ---------------------------------------------------------------------------------


def _flag_view(db: Session, project: Project) -> dict[int, tuple[Any, set[str]]]:
    """Annotators the whole-project figures flag now: user id → (their figures, the flag kinds)."""
    state = db.get(AgreementState, project.id)
    report = kept_report.report(db, project, None, [], state, people=False)
    return {a.user_id: (a, {f.kind for f in a.flags}) for a in report.annotators if a.flags}


def _announce(db: Session, project: Project, before: dict[int, tuple[Any, set[str]]],
              after: dict[int, tuple[Any, set[str]]]) -> None:
    """An `annotator.flagged` webhook event for each flag the figures raise now that they did not before."""
    fresh = {uid: sorted(kinds - before.get(uid, (None, set()))[1]) for uid, (_, kinds) in after.items()}
    fresh = {uid: kinds for uid, kinds in fresh.items() if kinds}
    if not fresh:
        return
    names = dict(db.execute(select(User.id, User.name).where(User.id.in_(list(fresh)))).all())
    for uid, kinds in sorted(fresh.items()):
        stats = after[uid][0]
        webhooks.fire(db, project.id, FLAGGED, {
            "user_id": uid, "name": names.get(uid, ""), "flags": kinds, "rankings": stats.rankings,
            "url": f"/projects/{project.id}/agreement/annotators/{uid}"})
