"""Backups and restores of a whole instance: the database, the data directory, and a manifest that proves both.

A backup directory holds `manifest.json`, the database (`database.dump`, pg_dump's custom format, or
`database.sqlite`, a copy made with SQLite's online backup API) and `data/`, the data directory's exports, run
outputs and job logs. The manifest records the schema revision, the rows of every table as the dump saw them,
and the sha256 of every file. A backup is written into a staging directory beside DIR and renamed at the end,
so a failure leaves no half backup; a restore checks every hash before it touches anything, and replaces the
database in one transaction that also verifies the counts.

Key files (`secret_key`, `encryption_key`) are never copied: a backup that held the key beside the data it
protects would protect nothing. Keep them (or PREFLAB_SECRET_KEY / PREFLAB_ENCRYPTION_KEY) apart from backups.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sqlite3
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, inspect, text
from sqlalchemy.engine import make_url

from app import __version__
from app.platform.migrate import database_revision, status_of
from app.platform.settings import Settings
from training.shared.files import fsync_path

FORMAT = 1
MANIFEST = "manifest.json"
DATA = "data"
PG_DUMP_FILE = "database.dump"
SQLITE_FILE = "database.sqlite"
KEY_FILES = frozenset({"secret_key", "encryption_key"})
"""Top-level files of the data directory that hold keys: never copied into a backup."""
PATH_COLUMNS: dict[str, tuple[str, ...]] = {
    "exports": ("path",),
    "jobs": ("log_path", "payload", "result"),
    "training_runs": ("metrics_path", "model_dir", "base_model", "config"),
}
"""Columns that hold absolute paths into the data directory (text, or JSON holding such text): a restore into
another data directory rewrites their prefix. A migration that adds such a column must add it here."""
CHUNK = 1 << 20


class BackupError(Exception):
    """A backup or restore that cannot go on; the message says what is wrong and what to do."""


@dataclass
class RestoreReport:
    revision: str
    counts: dict[str, int]
    files: int
    relocated: tuple[str, str] | None
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------------- helpers


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def _copy_hashing(src: Path, dst: Path) -> str:
    """Copy src to dst and return the sha256 of the bytes written, read once."""
    digest = hashlib.sha256()
    dst.parent.mkdir(parents=True, exist_ok=True)
    with src.open("rb") as fin, dst.open("wb") as fout:
        while block := fin.read(CHUNK):
            digest.update(block)
            fout.write(block)
        fout.flush()
        os.fsync(fout.fileno())
    shutil.copystat(src, dst)
    return digest.hexdigest()



def _sqlite_path(url: str) -> Path:
    database = make_url(url).database
    if not database or database == ":memory:":
        raise BackupError("PREFLAB_DATABASE_URL names an in-memory SQLite database: there is nothing to back up")
    return Path(database).resolve()


def _count_rows(conn: Connection) -> dict[str, int]:
    """Rows per table (every table present, alembic_version included), as this connection's snapshot sees them."""
    quote = conn.dialect.identifier_preparer.quote
    # B608 here and below: table and column names come from our own metadata, quoted; values stay bound.
    return {name: int(conn.execute(text(f"SELECT count(*) FROM {quote(name)}")).scalar_one())  # nosec B608
            for name in sorted(inspect(conn).get_table_names())}


LiveExports = list[tuple[int, str, dict[str, str]]]


def _live_exports(conn: Connection) -> LiveExports:
    """(id, path, {file: sha256}) of every export whose files should exist."""
    if "exports" not in inspect(conn).get_table_names():
        return []
    rows = conn.execute(text("SELECT id, path, files FROM exports "
                             "WHERE deleted_at IS NULL AND sha256 IS NOT NULL AND path IS NOT NULL")).all()
    return [(r[0], r[1], r[2] if isinstance(r[2], dict) else json.loads(r[2] or "{}")) for r in rows]


# ---------------------------------------------------------------------------------------------- PostgreSQL tools


def _libpq(url: str) -> tuple[str, dict[str, str]]:
    """A libpq URI without the password (it goes in PGPASSWORD, not on a command line others can read)."""
    parsed = make_url(url)
    env = dict(os.environ)
    if parsed.password:
        env["PGPASSWORD"] = str(parsed.password)
    uri = parsed.set(drivername="postgresql", password=None).render_as_string(hide_password=False)
    return uri, env


