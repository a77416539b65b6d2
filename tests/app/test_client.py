"""The Python client (`preflab.client`, source app/client): retries and errors against a mock transport, its types
and calls against the app's own OpenAPI document, its packaging, and the whole loop against a real server process
and a real worker (import a DataFrame → rank → export into `datasets` → train a reward model → read its metrics)."""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import socket
import string
import subprocess
import sys
import time
import tomllib
import types
import typing
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.client import client as pc
from app.client.types import api_fields
from tests.conftest import REPO, TEST_SECRET

# --- retries and errors, against a mock transport --------------------------------------------------


class Script:
    """A transport that answers from a list (a Response, or an exception to raise), recording each request."""

    def __init__(self, *answers: httpx.Response | Exception) -> None:
        self.answers, self.requests = list(answers), []  # type: ignore[var-annotated]

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def _client(script: Script, **kw: Any) -> tuple[pc.Client, list[float]]:
    waits: list[float] = []
    client = pc.Client("http://preflab.test", token="t0ken", transport=httpx.MockTransport(script),
                       sleep=waits.append, **kw)
    return client, waits


PROJECT = {"id": 3, "name": "Maths", "description": "", "completions_per_prompt": 2, "overlap": 1,
           "rubric_version": 1, "step_labels": False, "step_separator": None, "created_at": "2026-01-02T03:04:05Z"}


def test_a_read_is_retried_after_a_503_waiting_as_retry_after_says() -> None:
    script = Script(httpx.Response(503, headers={"Retry-After": "7"}, json={"detail": [{"message": "busy"}]}),
                    httpx.Response(200, json=PROJECT))
    client, waits = _client(script)
    project = client.projects.get(3)
    assert waits == [7.0]
    assert (project.id, project.name, project.created_at.year) == (3, "Maths", 2026)
    assert [r.url.path for r in script.requests] == ["/api/v1/projects/3"] * 2
    assert script.requests[0].headers["Authorization"] == "Bearer t0ken"


def test_connection_errors_back_off_exponentially_then_give_up() -> None:
    script = Script(*[httpx.ConnectError("refused")] * 4)
    client, waits = _client(script, retry=pc.Retry(attempts=4, backoff=1.0, max_wait=30))
    with pytest.raises(httpx.ConnectError):
        client.projects.list()
    assert len(script.requests) == 4 and len(waits) == 3
    # 1, 2, 4 seconds, each with at most 25% jitter on top
    assert [1 <= w <= 1.25 for w in waits[:1]] == [True] and 2 <= waits[1] <= 2.5 and 4 <= waits[2] <= 5


def test_retry_after_as_an_http_date_and_the_cap_on_waiting() -> None:
    later = httpx.Response(429, headers={"Retry-After": "Fri, 31 Dec 9999 23:59:59 GMT"}, json={"detail": []})
    script = Script(later, httpx.Response(504), httpx.Response(200, json=[PROJECT]))
    client, waits = _client(script, retry=pc.Retry(max_wait=12.0, backoff=0.5))
    assert [p.id for p in client.projects.list()] == [3]
    assert waits[0] == 12.0 and 1.0 <= waits[1] <= 1.25  # the second wait: backoff doubled


def test_a_post_that_may_have_been_applied_is_never_sent_twice() -> None:
    script = Script(httpx.Response(503, json={"detail": [{"message": "unavailable"}]}))
    client, waits = _client(script)
    with pytest.raises(pc.ServerError) as err:
        client.projects.create("Maths", completions_per_prompt=2, rubric="Correct first.")
    assert len(script.requests) == 1 and waits == [] and err.value.status_code == 503


def test_a_ranking_is_retried_under_the_same_submission_id() -> None:
    ok = {"ranking_id": 9, "pairs_created": 1, "created": False}
    script = Script(httpx.ReadTimeout("lost"), httpx.Response(502), httpx.Response(200, json=ok))
    client, waits = _client(script)
    result = client.project(3).submit_ranking(tiers=[[1], [2]], rubric_version=1, assignment_id=5)
    assert result == pc.RankingResult(ranking_id=9, pairs_created=1, created=False)
    bodies = [json.loads(r.content) for r in script.requests]
    assert len(bodies) == 3 and len({b["submission_id"] for b in bodies}) == 1
    assert bodies[0] == {"tiers": [[1], [2]], "rubric_version": 1, "assignment_id": 5,
                         "submission_id": bodies[0]["submission_id"]}
    assert len(waits) == 2


