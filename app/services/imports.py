"""Importing prompts with completions, or finished preference pairs, into a project; all or nothing.

`parse_import` (in import_formats) reads and validates the file without a database; `apply_import` checks
what needs the project (K, duplicates, splits), and only when everything passes writes prompts, completions
and, for pairs, one imported Ranking with its Pair per row, plus one AuditEvent. Nothing is committed here.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from sqlalchemy import JSON, insert, select, text
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.orm import Session

from app.models import Base, Completion, Pair, Project, Prompt, Ranking, User
from app.services import audit
from app.services.import_formats import (
    MAX_ERRORS,
    ImportRejected,
    PairRow,
    ParsedImport,
    PromptRow,
    RowError,
    _Problems,
    canonical_prompt,
    parse_import,
    prompt_text_hash,
    render_messages,
)

__all__ = [
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

OnDuplicate = Literal["error", "skip"]
SOURCE = "imported"
_CHUNK = 500
"""Ids or hashes per IN (...) query: well under SQLite's bound-parameter limit."""


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


def import_file(
    db: Session,
    project: Project,
    filename: str,
    data: bytes,
    *,
    actor: User | None,
    max_rows: int = 200_000,
    on_duplicate: OnDuplicate = "error",
) -> ImportResult:
    """Parse and apply one uploaded file; raises ImportRejected (nothing written) when anything is wrong."""
    parsed = parse_import(filename, data, max_rows=max_rows)
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
    else:
        result = _import_pairs(db, project, parsed.pairs, on_duplicate, problems)
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


def _prompt_values(project_id: int, row: PromptRow | PairRow, split: str) -> dict[str, Any]:
    values: dict[str, Any] = {
        "project_id": project_id,
        "text": row.text,
        "text_hash": row.text_hash,
        "split": split,
    }
    return values


def _bulk_insert(db: Session, model: type[Base], rows: list[dict[str, Any]], *, ids: bool = False) -> list[int]:
    """Insert many rows (keys are attribute names; a missing key means SQL NULL or the column's default),
    in the order given, returning their new ids when `ids` is set.

    Postgres gets COPY, several times faster than batched INSERTs for tens of thousands of rows, with ids
    drawn from the table's sequence first. Elsewhere each run of rows with the same keys is one executemany
    (leaving `messages` out stores SQL NULL, where an explicit None would store the JSON value null).
    """
    if not rows:
        return []
    db.flush()
    if db.get_bind().dialect.name == "postgresql":
        return _copy_rows(db, model, rows, ids=ids)
    new_ids: list[int] = []
    start = 0
    while start < len(rows):
        end = start
        while end < len(rows) and rows[end].keys() == rows[start].keys():
            end += 1
        statement = insert(model)
        if ids:
            id_column = sa_inspect(model).primary_key[0]
            new_ids.extend(
                db.scalars(statement.returning(id_column, sort_by_parameter_order=True), rows[start:end]).all()
            )
        else:
            db.execute(statement, rows[start:end])
        start = end
    return new_ids


def _copy_rows(db: Session, model: type[Base], rows: list[dict[str, Any]], *, ids: bool) -> list[int]:
    from psycopg import sql

    mapper = sa_inspect(model)
    table = mapper.local_table
    id_column = mapper.primary_key[0]
    given = {key for row in rows for key in row}
    columns: list[tuple[str, str]] = []  # (column name, attribute key) of the values the rows give
    fixed: dict[str, Any] = {}
    for attr in mapper.column_attrs:
        column = attr.columns[0]
        if column is id_column:
            continue
        if attr.key in given:
            columns.append((column.name, attr.key))
        elif column.default is not None and column.default.is_scalar:
            fixed[column.name] = column.default.arg
        elif column.default is not None and column.default.is_callable:
            fixed[column.name] = column.default.arg(None)  # utcnow, dict, list: one value for the whole import
    json_columns = {c.name for c in table.columns if isinstance(c.type, JSON)}

    def cell(name: str, value: Any) -> Any:
        # COPY's text format takes JSON as its text; serialising here skips psycopg's per-value adapter.
        return json.dumps(value, ensure_ascii=False) if name in json_columns and value is not None else value

    new_ids: list[int] = []
    if ids:
        new_ids = sorted(db.scalars(
            text("SELECT nextval(pg_get_serial_sequence(:table, :column)) FROM generate_series(1, :n)"),
            {"table": table.name, "column": id_column.name, "n": len(rows)},
        ).all())
    names = ([id_column.name] if ids else []) + [name for name, _ in columns] + list(fixed)
    statement = sql.SQL("COPY {} ({}) FROM STDIN").format(
        sql.Identifier(table.name), sql.SQL(", ").join(map(sql.Identifier, names))
    )
    fixed_cells = [cell(name, value) for name, value in fixed.items()]
    driver = db.connection().connection.driver_connection
    assert driver is not None
    with driver.cursor() as cursor, cursor.copy(statement) as copy:
        for i, row in enumerate(rows):
            values = [cell(name, row.get(key)) for name, key in columns]
            copy.write_row(([new_ids[i]] if ids else []) + values + fixed_cells)
    return new_ids


# --- prompt rows --------------------------------------------------------------------------------


