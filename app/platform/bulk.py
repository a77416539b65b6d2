"""Inserting many rows at once, in order, with their new ids: COPY on Postgres, one executemany elsewhere."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import JSON, insert, text
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.orm import Session

from app.models import Base


def insert_rows(db: Session, model: type[Base], rows: list[dict[str, Any]], *, ids: bool = False) -> list[int]:
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
    table = model.__table__
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
