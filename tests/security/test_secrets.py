"""Secrets at rest: model-endpoint API keys are encrypted, rotated in one transaction, never shown, never leaked.

A canary key is planted through the API and used by real jobs against a real HTTP server that demands it; then
every table's columns, the SQLite file itself, the data directory (job logs, exports), the log records and the
API answers and pages are searched for it.
"""

from __future__ import annotations

import logging
import stat
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet
from sqlalchemy import MetaData, create_engine, select, text
from typer.testing import CliRunner

from app.models import ModelEndpoint, Prompt
from app.platform.crypto import KEY_FILE, NEXT_KEY_FILE, Keyring, KeyringError, KeyUnreadable
from app.platform.settings import Settings, SettingsError, load_settings
from tests.conftest import TEST_SECRET
from tests.security.world import World
from tests.support.openai_server import OpenAICompatibleServer
from tests.training.tiny import char_tokenizer, save_tiny, tiny_gpt2

CANARY = "sk-CANARY-5f1e9a7c3b2d4e6f8a0b"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tokenizer = char_tokenizer()
    return save_tiny(tiny_gpt2(tokenizer, n_positions=64), tokenizer, tmp_path_factory.mktemp("tiny") / "model")


def _run_worker(app: Any) -> None:
    from app.worker import Worker

    Worker(app.state.settings, session_factory=app.state.session_factory, poll_s=0.05,
           heartbeat_s=0.2).run(exit_when_idle=True)


def _sample(client: Any, world: World, endpoint_id: int, tag: str) -> int:
    with client.app.state.session_factory() as db:
        db.add(Prompt(project_id=world.a.project_id, text=f"{tag} 1+1=", text_hash=f"canary-{tag}", split="train"))
        db.commit()
    spec = {"backend": "openai", "endpoint_id": endpoint_id, "max_retries": 0, "timeout_s": 10, "max_new_tokens": 4}
    response = client.post(f"/api/projects/{world.a.project_id}/sampling-jobs", json={"generator": spec},
                           headers=world.headers("lead"))
    assert response.status_code == 202, response.text
    return int(response.json()["job_id"])


def _every_column(url: str) -> str:
    """Every value of every column of every table, as text: a database dump, read by reflection."""
    engine = create_engine(url)
    meta = MetaData()
    meta.reflect(engine)
    parts = []
    with engine.connect() as conn:
        for table in meta.sorted_tables:
            for row in conn.execute(select(table)):
                parts.extend(repr(value) for value in row)
    engine.dispose()
    return "\n".join(parts)