def _import_prompts(
    db: Session, project: Project, rows: list[PromptRow], on_duplicate: str, problems: _Problems
) -> ImportResult:
    k = project.completions_per_prompt
    existing = _existing_prompts(db, project.id, (row.text_hash for row in rows))
    first_line: dict[str, int] = {}
    keep: list[PromptRow] = []
    skipped: list[int] = []
    for row in rows:
        field_name = "messages" if row.messages is not None else "prompt"
        if row.text_hash in existing:
            duplicate = f"prompt already in the project (prompt id {existing[row.text_hash][0]})"
        elif row.text_hash in first_line:
            duplicate = f"same prompt as line {first_line[row.text_hash]}"
        else:
            first_line[row.text_hash] = row.line
            if len(row.completions) > k:
                problems.add(
                    row.line, "completions",
                    f"{len(row.completions)} completions, but this project ranks {k} per prompt; "
                    "remove some or raise completions_per_prompt",
                )
            keep.append(row)
            continue
        if on_duplicate == "skip":
            skipped.append(row.line)
        else:
            problems.add(row.line, field_name, duplicate + _dup_hint(on_duplicate))
    problems.raise_if_any()

    values = []
    for row in keep:
        item = _prompt_values(project.id, row, row.split)
        item["reference"] = row.reference
        item["meta"] = row.metadata
        if row.messages is not None:
            item["messages"] = row.messages
        values.append(item)
    prompt_ids = _bulk_insert(db, Prompt, values, ids=True)
    completion_values = [
        {"prompt_id": prompt_id, "text": body, "source": SOURCE}
        for prompt_id, row in zip(prompt_ids, keep, strict=True)
        for body in row.completions
    ]
    _bulk_insert(db, Completion, completion_values)
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
    existing_ids = sorted(pid for pid, _ in existing.values())
    completion_id: dict[tuple[int, str], int] = {}
    known_pairs: set[tuple[int, int, int]] = set()
    for chunk in _chunks(existing_ids):
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

    split_from: dict[str, tuple[str, int]] = {}
    first_pair: dict[tuple[str, str, str], int] = {}
    keep: list[PairRow] = []
    skipped: list[int] = []
    for row in rows:
        if row.split is not None:
            if row.text_hash in existing and existing[row.text_hash][1] != row.split:
                pid, split = existing[row.text_hash]
                problems.add(row.line, "split", f"the prompt is already in the project (prompt id {pid}) "
                             f"in split {split!r}, not {row.split!r}")
            elif row.text_hash in split_from and split_from[row.text_hash][0] != row.split:
                split, line = split_from[row.text_hash]
                problems.add(row.line, "split", f"line {line} put the same prompt in split {split!r}")
            else:
                split_from.setdefault(row.text_hash, (row.split, row.line))
        key = (row.text_hash, row.chosen, row.rejected)
        duplicate = None
        if key in first_pair:
            duplicate = f"same prompt, chosen and rejected as line {first_pair[key]}"
        elif row.text_hash in existing:
            pid = existing[row.text_hash][0]
            ids = (pid, completion_id.get((pid, row.chosen)), completion_id.get((pid, row.rejected)))
            if ids in known_pairs:
                duplicate = f"this pair was already imported (prompt id {pid})"
        if duplicate is None:
            first_pair[key] = row.line
            keep.append(row)
        elif on_duplicate == "skip":
            skipped.append(row.line)
        else:
            problems.add(row.line, "chosen", duplicate + _dup_hint(on_duplicate))
    problems.raise_if_any()

    # Prompts new to the project, in file order; a prompt that several rows share is created once.
    prompt_id = {h: pid for h, (pid, _) in existing.items()}
    new_rows: dict[str, PairRow] = {}
    for row in keep:
        if row.text_hash not in prompt_id:
            new_rows.setdefault(row.text_hash, row)
    values = []
    for text_hash, row in new_rows.items():
        item = _prompt_values(project.id, row, split_from.get(text_hash, ("train", 0))[0])
        if row.messages is not None:
            item["messages"] = row.messages
        values.append(item)
    prompt_id.update(zip(new_rows, _bulk_insert(db, Prompt, values, ids=True), strict=True))

    new_completions: dict[tuple[int, str], None] = {}
    for row in keep:
        pid = prompt_id[row.text_hash]
        for response in (row.chosen, row.rejected):
            if (pid, response) not in completion_id:
                new_completions[(pid, response)] = None
    completion_id.update(zip(new_completions, _bulk_insert(
        db, Completion, [{"prompt_id": pid, "text": body, "source": SOURCE} for pid, body in new_completions], ids=True
    ), strict=True))

    def ids_of(row: PairRow) -> tuple[int, int, int]:
        pid = prompt_id[row.text_hash]
        return pid, completion_id[(pid, row.chosen)], completion_id[(pid, row.rejected)]

    labelled = [(row, *ids_of(row)) for row in keep]
    ranking_ids = _bulk_insert(db, Ranking, [
        {
            "project_id": project.id,
            "prompt_id": pid,
            "round": project.current_round,
            "source": SOURCE,
            "rubric_id": project.current_rubric_id,
            "tiers": [[chosen], [rejected]],
        }
        for _, pid, chosen, rejected in labelled
    ], ids=True)
    _bulk_insert(db, Pair, [
        {
            "ranking_id": ranking_id,
            "prompt_id": pid,
            "chosen_id": chosen,
            "rejected_id": rejected,
            "margin": row.margin,
            "source": SOURCE,
            "weight": row.weight,
            "p": row.p,
        }
        for ranking_id, (row, pid, chosen, rejected) in zip(ranking_ids, labelled, strict=True)
    ])
    return ImportResult(
        prompts=len(values),
        completions=len(new_completions),
        pairs=len(keep),
        skipped_duplicates=skipped,
        kind="pairs",
    )
