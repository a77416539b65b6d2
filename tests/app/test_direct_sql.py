"""Hot-path statements sent straight through psycopg (app/platform/direct_sql.py) answer exactly what SQLAlchemy answers.

On Postgres the annotation path's registered statements must all take the direct path (a silent fallback would
give the speed back); each gives the rows `Connection.execute` gives, with the same types (UTC datetimes, JSON);
errors are SQLAlchemy's; an engine with execution listeners sees every statement. On SQLite everything runs
through SQLAlchemy, which the rest of the suite covers.
"""

from __future__ import annotations

import ast
from datetime import UTC, datetime
from inspect import isfunction, signature
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy
from sqlalchemy import event
from sqlalchemy.exc import IntegrityError, InvalidRequestError

from app.annotation import queue, rankings
from app.models import Assignment
from app.platform import direct_sql
from app.platform.db import core
from tests.app.test_annotation_api import _ranking, _seed


def _need_postgres(db: Any) -> None:
    if db.get_bind().dialect.name != "postgresql":
        pytest.skip(reason="Postgres only: on SQLite every statement runs through SQLAlchemy")


def _one_round(db: Any, make_user: Any, make_project: Any, token_for: Any, api: Any) -> tuple[Any, dict, Any]:
    """A project where an annotator took a task, submitted it and took the next one (every hot statement ran)."""
    _, project, (annotator,) = _seed(db, make_user, make_project, n_prompts=3, overlap=1)
    client = api(token_for(db, annotator))
    db.commit()
    task = client.get(f"/api/projects/{project.id}/tasks/next").json()
    assert client.post(f"/api/projects/{project.id}/rankings", json=_ranking(task)).status_code == 201
    following = client.get(f"/api/projects/{project.id}/tasks/next")
    assert following.status_code == 200
    return project, following.json(), annotator


def test_every_statement_of_the_annotation_path_runs_direct(db, make_user, make_project, token_for, api) -> None:
    _need_postgres(db)
    _one_round(db, make_user, make_project, token_for, api)
    planned = {str(statement).split("\n")[0][:80]: plans for statement, plans in direct_sql._PLANS.items() if plans}
    # next: the token, the caller's own lease, the candidate scan, the lease with what its task shows; submit: the
    # token, the task's lock, the ranking with its pairs and done mark, a count
    assert len(planned) >= 7, sorted(planned)
    for statement in (queue._LEASE_SHOWN, rankings._RECORD, rankings._TASK_LOCKED, queue._OWN_ACTIVE):
        assert direct_sql._PLANS[statement], f"not run: {statement}"
    fallbacks = [sql for sql, plans in planned.items() if None in plans.values()]
    assert fallbacks == [], f"these run through SQLAlchemy instead: {fallbacks}"


def test_direct_rows_equal_sqlalchemys(db, make_user, make_project, token_for, api) -> None:
    _need_postgres(db)
    project, task, annotator = _one_round(db, make_user, make_project, token_for, api)
    conn = core(db)
    cases = [
        (queue._OWN_ACTIVE, {"project_id": project.id, "annotator_id": annotator.id, "round": project.current_round,
                             "now": datetime(2000, 1, 1, tzinfo=UTC)}),
        (queue._TASK_SHOWN, {"prompt_id": task["prompt"]["id"], "k": 4}),
        (rankings._TASK_LOCKED, {"assignment_id": task["assignment_id"], "k": 4}),
        (rankings._SUBMITTED, {"prompt_id": task["prompt"]["id"], "round": project.current_round}),
        # `state IN ('submitted', 'skipped')`, expanded once when the statement is first run
        (queue._candidates_stmt(False, "lease"), queue._params(project, annotator, datetime.now(UTC))),
    ]
    for statement, params in cases:
        direct = conn.execute(statement, params).all()
        assert direct, statement
        through_sqlalchemy = conn.conn.execute(statement, params).all()
        assert direct == [tuple(row) for row in through_sqlalchemy], statement
        assert [row._fields for row in direct] == [tuple(row._fields) for row in through_sqlalchemy]
    own = conn.execute(queue._OWN_ACTIVE, cases[0][1]).one()
    assert own.leased_until.tzinfo is not None and own.leased_until.utcoffset().total_seconds() == 0
    assert own.id == task["assignment_id"]


def test_direct_errors_are_sqlalchemys(db, make_user, make_project, token_for, api) -> None:
    _need_postgres(db)
    project, _, annotator = _one_round(db, make_user, make_project, token_for, api)
    conn = core(db)
    with pytest.raises(InvalidRequestError, match="'prompt_id'"):
        conn.execute(queue._TASK_SHOWN, {"k": 4})
    with pytest.raises(InvalidRequestError, match="fixed when the statement was built"):
        conn.execute(queue._candidates_stmt(False, "lease"),
                     queue._params(project, annotator, datetime.now(UTC)) | {"state_1": ["leased"]})
    bogus = {"ranking_id_0": -1, "prompt_id_0": -1, "chosen_id_0": -1, "rejected_id_0": -1, "margin_0": 1,
             "source_0": "human", "weight_0": 1.0, "p_0": 1.0, "metadata_0": {}, "created_at_0": datetime.now(UTC)}
    with pytest.raises(IntegrityError):  # no such ranking: the foreign key refuses it
        conn.execute(rankings._insert_pairs(1), bogus)
    db.rollback()


