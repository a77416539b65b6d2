"""Request ids, structured logs, liveness and readiness, and /metrics, as an operator meets them."""

from __future__ import annotations

import io
import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from app.models import Completion, Prompt
from app.platform.observability import forget_worker, record_worker_heartbeat
from app.projects import projects
from tests.conftest import TEST_SECRET


@pytest.fixture
def log_lines() -> Iterator[io.StringIO]:
    """What preflab's log handler writes, as JSON lines (PREFLAB_LOG_FORMAT=json), captured in memory."""
    from app.platform.observability import configure_logging

    buffer = io.StringIO()
    handler = configure_logging("json")
    handler.setStream(buffer)  # type: ignore[attr-defined]
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.INFO)
    yield buffer
    root.setLevel(level)
    configure_logging("text")


def _records(buffer: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in buffer.getvalue().splitlines() if line.strip()]


@pytest.fixture
def own_app(database_url: str, clean_engine: Any, tmp_path: Path) -> Iterator[Any]:
    """A fresh app (its own routes may be added) on the test database, with JSON logs."""
    from app.main import create_app
    from app.platform.settings import Settings

    application = create_app(Settings(database_url=database_url, secret_key=TEST_SECRET, data_dir=tmp_path,
                                      log_format="json"))
    yield application
    application.state.engine.dispose()


# ------------------------------------------------------------------------------------------------
# request ids and logs


def test_the_response_header_and_the_log_line_share_the_request_id(own_app, log_lines) -> None:
    @own_app.get("/_test/log")
    def logs_something() -> dict[str, str]:
        logging.getLogger("preflab.test").info("handling the request")
        return {"ok": "yes"}

    client = TestClient(own_app)
    r = client.get("/_test/log")
    rid = r.headers["x-request-id"]
    assert len(rid) == 32
    line = next(rec for rec in _records(log_lines) if rec["message"] == "handling the request")
    assert line["request_id"] == rid
    assert set(line) >= {"time", "level", "logger", "message", "request_id", "job_id"}
    assert line["level"] == "INFO" and line["logger"] == "preflab.test" and line["job_id"] is None

    # A proxy's id is kept; anything that could forge a log line or a header is replaced, never echoed.
    assert client.get("/_test/log", headers={"X-Request-ID": "lb-7f3a.1:2"}).headers["x-request-id"] == "lb-7f3a.1:2"
    forged = client.get("/_test/log", headers={"X-Request-ID": 'x" , "level": "ERROR'}).headers["x-request-id"]
    assert forged != 'x" , "level": "ERROR' and len(forged) == 32
    assert client.get("/_test/log", headers={"X-Request-ID": "a" * 129}).headers["x-request-id"] != "a" * 129
    ids = [rec["request_id"] for rec in _records(log_lines) if rec["message"] == "handling the request"]
    assert ids == [rid, "lb-7f3a.1:2", forged, ids[3]] and len(set(ids)) == 4  # each request its own id


def test_text_logs_carry_the_request_id_too(own_app) -> None:
    from app.platform.observability import configure_logging

    buffer = io.StringIO()
    configure_logging("text").setStream(buffer)  # type: ignore[attr-defined]

    @own_app.get("/_test/warn")
    def warns() -> dict[str, str]:
        logging.getLogger("preflab.test").warning("something odd")
        return {}

    rid = TestClient(own_app).get("/_test/warn", headers={"X-Request-ID": "plain-1"}).headers["x-request-id"]
    line = next(x for x in buffer.getvalue().splitlines() if "something odd" in x)
    assert rid == "plain-1" and "WARNING preflab.test something odd [request_id=plain-1]" in line
    with pytest.raises(json.JSONDecodeError):
        json.loads(line)


def test_an_error_page_shows_the_request_id(app, browser) -> None:
    page = browser()
    r = page.get("/projects/987654", headers={"X-Request-ID": "support-ticket-42"})
    assert r.status_code in (303, 404)
    page.client.headers["accept"] = "text/html"
    r = page.get("/no/such/page")
    assert r.status_code == 404 and r.headers["x-request-id"]
    assert f"quote this id: <code>{r.headers['x-request-id']}</code>" in r.text


def test_an_unexpected_error_shows_and_logs_its_request_id(own_app, log_lines) -> None:
    @own_app.get("/_test/boom")
    def boom() -> None:
        raise RuntimeError("the bug")

    client = TestClient(own_app, raise_server_exceptions=False)
    r = client.get("/_test/boom", headers={"accept": "text/html"})
    rid = r.headers["x-request-id"]
    assert r.status_code == 500 and f"<code>{rid}</code>" in r.text and "the bug" not in r.text
    logged = next(rec for rec in _records(log_lines) if rec["message"].startswith("unhandled error"))
    assert logged["request_id"] == rid and logged["level"] == "ERROR" and "RuntimeError: the bug" in logged["exc_info"]
    api = client.get("/_test/boom", headers={"accept": "application/json", "X-Request-ID": "api-500"})
    assert api.status_code == 500 and api.json() == {"detail": "internal error", "request_id": "api-500"}


