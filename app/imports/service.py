"""Importing prompts with completions, or finished preference pairs, into a project; all or nothing.

`parse_import` (in import_formats) reads and validates the file without a database; `apply_import` checks
what needs the project (K, duplicates, splits), and only when everything passes writes prompts, completions
and, for pairs, one imported Ranking with its Pair per row, plus one AuditEvent. Nothing is committed here.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.accounts import security
from app.annotation import rankings, steps
from app.imports.formats import (
    MAX_ERRORS,
    ImportRejected,
    PairRow,
    ParsedImport,
    PromptRow,
    RankedRow,
    RowError,
    StepRow,
    _Problems,
    canonical_prompt,
    parse_import,
    prompt_text_hash,
    render_messages,
)
from app.models import Assignment, Completion, Pair, Project, ProjectMember, Prompt, StepLabel, User, utcnow
from app.platform import audit, bulk
from app.platform.formats import IMPORT_PRESETS

__all__ = [
    "PRESETS",
    "ImportRejected",
    "ImportResult",
    "PairRow",
    "ParsedImport",
    "PromptRow",
    "RowError",
    "apply_import",
    "canonical_prompt",
    "import_file",
    "parse_import",
    "prompt_text_hash",
    "render_messages",
]

PRESETS = IMPORT_PRESETS
OnDuplicate = Literal["error", "skip"]
SOURCE = "imported"
_CHUNK = 500
"""Ids or hashes per IN (...) query: well under SQLite's bound-parameter limit."""
_R = TypeVar("_R", PromptRow, RankedRow)


@dataclass
class ImportResult:
    prompts: int
    """Prompts created (for pair files: prompts that were not in the project yet)."""
    completions: int
    """Completions created; identical text under one prompt is reused, not counted twice."""
    pairs: int
    skipped_duplicates: list[int] = field(default_factory=list)
    """Lines (Parquet: rows) left out because on_duplicate="skip" and they repeated a prompt or pair."""
    kind: str = "prompts"
    rankings: int = 0
    """Rankings by other tools' annotators (label-studio, argilla presets)."""
    annotators: int = 0
    """Pseudonymous users those rankings brought (new or already known from an earlier import)."""
    step_labels: int = 0
    """Step labels imported (trl-stepwise, prm800k presets), one per labelled step."""
    preset: str = "preflab"
    """The layout the file was read in (asked for, or detected)."""
    extra_columns: list[str] = field(default_factory=list)
    note: str | None = None
    """The import report's line about extra columns: "kept 3 extra columns: prompt_id, source, model"."""


def import_file(
    db: Session,
    project: Project,
    filename: str,
    data: bytes,
    *,
    actor: User | None,
    max_rows: int = 200_000,
    on_duplicate: OnDuplicate = "error",
    preset: str | None = None,
    strict: bool = False,
) -> ImportResult:
    """Parse and apply one uploaded file; raises ImportRejected (nothing written) when anything is wrong.

    `preset` names the file's layout (detected when None); `strict` refuses unknown columns instead of keeping
    them in each row's metadata."""
    parsed = parse_import(filename, data, max_rows=max_rows, preset=preset, strict=strict)
    return apply_import(db, project, parsed, actor=actor, on_duplicate=on_duplicate)


def apply_import(
    db: Session,
    project: Project,
    parsed: ParsedImport,
    *,
    actor: User | None,
    on_duplicate: OnDuplicate = "error",
) -> ImportResult:
    """Check the parsed rows against the project, then write them; raises ImportRejected before any write."""
    if on_duplicate not in ("error", "skip"):
        raise ValueError(f"on_duplicate must be 'error' or 'skip', got {on_duplicate!r}")
    problems = _Problems("row" if parsed.format == "parquet" else "line")
    if parsed.kind == "prompts":
        result = _import_prompts(db, project, parsed.prompts, on_duplicate, problems)
    elif parsed.kind == "rankings":
        result = _import_ranked(db, project, parsed.ranked, on_duplicate, problems)
    elif parsed.kind == "steps":
        result = _import_steps(db, project, parsed.stepped, on_duplicate, problems, parsed.sha256)
    else:
        result = _import_pairs(db, project, parsed.pairs, on_duplicate, problems)
    result.preset = parsed.preset
    result.extra_columns = parsed.extra_columns
    result.note = parsed.extra_columns_note()
    audit.record(
        db,
        actor,
        "import",
        project_id=project.id,
        object_type="project",
        object_id=project.id,
        filename=parsed.filename,
        format=parsed.format,
        kind=parsed.kind,
        sha256=parsed.sha256,
        bytes=parsed.size,
        rows=parsed.rows,
        prompts=result.prompts,
        completions=result.completions,
        pairs=result.pairs,
        skipped_duplicates=len(result.skipped_duplicates),
        skipped_lines=result.skipped_duplicates[:MAX_ERRORS],
        on_duplicate=on_duplicate,
        preset=parsed.preset,
        rankings=result.rankings,
        step_labels=result.step_labels,
        extra_columns=parsed.extra_columns[:MAX_ERRORS],
    )
    db.flush()
    return result