def test_an_engine_with_execution_listeners_sees_every_statement(db, make_user, make_project, token_for,
                                                                 api) -> None:
    _need_postgres(db)
    project, task, annotator = _one_round(db, make_user, make_project, token_for, api)
    seen: list[str] = []

    def listener(_conn, _cursor, statement, *_args) -> None:  # type: ignore[no-untyped-def]
        seen.append(statement)

    engine = db.get_bind()
    event.listen(engine, "before_cursor_execute", listener)
    try:
        rows = core(db).execute(queue._TASK_SHOWN, {"prompt_id": task["prompt"]["id"], "k": 4}).all()
    finally:
        event.remove(engine, "before_cursor_execute", listener)
    assert len(rows) == 4 and any("FROM prompts" in sql for sql in seen)
    assert db.get(Assignment, task["assignment_id"]).state == "leased"


def test_row_loader_builds_the_instances_a_query_would(db, make_user, make_project, token_for) -> None:
    # Both backends: the token's project comes from one Core row, built into persistent instances.
    from sqlalchemy import inspect, select

    from app.annotation import tasks as annotation
    from app.models import Project, User

    _, project, (annotator,) = _seed(db, make_user, make_project, n_prompts=1)
    token = token_for(db, annotator)
    project_id, annotator_id = project.id, annotator.id
    db.commit()
    db.expunge_all()
    user, loaded = annotation.token_caller_project(db, token, project_id)
    assert user.id == annotator_id and loaded.id == project_id
    for instance in (user, loaded):
        state = inspect(instance)
        assert state.persistent and not state.modified and instance in db and not db.dirty
    fresh = db.execute(select(Project).where(Project.id == project_id)).scalar_one()
    assert fresh is loaded, "the session's identity map holds the built instance"
    assert annotator_id in {m.user_id for m in loaded.members}, "its relationships load lazily, as a query's would"
    columns = [c.key for c in inspect(Project).column_attrs]
    built = {k: getattr(loaded, k) for k in columns}
    db.expunge_all()
    queried = db.get(Project, project_id)
    assert built == {k: getattr(queried, k) for k in columns}
    # An instance the session already holds is the one returned, not a second copy.
    held = db.get(User, annotator_id)
    again, _ = annotation.token_caller_project(db, token, project_id)
    assert again is held



def _has(owner: Any, name: str, live: dict[Any, Any]) -> bool:
    if isfunction(owner):  # a keyword parameter
        return name in signature(owner).parameters
    # An instance too: some names are set per instance (`Connection._has_events` in SQLAlchemy 2.0).
    return hasattr(owner, name) or (owner in live and hasattr(live[owner], name))


def test_the_private_sqlalchemy_names_direct_sql_uses_all_exist() -> None:
    # The pin in pyproject.toml keeps SQLAlchemy below its next minor; this says by name what a new release broke.
    from sqlalchemy import Connection, Engine, create_engine, literal, select
    from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
    from sqlalchemy.sql.compiler import SQLCompiler

    engine = create_engine("sqlite://")
    try:
        with engine.connect() as conn:
            live = {Engine: engine, Connection: conn,
                    SQLCompiler: select(literal(1)).compile(dialect=PGDialect_psycopg())}
            missing = [f"{owner.__qualname__}.{name}" for owner, name in direct_sql.PRIVATE_SQLALCHEMY
                       if not _has(owner, name, live)]
    finally:
        engine.dispose()
    assert missing == [], (f"SQLAlchemy {sqlalchemy.__version__} has no {', '.join(missing)}, which "
                           "app/platform/direct_sql.py relies on: adapt the module to this release or stay below it")

def test_direct_sql_lists_every_private_sqlalchemy_name_it_uses() -> None:
    # A private name read off a SQLAlchemy object and not in PRIVATE_SQLALCHEMY would escape the test above.
    tree = ast.parse(Path(direct_sql.__file__).read_text(encoding="utf-8"))
    used = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    used |= {node.arg for node in ast.walk(tree) if isinstance(node, ast.keyword) and node.arg}
    used |= {node.args[1].value for node in ast.walk(tree) if isinstance(node, ast.Call)
             and getattr(node.func, "id", None) == "getattr" and isinstance(node.args[1], ast.Constant)}
    private = {name for name in used if name.startswith("_") and not name.startswith("__")}
    own = {name for cls in (direct_sql._Plan, direct_sql.Rows, direct_sql.CoreConnection)
           for name in [*vars(cls), *getattr(cls, "__slots__", ())]}
    own.add("_make")  # namedtuple's documented constructor from an iterable
    listed = {name for _, name in direct_sql.PRIVATE_SQLALCHEMY}
    assert sorted(private - own - listed) == [], "add these to direct_sql.PRIVATE_SQLALCHEMY"