def _seed(db, make_user, make_project, *, n_prompts: int = 3, k: int = 2):  # type: ignore[no-untyped-def]
    lead = make_user(db, "lead")
    project = make_project(db, lead=lead, k=k, overlap=1)
    annotator = make_user(db, "annotator")
    projects.add_member(db, project, lead, email=annotator.email, role="annotator")
    for i in range(n_prompts):
        prompt = Prompt(project_id=project.id, text=f"q{i}", text_hash=f"obs{i}-{project.id}", split="train")
        db.add(prompt)
        db.flush()
        db.add_all(Completion(prompt_id=prompt.id, text=f"answer {i}.{j}") for j in range(k))
    db.flush()
    return lead, annotator, project


def test_a_job_started_by_a_request_logs_its_request_id(app, db, api, make_user, make_project, token_for,
                                                        log_lines) -> None:
    from app.jobs import queue as jobs
    from app.worker import Worker

    lead, _, project = _seed(db, make_user, make_project)
    client = api(token_for(db, lead))
    db.commit()
    r = client.post(f"/api/projects/{project.id}/exports", json={"format": "jsonl"},
                    headers={"X-Request-ID": "export-click-1"})
    assert r.status_code == 202, r.text
    job_id = r.json()["job_id"]
    path = jobs.log_path(app.state.settings.data_dir, job_id)
    # The session's data directory is shared, and SQLite reuses the ids of deleted jobs: read this run's lines only.
    before = path.stat().st_size if path.exists() else 0
    assert Worker(app.state.settings, session_factory=app.state.session_factory, heartbeat_s=0.2).run_one()

    job_log = path.read_bytes()[before:].decode()
    lines = job_log.splitlines()
    assert lines and all("[request export-click-1]" in line for line in lines), job_log
    worker_lines = [rec for rec in _records(log_lines) if rec["logger"] == "preflab.worker"]
    assert worker_lines and all(rec["request_id"] == "export-click-1" and rec["job_id"] == job_id
                                for rec in worker_lines)
    assert client.get(f"/api/jobs/{job_id}").json()["state"] == "succeeded"


# ------------------------------------------------------------------------------------------------
# liveness and readiness


def test_readiness_names_the_worker_check_until_a_worker_is_seen(app, api) -> None:
    from app.worker import Worker

    client = api(None)
    data_dir = app.state.settings.data_dir
    forget_worker(data_dir, "obs-test")
    assert client.get("/healthz/live").json() == {"status": "ok"}
    assert client.get("/healthz").json() == {"status": "ok", "database": "ok"}  # unchanged for existing callers
    for name in os.listdir(data_dir / "workers") if (data_dir / "workers").exists() else []:
        (data_dir / "workers" / name).unlink()

    r = client.get("/healthz/ready")
    assert r.status_code == 503 and r.json()["failing"] == ["worker"]
    assert r.json()["checks"]["database"]["status"] == "ok" and r.json()["checks"]["migrations"]["status"] == "ok"
    assert "no worker" in r.json()["checks"]["worker"]["detail"]

    worker = Worker(app.state.settings, session_factory=app.state.session_factory, worker_id="obs-test")
    worker.run(exit_when_idle=True)  # an idle worker announces itself too
    r = client.get("/healthz/ready")
    assert r.status_code == 200 and r.json()["status"] == "ok" and r.json()["failing"] == []

    stale = time.time() - 600
    os.utime(data_dir / "workers" / "obs-test", (stale, stale))
    r = client.get("/healthz/ready")
    assert r.status_code == 503 and r.json()["failing"] == ["worker"]
    assert "600 s ago" in r.json()["checks"]["worker"]["detail"]
    forget_worker(data_dir, "obs-test")