# --- lookups ------------------------------------------------------------------------------------


def _chunks(values: Sequence[Any]) -> Iterable[Sequence[Any]]:
    for start in range(0, len(values), _CHUNK):
        yield values[start : start + _CHUNK]


def _existing_prompts(db: Session, project_id: int, hashes: Iterable[str]) -> dict[str, tuple[int, str]]:
    """text_hash → (prompt id, split) for the prompts of this project among `hashes`."""
    found: dict[str, tuple[int, str]] = {}
    for chunk in _chunks(sorted(set(hashes))):
        rows = db.execute(
            select(Prompt.text_hash, Prompt.id, Prompt.split).where(
                Prompt.project_id == project_id, Prompt.text_hash.in_(chunk)
            )
        )
        found.update({h: (pid, split) for h, pid, split in rows})
    return found


def _dup_hint(on_duplicate: str) -> str:
    return "; import with on_duplicate=skip to leave duplicates out" if on_duplicate == "error" else ""


def _prompt_values(project_id: int, row: PromptRow | PairRow | RankedRow | StepRow, split: str,
                   **columns: Any) -> dict[str, Any]:
    """A new prompt's row; `messages` is left out for a plain prompt (SQL NULL, not JSON null)."""
    values: dict[str, Any] = {
        "project_id": project_id,
        "text": row.text,
        "text_hash": row.text_hash,
        "split": split,
        **columns,
    }
    if row.messages is not None:
        values["messages"] = row.messages
    return values


def _set_aside(line: int, field: str, why: str, on_duplicate: str, skipped: list[int], problems: _Problems) -> None:
    """A duplicate row: left out (its line noted) with on_duplicate=skip, else a problem on `field`."""
    if on_duplicate == "skip":
        skipped.append(line)
    else:
        problems.add(line, field, why + _dup_hint(on_duplicate))


def _new_prompt_rows(rows: list[_R], existing: dict[str, tuple[int, str]], on_duplicate: str, problems: _Problems,
                     skipped: list[int], *, chat_field: str) -> Iterator[_R]:
    """The rows whose prompt is neither in the project nor on an earlier line; each other row is set aside on
    `prompt` (on `chat_field` for a chat). Lazy, so the caller's own problems stay in file order with these."""
    first_line: dict[str, int] = {}
    for row in rows:
        if row.text_hash in existing:
            why = f"prompt already in the project (prompt id {existing[row.text_hash][0]})"
        elif row.text_hash in first_line:
            why = f"same prompt as line {first_line[row.text_hash]}"
        else:
            first_line[row.text_hash] = row.line
            yield row
            continue
        field_name = chat_field if row.messages is not None else "prompt"
        _set_aside(row.line, field_name, why, on_duplicate, skipped, problems)


def _new_tasks(db: Session, project: Project, rows: list[_R], on_duplicate: str, problems: _Problems, *,
               chat_field: str, noun: str, check: Callable[[_R, _Problems], None] | None = None,
               ) -> tuple[list[_R], list[int]]:
    """Rows that become new tasks (prompt plus its completions), checked against the project's K, and the lines
    skipped as duplicates; raises with every problem found."""
    k = project.completions_per_prompt
    existing = _existing_prompts(db, project.id, (row.text_hash for row in rows))
    keep: list[_R] = []
    skipped: list[int] = []
    for row in _new_prompt_rows(rows, existing, on_duplicate, problems, skipped, chat_field=chat_field):
        if len(row.completions) > k:
            problems.add(row.line, "completions", f"{len(row.completions)} {noun}, but this project ranks {k} "
                         "per prompt; remove some or raise completions_per_prompt")
        if check is not None:
            check(row, problems)
        keep.append(row)
    problems.raise_if_any()
    return keep, skipped


def _one_ranking_per_annotator(row: RankedRow, problems: _Problems) -> None:
    annotators = [r.annotator for r in row.rankings]
    if len(set(annotators)) != len(annotators):
        problems.add(row.line, "annotations", "one annotator ranked this task twice; keep one of the two")