def _tool_major(name: str) -> tuple[str, int]:
    """(path, major version) of a PostgreSQL client program on PATH."""
    path = shutil.which(name)
    if path is None:
        raise BackupError(f"{name} is not on PATH: install the PostgreSQL client (e.g. the postgresql-client "
                          "package) of the server's major version")
    out = subprocess.run([path, "--version"], capture_output=True, text=True, check=True).stdout
    match = re.search(r"(\d+)(?:\.(\d+))?", out)
    if match is None:
        raise BackupError(f"cannot read the version of {path} from {out.strip()!r}")
    return path, int(match.group(1))


def _server_major(conn: Connection) -> int:
    return int(conn.execute(text("SHOW server_version_num")).scalar_one()) // 10000


def _check_client(name: str, server_major: int) -> str:
    path, major = _tool_major(name)
    if major != server_major:
        raise BackupError(f"{path} is PostgreSQL {major}, the server is PostgreSQL {server_major}: use the "
                          f"client of the server's version (postgresql-client-{server_major}) first on PATH")
    return path


def _run(argv: list[str], env: dict[str, str], what: str, **kw: Any) -> None:
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        raise BackupError(f"{what} failed (exit {proc.returncode}): {' | '.join(detail[-5:])}")


# ------------------------------------------------------------------------------------------------------ backup


def _dump_postgres(engine: Engine, staging: Path) -> tuple[dict[str, Any], dict[str, int], LiveExports]:
    """pg_dump under a snapshot this transaction exported, so counts and export rows are those of the dump."""
    uri, env = _libpq(engine.url.render_as_string(hide_password=False))
    with engine.connect() as conn:
        conn = conn.execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True)
        with conn.begin():
            server = _server_major(conn)
            pg_dump = _check_client("pg_dump", server)
            snapshot = conn.execute(text("SELECT pg_export_snapshot()")).scalar_one()
            revision = database_revision(conn)
            counts = _count_rows(conn)
            exports = _live_exports(conn)
            # The snapshot stays importable while this transaction is open: pg_dump reads exactly what we counted.
            _run([pg_dump, "--format=custom", "--compress=6", f"--snapshot={snapshot}", "--no-owner",
                  "--no-privileges", f"--file={staging / PG_DUMP_FILE}", f"--dbname={uri}"], env, "pg_dump")
    info = {"backend": "postgresql", "file": PG_DUMP_FILE, "server_major": server, "revision": revision}
    return info, counts, exports


def _dump_sqlite(url: str, staging: Path) -> tuple[dict[str, Any], dict[str, int], LiveExports]:
    source = _sqlite_path(url)
    if not source.exists():
        raise BackupError(f"no SQLite database at {source} (PREFLAB_DATABASE_URL)")
    target = staging / SQLITE_FILE
    src = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
    dst = sqlite3.connect(target)
    try:
        src.execute("PRAGMA busy_timeout=30000")
        src.backup(dst)  # one step: a consistent copy even while the app writes (WAL)
    finally:
        src.close()
        dst.close()
    copy = create_engine(f"sqlite:///{target}")  # not the app's engine: no WAL switch, no write lock taken
    try:
        with copy.connect() as conn:
            revision, counts, exports = database_revision(conn), _count_rows(conn), _live_exports(conn)
    finally:
        copy.dispose()
    return {"backend": "sqlite", "file": SQLITE_FILE, "revision": revision}, counts, exports


def _data_files(data_dir: Path, skip: set[Path]) -> Iterator[Path]:
    """Files of the data directory worth keeping: not keys, not the database, not an export being written."""
    for root, dirs, files in os.walk(data_dir):
        here = Path(root)
        dirs[:] = sorted(d for d in dirs if not d.startswith((".tmp-", ".restore-", ".backup-"))
                         and (here / d).resolve() not in skip)
        for name in sorted(files):
            path = here / name
            if here == data_dir and name in KEY_FILES:
                continue
            if path.resolve() in skip or path.is_symlink() or not path.is_file():
                continue
            yield path


