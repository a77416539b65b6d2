"""`preflab backup` / `preflab restore` on SQLite and Postgres: a project with rankings, an export and a finished
run goes into a backup, comes back into a fresh database and data directory, and answers the same; damaged,
foreign or mismatched backups are refused with nothing changed. Also `preflab migrate --check` and the refusal
to run on a database a newer preflab upgraded."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from typer.testing import CliRunner

from app.platform.backup import BackupError, backup, restore
from app.platform.migrate import SchemaTooNew, upgrade
from app.platform.settings import Settings
from tests.conftest import PASSWORD, TEST_SECRET, _reset_postgres, pg_url


def scratch_postgres(suffix: str) -> str:
    """A database beside the test database, emptied (parallel CI runs use their own test database names)."""
    base, _, name = pg_url().rpartition("/")
    scratch = f"{name.split('?')[0]}_{suffix}"
    admin = create_engine(pg_url(), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        if not conn.execute(text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": scratch}).scalar():
            conn.execute(text(f'CREATE DATABASE "{scratch}"'))
    admin.dispose()
    url = f"{base}/{scratch}"
    _reset_postgres(url)
    return url


@pytest.fixture(params=["sqlite", "postgres"])
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[str], Settings]:
    """place("src") / place("dst"): settings for a fresh, empty database and data directory of the backend."""

    def make(name: str) -> Settings:
        (tmp_path / f"{name}-db").mkdir()
        url = (f"sqlite:///{tmp_path}/{name}-db/preflab.db" if request.param == "sqlite"
               else scratch_postgres(f"backup_{name}"))
        return Settings(env="dev", database_url=url, secret_key=TEST_SECRET, data_dir=tmp_path / f"{name}-data")

    return make


def _seed(settings: Settings) -> dict[str, object]:
    """A project as months of work leave it: prompts, rankings with pairs, a written export, a finished run."""
    from app.accounts import users
    from app.annotation.pairs import expand_tiers
    from app.exports import service as exports
    from app.exports import writer as export_writer
    from app.models import Completion, Export, Job, Pair, Project, Prompt, Ranking, User
    from app.platform.db import make_engine, make_session_factory, session_scope
    from app.projects import projects
    from app.runs import training_runs

    engine = make_engine(settings.database_url)  # creates a SQLite file's directory
    upgrade(settings.database_url)
    factory = make_session_factory(engine)
    with session_scope(factory) as db:
        lead = users.create_user(db, "lead@example.org", PASSWORD, "lead")
        engineer = users.create_user(db, "eng@example.org", PASSWORD, "engineer")
        people = [users.create_user(db, f"ann{i}@example.org", PASSWORD, "annotator") for i in range(2)]
        _, token = users.create_token(db, lead)
        project = projects.create_project(db, lead, name="kept ✓", completions_per_prompt=3, overlap=2,
                                          rubric_text="Prefer correct answers.", criteria=["Correctness"])
        for person in [engineer, *people]:
            projects.add_member(db, project, lead, email=person.email,
                                role="engineer" if person is engineer else "annotator")
        for i in range(6):
            prompt = Prompt(project_id=project.id, text=f"What is {i} + {i}? é", text_hash=f"{i:064x}",
                            split="heldout" if i == 0 else "train", reference=str(2 * i))
            db.add(prompt)
            db.flush()
            completions = [Completion(prompt_id=prompt.id, text=f"{2 * i + j}", source="imported") for j in range(3)]
            db.add_all(completions)
            db.flush()
            for person in people:
                tiers = [[completions[0].id], [completions[1].id, completions[2].id]]
                ranking = Ranking(project_id=project.id, prompt_id=prompt.id, source="human",
                                  annotator_id=person.id, rubric_id=project.current_rubric_id, tiers=tiers,
                                  display_order=[c.id for c in completions], flags={}, seconds_spent=9.5)
                db.add(ranking)
                db.flush()
                db.add_all([Pair(ranking_id=ranking.id, prompt_id=prompt.id, chosen_id=s.chosen,
                                 rejected_id=s.rejected, margin=s.margin, source="human") for s in expand_tiers(tiers)])
        export = exports.create_export(db, project, lead, kind="pairs", format="jsonl")
        export_id, spec, project_id = export.id, exports.spec_of(export), project.id
    result = export_writer.write_export(engine, spec, exports.export_dir(settings.data_dir, export_id),
                                        secret=settings.resolved_secret())
    with session_scope(factory) as db:
        row = db.get(Export, export_id)
        assert row is not None
        row.files, row.sha256, row.path, row.snapshot = result.files, result.sha256, str(result.path), result.snapshot
        row.row_count, row.row_counts = result.row_count, result.row_counts
    with session_scope(factory) as db:
        project = db.get(Project, project_id)
        engineer_row = db.get(User, engineer.id)
        run, job = training_runs.request_run(db, project, engineer_row, data_dir=settings.data_dir, kind="reward",
                                             export_id=export_id, base_model=None, reward_run_id=None, config={})
        # The run's files as a finished reward run leaves them; the job done, its log kept.
        out = Path(run.model_dir).parent
        (out / "model").mkdir(parents=True)
        (out / "model" / "config.json").write_text('{"architectures": ["Tiny"]}')
        (out / "model" / "model.safetensors").write_bytes(bytes(range(256)) * 64)
        (out / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 0.7 - s / 100}) + "\n"
                                                   for s in range(5)))
        (out / "eval.json").write_text('{"heldout_accuracy": 0.75}')
        log = settings.data_dir / "jobs" / f"{job.id}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("step 4 loss 0.66\ndone\n")
        run.state = "succeeded"
        job_row = db.get(Job, job.id)
        assert job_row is not None
        job_row.state, job_row.progress, job_row.log_path = "succeeded", 1.0, str(log)
        run_id, job_id = run.id, job.id
    engine.dispose()
    return {"token": token, "project": project_id, "export": export_id, "run": run_id, "job": job_id,
            "files": result.files}


def _answers(settings: Settings, ids: dict[str, object]) -> dict[str, object]:
    """What a user sees through the API, and the export's bytes as downloaded."""
    from fastapi.testclient import TestClient

    from app.main import create_app

    app = create_app(settings)
    client = TestClient(app, headers={"Authorization": f"Bearer {ids['token']}"})
    p, e, r = ids["project"], ids["export"], ids["run"]
    out: dict[str, object] = {}
    for url in (f"/api/projects/{p}", f"/api/projects/{p}/exports", f"/api/exports/{e}", f"/api/training-runs/{r}",
                f"/api/training-runs/{r}/metrics", f"/api/projects/{p}/agreement", f"/api/projects/{p}/members",
                f"/api/projects/{p}/training-runs"):
        response = client.get(url)
        assert response.status_code == 200, (url, response.text)
        out[url] = response.json()
        if url.endswith("/agreement"):  # how fresh the figures are is about the clock, not the data
            for volatile in ("as_of", "age_seconds"):
                out[url].pop(volatile, None)  # type: ignore[union-attr]
    for name in ids["files"]:  # type: ignore[union-attr]
        response = client.get(f"/api/exports/{e}/files/{name}")
        assert response.status_code == 200, name
        out[f"sha256 {name}"] = hashlib.sha256(response.content).hexdigest()
    app.state.engine.dispose()
    return out