def test_the_container_health_probe_follows_readiness_and_says_why(app, server_url) -> None:
    """The Dockerfile's HEALTHCHECK (`python -m app.platform.healthcheck`) against a real server: unhealthy, naming the
    worker check, until a worker is seen; healthy then; unhealthy with the reason when nothing listens."""
    import subprocess
    import sys

    from tests.conftest import REPO

    data_dir = app.state.settings.data_dir
    for name in os.listdir(data_dir / "workers") if (data_dir / "workers").exists() else []:
        (data_dir / "workers" / name).unlink()

    def probe(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "app.platform.healthcheck", *args], cwd=REPO, capture_output=True,
                              text=True, timeout=60, env=os.environ | env)

    unready = probe(f"{server_url}/healthz/ready")
    assert unready.returncode == 1 and "503" in unready.stdout and "no worker has sent a heartbeat" in unready.stdout
    record_worker_heartbeat(data_dir, "probe-test")
    try:
        ready = probe(PREFLAB_HEALTHCHECK_URL=f"{server_url}/healthz/ready")  # the URL from the environment
        assert ready.returncode == 0 and json.loads(ready.stdout)["status"] == "ok", ready.stdout
    finally:
        forget_worker(data_dir, "probe-test")
    down = probe("http://127.0.0.1:9/healthz/ready")
    assert down.returncode == 1 and "http://127.0.0.1:9/healthz/ready" in down.stdout and "refused" in down.stdout
    assert probe("file:///etc/passwd").returncode == 1


def test_readiness_fails_with_the_database_named_when_it_is_down(tmp_path) -> None:
    from app.main import create_app
    from app.platform.settings import Settings

    settings = Settings(database_url="postgresql://nobody@127.0.0.1:1/none", data_dir=tmp_path)
    record_worker_heartbeat(tmp_path, "w1")
    client = TestClient(create_app(settings))
    r = client.get("/healthz/ready")
    assert r.status_code == 503 and r.json()["failing"] == ["database"]
    assert r.json()["checks"]["database"]["detail"].startswith("unreachable")
    assert client.get("/healthz/live").status_code == 200  # the process still serves: do not restart it


def test_readiness_fails_with_migrations_named_when_the_schema_is_behind(tmp_path) -> None:
    from app.main import create_app
    from app.platform.migrate import revisions, upgrade
    from app.platform.settings import Settings

    url = f"sqlite:///{tmp_path}/old.db"
    upgrade(url, revisions()[-2])
    record_worker_heartbeat(tmp_path, "w1")
    application = create_app(Settings(database_url=url, data_dir=tmp_path))
    r = TestClient(application).get("/healthz/ready")
    assert r.status_code == 503 and r.json()["failing"] == ["migrations"]
    assert "1 revision behind" in r.json()["checks"]["migrations"]["detail"]
    application.state.engine.dispose()


# ------------------------------------------------------------------------------------------------
# /metrics