def _skipped_paths(settings: Settings, dest: Path, staging: Path) -> set[Path]:
    skip = {dest.resolve(), staging.resolve()}
    if settings.is_sqlite:
        db = _sqlite_path(settings.database_url)
        skip |= {db, Path(f"{db}-wal"), Path(f"{db}-shm"), Path(f"{db}-journal")}
    return skip


def _check_exports(exports: LiveExports, data_dir: Path, copied: dict[str, str]) -> list[str]:
    """Every export the database calls ready must be in the backup with the bytes its row records."""
    notes = []
    for export_id, path, files in exports:
        root = Path(path).resolve()
        if root != data_dir and data_dir not in root.parents:
            notes.append(f"export {export_id} lives outside the data directory ({path}): not in this backup")
            continue
        rel = root.relative_to(data_dir).as_posix()
        for name, digest in files.items():
            got = copied.get(f"{DATA}/{rel}/{name}")
            if got != digest:
                state = "is missing" if got is None else "has other bytes than its row records"
                raise BackupError(f"export {export_id}: file {name} {state} (was the export deleted during the "
                                  "backup?); nothing was written, run the backup again")
    return notes


def backup(settings: Settings, dest: Path) -> dict[str, Any]:
    """Write a backup of the database and data directory to `dest` (new, or an empty directory); the manifest."""
    from app.platform.db import make_engine

    dest = Path(dest).absolute()
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise BackupError(f"{dest} exists and is not an empty directory: give each backup a new directory "
                          "(e.g. backups/$(date +%Y-%m-%dT%H%M))")
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = dest.parent / f".{dest.name}.partial-{uuid.uuid4().hex[:8]}"
    staging.mkdir(mode=0o700)
    try:
        if settings.is_sqlite:
            db_info, counts, exports = _dump_sqlite(settings.database_url, staging)
        else:
            engine = make_engine(settings.database_url, pool_size=1,
                                 prepared_statements=settings.database_prepared_statements)
            try:
                db_info, counts, exports = _dump_postgres(engine, staging)
            finally:
                engine.dispose()
        if db_info["revision"] is None:
            raise BackupError("the database has no schema (run `preflab migrate`): there is nothing to back up")
        files = {db_info["file"]: _sha256(staging / db_info["file"])}
        data_dir = settings.data_dir.resolve()
        if data_dir.is_dir():
            for path in _data_files(data_dir, _skipped_paths(settings, dest, staging)):
                rel = f"{DATA}/{path.relative_to(data_dir).as_posix()}"
                files[rel] = _copy_hashing(path, staging / rel)
        notes = _check_exports(exports, data_dir, files)
        manifest = {"format": FORMAT, "preflab_version": __version__,
                    "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
                    "revision": db_info.pop("revision"), "database": db_info, "data_dir": str(data_dir),
                    "counts": counts, "files": files, "not_backed_up": sorted(KEY_FILES), "notes": notes}
        with (staging / MANIFEST).open("w", encoding="utf-8") as fh:
            json.dump(manifest, fh, indent=1, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        fsync_path(staging)
        if dest.exists():
            dest.rmdir()  # empty (checked above): rename cannot replace a directory on every platform
        os.rename(staging, dest)
        fsync_path(dest.parent)
        return manifest
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


# ----------------------------------------------------------------------------------------------------- restore


def read_manifest(src: Path) -> dict[str, Any]:
    path = Path(src) / MANIFEST
    if not path.is_file():
        raise BackupError(f"{src} is not a preflab backup: it has no {MANIFEST}")
    try:
        manifest: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BackupError(f"{path}: not valid JSON ({exc}); the backup is damaged") from None
    for key in ("format", "revision", "database", "counts", "files", "data_dir"):
        if key not in manifest:
            raise BackupError(f"{path}: field {key!r} is missing; the backup is damaged")
    if manifest["format"] != FORMAT:
        raise BackupError(f"{path}: format {manifest['format']}, this preflab reads format {FORMAT}")
    return manifest


def _check_manifest(settings: Settings, src: Path, manifest: dict[str, Any]) -> None:
    backend = "sqlite" if settings.is_sqlite else "postgresql"
    if manifest["database"]["backend"] != backend:
        raise BackupError(f"this backup holds a {manifest['database']['backend']} database and "
                          f"PREFLAB_DATABASE_URL names {backend}: restore it into the same kind of database")
    status = status_of(manifest["revision"])
    if not status.known:
        raise BackupError(f"the backup is at schema revision {manifest['revision']}, which this preflab does not "
                          f"know (its newest is {status.head}): restore it with preflab "
                          f"{manifest.get('preflab_version', '?')} or newer")
    for rel, digest in manifest["files"].items():
        path = src / rel
        if not path.is_file():
            raise BackupError(f"{path} is listed in the manifest but missing: the backup is incomplete")
        if rel == manifest["database"]["file"] and _sha256(path) != digest:
            raise BackupError(f"{path}: sha256 differs from the manifest's; the backup is damaged")


def _nonempty_tables(conn: Connection) -> list[str]:
    counts = _count_rows(conn)
    return [name for name, n in counts.items() if n and name != "alembic_version"]


def _stage_data(src: Path, manifest: dict[str, Any], data_dir: Path) -> Path:
    """Copy the backup's data files into a staging directory inside the data directory, checking each hash."""
    data_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".restore-", dir=data_dir))
    try:
        for rel, digest in manifest["files"].items():
            if not rel.startswith(f"{DATA}/"):
                continue
            got = _copy_hashing(src / rel, staging / rel[len(DATA) + 1:])
            if got != digest:
                raise BackupError(f"{src / rel}: sha256 differs from the manifest's; the backup is damaged, "
                                  "nothing was restored")
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return staging