def test_a_restored_backup_answers_the_same_with_the_same_export_bytes(place: Callable[[str], Settings],
                                                                       tmp_path: Path) -> None:
    src, dst = place("src"), place("dst")
    ids = _seed(src)
    before = _answers(src, ids)
    manifest = backup(src, tmp_path / "backup")
    assert manifest["counts"]["pairs"] == 2 * 6 * 2 and manifest["counts"]["rankings"] == 12
    assert not list(tmp_path.glob(".backup.partial-*"))
    assert "secret_key" not in {Path(rel).name for rel in manifest["files"]}

    report = restore(dst, tmp_path / "backup")
    assert report.counts == manifest["counts"]
    after = _answers(dst, ids)
    # Paths into the data directory (a run's model_dir and config) now point into the new one; nothing else moved.
    moved = json.loads(json.dumps(before).replace(str(src.data_dir.resolve()), str(dst.data_dir.resolve())))
    assert after == moved
    assert after[f"sha256 {next(iter(ids['files']))}"] == next(iter(ids["files"].values()))  # type: ignore[union-attr]
    assert before[f"/api/training-runs/{ids['run']}"]["eval"] == {"heldout_accuracy": 0.75}  # type: ignore[index]


def test_restore_refuses_a_database_with_rows_unless_forced(place: Callable[[str], Settings], tmp_path: Path) -> None:
    src, dst = place("src"), place("dst")
    _seed(src)
    backup(src, tmp_path / "backup")
    with pytest.raises(BackupError, match=r"target database is not empty \(rows in [^)]*\bapi_tokens\b[^)]*\): .*--force"):
        restore(src.model_copy(update={"data_dir": tmp_path / "empty"}), tmp_path / "backup")
    assert not (tmp_path / "empty" / "exports").exists()  # the staged files went away with the refusal
    restore(dst, tmp_path / "backup")
    with pytest.raises(BackupError, match="not empty"):
        restore(dst, tmp_path / "backup")
    report = restore(dst, tmp_path / "backup", force=True)
    assert report.counts["pairs"] == 24