# --- prompt rows --------------------------------------------------------------------------------


def _import_prompts(
    db: Session, project: Project, rows: list[PromptRow], on_duplicate: str, problems: _Problems
) -> ImportResult:
    keep, skipped = _new_tasks(db, project, rows, on_duplicate, problems, chat_field="messages", noun="completions")

    values = [_prompt_values(project.id, row, row.split, reference=row.reference, meta=row.metadata) for row in keep]
    prompt_ids = bulk.insert_rows(db, Prompt, values, ids=True)
    completion_values = [
        _completion_values(project, prompt_id, body)
        for prompt_id, row in zip(prompt_ids, keep, strict=True)
        for body in row.completions
    ]
    bulk.insert_rows(db, Completion, completion_values)
    return ImportResult(
        prompts=len(prompt_ids), completions=len(completion_values), pairs=0, skipped_duplicates=skipped
    )


# --- pair rows ----------------------------------------------------------------------------------
#
# Pairs are finished labels, not a ranking queue: a prompt may collect any number of distinct responses
# across pair rows (HH-RLHF has prompts answered many ways), so the project's K, which sizes what an
# annotator is shown at once, does not limit them. Each row becomes one imported Ranking [[chosen],[rejected]].


def _import_pairs(
    db: Session, project: Project, rows: list[PairRow], on_duplicate: str, problems: _Problems
) -> ImportResult:
    existing = _existing_prompts(db, project.id, (row.text_hash for row in rows))
    completion_id, known_pairs = _known_completions_and_pairs(db, existing)
    keep, skipped, split_from = _rows_to_write(rows, existing, completion_id, known_pairs, on_duplicate, problems)
    problems.raise_if_any()

    prompt_id = {h: pid for h, (pid, _) in existing.items()}
    new_prompts = _create_prompts(db, project, keep, prompt_id, split_from)
    new_completions = _create_completions(db, project, keep, prompt_id, completion_id)
    labelled = []
    for row in keep:
        pid = prompt_id[row.text_hash]
        chosen, rejected = completion_id[(pid, row.chosen)], completion_id[(pid, row.rejected)]
        labelled.append(rankings.NewRanking(
            {"project_id": project.id, "prompt_id": pid, "round": project.current_round, "source": SOURCE,
             "rubric_id": project.current_rubric_id, "tiers": [[chosen], [rejected]]},
            {(chosen, rejected): rankings.PairLabel(margin=row.margin, weight=row.weight, p=row.p,
                                                    meta=row.metadata)},
        ))
    rankings.write_rankings(db, labelled)
    return ImportResult(
        prompts=new_prompts,
        completions=new_completions,
        pairs=len(keep),
        skipped_duplicates=skipped,
        kind="pairs",
    )


def _known_completions_and_pairs(
    db: Session, existing: dict[str, tuple[int, str]]
) -> tuple[dict[tuple[int, str], int], set[tuple[int, int, int]]]:
    """(prompt id, text) → completion id, and the (prompt, chosen, rejected) already imported, of prompts we have."""
    completion_id: dict[tuple[int, str], int] = {}
    known_pairs: set[tuple[int, int, int]] = set()
    for chunk in _chunks(sorted(pid for pid, _ in existing.values())):
        completion_id.update(
            {(pid, text): cid for pid, cid, text in db.execute(
                select(Completion.prompt_id, Completion.id, Completion.text).where(Completion.prompt_id.in_(chunk))
            )}
        )
        known_pairs.update(
            (pid, chosen, rejected) for pid, chosen, rejected in db.execute(
                select(Pair.prompt_id, Pair.chosen_id, Pair.rejected_id).where(
                    Pair.prompt_id.in_(chunk), Pair.source == SOURCE
                )
            )
        )
    return completion_id, known_pairs


def _rows_to_write(
    rows: list[PairRow],
    existing: dict[str, tuple[int, str]],
    completion_id: dict[tuple[int, str], int],
    known_pairs: set[tuple[int, int, int]],
    on_duplicate: str,
    problems: _Problems,
) -> tuple[list[PairRow], list[int], dict[str, tuple[str, int]]]:
    """(rows to write, lines skipped, text_hash → (split, first line naming it)), each row's problems in file order:
    a prompt given two splits, and a pair repeated in the file or already imported (skipped, or a problem)."""
    split_from: dict[str, tuple[str, int]] = {}
    first_pair: dict[tuple[str, str, str], int] = {}
    keep: list[PairRow] = []
    skipped: list[int] = []
    for row in rows:
        _check_split(row, existing, split_from, problems)
        duplicate = _duplicate_of(row, first_pair, existing, completion_id, known_pairs)
        if duplicate is None:
            first_pair[(row.text_hash, row.chosen, row.rejected)] = row.line
            keep.append(row)
        else:
            _set_aside(row.line, "chosen", duplicate, on_duplicate, skipped, problems)
    return keep, skipped, split_from