def _occupied(data_dir: Path) -> list[str]:
    """Top-level entries of the data directory a restore would replace, other than keys and staging areas."""
    if not data_dir.is_dir():
        return []
    return sorted(p.name for p in data_dir.iterdir()
                  if p.name not in KEY_FILES and not p.name.startswith(".restore-")
                  and (p.is_file() or any(p.iterdir())))


def _swap_in(staging: Path, data_dir: Path, keep: set[Path]) -> None:
    """Replace the data directory's contents by the staged ones (keys and the live database stay)."""
    for entry in data_dir.iterdir():
        if entry == staging or entry.name in KEY_FILES or entry.resolve() in keep:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    for entry in staging.iterdir():
        os.rename(entry, data_dir / entry.name)
    staging.rmdir()


def _relocation_sql(table_columns: dict[str, dict[str, bool]], old: str, new: str, *,
                    json_type: str = "TEXT") -> list[tuple[str, dict[str, Any]]]:
    """UPDATEs that rewrite `old/…` paths to `new/…` in PATH_COLUMNS (both backends: substr, replace, ||).
    JSON is rewritten as its text and cast back to `json_type` (SQLite stores JSON as text)."""
    statements: list[tuple[str, dict[str, Any]]] = []
    for table, columns in PATH_COLUMNS.items():
        present = table_columns.get(table, {})
        for column in columns:
            if column not in present:
                continue
            if present[column]:  # JSON: the path's start is a string's start, `"old/`
                sets = [(json.dumps(old)[:-1] + "/", json.dumps(new)[:-1] + "/")]
                if not old.isascii():  # Postgres prints JSONB text unescaped, SQLite kept json.dumps' escapes
                    sets.append(('"' + old + "/", '"' + new + "/"))
                for i, (a, b) in enumerate(sets):
                    statements.append((
                        f"UPDATE {table} SET {column} = CAST(REPLACE(CAST({column} AS TEXT), :a{i}, :b{i}) AS "  # nosec B608
                        f"{json_type}) WHERE CAST({column} AS TEXT) LIKE '%' || :a{i} || '%'",
                        {f"a{i}": a, f"b{i}": b}))
            else:
                statements.append((f"UPDATE {table} SET {column} = :new || substr({column}, :n + 1) "  # nosec B608
                                   f"WHERE {column} = :old OR substr({column}, 1, :n + 1) = :old || '/'",
                                   {"new": new, "old": old, "n": len(old)}))
    return statements