def test_errors_carry_the_servers_field_and_line() -> None:
    body = {"detail": [{"field": "completions", "line": 4, "message": "must not be empty"},
                       {"field": "overlap", "message": "Input should be greater than or equal to 1"}]}
    script = Script(httpx.Response(422, json=body, headers={"X-Request-ID": "req-1"}),
                    httpx.Response(404, json={"detail": [{"message": "no such project"}]}))
    client, _ = _client(script)
    with pytest.raises(pc.ValidationFailed) as err:
        client.project(3).import_records([{"prompt": "p", "completions": ["a", ""]}])
    assert err.value.fields == ["completions", "overlap"] and err.value.details[0].line == 4
    assert "line 4.completions: must not be empty" in str(err.value) and "req-1" in str(err.value)
    with pytest.raises(pc.NotFound, match="no such project"):
        client.projects.get(99)


def test_records_from_a_dataframe_and_a_dataset_are_sent_as_one_jsonl_file() -> None:
    pandas = pytest.importorskip("pandas")
    datasets = pytest.importorskip("datasets")
    frame = pandas.DataFrame({"prompt": ["one", "two"], "completions": [["a", "b"], ["c", "d"]],
                              "reference": ["x", float("nan")]})
    answer = {"prompts": 2, "completions": 4, "pairs": 0}
    script = Script(httpx.Response(201, json=answer), httpx.Response(201, json=answer))
    client, _ = _client(script)
    assert client.project(3).import_records(frame, on_duplicate="skip").prompts == 2
    client.project(3).import_records(datasets.Dataset.from_pandas(frame), preset="preflab")
    for request in script.requests:
        assert b'filename="records.jsonl"' in request.content
    first = script.requests[0].content.decode()
    assert '{"prompt": "two", "completions": ["c", "d"], "reference": null}' in first  # NaN: a missing value
    assert script.requests[0].url.params["on_duplicate"] == "skip"
    assert script.requests[1].url.params["preset"] == "preflab"
    with pytest.raises(TypeError, match="DatasetDict"):
        client.project(3).import_records(datasets.DatasetDict({"train": datasets.Dataset.from_pandas(frame)}))


EXPORT = {"id": 5, "project_id": 3, "kind": "pairs", "format": "parquet", "filters": {}, "status": "ready",
          "row_count": 2, "row_counts": {"train": 2}, "empty": False, "sha256": "ab", "snapshot": None, "job_id": 8,
          "created_by_id": 1, "created_at": "2026-01-02T03:04:05+00:00", "deleted_at": None}


def test_a_parquet_export_loads_into_datasets_and_a_file_that_does_not_match_its_hash_is_refused() -> None:
    import hashlib
    import io

    datasets = pytest.importorskip("datasets")
    import pyarrow as pa
    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    pq.write_table(pa.table({"prompt": ["p1", "p2"], "chosen": ["a", "b"], "rejected": ["c", "d"]}), buffer)
    data = buffer.getvalue()
    files = {"pairs.parquet": hashlib.sha256(data).hexdigest(), "README.md": "0" * 64}
    script = Script(httpx.Response(200, json=EXPORT | {"files": files}), httpx.Response(200, content=data),
                    httpx.Response(200, content=data + b"x"))
    client, _ = _client(script)
    export = client.export(5)
    pairs = export.to_datasets()
    assert isinstance(pairs, datasets.Dataset) and pairs["chosen"] == ["a", "b"]
    assert script.requests[1].url.path == "/api/v1/exports/5/files/pairs.parquet"
    with pytest.raises(pc.IntegrityError, match="pairs.parquet"):
        export.to_datasets()


def test_waiting_on_an_export_that_failed_says_why() -> None:
    job = {"id": 8, "kind": "export", "state": "failed", "attempts": 3, "project_id": 3,
           "created_at": "2026-01-02T03:04:05Z", "started_at": None, "finished_at": None,
           "progress": {"done": 0, "total": 0}, "error": "disk full"}
    queued = EXPORT | {"status": "queued", "files": {}}
    script = Script(httpx.Response(200, json=queued), httpx.Response(200, json=queued),
                    httpx.Response(200, json=EXPORT | {"status": "failed", "files": {}}),
                    httpx.Response(200, json=job))
    client, waits = _client(script)
    with pytest.raises(pc.JobFailed, match="export 5 failed: disk full"):
        client.export(5).wait()
    assert len(waits) == 1  # polled until the status changed, then asked the job why
    with pytest.raises(pc.PreflabError, match="not ready"):
        pc.Export(**{**{k: v for k, v in queued.items() if k != "created_at"},
                     "created_at": datetime(2026, 1, 1)}).to_datasets()


# --- types and calls against the app's OpenAPI document -----------------------------------------


