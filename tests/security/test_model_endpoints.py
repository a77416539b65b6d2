"""Check 11: model endpoints are configured by admins only; leads pick one; no server-side fetch goes inward.

A lead's free-form base URL is refused (4xx naming the field) on every form and API that builds a generator;
an endpoint's API key is never shown or stored with a job; loopback and private hosts need an admin's explicit
trust, metadata addresses are refused even then; the worker re-checks the endpoint when the job runs; redirects
are not followed and a remote server's error body never reaches a job's error or page.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from sqlalchemy import select

from app.models import AuditEvent, Job, JudgeRun, ModelEndpoint
from app.platform import outbound
from app.platform.errors import Invalid
from tests.security.test_object_access import snapshot
from tests.security.world import World

SECRET = "sk-world-secret-key"  # the key world.py stores on its endpoint
REMOTE_BODY = "REMOTE-BODY-7f3a: internal stack trace, db password=hunter2"


# --- the URL policy ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000/v1", "http://10.0.0.5/v1", "http://192.168.1.9:8080/v1",
                                 "http://[::1]:8000/v1", "http://100.64.0.1/v1", "http://localhost:8000/v1"])
def test_private_and_loopback_hosts_need_an_admins_explicit_trust(url: str) -> None:
    with pytest.raises(Invalid, match="private or loopback") as err:
        outbound.check_base_url(url)
    assert err.value.field == "base_url"
    assert outbound.check_base_url(url, allow_private=True) == url


@pytest.mark.parametrize("url", ["http://169.254.169.254/latest/meta-data/", "http://[fd00:ec2::254]/",
                                 "http://100.100.100.200/", "http://metadata.google.internal/", "file:///etc/passwd",
                                 "http://[::ffff:169.254.169.254]/v1"])
def test_metadata_and_link_local_stay_refused_even_when_trusted(url: str) -> None:
    with pytest.raises(Invalid):
        outbound.check_base_url(url, allow_private=True)


# --- who may configure, who may see ------------------------------------------------------------------------


def test_the_api_key_is_never_returned_and_urls_only_to_admins(client: Any, world: World) -> None:
    admin, lead = world.headers("admin"), world.headers("lead")
    listed = client.get("/api/model-endpoints", headers=admin)
    assert listed.status_code == 200 and SECRET not in listed.text
    [item] = listed.json()
    assert item["has_api_key"] is True and item["base_url"] == "http://10.9.8.7:8000/v1" and "api_key" not in item
    as_lead = client.get("/api/model-endpoints", headers=lead)
    assert as_lead.json() == [{"id": world.endpoint_id, "name": "World vLLM", "model": "world-model"}]
    for page in (f"/projects/{world.a.project_id}/jobs", f"/projects/{world.a.project_id}/judge"):
        html = client.get(page, headers=lead).text  # the lead's picker: names, never the URL or the key
        assert f'<option value="{world.endpoint_id}"' in html and "World vLLM (world-model)" in html, page
        assert "10.9.8.7" not in html and SECRET not in html and 'name="base_url"' not in html
    patched = client.patch(f"/api/model-endpoints/{world.endpoint_id}", json={"model": "other"}, headers=admin)
    assert patched.status_code == 200 and SECRET not in patched.text and patched.json()["has_api_key"] is True
    created = client.post("/api/model-endpoints", headers=admin,
                          json={"name": "Hosted", "base_url": "http://1.2.3.4/v1", "model": "m",
                                "api_key": "sk-brand-new-key"})
    assert created.status_code == 201 and "sk-brand-new-key" not in created.text
    page = client.get("/admin/endpoints", headers=admin)
    assert page.status_code == 200 and SECRET not in page.text and "sk-brand-new-key" not in page.text
    assert "World vLLM" in page.text
    with client.app.state.session_factory() as db:
        events = db.scalars(select(AuditEvent.data).where(AuditEvent.action.like("model_endpoint.%"))).all()
    assert events and "sk-brand-new-key" not in repr(events)


def test_an_admin_page_form_keeps_the_key_when_left_blank_and_refuses_inward_urls(client: Any, world: World,
                                                                                  clean_engine: Any) -> None:
    admin = world.headers("admin")
    form = {"name": "World vLLM", "base_url": "http://10.9.8.7:8000/v1", "model": "world-model", "api_key": "",
            "allow_private": "on"}
    assert client.post(f"/admin/endpoints/{world.endpoint_id}", data=form, headers=admin).status_code == 303
    with client.app.state.session_factory() as db:
        assert client.app.state.keyring.decrypt(db.get(ModelEndpoint, world.endpoint_id).api_key_stored) == SECRET
    before = snapshot(clean_engine, world)
    for change in ({"allow_private": ""}, {"base_url": "http://169.254.169.254/v1"}, {"base_url": "file:///x"}):
        response = client.post(f"/admin/endpoints/{world.endpoint_id}", data=form | change, headers=admin)
        assert response.status_code == 422 and "base_url" in response.text, change
    response = client.post("/admin/endpoints", data=form | {"name": "New", "allow_private": ""}, headers=admin)
    assert response.status_code == 422 and "private or loopback" in response.text
    assert snapshot(clean_engine, world) == before


# --- leads pick, never type -------------------------------------------------------------------------------


def _generator_routes(w: World) -> list[tuple[str, str]]:
    p = w.a.project_id
    return [(f"/api/projects/{p}/sampling-jobs", "json"), (f"/api/projects/{p}/judge-runs", "json"),
            (f"/api/projects/{p}/revision-jobs", "json"), (f"/projects/{p}/jobs/sample", "form"),
            (f"/projects/{p}/judge/runs", "form")]


@pytest.mark.parametrize("who", ["lead", "engineer"])
def test_a_free_form_base_url_from_a_non_admin_is_refused_everywhere(client: Any, world: World, clean_engine: Any,
                                                                    who: str) -> None:
    before = snapshot(clean_engine, world)
    for url in ("http://1.2.3.4/v1", "http://127.0.0.1:9/v1", "http://169.254.169.254/v1"):
        for path, kind in _generator_routes(world):
            spec = {"backend": "openai", "base_url": url, "model": "m"}
            body = {"json": {"generator": spec}} if kind == "json" else {"data": spec}
            response = client.post(path, headers=world.headers(who), **body)
            assert response.status_code == 422, (path, response.text)
            assert "generator.base_url" in response.text, (path, response.text)
    assert snapshot(clean_engine, world) == before


def test_keys_and_unknown_endpoints_are_refused_naming_the_field(client: Any, world: World,
                                                                 clean_engine: Any) -> None:
    before = snapshot(clean_engine, world)
    path = f"/api/projects/{world.a.project_id}/sampling-jobs"
    cases = [({"endpoint_id": world.endpoint_id, "api_key": "sk-mine"}, "generator.api_key"),
             ({"endpoint_id": 999_999}, "generator.endpoint_id"),
             ({"endpoint_id": world.endpoint_id, "base_url": "http://1.2.3.4/v1"}, "generator.base_url"),
             ({}, "generator.endpoint_id")]
    for extra, field in cases:
        response = client.post(path, json={"generator": {"backend": "openai", **extra}}, headers=world.headers("lead"))
        assert response.status_code == 422 and response.json()["detail"][0]["field"] == field, response.text
    # Even an admin's free-form URL may not carry a key: keys live on endpoints, never in a job's payload.
    response = client.post(path, headers=world.headers("admin"), json={"generator": {
        "backend": "openai", "base_url": "http://1.2.3.4/v1", "model": "m", "api_key": "sk-x"}})
    assert response.status_code == 422 and response.json()["detail"][0]["field"] == "generator.api_key"
    assert snapshot(clean_engine, world) == before


def test_a_picked_endpoint_is_stored_by_id_without_its_url_or_key(client: Any, world: World) -> None:
    lead = world.headers("lead")
    spec = {"backend": "openai", "endpoint_id": world.endpoint_id}
    sampled = client.post(f"/api/projects/{world.a.project_id}/sampling-jobs", json={"generator": spec}, headers=lead)
    judged = client.post(f"/api/projects/{world.a.project_id}/judge-runs", json={"generator": spec}, headers=lead)
    revised = client.post(f"/api/projects/{world.a.project_id}/revision-jobs", json={"generator": spec},
                          headers=lead)
    assert (sampled.status_code, judged.status_code, revised.status_code) == (202, 202, 202), judged.text
    page = client.post(f"/projects/{world.a.project_id}/jobs/sample", headers=lead,
                       data={"backend": "openai", "endpoint_id": str(world.endpoint_id)})
    assert page.status_code == 303, page.text
    with client.app.state.session_factory() as db:
        payloads = [db.get(Job, i).payload for i in (sampled.json()["job_id"], judged.json()["job_id"],
                                                      revised.json()["job_id"])]
        params = db.get(JudgeRun, judged.json()["judge_run_id"]).params
    for stored in [*payloads, params]:
        assert stored["generator"] == {"backend": "openai", "endpoint_id": world.endpoint_id, "model": "world-model",
                                       **{k: v for k, v in stored["generator"].items()
                                          if k not in ("backend", "endpoint_id", "model")}}
        assert SECRET not in repr(stored) and "10.9.8.7" not in repr(stored)


def test_a_grpo_run_may_sample_only_from_a_configured_server(client: Any, world: World) -> None:
    """GRPO's `server_base_url` is a fetch the trainer makes: a lead may name only a configured endpoint's URL."""
    from app.judge import endpoints
    from app.models import User

    with client.app.state.session_factory() as db:
        admin, lead = db.get(User, world.user_ids["admin"]), db.get(User, world.user_ids["lead"])
        for url in ("http://1.2.3.4/v1", "http://169.254.169.254/v1", "http://127.0.0.1:8000/v1"):
            with pytest.raises(Invalid) as err:
                endpoints.check_server_url(db, lead, url, field="config.server_base_url")
            assert err.value.field == "config.server_base_url"
        assert endpoints.check_server_url(db, lead, "http://10.9.8.7:8000/v1/", field="f") == "http://10.9.8.7:8000/v1"
        with pytest.raises(Invalid):
            endpoints.check_server_url(db, admin, "http://169.254.169.254/v1", field="f")


# --- at run time: re-check, no redirects, no remote bodies ----------------------------------------------------


class _Recorder(BaseHTTPRequestHandler):
    """/redirect/... answers 302 to the "inward" server; /error/... answers 500 with a body that must not leak."""

    hits: list[str]
    inward: str

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass

    def _answer(self) -> None:
        self.server.hits.append(self.path)  # type: ignore[attr-defined]
        if self.path.startswith("/redirect/"):
            self.send_response(302)
            self.send_header("Location", self.server.inward + "/latest/meta-data/")  # type: ignore[attr-defined]
            self.end_headers()
            return
        body = REMOTE_BODY.encode()
        self.send_response(500 if self.path.startswith("/error/") else 200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer  # noqa: N815 - stdlib names


def _serve() -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    server.hits = []  # type: ignore[attr-defined]
    server.inward = ""  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def servers() -> Iterator[tuple[ThreadingHTTPServer, ThreadingHTTPServer]]:
    remote, inward = _serve(), _serve()
    remote.inward = f"http://127.0.0.1:{inward.server_port}"  # type: ignore[attr-defined]
    yield remote, inward
    for s in (remote, inward):
        s.shutdown()
        s.server_close()


def _run_worker(app: Any) -> None:
    from app.worker import Worker

    Worker(app.state.settings, session_factory=app.state.session_factory, poll_s=0.05,
           heartbeat_s=0.2).run(exit_when_idle=True)


def _endpoint_at(client: Any, world: World, url: str) -> int:
    response = client.post("/api/model-endpoints", headers=world.headers("admin"),
                           json={"name": url, "base_url": url, "model": "m", "allow_private": True})
    assert response.status_code == 201, response.text
    return int(response.json()["id"])


def _sample(client: Any, world: World, endpoint_id: int) -> int:
    """Queue a sampling job for a fresh prompt (the world's own prompt already has its K completions)."""
    from app.models import Prompt

    with client.app.state.session_factory() as db:
        if not db.scalar(select(Prompt.id).where(Prompt.text_hash == "needs-completions")):
            db.add(Prompt(project_id=world.a.project_id, text="1+1=", text_hash="needs-completions", split="train"))
            db.commit()
    spec = {"backend": "openai", "endpoint_id": endpoint_id, "max_retries": 0, "timeout_s": 5}
    response = client.post(f"/api/projects/{world.a.project_id}/sampling-jobs", json={"generator": spec},
                           headers=world.headers("lead"))
    assert response.status_code == 202, response.text
    return int(response.json()["job_id"])


def _finished(client: Any, world: World, job_id: int) -> tuple[dict[str, Any], str]:
    status = client.get(f"/api/jobs/{job_id}", headers=world.headers("lead"))
    page = client.get(f"/jobs/{job_id}", headers=world.headers("lead"))
    listing = client.get(f"/projects/{world.a.project_id}/jobs", headers=world.headers("lead"))
    return status.json(), status.text + page.text + listing.text


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_redirects_are_not_followed_inward(app: Any, client: Any, world: World, servers: Any) -> None:
    remote, inward = servers
    job_id = _sample(client, world, _endpoint_at(client, world, f"http://127.0.0.1:{remote.server_port}/redirect/v1"))
    _run_worker(app)
    status, shown = _finished(client, world, job_id)
    assert status["state"] == "failed" and "redirect" in status["error"], status
    assert remote.hits and inward.hits == []  # the Location was never requested


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_remote_error_body_never_reaches_the_job_error_or_its_pages(app: Any, client: Any, world: World,
                                                                      servers: Any) -> None:
    remote, _ = servers
    job_id = _sample(client, world, _endpoint_at(client, world, f"http://127.0.0.1:{remote.server_port}/error/v1"))
    _run_worker(app)
    status, shown = _finished(client, world, job_id)
    assert status["state"] == "failed" and "HTTP 500" in status["error"] and "remote server error" in status["error"]
    assert "REMOTE-BODY" not in shown and "hunter2" not in shown


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_worker_checks_the_endpoint_again_when_the_job_runs(app: Any, client: Any, world: World,
                                                                servers: Any) -> None:
    remote, _ = servers
    endpoint_id = _endpoint_at(client, world, f"http://127.0.0.1:{remote.server_port}/v1")
    distrusted, deleted = _sample(client, world, endpoint_id), _sample(client, world, world.endpoint_id)
    with app.state.session_factory() as db:  # trust withdrawn behind the service's back (say, a DNS change)
        db.get(ModelEndpoint, endpoint_id).allow_private = False
        db.commit()
    assert client.delete(f"/api/model-endpoints/{world.endpoint_id}",
                         headers=world.headers("admin")).status_code == 204
    _run_worker(app)
    first, _ = _finished(client, world, distrusted)
    second, _ = _finished(client, world, deleted)
    assert first["state"] == "failed" and "private or loopback" in first["error"], first
    assert second["state"] == "failed" and "no longer exists" in second["error"], second
    assert remote.hits == []  # refused before any request left the worker


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_host_whose_dns_turns_inward_after_the_check_is_refused_at_connect_time(
        app: Any, client: Any, world: World, servers: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """DNS rebinding: the name answers a public address to every URL check and a loopback one to the connection.
    The worker's client resolves the name itself and checks the address it is about to connect to."""
    import socket

    remote, _ = servers
    host, public = "model.rebind.test", "93.184.216.34"
    real = socket.getaddrinfo

    def rebinding(name: str, port: Any, *args: Any, **kwargs: Any) -> Any:
        if name == host:  # what a second, later lookup of an attacker's name answers
            return real("127.0.0.1", port, *args, **kwargs)
        return real(name, port, *args, **kwargs)

    class CheckTimeDns:  # what the URL checks see
        @staticmethod
        def getaddrinfo(name: str, port: Any, *args: Any, **kwargs: Any) -> Any:
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (public, port))] if name == host else real(
                name, port, *args, **kwargs)

        IPPROTO_TCP = socket.IPPROTO_TCP

    monkeypatch.setattr(outbound, "socket", CheckTimeDns)
    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    url = f"http://{host}:{remote.server_port}/v1"
    response = client.post("/api/model-endpoints", headers=world.headers("admin"),
                           json={"name": "rebinding", "base_url": url, "model": "m"})  # a public host: no trust
    assert response.status_code == 201, response.text
    job_id = _sample(client, world, int(response.json()["id"]))
    _run_worker(app)
    status, _ = _finished(client, world, job_id)
    assert status["state"] == "failed", status
    assert "refused to connect" in status["error"] and "127.0.0.1" in status["error"], status
    assert remote.hits == []  # no request reached the inward address


def test_the_connect_time_guard_keeps_an_endpoints_trust() -> None:
    trusted, untrusted = outbound.address_guard(True), outbound.address_guard(False)
    trusted("10.1.2.3")
    trusted("::1")
    with pytest.raises(ValueError, match="private or loopback"):
        untrusted("10.1.2.3")
    for address in ("169.254.169.254", "::ffff:169.254.169.254", "fd00:ec2::254", "fe80::1%eth0"):
        with pytest.raises(ValueError, match="metadata|link-local"):
            trusted(address)
    untrusted("93.184.216.34")
