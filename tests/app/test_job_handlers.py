"""Job handlers read their arguments, call their feature's services and report progress: the ORM stays in the services."""

from __future__ import annotations

import ast
import importlib.util
import tomllib
from pathlib import Path

import pytest

from app.jobs import HANDLERS
from app.jobs.context import JobError, job_row
from app.projects import projects

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = "job handlers never import the ORM models"


def _handler_modules() -> set[str]:
    return {target.partition(":")[0] for target in HANDLERS.values()}


def test_every_handler_module_is_under_the_contract_that_keeps_the_models_out() -> None:
    # A handler added to the kind table but not to the contract would escape lint-imports.
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]["contracts"]
    (contract,) = [c for c in contracts if c["name"] == CONTRACT]
    assert set(contract["source_modules"]) == _handler_modules()
    assert contract["forbidden_modules"] == ["app.models"]


@pytest.mark.parametrize("module", sorted(_handler_modules()))
def test_a_handler_builds_no_query_of_its_own(module: str) -> None:
    # select(), update(), func… belong in the services; a handler names at most a Session, in a type hint.
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    from_sqlalchemy = {(node.module, alias.name) for node in ast.walk(tree)
                       if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "sqlalchemy"
                       for alias in node.names}
    plain = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
             for alias in node.names if alias.name.split(".")[0] == "sqlalchemy"]
    assert from_sqlalchemy <= {("sqlalchemy.orm", "Session")} and not plain


def test_a_row_deleted_since_the_job_was_queued_fails_the_job_by_name(db) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(JobError, match="project 987654 no longer exists"):
        job_row(db, projects.find, 987654, "project")