def _check_split(row: PairRow, existing: dict[str, tuple[int, str]], split_from: dict[str, tuple[str, int]],
                 problems: _Problems) -> None:
    """A prompt keeps one split: the one it has in the project, else the first row's that names one."""
    if row.split is None:
        return
    if row.text_hash in existing and existing[row.text_hash][1] != row.split:
        pid, split = existing[row.text_hash]
        problems.add(row.line, "split", f"the prompt is already in the project (prompt id {pid}) "
                     f"in split {split!r}, not {row.split!r}")
    elif row.text_hash in split_from and split_from[row.text_hash][0] != row.split:
        split, line = split_from[row.text_hash]
        problems.add(row.line, "split", f"line {line} put the same prompt in split {split!r}")
    else:
        split_from.setdefault(row.text_hash, (row.split, row.line))


def _duplicate_of(row: PairRow, first_pair: dict[tuple[str, str, str], int], existing: dict[str, tuple[int, str]],
                  completion_id: dict[tuple[int, str], int], known_pairs: set[tuple[int, int, int]]) -> str | None:
    """Why the row repeats a pair (an earlier line's, or one already imported), or None."""
    key = (row.text_hash, row.chosen, row.rejected)
    if key in first_pair:
        return f"same prompt, chosen and rejected as line {first_pair[key]}"
    if row.text_hash in existing:
        pid = existing[row.text_hash][0]
        ids = (pid, completion_id.get((pid, row.chosen)), completion_id.get((pid, row.rejected)))
        if ids in known_pairs:
            return f"this pair was already imported (prompt id {pid})"
    return None


def _create_prompts(
    db: Session, project: Project, keep: list[PairRow], prompt_id: dict[str, int],
    split_from: dict[str, tuple[str, int]],
) -> int:
    """Prompts new to the project, in file order (one for all rows that share it), added to `prompt_id`; how many."""
    new_rows: dict[str, PairRow] = {}
    for row in keep:
        if row.text_hash not in prompt_id:
            new_rows.setdefault(row.text_hash, row)
    values = [_prompt_values(project.id, row, split_from.get(text_hash, ("train", 0))[0])
              for text_hash, row in new_rows.items()]
    prompt_id.update(zip(new_rows, bulk.insert_rows(db, Prompt, values, ids=True), strict=True))
    return len(values)


def _completion_values(project: Project, prompt_id: int, body: str) -> dict[str, Any]:
    """An imported completion's row: split into steps when the project labels steps."""
    values: dict[str, Any] = {"prompt_id": prompt_id, "text": body, "source": SOURCE}
    split = steps.steps_for(project, body)
    if split is not None:
        values["steps"] = split
    return values


def _create_completions(
    db: Session, project: Project, keep: list[PairRow], prompt_id: dict[str, int],
    completion_id: dict[tuple[int, str], int]
) -> int:
    """The responses not yet under their prompt (identical text is reused), added to `completion_id`; how many."""
    new_completions: dict[tuple[int, str], list[dict[str, str]] | None] = {}
    for row in keep:
        pid = prompt_id[row.text_hash]
        for response, turns in ((row.chosen, row.chosen_messages), (row.rejected, row.rejected_messages)):
            if (pid, response) not in completion_id:
                new_completions.setdefault((pid, response), turns)
    values = []
    for (pid, body), turns in new_completions.items():
        # Every row names every column: a bulk COPY writes NULL for a key some rows leave out.
        meta = {"messages": turns} if turns is not None else {}
        values.append(_completion_values(project, pid, body) | {"meta": meta})
    completion_id.update(zip(new_completions, bulk.insert_rows(db, Completion, values, ids=True), strict=True))
    return len(new_completions)


# --- rows ranked in another tool (Label Studio, Argilla) ------------------------------------------
#
# Each annotator of the source tool becomes one pseudonymous, inactive preflab user (it cannot sign in or be
# given tasks), a member of the project as annotator, so agreement and quality figures count their rankings
# like any other person's, and the queue counts them towards each prompt's overlap. The tool, task and
# annotation ids stay in each ranking's metadata.