def test_a_damaged_backup_is_refused_and_nothing_changes(place: Callable[[str], Settings], tmp_path: Path) -> None:
    src, dst = place("src"), place("dst")
    ids = _seed(src)
    backup(src, tmp_path / "backup")
    victim = tmp_path / "backup" / "data" / "exports" / str(ids["export"]) / next(iter(ids["files"]))  # type: ignore[arg-type]
    victim.write_bytes(victim.read_bytes() + b"\n")
    with pytest.raises(BackupError, match=r"pairs.*sha256 differs from the manifest's; the backup is damaged"):
        restore(dst, tmp_path / "backup")
    assert list(dst.data_dir.iterdir()) == []
    engine = create_engine(dst.database_url)
    with engine.connect() as conn:
        from sqlalchemy import inspect

        assert inspect(conn).get_table_names() == []
    engine.dispose()


def test_counts_that_differ_roll_the_whole_restore_back(place: Callable[[str], Settings], tmp_path: Path) -> None:
    """The counts are checked inside the restore's transaction: a mismatch leaves the old database as it was."""
    src, dst = place("src"), place("dst")
    _seed(src)
    backup(src, tmp_path / "backup")
    restore(dst, tmp_path / "backup")
    manifest_path = tmp_path / "backup" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["counts"]["pairs"] += 1
    manifest_path.write_text(json.dumps(manifest))
    engine = create_engine(dst.database_url)
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM api_tokens"))  # a change a full restore would undo
    with pytest.raises(BackupError, match=r"table pairs: 24 rows restored, the manifest says 25"):
        restore(dst, tmp_path / "backup", force=True)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM api_tokens")).scalar() == 0
        assert conn.execute(text("SELECT count(*) FROM pairs")).scalar() == 24
    engine.dispose()


def test_a_failed_backup_leaves_no_half_backup(tmp_path: Path) -> None:
    settings = Settings(env="dev", database_url=f"sqlite:///{tmp_path}/db/preflab.db", secret_key=TEST_SECRET,
                        data_dir=tmp_path / "data")
    ids = _seed(settings)
    (settings.data_dir / "exports" / str(ids["export"]) / next(iter(ids["files"]))).unlink()  # type: ignore[arg-type]
    with pytest.raises(BackupError, match=rf"export {ids['export']}: file .* is missing"):
        backup(settings, tmp_path / "out" / "b1")
    assert list((tmp_path / "out").iterdir()) == []


def test_a_backup_needs_a_new_directory_and_a_matching_database(tmp_path: Path) -> None:
    settings = Settings(env="dev", database_url=f"sqlite:///{tmp_path}/db/preflab.db", secret_key=TEST_SECRET,
                        data_dir=tmp_path / "data")
    _seed(settings)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(BackupError, match="is not an empty directory"):
        backup(settings, tmp_path / "full")
    backup(settings, tmp_path / "b")
    pg = settings.model_copy(update={"database_url": "postgresql+psycopg://nobody@127.0.0.1:1/none"})
    with pytest.raises(BackupError, match="holds a sqlite database and PREFLAB_DATABASE_URL names postgresql"):
        restore(pg, tmp_path / "b")
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    manifest["revision"] = "9999"
    (tmp_path / "b" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BackupError, match="revision 9999, which this preflab does not know"):
        restore(settings.model_copy(update={"data_dir": tmp_path / "d2"}), tmp_path / "b")
    with pytest.raises(BackupError, match="has no manifest.json"):
        restore(settings, tmp_path / "full")


