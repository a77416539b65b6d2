"""Files outside the database go only after the commit that says so: `db.after_commit` and deleting an export."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy.exc import IntegrityError

from app.exports import service as exports
from app.models import Export, Prompt
from app.platform.db import after_commit


def _written_export(db, project, tmp_path: Path) -> tuple[Export, Path]:  # type: ignore[no-untyped-def]
    out = tmp_path / "exports" / "1"
    out.mkdir(parents=True)
    (out / "pairs.jsonl").write_text("{}\n", encoding="utf-8")
    export = Export(project_id=project.id, format="jsonl", path=str(out), files={"pairs.jsonl": "0" * 64})
    db.add(export)
    db.commit()
    return export, out


def test_a_failed_commit_leaves_the_export_and_its_files(db, make_user, make_project, tmp_path) -> None:  # type: ignore[no-untyped-def]
    lead = make_user(db, "lead")
    project = make_project(db, lead=lead)
    export, out = _written_export(db, project, tmp_path)
    leftover = tmp_path / "exports" / f".tmp-{export.id}-deadbeef"
    leftover.mkdir()

    exports.delete(db, export, lead, data_dir=tmp_path)
    assert out.exists() and leftover.exists()  # nothing is removed before the commit
    db.add(Prompt(project_id=project.id + 1000, text="x", text_hash="x"))  # no such project: the commit fails
    with pytest.raises(IntegrityError):
        db.commit()
    db.rollback()
    assert out.exists() and leftover.exists()
    db.refresh(export)
    assert export.deleted_at is None

    exports.delete(db, export, lead, data_dir=tmp_path)
    db.commit()
    assert not out.exists() and not leftover.exists()
    assert db.get(Export, export.id).deleted_at is not None  # the tombstone stays


def test_after_commit_runs_once_on_commit_and_never_after_a_rollback(db) -> None:  # type: ignore[no-untyped-def]
    ran: list[str] = []
    after_commit(db, lambda: ran.append("rolled back"))
    db.rollback()
    db.commit()
    assert ran == []
    after_commit(db, lambda: ran.append("committed"))
    db.commit()
    db.commit()
    assert ran == ["committed"]


def test_a_failing_action_does_not_undo_the_commit_or_stop_the_others(db) -> None:  # type: ignore[no-untyped-def]
    ran: list[int] = []
    after_commit(db, lambda: 1 / 0)  # type: ignore[func-returns-value]
    after_commit(db, lambda: ran.append(2))
    db.commit()
    assert ran == [2]