def _families(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def _sample(families: dict[str, Any], family: str, name: str, **labels: str) -> float:
    for s in families[family].samples:
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    raise AssertionError(f"no sample {name}{labels} in {families[family].samples}")


def test_metrics_refuse_strangers_and_serve_an_admin(app, db, api, make_user, make_project, token_for) -> None:
    from app.worker import Worker

    lead, annotator, project = _seed(db, make_user, make_project)
    admin = make_user(db, "admin")
    tokens = {who: token_for(db, user) for who, user in (("admin", admin), ("lead", lead), ("ann", annotator))}
    db.commit()
    # TestClient's address ("testclient") is in no allowed network: only an admin gets through.
    assert api(None).get("/metrics").status_code == 401
    assert api(tokens["lead"]).get("/metrics").status_code == 403
    assert api(tokens["ann"]).get("/metrics").status_code == 403

    person = api(tokens["ann"])
    task = person.get(f"/api/projects/{project.id}/tasks/next").json()  # a lease
    ids = sorted(c["id"] for c in task["completions"])
    body = {"assignment_id": task["assignment_id"], "tiers": [[i] for i in ids],
            "rubric_version": task["rubric"]["version"], "submission_id": "obs-1"}
    assert person.post(f"/api/projects/{project.id}/rankings", json=body).status_code == 201
    person.get(f"/api/projects/{project.id}/tasks/next")  # a second lease, left outstanding
    lead_client = api(tokens["lead"])
    assert lead_client.post(f"/api/projects/{project.id}/exports", json={"format": "jsonl"}).status_code == 202
    Worker(app.state.settings, session_factory=app.state.session_factory, worker_id="metrics-w").run(
        exit_when_idle=True)
    try:
        r = api(tokens["admin"]).get("/metrics")
    finally:
        forget_worker(app.state.settings.data_dir, "metrics-w")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    f = _families(r.text)
    p = str(project.id)
    # Requests by route template, never by raw path (no series per project id).
    route = "/api/projects/{project_id}/tasks/next"
    assert _sample(f, "preflab_http_requests", "preflab_http_requests_total", route=route, status="200") >= 2
    assert _sample(f, "preflab_http_request_duration_seconds", "preflab_http_request_duration_seconds_count",
                   route=route, method="GET") >= 2
    assert not any(f"/api/projects/{project.id}/" in s.labels.get("route", "")
                   for s in f["preflab_http_requests"].samples)
    assert _sample(f, "preflab_queue_depth", "preflab_queue_depth", project=p) == 3 - 1 - 1  # 3 prompts × 1
    assert _sample(f, "preflab_leases_outstanding", "preflab_leases_outstanding", project=p) == 1
    assert _sample(f, "preflab_leases_expiring", "preflab_leases_expiring", project=p) == 0  # 30-minute leases
    assert _sample(f, "preflab_rankings_last_minute", "preflab_rankings_last_minute", project=p, source="human") == 1
    assert _sample(f, "preflab_rankings", "preflab_rankings_total", project=p, source="human") == 1
    assert _sample(f, "preflab_jobs", "preflab_jobs", kind="export", state="succeeded") == 1
    assert _sample(f, "preflab_job_duration_seconds", "preflab_job_duration_seconds_count", kind="export",
                   state="succeeded") == 1
    assert _sample(f, "preflab_job_duration_seconds", "preflab_job_duration_seconds_bucket", kind="export",
                   state="succeeded", le="+Inf") == 1
    assert 0 <= _sample(f, "preflab_worker_heartbeat_age_seconds", "preflab_worker_heartbeat_age_seconds",
                        worker="metrics-w") < 60
    assert _sample(f, "preflab_database_up", "preflab_database_up") == 1
    assert "preflab_db_pool_connections" in f and "preflab_metrics_scrape_seconds" in f


def test_metrics_from_an_allowed_network_need_no_login(server_url) -> None:
    # The test server listens on 127.0.0.1, in the default allowed networks (loopback only).
    r = httpx.get(f"{server_url}/metrics")
    assert r.status_code == 200 and "preflab_http_requests_total" in r.text and r.headers["x-request-id"]


def test_metrics_from_a_network_not_listed_are_refused(database_url, clean_engine, tmp_path) -> None:
    import socket
    import threading

    import uvicorn

    from app.main import create_app
    from app.platform.settings import Settings

    application = create_app(Settings(database_url=database_url, secret_key=TEST_SECRET, data_dir=tmp_path,
                                      metrics_allowed_networks="10.0.0.0/8, fd00::/8"))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(application, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        r = httpx.get(f"http://127.0.0.1:{sock.getsockname()[1]}/metrics")
        assert r.status_code == 401 and "PREFLAB_METRICS_ALLOWED_NETWORKS" in r.json()["detail"][0]["message"]
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
        application.state.engine.dispose()


def test_a_bad_metrics_network_is_refused_by_name() -> None:
    from app.platform.settings import Settings

    with pytest.raises(ValueError, match="'10.0.0/33' is not a network in CIDR notation"):
        Settings(metrics_allowed_networks="127.0.0.1/32,10.0.0/33")


def test_metrics_count_the_requests_of_every_server_process(database_url, clean_engine, tmp_path) -> None:
    """`preflab serve --workers 2` (Postgres): whichever process answers a scrape, it reports the requests both
    answered (prometheus-client's multiprocess mode), not only its own."""
    import threading

    from tests.support.server import Server, wait_for

    if not database_url.startswith("postgresql"):
        pytest.skip(reason="several server processes need Postgres")
    shared = tmp_path / "prometheus"
    shared.mkdir()
    # Started once /healthz answers: the counts below are of /healthz/live alone.
    server = Server(database_url, tmp_path / "data", workers=2, probe="/healthz",
                    PROMETHEUS_MULTIPROC_DIR=str(shared))
    base = server.base

    sent = 0
    lock = threading.Lock()

    def burst() -> None:
        nonlocal sent
        for _ in range(5):
            assert httpx.get(f"{base}/healthz/live", timeout=10).status_code == 200  # a new connection each
            with lock:
                sent += 1

    def processes_counted() -> set[str]:
        return {p.stem.rsplit("_", 1)[1] for p in shared.glob("counter_*.db")}

    def both_counted() -> bool:
        threads = [threading.Thread(target=burst) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        return len(processes_counted()) >= 2

    try:
        server.start()
        wait_for("both server processes to answer requests", both_counted, 60, every=0.05, detail=server.output)
        for _ in range(6):  # several scrapes: both processes answer some of them
            r = httpx.get(f"{base}/metrics", timeout=10)
            assert r.status_code == 200
            families = {f.name: f for f in text_string_to_metric_families(r.text)}
            live = [s.value for s in families["preflab_http_requests"].samples
                    if s.name == "preflab_http_requests_total" and s.labels["route"] == "/healthz/live"]
            assert live == [sent], (live, sent)
            assert "preflab_queue_depth" in families  # the database families are there too
    finally:
        server.stop()