def _columns(conn: Connection) -> dict[str, dict[str, bool]]:
    """{table: {column: is JSON}} of the PATH_COLUMNS tables as they exist in this database."""
    from sqlalchemy import JSON

    insp = inspect(conn)
    names = set(insp.get_table_names())
    return {table: {c["name"]: isinstance(c["type"], JSON) for c in insp.get_columns(table)}
            for table in PATH_COLUMNS if table in names}


def _verify_counts(conn: Connection, expected: dict[str, int]) -> None:
    got = _count_rows(conn)
    wrong = [f"table {t}: {got.get(t, 'no')} rows restored, the manifest says {n}" for t, n in expected.items()
             if got.get(t) != n]
    if wrong:
        raise BackupError("; ".join(wrong))


def _restore_sqlite(settings: Settings, src: Path, manifest: dict[str, Any], force: bool,
                    relocate: tuple[str, str] | None) -> None:
    target = _sqlite_path(settings.database_url)
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = target.parent / f".{target.name}.restore-{uuid.uuid4().hex[:8]}"
    try:
        shutil.copyfile(src / SQLITE_FILE, scratch)
        work = create_engine(f"sqlite:///{scratch}")
        try:
            with work.begin() as conn:
                if relocate:
                    for sql, params in _relocation_sql(_columns(conn), *relocate):
                        conn.execute(text(sql), params)
                _verify_counts(conn, manifest["counts"])
        finally:
            work.dispose()  # the last connection closing folds any WAL back into the file
        source, dest = sqlite3.connect(scratch), sqlite3.connect(target, timeout=30)
        try:
            busy = _sqlite_tables_with_rows(dest)
            if busy and not force:
                raise BackupError(_nonempty_message(busy))
            source.backup(dest)  # replaces the whole database under one write lock: readers see old or new
        finally:
            source.close()
            dest.close()
    finally:
        for path in (scratch, Path(f"{scratch}-wal"), Path(f"{scratch}-shm")):
            path.unlink(missing_ok=True)


def _sqlite_tables_with_rows(conn: sqlite3.Connection) -> list[str]:
    names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                        "AND name NOT LIKE 'sqlite_%' AND name != 'alembic_version'")]
    return [n for n in sorted(names) if conn.execute(f'SELECT EXISTS (SELECT 1 FROM "{n}")').fetchone()[0]]  # nosec B608


def _nonempty_message(tables: list[str]) -> str:
    shown = ", ".join(tables[:5]) + (" …" if len(tables) > 5 else "")
    return (f"the target database is not empty (rows in {shown}): restore into a new database, or pass --force "
            "to replace everything in it")


def _pg_literal(value: Any) -> str:
    if isinstance(value, int):
        return str(value)
    return "'" + str(value).replace("'", "''") + "'"


def _pg_bind(sql: str, params: dict[str, Any]) -> str:
    # One pass, so a path that itself holds ":n" is never substituted again.
    return re.sub(r":(\w+)", lambda m: _pg_literal(params[m.group(1)]), sql)


def _pg_postamble(conn: Connection, manifest: dict[str, Any], relocate: tuple[str, str] | None) -> str:
    """SQL run after the restored script, in its transaction: the relocation, then a count check that aborts."""
    lines = ["SET search_path = public;"]
    if relocate:
        # The columns as the backup's revision has them: the dump recreates exactly that schema.
        cols = {t: dict(c) for t, c in _pg_columns_at(manifest).items()}
        for sql, params in _relocation_sql(cols, *relocate, json_type="JSONB"):
            lines.append(_pg_bind(sql, params) + ";")
    checks = " ".join(
        f"IF (SELECT count(*) FROM {conn.dialect.identifier_preparer.quote(t)}) <> {int(n)} THEN RAISE EXCEPTION "  # nosec B608
        f"'table {t}: % rows restored, the manifest says {int(n)}', (SELECT count(*) FROM "
        f"{conn.dialect.identifier_preparer.quote(t)}); END IF;" for t, n in manifest["counts"].items())
    lines.append(f"DO $$ BEGIN {checks} END $$;")
    return "\n".join(lines) + "\n"


def _pg_columns_at(manifest: dict[str, Any]) -> dict[str, dict[str, bool]]:
    """PATH_COLUMNS present in the backup (tables the manifest counted); JSON columns are those that hold JSON."""
    json_columns = {"payload", "result", "config"}
    return {t: {c: c in json_columns for c in PATH_COLUMNS[t]} for t in PATH_COLUMNS if t in manifest["counts"]}