@pytest.fixture(scope="module")
def openapi(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from app.main import create_app
    from app.platform.settings import Settings

    tmp = tmp_path_factory.mktemp("openapi")
    app = create_app(Settings(env="dev", database_url=f"sqlite:///{tmp}/x.db", secret_key=TEST_SECRET,
                              data_dir=tmp))
    try:
        return app.openapi()
    finally:
        app.state.engine.dispose()


def test_every_call_the_client_makes_is_an_operation_of_the_schema(openapi: dict[str, Any]) -> None:
    for name, (method, path) in pc.OPERATIONS.items():
        full = pc.API_PREFIX + path
        assert full in openapi["paths"], f"{name}: {full} is not in /openapi.json"
        operation = openapi["paths"][full].get(method.lower())
        assert operation is not None, f"{name}: {method} {full} is not in /openapi.json"
        in_path = {p["name"] for p in operation.get("parameters", []) if p["in"] == "path"}
        assert in_path == {field for _, field, _, _ in string.Formatter().parse(path) if field}, name


def _schema_type(prop: dict[str, Any]) -> set[str]:
    """The JSON types a property may take (`anyOf` with null for optional ones)."""
    if "anyOf" in prop:
        return set().union(*(_schema_type(p) for p in prop["anyOf"]))
    if "$ref" in prop:
        return {"object"}
    return {prop.get("type", "any")}


def _python_type(hint: Any) -> set[str]:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return set().union(*(_python_type(a) for a in typing.get_args(hint)))
    if hint is type(None):
        return {"null"}
    if origin is list:
        return {"array"}
    if origin is dict or hint is dict:
        return {"object"}
    if dataclasses.is_dataclass(hint):
        return {"object"}
    return {int: {"integer"}, str: {"string"}, bool: {"boolean"}, float: {"number"},
            datetime: {"string"}}.get(hint, {"any"})


@pytest.mark.parametrize("cls", pc.ANSWER_TYPES, ids=lambda c: c.__name__)
def test_each_answer_type_has_the_fields_and_types_of_its_schema(cls: type, openapi: dict[str, Any]) -> None:
    schema = openapi["components"]["schemas"][cls.SCHEMA]  # type: ignore[attr-defined]
    props, required = schema["properties"], set(schema.get("required", []))
    fields = api_fields(cls)
    assert set(fields) == set(props), f"{cls.__name__} vs {cls.SCHEMA}"  # type: ignore[attr-defined]

    defaults = {f.metadata.get("api", f.name) for f in dataclasses.fields(cls)
                if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING}
    for name, hint in fields.items():
        wanted = _schema_type(props[name])
        if "any" not in wanted:
            assert _python_type(hint) == wanted, f"{cls.__name__}.{name}: {hint} vs {props[name]}"
        # A field the server may leave out has a default here; one it always sends need not.
        assert name in required or name in defaults, f"{cls.__name__}.{name} needs a default"


# --- packaging ------------------------------------------------------------------------------------


def test_the_client_is_shipped_as_preflab_and_imports_only_stdlib_and_httpx() -> None:
    from setuptools import find_namespace_packages

    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert config["package-dir"] == {"preflab": "app/client"}
    # Every folder that ships, with or without an __init__.py (app/static, its vendor/, migrations/versions).
    found = find_namespace_packages(str(REPO), include=["app*", "training*", "migrations*", "templates"], exclude=["*__pycache__*"])
    assert sorted(config["packages"]) == sorted([*found, "preflab"]), "a new package is missing from pyproject"
    allowed = set(sys.stdlib_module_names) | {"httpx", "datasets", "pandas", "pyarrow"}
    for source in (REPO / "app" / "client").glob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert name.split(".")[0] in allowed, f"{source.name} imports {name}"
    # And in a fresh interpreter nothing of the server comes along.
    probe = ("import sys; import app.client.client; "
             "print(sorted(m for m in sys.modules if m.split('.')[0] in "
             "('fastapi', 'sqlalchemy', 'pydantic', 'torch', 'pandas', 'datasets') "
             "or (m.startswith('app.') and not m.startswith('app.client'))))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True,
                         env=os.environ | {"PYTHONPATH": str(REPO)})
    assert out.stdout.strip() == "[]"


# --- the whole loop against a real server and worker ------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(what: str, condition: Callable[[], bool], timeout: float, detail: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}:\n{detail()}")


def _seed_accounts(url: str) -> dict[str, str]:
    """Lead, annotator and engineer accounts with API tokens (as `preflab user add` / `token create` make them)."""
    from app.accounts import users
    from app.platform.db import make_engine, make_session_factory, session_scope

    engine = make_engine(url)
    tokens = {}
    with session_scope(make_session_factory(engine)) as db:
        for role in ("lead", "annotator", "engineer"):
            person = users.create_user(db, f"{role}@example.org", "client test password", role)
            tokens[role] = users.create_token(db, person)[1]
    engine.dispose()
    return tokens


@pytest.fixture
def live_server(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """uvicorn and `preflab worker` as their own processes on one migrated SQLite database."""
    from app.platform.migrate import upgrade

    url = f"sqlite:///{tmp_path}/client.db"
    upgrade(url)
    tokens = _seed_accounts(url)
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFLAB_")}
    env.update(PREFLAB_DATABASE_URL=url, PREFLAB_DATA_DIR=str(tmp_path / "data"), PREFLAB_ENV="dev",
               PREFLAB_SECRET_KEY=TEST_SECRET, PREFLAB_ENCRYPTION_KEY=os.environ["PREFLAB_ENCRYPTION_KEY"],
               PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", CUDA_VISIBLE_DEVICES="")
    log = tmp_path / "processes.log"
    with open(log, "ab") as out:
        server = subprocess.Popen([sys.executable, "-m", "uvicorn", "app.asgi:app", "--host", "127.0.0.1",
                                   "--port", str(port), "--log-level", "warning"],
                                  cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
        worker = subprocess.Popen([sys.executable, "-m", "app.cli", "worker", "--kinds", "export,train"],
                                  cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"

    def live() -> bool:
        assert server.poll() is None, log.read_text(errors="replace")[-4000:]
        try:
            return httpx.get(f"{base}/healthz/live", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    try:
        _wait_for("the server", live, 90, lambda: log.read_text(errors="replace")[-4000:])
        yield base, tokens
    finally:
        for proc in (worker, server):
            proc.terminate()
        for proc in (worker, server):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_whole_loop_through_the_client_against_a_real_server(live_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    pandas = pytest.importorskip("pandas")
    datasets = pytest.importorskip("datasets")
    from tests.app.test_training_runs import _tiny_reward_base

    base, tokens = live_server
    lead = pc.Client(base, token=tokens["lead"])
    with pytest.raises(pc.ValidationFailed) as bad:
        lead.projects.create("Maths", completions_per_prompt=2, overlap=0, rubric="Correct first.")
    assert bad.value.fields == ["overlap"]

    project = lead.projects.create("Maths", completions_per_prompt=2, rubric="Correct first.",
                                   criteria=["Correctness"])
    assert (project.completions_per_prompt, project.rubric_version) == (2, 1)
    rubric = project.rubrics.create("Correct and clear first.", criteria=["Correctness", "Clarity"], note="clarity")
    assert (rubric.version, rubric.current) == (2, True)
    with pytest.raises(pc.Conflict):
        project.rubrics.create("stale", base_version=1)
    project.add_member("annotator@example.org", "annotator")
    project.add_member("engineer@example.org", "engineer")

    frame = pandas.DataFrame({"prompt": [f"what is {i}" for i in range(12)],
                              "completions": [["good right answer", "bad wrong"]] * 12,
                              "split": ["heldout" if i % 4 == 3 else "train" for i in range(12)]})
    imported = lead.project(project.id).import_records(frame)
    assert (imported.prompts, imported.completions) == (12, 24)
    with pytest.raises(pc.ValidationFailed) as dup:
        project.import_records(frame.head(1))
    assert dup.value.details[0].line == 1

    annotator = pc.Client(base, token=tokens["annotator"]).project(project.id)
    ranked = 0
    for task in annotator.tasks():
        assert task.rubric is not None and task.rubric.version == 2
        result = task.rank_by(lambda c: c.text.startswith("good"))
        assert (result.created, result.pairs_created) == (True, 1)
        assert task.submit([[c.id] for c in task.completions]).created is False  # the same task again: stored once
        ranked += 1
    assert ranked == 12

    engineer = pc.Client(base, token=tokens["engineer"]).project(project.id)
    export = engineer.exports.create("pairs").wait(timeout=180)
    pairs = export.to_datasets()
    assert isinstance(pairs, datasets.Dataset) and pairs.num_rows == export.row_count == 12
    assert set(pairs["chosen"]) == {"good right answer"} and set(pairs["rejected"]) == {"bad wrong"}
    assert len(export.to_pandas()) == 12
    for fmt in ("parquet", "hf"):  # the same rows, whatever the file format
        other = engineer.exports.create("pairs", format=fmt).wait(timeout=180).to_datasets()
        assert sorted(other["prompt"]) == sorted(pairs["prompt"])

    run = export.train("reward", base_model=str(_tiny_reward_base(tmp_path / "reward-base")),
                       config={"steps": 4, "batch_size": 4, "lr": 1e-3, "log_every": 1, "eval_every": 2})
    assert run.state in ("queued", "running")
    run.wait(timeout=480)
    assert run.state == "succeeded" and run.model_dir
    metrics = run.metrics()
    assert metrics and all("step" in row for row in metrics)
    assert any("loss" in key for row in metrics for key in row)
    assert [r.id for r in engineer.training_runs.list()] == [run.id]