def _files_under(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_canary_key_is_nowhere_but_encrypted_in_its_row(app: Any, client: Any, world: World, tiny_dir: Path,
                                                          database_url: str, caplog: pytest.LogCaptureFixture,
                                                          capfd: pytest.CaptureFixture[str]) -> None:
    caplog.set_level(logging.DEBUG)
    admin = world.headers("admin")
    answers: list[str] = []
    with OpenAICompatibleServer(tiny_dir, model_name="tiny", api_key=CANARY) as server:
        created = client.post("/api/model-endpoints", headers=admin, json={
            "name": "canary", "base_url": server.url, "model": "tiny", "api_key": CANARY, "allow_private": True})
        assert created.status_code == 201, created.text
        endpoint_id = created.json()["id"]
        patched = client.patch(f"/api/model-endpoints/{endpoint_id}", headers=admin, json={"api_key": CANARY})
        page_saved = client.post(f"/admin/endpoints/{endpoint_id}", headers=admin, data={
            "name": "canary", "base_url": server.url, "model": "tiny", "api_key": CANARY, "allow_private": "on"})
        assert patched.status_code == 200 and page_saved.status_code == 303
        answers += [created.text, patched.text, page_saved.text]

        ok = _sample(client, world, endpoint_id, "ok")
        _run_worker(app)  # the key is used: the server refuses any other
        server.fail_always(401)  # every attempt of the job is refused
        failed = _sample(client, world, endpoint_id, "refused")
        _run_worker(app)
        server.clear_faults()
    lead = world.headers("lead")
    status_ok = client.get(f"/api/jobs/{ok}", headers=lead).json()
    status_failed = client.get(f"/api/jobs/{failed}", headers=lead).json()
    assert status_ok["state"] == "succeeded", status_ok
    assert status_failed["state"] == "failed" and "HTTP 401" in status_failed["error"], status_failed
    assert server.requests  # the key reached the server: a request without it would have been answered 401
    for path, who in [("/api/model-endpoints", admin), ("/admin/endpoints", admin), (f"/api/jobs/{ok}", lead),
                      (f"/api/jobs/{failed}", lead), (f"/jobs/{failed}", lead),
                      (f"/projects/{world.a.project_id}/jobs", lead), ("/openapi.json", admin)]:
        response = client.get(path, headers=who)
        assert response.status_code == 200, path
        answers.append(response.text)
    assert [e["api_key_status"] for e in client.get("/api/model-endpoints", headers=admin).json()
            if e["id"] == endpoint_id] == ["stored"]

    dump = _every_column(database_url)
    database = Path(database_url.removeprefix("sqlite:///"))
    raw = b"".join(p.read_bytes() for p in database.parent.glob(database.name + "*"))  # the file, its WAL
    files = _files_under(app.state.settings.data_dir)
    assert any(p.parent.name == "jobs" and p.suffix == ".log" for p in files), "the jobs wrote logs"
    logged = "\n".join(r.getMessage() for r in caplog.records) + "".join(capfd.readouterr())

    assert CANARY not in dump and CANARY.encode() not in raw
    assert [p for p, body in files.items() if CANARY.encode() in body] == []
    assert CANARY not in logged and all(CANARY not in a for a in answers)
    with app.state.session_factory() as db:
        stored = db.get(ModelEndpoint, endpoint_id).api_key_stored
    assert stored.startswith("fernet:") and stored in dump
    assert app.state.keyring.decrypt(stored) == CANARY


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_an_unreadable_key_fails_only_its_endpoints_jobs(app: Any, client: Any, world: World) -> None:
    admin, lead = world.headers("admin"), world.headers("lead")
    created = client.post("/api/model-endpoints", headers=admin, json={
        "name": "lost key", "base_url": "http://127.0.0.1:9/v1", "model": "m", "api_key": "sk-lost",
        "allow_private": True})
    endpoint_id = created.json()["id"]
    with app.state.session_factory() as db:  # encrypted under a key this app does not have (a lost key)
        foreign = Keyring(Settings(encryption_key=Fernet.generate_key().decode(), data_dir=Path("unused")))
        db.get(ModelEndpoint, endpoint_id).api_key_stored = foreign.encrypt("sk-lost")
        db.commit()

    listed = {e["name"]: e["api_key_status"] for e in client.get("/api/model-endpoints", headers=admin).json()}
    assert listed == {"World vLLM": "stored", "lost key": "unreadable"}
    page = client.get("/admin/endpoints", headers=admin)
    assert page.status_code == 200 and page.text.count("key unreadable") == 1
    for path in (f"/projects/{world.a.project_id}", f"/projects/{world.a.project_id}/jobs", "/projects"):
        assert client.get(path, headers=lead).status_code == 200, path

    job_id = _sample(client, world, endpoint_id, "lost")
    _run_worker(app)
    status = client.get(f"/api/jobs/{job_id}", headers=lead).json()
    assert status["state"] == "failed", status
    assert "API key of model endpoint 'lost key' cannot be decrypted" in status["error"]
    assert "enter the key again" in status["error"] and "sk-lost" not in status["error"]

    # An admin entering the key again mends it.
    fixed = client.patch(f"/api/model-endpoints/{endpoint_id}", headers=admin, json={"api_key": "sk-new"})
    assert fixed.json()["api_key_status"] == "stored"


# --- the key itself ---------------------------------------------------------------------------------------------


def test_the_dev_key_is_generated_once_with_mode_0600_and_production_needs_one(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PREFLAB_ENCRYPTION_KEY", raising=False)
    dev = Settings(env="dev", data_dir=tmp_path)
    token = Keyring(dev).encrypt("sk-dev")
    key_file = tmp_path / KEY_FILE
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert Keyring(Settings(env="demo", data_dir=tmp_path)).decrypt(token) == "sk-dev"  # the same file, reused
    assert "sk-dev" not in token and token.startswith("fernet:")
    assert "PREFLAB_ENCRYPTION_KEY" in repr(Keyring(Settings(encryption_key=Fernet.generate_key().decode())))
    assert Fernet.generate_key().decode() not in repr(dev)

    production = Settings(env="production", secret_key=TEST_SECRET, data_dir=tmp_path / "prod")
    with pytest.raises(KeyringError, match="PREFLAB_ENCRYPTION_KEY is not set"):
        Keyring(production).encrypt("sk-x")
    assert not (tmp_path / "prod").exists()  # never a generated key in production
    with pytest.raises(KeyUnreadable):
        Keyring(production).decrypt(token)

    monkeypatch.setenv("PREFLAB_ENCRYPTION_KEY", "not-a-fernet-key")
    with pytest.raises(SettingsError, match="PREFLAB_ENCRYPTION_KEY: must be a Fernet key"):
        load_settings()


def test_a_tampered_value_is_unreadable_not_wrong(tmp_path: Path) -> None:
    ring = Keyring(Settings(data_dir=tmp_path))
    token = ring.encrypt("sk-abc")
    flipped = token[:-5] + ("A" if token[-5] != "A" else "B") + token[-4:]
    with pytest.raises(KeyUnreadable):
        ring.decrypt(flipped)


# --- upgrade: plain keys from before are encrypted at first start -----------------------------------------------


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_plain_keys_of_an_older_version_are_encrypted_when_the_new_one_starts(backend: str, tmp_path: Path) -> None:
    from app.main import create_app
    from app.platform.migrate import downgrade, upgrade
    from tests.conftest import _reset_postgres, pg_url

    if backend == "sqlite":
        url = f"sqlite:///{tmp_path}/old.db"
    else:
        url = pg_url()
        _reset_postgres(url)
    upgrade(url, "0007")
    engine = create_engine(Settings(database_url=url).database_url)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO model_endpoints (name, base_url, model, api_key, allow_private, created_at, "
                          "updated_at) VALUES ('old', 'http://10.0.0.1/v1', 'm', 'sk-plain-from-0007', false, "
                          "CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"))
    upgrade(url)
    with engine.connect() as conn:  # the schema upgrade alone does not need (or touch) the key
        assert conn.execute(text("SELECT api_key FROM model_endpoints")).scalar() == "sk-plain-from-0007"
    app = create_app(Settings(database_url=url, secret_key=TEST_SECRET, data_dir=tmp_path / "data"))
    app.state.engine.dispose()
    with engine.connect() as conn:
        stored = conn.execute(text("SELECT api_key FROM model_endpoints")).scalar()
    assert stored.startswith("fernet:") and app.state.keyring.decrypt(stored) == "sk-plain-from-0007"
    assert "sk-plain-from-0007" not in _every_column(Settings(database_url=url).database_url)
    create_app(Settings(database_url=url, secret_key=TEST_SECRET, data_dir=tmp_path / "data")).state.engine.dispose()
    with engine.connect() as conn:  # a second start changes nothing
        assert conn.execute(text("SELECT api_key FROM model_endpoints")).scalar() == stored
    engine.dispose()
    with pytest.raises(RuntimeError, match="stored encrypted"):  # the old code would send the token as the key
        downgrade(url, "0007")


# --- rotation ---------------------------------------------------------------------------------------------------


def _endpoints_with_keys(db: Any, keys: dict[str, str | None]) -> None:
    for name, stored in keys.items():
        db.add(ModelEndpoint(name=name, base_url="http://10.0.0.1/v1", model="m", allow_private=True,
                             api_key_stored=stored))
    db.commit()


def _stored(url: str) -> dict[str, str | None]:
    engine = create_engine(url)
    with engine.connect() as conn:
        rows = dict(conn.execute(text("SELECT name, api_key FROM model_endpoints")).all())
    engine.dispose()
    return rows


def _rotate(monkeypatch: pytest.MonkeyPatch, database_url: str, data_dir: Path, *args: str) -> Any:
    from app.cli import cli

    monkeypatch.setenv("PREFLAB_DATABASE_URL", database_url)
    monkeypatch.setenv("PREFLAB_DATA_DIR", str(data_dir))
    return CliRunner().invoke(cli, ["rotate-encryption-key", *args])


def test_rotation_with_environment_keys_reencrypts_everything_in_one_go(db: Any, database_url: str, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    old, new, lost = (Fernet.generate_key().decode() for _ in range(3))
    old_ring = Keyring(Settings(encryption_key=old, data_dir=tmp_path))
    new_only = Keyring(Settings(encryption_key=new, data_dir=tmp_path))
    _endpoints_with_keys(db, {"one": old_ring.encrypt("sk-one"), "two": old_ring.encrypt("sk-two"),
                                        "plain": "sk-three", "none": None})
    monkeypatch.setenv("PREFLAB_ENCRYPTION_KEY", new)
    monkeypatch.setenv("PREFLAB_ENCRYPTION_KEY_OLD", f"{Fernet.generate_key().decode()}, {old}")
    done = _rotate(monkeypatch, database_url, tmp_path)
    assert done.exit_code == 0, done.output
    assert "re-encrypted 3 API key(s) under PREFLAB_ENCRYPTION_KEY (2 were under an old key, 1 in plain text)" in (
        done.output)
    assert "PREFLAB_ENCRYPTION_KEY_OLD is no longer needed" in done.output
    stored = _stored(database_url)
    assert stored["none"] is None
    assert {name: new_only.decrypt(stored[name]) for name in ("one", "two", "plain")} == {
        "one": "sk-one", "two": "sk-two", "plain": "sk-three"}
    with pytest.raises(KeyUnreadable):
        old_ring.decrypt(stored["one"])

    # A key nobody can open: the rotation stops and changes nothing, unless told to forget it.
    lost_ring = Keyring(Settings(encryption_key=lost, data_dir=tmp_path))
    _endpoints_with_keys(db, {"lost": lost_ring.encrypt("sk-lost")})
    before = _stored(database_url)
    refused = _rotate(monkeypatch, database_url, tmp_path)
    assert refused.exit_code == 1 and "lost" in refused.output and "nothing was changed" in refused.output
    assert _stored(database_url) == before
    forgot = _rotate(monkeypatch, database_url, tmp_path, "--forget-unreadable")
    assert forgot.exit_code == 0 and "removed 1 unreadable key(s), of: lost" in forgot.output
    after = _stored(database_url)
    assert after["lost"] is None and new_only.decrypt(after["one"]) == "sk-one"


def test_rotation_of_the_generated_dev_key_replaces_the_key_file(db: Any, database_url: str, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PREFLAB_ENCRYPTION_KEY", raising=False)
    monkeypatch.setenv("PREFLAB_ENV", "dev")
    ring = Keyring(Settings(env="dev", data_dir=tmp_path))
    _endpoints_with_keys(db, {"dev": ring.encrypt("sk-dev")})
    old_key = (tmp_path / KEY_FILE).read_bytes()
    done = _rotate(monkeypatch, database_url, tmp_path)
    assert done.exit_code == 0, done.output
    assert f"re-encrypted 1 API key(s) under {tmp_path / KEY_FILE} (1 were under an old key" in done.output
    assert (tmp_path / KEY_FILE).read_bytes() != old_key and not (tmp_path / NEXT_KEY_FILE).exists()
    assert stat.S_IMODE((tmp_path / KEY_FILE).stat().st_mode) == 0o600
    stored = _stored(database_url)["dev"]
    assert ring.decrypt(stored) == "sk-dev"  # the keyring reads the new file
    with pytest.raises(KeyUnreadable):
        Keyring(Settings(encryption_key=old_key.decode(), data_dir=tmp_path / "x")).decrypt(stored)


def test_rotation_reencrypts_cluster_secrets_too(db: Any, database_url: str, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from app.models import ComputeCluster

    old, new = (Fernet.generate_key().decode() for _ in range(2))
    db.add(ComputeCluster(name="lab", kind="ray", address="http://ray:8265", shared_dir="/shared", resources={},
                          env={}, job_prefix="preflab",
                          secret_stored=Keyring(Settings(encryption_key=old, data_dir=tmp_path)).encrypt("ray-token")))
    db.commit()
    monkeypatch.setenv("PREFLAB_ENCRYPTION_KEY", new)
    monkeypatch.setenv("PREFLAB_ENCRYPTION_KEY_OLD", old)
    done = _rotate(monkeypatch, database_url, tmp_path)
    assert done.exit_code == 0 and "re-encrypted 1 cluster secret(s)" in done.output, done.output
    engine = create_engine(database_url)
    with engine.connect() as conn:
        stored = conn.execute(text("SELECT secret FROM clusters")).scalar_one()
    engine.dispose()
    assert Keyring(Settings(encryption_key=new, data_dir=tmp_path)).decrypt(stored) == "ray-token"