PSEUDONYM_DOMAIN = "imported.invalid"


def pseudonym_email(key: str) -> str:
    """The stable e-mail of the user standing for `key` ("tool:annotator id")."""
    tool, _, who = key.partition(":")
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in who)[:80] or "unknown"
    return f"{tool}-{safe}@{PSEUDONYM_DOMAIN}".lower()


def _pseudonymous_users(db: Session, project: Project, keys: Iterable[str]) -> dict[str, int]:
    """key → user id, creating the users (and their membership of the project) not there yet."""
    wanted = {key: pseudonym_email(key) for key in dict.fromkeys(keys)}
    found = dict(db.execute(select(User.email, User.id).where(User.email.in_(sorted(set(wanted.values()))))).all())
    for key, email in wanted.items():
        if email not in found:
            user = User(email=email, name=f"{key} (imported)"[:200], role="annotator", active=False,
                        password_hash=security.hash_password(secrets.token_urlsafe(32)))
            db.add(user)
            db.flush()
            found[email] = user.id
    members = set(db.scalars(select(ProjectMember.user_id).where(ProjectMember.project_id == project.id)))
    for user_id in sorted(set(found.values()) - members):
        db.add(ProjectMember(project_id=project.id, user_id=user_id, role="annotator"))
    db.flush()
    return {key: found[email] for key, email in wanted.items()}


def _import_ranked(
    db: Session, project: Project, rows: list[RankedRow], on_duplicate: str, problems: _Problems
) -> ImportResult:
    keep, skipped = _new_tasks(db, project, rows, on_duplicate, problems, chat_field="prompt", noun="responses",
                               check=_one_ranking_per_annotator)

    values = [_prompt_values(project.id, row, "train", meta=row.metadata) for row in keep]
    prompt_ids = bulk.insert_rows(db, Prompt, values, ids=True)
    completion_ids = bulk.insert_rows(db, Completion, [
        {"prompt_id": pid, "text": body, "source": SOURCE}
        for pid, row in zip(prompt_ids, keep, strict=True) for body in row.completions
    ], ids=True)
    user_id = _pseudonymous_users(db, project, (r.annotator for row in keep for r in row.rankings))
    labelled = []
    offset = 0
    for pid, row in zip(prompt_ids, keep, strict=True):
        ids = completion_ids[offset: offset + len(row.completions)]
        offset += len(row.completions)
        for ranking in row.rankings:
            labelled.append(rankings.NewRanking(
                {"project_id": project.id, "prompt_id": pid, "round": project.current_round, "source": "human",
                 "annotator_id": user_id[ranking.annotator], "rubric_id": project.current_rubric_id,
                 "tiers": [[ids[i] for i in tier] for tier in ranking.tiers], "display_order": list(ids),
                 "meta": ranking.meta}
            ))
    rankings.write_rankings(db, labelled)
    # A submitted assignment per ranking, as a ranking made here leaves: the queue counts a prompt's overlap from
    # them, so a task ranked enough times in the other tool is not handed out again.
    now = utcnow()
    bulk.insert_rows(db, Assignment, [
        {"project_id": project.id, "prompt_id": r.values["prompt_id"], "annotator_id": r.values["annotator_id"],
         "round": project.current_round, "state": "submitted", "leased_until": now, "created_at": now,
         "completed_at": now} for r in labelled])
    return ImportResult(prompts=len(prompt_ids), completions=len(completion_ids),
                        pairs=sum(len(rankings.pair_rows(0, r)) for r in labelled), skipped_duplicates=skipped,
                        kind="rankings", rankings=len(labelled), annotators=len(user_id))


# --- step-labelled rows (TRL stepwise supervision, PRM800K) -----------------------------------------
#
# A step label belongs to a ranking (StepLabel.ranking_id), and a prompt has one ranking per labeller and round.
# So rows are grouped: one prompt per prompt text, one completion per distinct path of steps under it (labellers
# who labelled the same solution share it, so step agreement compares them), and one ranking per prompt and
# labeller holding that labeller's step labels for each of its completions. The ranking ties them all in one
# tier: step data says nothing about which solution is better, so it makes no pairs. A PRM800K labeller is a
# pseudonymous user (source human, as Label Studio's); a TRL-stepwise file names none, so its labels are the
# source `imported`, like imported pairs. A prompt may collect more completions than K: these are finished
# labels, as pair files' are.