def _restore_postgres(settings: Settings, src: Path, manifest: dict[str, Any], force: bool,
                      relocate: tuple[str, str] | None) -> None:
    from app.platform.db import make_engine

    engine = make_engine(settings.database_url, pool_size=1,
                         prepared_statements=settings.database_prepared_statements)
    try:
        with engine.connect() as conn:
            server = _server_major(conn)
            pg_restore, psql = _check_client("pg_restore", server), _check_client("psql", server)
            busy = _nonempty_tables(conn)
            if busy and not force:
                raise BackupError(_nonempty_message(busy))
            tables = inspect(conn).get_table_names(schema="public")
            preamble = "".join(f'DROP TABLE IF EXISTS public."{t}" CASCADE;\n' for t in tables)
            postamble = _pg_postamble(conn, manifest, relocate)
    finally:
        engine.dispose()
    uri, env = _libpq(settings.database_url)
    with tempfile.TemporaryDirectory(prefix="preflab-restore-") as tmp:
        pre, post = Path(tmp) / "pre.sql", Path(tmp) / "post.sql"
        pre.write_text(preamble or "SELECT 1;\n", encoding="utf-8")
        post.write_text(postamble, encoding="utf-8")
        # pg_restore writes the script; psql runs it, with our drops before and checks after, as ONE transaction:
        # any failure (a bad row, a count that differs) leaves the database as it was.
        script = subprocess.Popen([pg_restore, "--no-owner", "--no-privileges", "--file=-", str(src / PG_DUMP_FILE)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        try:
            _run([psql, "--no-psqlrc", "--quiet", "--single-transaction", "--set=ON_ERROR_STOP=1",
                  f"--file={pre}", "--file=-", f"--file={post}", f"--dbname={uri}"], env, "restoring the database",
                 stdin=script.stdout)
        finally:
            assert script.stdout is not None
            script.stdout.close()
            err = script.stderr.read().decode(errors="replace") if script.stderr else ""
            script.wait()
        if script.returncode != 0:
            raise BackupError(f"pg_restore failed (exit {script.returncode}): {err.strip()}")


def restore(settings: Settings, src: Path, *, force: bool = False) -> RestoreReport:
    """Restore the backup in `src` into PREFLAB_DATABASE_URL and PREFLAB_DATA_DIR.

    Refuses a database with rows, or a data directory with files, unless `force`. Every hash is checked before
    anything is replaced; the database is replaced in one transaction that also checks the counts."""
    src = Path(src).absolute()
    manifest = read_manifest(src)
    _check_manifest(settings, src, manifest)
    data_dir = settings.data_dir.absolute()
    old_root = manifest["data_dir"]
    relocate = (old_root, str(data_dir.resolve())) if old_root != str(data_dir.resolve()) else None
    keep: set[Path] = set()
    if settings.is_sqlite:
        db = _sqlite_path(settings.database_url)
        keep = {db, Path(f"{db}-wal"), Path(f"{db}-shm"), Path(f"{db}-journal")}
    occupied = [n for n in _occupied(data_dir) if (data_dir / n).resolve() not in keep]
    if occupied and not force:
        raise BackupError(f"the data directory {data_dir} is not empty ({', '.join(occupied[:5])}): restore "
                          "into an empty one, or pass --force to replace its contents")
    staging = _stage_data(src, manifest, data_dir)
    try:
        if settings.is_sqlite:
            _restore_sqlite(settings, src, manifest, force, relocate)
        else:
            _restore_postgres(settings, src, manifest, force, relocate)
        _swap_in(staging, data_dir, keep)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    notes = list(manifest.get("notes", []))
    status = status_of(manifest["revision"])
    if status.behind:
        notes.append(f"the database is at revision {manifest['revision']}, {status.behind} behind this preflab: "
                     "run `preflab migrate`")
    files = sum(1 for rel in manifest["files"] if rel.startswith(f"{DATA}/"))
    return RestoreReport(manifest["revision"], manifest["counts"], files, relocate, notes)