def test_a_pg_dump_of_another_major_version_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from app.platform import backup as backup_module

    url = scratch_postgres("backup_src")
    upgrade(url)
    monkeypatch.setattr(backup_module, "_tool_major", lambda name: (f"/opt/pg/{name}", 11))
    settings = Settings(env="dev", database_url=url, secret_key=TEST_SECRET, data_dir=tmp_path / "data")
    with pytest.raises(BackupError, match=r"/opt/pg/pg_dump is PostgreSQL 11, the server is PostgreSQL \d+"):
        backup(settings, tmp_path / "b")
    assert not (tmp_path / "b").exists()


def _cli(env: dict[str, str], *args: str):  # type: ignore[no-untyped-def]
    from app.cli import cli

    return CliRunner().invoke(cli, list(args), env={"PREFLAB_SECRET_KEY": TEST_SECRET, **env})


def test_the_backup_and_restore_commands(tmp_path: Path) -> None:
    src = {"PREFLAB_DATABASE_URL": f"sqlite:///{tmp_path}/src/preflab.db", "PREFLAB_DATA_DIR": str(tmp_path / "sd")}
    dst = {"PREFLAB_DATABASE_URL": f"sqlite:///{tmp_path}/dst/preflab.db", "PREFLAB_DATA_DIR": str(tmp_path / "dd")}
    _seed(Settings(env="dev", database_url=src["PREFLAB_DATABASE_URL"], secret_key=TEST_SECRET,
                   data_dir=tmp_path / "sd"))
    done = _cli(src, "backup", str(tmp_path / "b"))
    assert done.exit_code == 0, done.output
    assert "at revision" in done.output and "-> " in done.output
    again = _cli(src, "backup", str(tmp_path / "b"))
    assert again.exit_code == 1 and "no backup was written" in again.output
    restored = _cli(dst, "restore", str(tmp_path / "b"))
    assert restored.exit_code == 0, restored.output
    assert "rows verified" in restored.output and "now point into" in restored.output
    refused = _cli(dst, "restore", str(tmp_path / "b"))
    assert refused.exit_code == 1 and "nothing was restored" in refused.output and "--force" in refused.output
    assert _cli(dst, "restore", str(tmp_path / "b"), "--force").exit_code == 0


def test_migrate_check_says_how_far_behind_and_changes_nothing(tmp_path: Path) -> None:
    from app.platform.migrate import current_head, revisions

    url = f"sqlite:///{tmp_path}/preflab.db"
    env = {"PREFLAB_DATABASE_URL": url, "PREFLAB_DATA_DIR": str(tmp_path / "data")}
    older = revisions()[-3]
    upgrade(url, older)
    behind = _cli(env, "migrate", "--check")
    assert behind.exit_code == 1
    assert f"at revision {older}, 2 revisions behind {current_head()}: run `preflab migrate`" in behind.output
    engine = create_engine(url)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == older  # untouched
    assert _cli(env, "migrate").exit_code == 0
    current = _cli(env, "migrate", "--check")
    assert current.exit_code == 0 and "is current" in current.output
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    engine.dispose()
    newer = _cli(env, "migrate", "--check")
    assert newer.exit_code == 2 and "revision 9999, newer than this version of preflab knows" in newer.output
    refused = _cli(env, "migrate")
    assert refused.exit_code == 1 and "newer than this version of preflab knows" in refused.output


def test_the_app_refuses_to_start_on_a_database_a_newer_preflab_upgraded(tmp_path: Path) -> None:
    from app.main import create_app

    url = f"sqlite:///{tmp_path}/preflab.db"
    upgrade(url)
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    engine.dispose()
    settings = Settings(env="dev", database_url=url, secret_key=TEST_SECRET, data_dir=tmp_path / "data")
    with pytest.raises(SchemaTooNew, match="revision 9999, newer than this version of preflab knows"):
        create_app(settings)
    served = _cli({"PREFLAB_DATABASE_URL": url, "PREFLAB_DATA_DIR": str(tmp_path / "data")}, "serve")
    assert served.exit_code == 1 and "newer than this version of preflab knows" in served.output