def _import_steps(db: Session, project: Project, rows: list[StepRow], on_duplicate: str, problems: _Problems,
                  sha256: str) -> ImportResult:
    options = steps.options(project)
    if not options.enabled:
        problems.add(0, "preset", "this project does not label steps; turn step labels on (the project page, "
                     "or PUT /api/projects/{id}/step-options) before importing step labels")
        problems.raise_if_any()
    keep, skipped = _step_rows_to_write(db, project, rows, on_duplicate, problems)
    problems.raise_if_any()

    first: dict[str, StepRow] = {}
    for row in keep:
        first.setdefault(row.text_hash, row)
    prompt_ids = dict(zip(first, bulk.insert_rows(db, Prompt, [
        _prompt_values(project.id, row, "train", reference=row.reference, meta=row.metadata)
        for row in first.values()], ids=True), strict=True))
    paths = list(dict.fromkeys((row.text_hash, tuple(row.steps)) for row in keep))
    completion_ids = dict(zip(paths, bulk.insert_rows(db, Completion, [
        {"prompt_id": prompt_ids[h], "text": steps.join(list(path), options.separator), "source": SOURCE,
         "steps": list(path), "meta": {}} for h, path in paths], ids=True), strict=True))
    user_id = _pseudonymous_users(db, project, [row.annotator for row in keep if row.annotator is not None])

    groups: dict[tuple[str, str | None], list[StepRow]] = {}
    for row in keep:
        groups.setdefault((row.text_hash, row.annotator), []).append(row)
    labelled = []
    for (text_hash, annotator), group in groups.items():
        ids = [completion_ids[(text_hash, tuple(row.steps))] for row in group]
        who = {"source": "human", "annotator_id": user_id[annotator]} if annotator else {"source": SOURCE}
        labelled.append(rankings.NewRanking({
            "project_id": project.id, "prompt_id": prompt_ids[text_hash], "round": project.current_round,
            "rubric_id": project.current_rubric_id, "tiers": [ids], "display_order": ids, **who,
            "meta": {"source_tool": group[0].meta.get("source_tool"), "file_sha256": sha256,
                     "rows": [{k: v for k, v in row.meta.items() if k != "source_tool"} | {"line": row.line}
                              for row in group]}}))
    ranking_ids = rankings.write_rankings(db, labelled)
    label_rows = [{"ranking_id": ranking_id, "completion_id": completion_ids[(row.text_hash, tuple(row.steps))],
                   "step_index": i, "label": label}
                  for ranking_id, group in zip(ranking_ids, groups.values(), strict=True)
                  for row in group for i, label in enumerate(row.labels)]
    bulk.insert_rows(db, StepLabel, label_rows)
    # A submitted assignment per labeller's ranking, as the Label Studio import leaves: the queue counts overlap
    # from them.
    now = utcnow()
    bulk.insert_rows(db, Assignment, [
        {"project_id": project.id, "prompt_id": r.values["prompt_id"], "annotator_id": r.values["annotator_id"],
         "round": project.current_round, "state": "submitted", "leased_until": now, "created_at": now,
         "completed_at": now} for r in labelled if r.values["source"] == "human"])
    return ImportResult(prompts=len(prompt_ids), completions=len(completion_ids), pairs=0,
                        skipped_duplicates=skipped, kind="steps", rankings=len(labelled), annotators=len(user_id),
                        step_labels=len(label_rows))


def _step_rows_to_write(db: Session, project: Project, rows: list[StepRow], on_duplicate: str,
                        problems: _Problems) -> tuple[list[StepRow], list[int]]:
    """The rows to write and the lines skipped: a prompt already in the project is a duplicate (skipped or a
    problem), as in other imports; one labeller labelling the same steps twice is a problem."""
    existing = _existing_prompts(db, project.id, (row.text_hash for row in rows))
    seen: dict[tuple[str, str | None, tuple[str, ...]], int] = {}
    keep: list[StepRow] = []
    skipped: list[int] = []
    for row in rows:
        if row.text_hash in existing:
            _set_aside(row.line, "prompt", f"prompt already in the project (prompt id {existing[row.text_hash][0]})",
                       on_duplicate, skipped, problems)
            continue
        key = (row.text_hash, row.annotator, tuple(row.steps))
        if key in seen:
            who = "the dataset" if row.annotator is None else f"labeller {row.annotator.partition(':')[2]}"
            problems.add(row.line, "steps", f"line {seen[key]} has the same prompt and steps, labelled by {who}; "
                         "keep one of the two")
            continue
        seen[key] = row.line
        keep.append(row)
    return keep, skipped
