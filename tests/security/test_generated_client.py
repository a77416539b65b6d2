"""The API as a contract: a client generated from `/openapi.json` by a standard generator (openapi-python-client,
pinned in the `dev` extra) drives the whole loop against a real server process with no hand-written type.

The app's schema is written to a file, the generator writes a package from it into tmp_path, and that package alone
(its operation functions and its models, the import's file part through its multipart model) creates a project,
adds an annotator, imports prompts, leases and ranks a task as the annotator, exports pairs (a `preflab worker`
process beside the server runs the export job), downloads the file, and requests a reward run on it and reads it
back. The worker runs export jobs only, so the run stays queued: nothing is trained.
"""

from __future__ import annotations

import importlib
import io
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.support.server import Server, preflab_env, wait_for

pytestmark = pytest.mark.timeout(180)

K = 3
PROMPTS = 2
PACKAGE = "preflab_client"
GENERATOR_CONFIG = {"post_hooks": []}
"""The generator formats its output with ruff by default; the test imports the package and has no use for that."""


def _generate(tmp_path: Path) -> None:
    from app.main import create_app
    from app.platform.settings import Settings

    settings = Settings(env="dev", database_url=f"sqlite:///{tmp_path}/schema.db", data_dir=tmp_path / "schema",
                        secret_key="generated-client-" + "x" * 40)
    app = create_app(settings)
    try:
        (tmp_path / "openapi.json").write_text(json.dumps(app.openapi()))
    finally:
        app.state.engine.dispose()
    (tmp_path / "generator.json").write_text(json.dumps(GENERATOR_CONFIG))
    result = subprocess.run([sys.executable, "-m", "openapi_python_client", "generate", "--path", "openapi.json",
                             "--output-path", PACKAGE, "--meta", "none", "--config", "generator.json"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    # The generator still writes the client when it cannot read part of the schema; then it warns.
    assert "Warning" not in result.stdout + result.stderr, result.stdout + result.stderr


@pytest.fixture
def client_package(tmp_path: Path) -> Iterator[dict[str, ModuleType]]:
    """The generated package's modules the test uses, by short name; imported from tmp_path, then forgotten."""
    _generate(tmp_path)
    sys.path.insert(0, str(tmp_path))
    names = {"client": "client", "types": "types", "models": "models",
             "projects": "api.projects.create_project", "members": "api.projects.add_member",
             "imports": "api.projects.import_file", "next_task": "api.annotation.next_task",
             "submit": "api.annotation.submit_ranking", "create_export": "api.exports.create_export",
             "get_export": "api.exports.get_export", "download": "api.exports.download_file",
             "create_run": "api.training.create_run", "get_run": "api.training.get_run",
             "ready": "api.health.ready"}
    try:
        yield {short: importlib.import_module(f"{PACKAGE}.{name}") for short, name in names.items()}
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
            del sys.modules[name]


@pytest.fixture
def live(tmp_path: Path) -> Iterator[tuple[Server, dict[str, str]]]:
    """A migrated SQLite database with a lead and an annotator (their tokens), `preflab serve` on it, and a
    `preflab worker` that runs export jobs."""
    from app.accounts import users
    from app.platform.db import make_engine, make_session_factory
    from app.platform.migrate import upgrade

    data_dir = tmp_path / "data"
    data_dir.mkdir()
    url = f"sqlite:///{data_dir}/preflab.db"
    upgrade(url)
    engine = make_engine(url)
    with make_session_factory(engine)() as db:
        tokens = {}
        for role in ("lead", "annotator"):
            user = users.create_user(db, f"{role}@example.org", "correct horse battery staple", role)
            tokens[role] = users.create_token(db, user)[1]
        db.commit()
    engine.dispose()
    server = Server(url, data_dir)
    with open(data_dir / "worker-output.log", "ab") as output:  # the child keeps its own copy of the handle
        worker = subprocess.Popen([sys.executable, "-m", "app.cli", "worker", "--kinds", "export", "--poll", "0.1",
                                   "--heartbeat", "0.5"], env=preflab_env(url, data_dir),
                                  stdout=output, stderr=subprocess.STDOUT)
    try:
        server.start()
        yield server, tokens
    finally:
        server.stop()
        worker.terminate()
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(timeout=30)


def _jsonl(rows: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


def test_a_generated_client_runs_the_loop_from_project_to_training_run(
        client_package: dict[str, ModuleType], live: tuple[Server, dict[str, str]]) -> None:
    c = client_package
    m = c["models"]
    server, tokens = live
    lead = c["client"].AuthenticatedClient(base_url=server.base, token=tokens["lead"], raise_on_unexpected_status=True)
    annotator = c["client"].AuthenticatedClient(base_url=server.base, token=tokens["annotator"],
                                                raise_on_unexpected_status=True)

    # The worker's heartbeat makes the server ready: the readiness body parses into its model.
    readiness = wait_for("the worker's heartbeat", lambda: c["ready"].sync_detailed(client=lead).status_code == 200,
                         60, every=0.1, detail=server.output)
    assert readiness
    ready = c["ready"].sync(client=lead)
    assert isinstance(ready, m.Readiness) and ready.failing == [] and ready.checks.worker.status.value == "ok"

    project = c["projects"].sync(client=lead, body=m.ProjectIn(
        name="Generated", completions_per_prompt=K, overlap=1,
        rubric=m.RubricIn(text="Correct first.", criteria=["Correctness"])))
    assert isinstance(project, m.ProjectOut), project
    assert project.completions_per_prompt == K and project.rubric_version == 1

    member = c["members"].sync(project.id, client=lead, body=m.MemberIn(email="annotator@example.org",
                                                                       role=m.MemberInRole.ANNOTATOR))
    assert isinstance(member, m.MemberOut) and member.role == "annotator", member

    rows = [{"prompt": f"What is {n} + {n}?", "completions": [f"{2 * n}", f"{2 * n + 1}", f"about {2 * n}"]}
            for n in range(1, PROMPTS + 1)]
    upload = c["types"].File(payload=io.BytesIO(_jsonl(rows)), file_name="prompts.jsonl", mime_type="application/x-ndjson")
    imported = c["imports"].sync(project.id, client=lead,
                                 body=m.BodyImportFileApiProjectsProjectIdImportsPost(file=upload))
    assert isinstance(imported, m.ImportOut), imported
    assert (imported.prompts, imported.completions, imported.pairs) == (PROMPTS, PROMPTS * K, 0)

    # The annotator ranks every prompt, best tier first by the completions' text; then the queue is empty (204).
    ranked = []
    for n in range(PROMPTS):
        task = c["next_task"].sync(project.id, client=annotator)
        assert isinstance(task, m.TaskOut), task
        assert len(task.completions) == K and task.rubric.version == 1
        order = sorted(task.completions, key=lambda completion: (completion.text.startswith("about"),
                                                                 int(completion.text.split()[-1]) % 2))
        ranking = c["submit"].sync(project.id, client=annotator, body=m.RankingIn(
            assignment_id=task.assignment_id, tiers=[[completion.id] for completion in order],
            rubric_version=task.rubric.version, submission_id=f"generated-{n}"))
        assert isinstance(ranking, m.RankingOut), ranking
        assert ranking.created and ranking.pairs_created == K * (K - 1) // 2
        ranked.append(ranking.ranking_id)
    assert len(set(ranked)) == PROMPTS
    assert c["next_task"].sync_detailed(project.id, client=annotator).status_code == 204

    accepted = c["create_export"].sync(project.id, client=lead, body=m.ExportIn(
        kind=m.ExportInKind.PAIRS, format_=m.ExportInFormat.JSONL))
    assert isinstance(accepted, m.ExportAccepted), accepted

    def finished() -> Any:
        export = c["get_export"].sync(accepted.export_id, client=lead)
        return export if export.status not in ("queued", "running") else None

    export = wait_for("the export job", finished, 60, every=0.1,
                      detail=lambda: (server.log.parent / "worker-output.log").read_text(errors="replace")[-3000:])
    assert isinstance(export, m.ExportOut) and export.status == "ready", export
    assert export.row_count == PROMPTS * K * (K - 1) // 2
    data_files = [name for name in export.files.additional_keys if name.endswith(".jsonl")]
    assert data_files, export.files.to_dict()
    pairs = []
    for name in data_files:
        downloaded = c["download"].sync_detailed(export.id, name, client=lead)
        assert downloaded.status_code == 200 and isinstance(downloaded.parsed, c["types"].File)
        pairs += [json.loads(line) for line in downloaded.parsed.payload.read().decode().splitlines()]
    assert len(pairs) == export.row_count
    assert {row["chosen"] for row in pairs} >= {"2", "4"}  # each prompt's best completion is chosen against the rest

    run = c["create_run"].sync(project.id, client=lead, body=m.TrainingRunIn(
        kind=m.TrainingRunInKind.REWARD, export_id=export.id))
    assert isinstance(run, m.TrainingRunAccepted), run
    read = c["get_run"].sync(run.run_id, client=lead)
    assert isinstance(read, m.TrainingRunOut), read
    assert (read.id, read.kind, read.export_id, read.job_id) == (run.run_id, "reward", export.id, run.job_id)
    assert read.state == "queued" and read.metrics == []
