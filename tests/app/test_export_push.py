"""`preflab export push` against a local stand-in for a Hugging Face Hub server, on SQLite and Postgres.

No real Hub can run here, so the stand-in implements only the routes huggingface_hub calls to create a dataset repo
and commit small regular (non-LFS) files: /api/repos/create, /api/validate-yaml, .../preupload/{rev} and
.../commit/{rev} (NDJSON, base64 contents), plus the repo info it asks for after a refused create.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest

from tests.app.test_exports import _export, _rank_everything, _seed
from tests.support.server import serve_in_thread

TOKEN = "hf_good"


@dataclass
class Hub:
    url: str = ""
    repos: dict[str, dict[str, Any]] = field(default_factory=dict)
    """repo id → {"private": bool, "commits": [{"revision", "summary", "files": {path: bytes}}]}"""


@pytest.fixture
def hub() -> Iterator[Hub]:
    state = Hub()

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, status: int, body: dict[str, Any]) -> None:
            raw = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def _authorized(self) -> bool:
            if self.headers.get("Authorization") == f"Bearer {TOKEN}":
                return True
            self._answer(403, {"error": "You don't have the rights to create a dataset under this namespace"})
            return False

        def do_GET(self) -> None:  # noqa: N802 (http.server's name): repo info, asked after a refused create
            if not self._authorized():
                return
            repo = self.path.removeprefix("/api/datasets/").split("/revision/")[0]
            if repo not in state.repos:
                self._answer(404, {"error": "Repository not found"})
                return
            self._answer(200, {"id": repo, "sha": "0" * 40, "private": state.repos[repo]["private"]})

        def do_POST(self) -> None:  # noqa: N802
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if not self._authorized():
                return
            if self.path == "/api/repos/create":
                asked = json.loads(body)
                assert asked["type"] == "dataset"
                repo = f"{asked['organization']}/{asked['name']}"
                if repo in state.repos:
                    self._answer(409, {"error": "You already created this dataset repo",
                                        "url": f"{state.url}/datasets/{repo}"})
                    return
                state.repos[repo] = {"private": asked.get("visibility") == "private", "commits": []}
                self._answer(200, {"url": f"{state.url}/datasets/{repo}"})
            elif self.path == "/api/validate-yaml":
                self._answer(200, {"errors": [], "warnings": []})
            elif "/preupload/" in self.path:
                files = json.loads(body)["files"]
                self._answer(200, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                                             for f in files]})
            elif "/commit/" in self.path:
                repo, revision = self.path.removeprefix("/api/datasets/").split("/commit/")
                lines = [json.loads(line) for line in body.splitlines() if line.strip()]
                header = next(x["value"] for x in lines if x["key"] == "header")
                files = {x["value"]["path"]: base64.b64decode(x["value"]["content"])
                         for x in lines if x["key"] == "file"}
                state.repos[repo]["commits"].append({"revision": revision, "summary": header["summary"],
                                                     "files": files})
                self._answer(200, {"commitUrl": f"{state.url}/datasets/{repo}/commit/{'1' * 40}",
                                   "commitOid": "1" * 40})
            else:
                self._answer(404, {"error": f"the stand-in has no route {self.path}"})

        def log_message(self, *_: Any) -> None:
            pass

    with serve_in_thread(Handler) as base:
        state.url = base
        yield state


def test_push_sends_every_export_file_and_its_card_in_one_commit(db, app, make_user, make_project, token_for, api,
                                                                  monkeypatch, database_url, hub) -> None:
    from typer.testing import CliRunner

    from app.cli import cli

    _, engineer, project, people = _seed(db, make_user, make_project)
    _rank_everything(db, api, token_for, project, people)
    client = api(token_for(db, engineer))
    db.commit()
    done = _export(client, app, project.id, kind="pairs", format="jsonl")
    settings = app.state.settings
    monkeypatch.setenv("PREFLAB_DATABASE_URL", database_url)
    monkeypatch.setenv("PREFLAB_SECRET_KEY", settings.resolved_secret())
    monkeypatch.setenv("PREFLAB_DATA_DIR", str(settings.data_dir))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    runner = CliRunner()

    pushed = runner.invoke(cli, ["export", "push", str(done["id"]), "--repo", "team/prefs", "--private"],
                           env={"HF_TOKEN": TOKEN})
    assert pushed.exit_code == 0, pushed.output
    assert "team/prefs@main" in pushed.output
    [commit] = hub.repos["team/prefs"]["commits"]
    assert hub.repos["team/prefs"]["private"] and commit["revision"] == "main"
    export_dir = settings.data_dir / "exports" / str(done["id"])
    assert set(commit["files"]) == set(done["files"]) and "README.md" in commit["files"]
    for name, data in commit["files"].items():
        assert data == (export_dir / name).read_bytes(), name
    assert b"pairs" in commit["files"]["README.md"]

    again = runner.invoke(cli, ["export", "push", str(done["id"]), "--repo", "team/prefs", "--revision",
                                "v2", "--token", TOKEN])  # the repo exists: a second commit, to the branch asked
    assert again.exit_code == 0, again.output
    assert [c["revision"] for c in hub.repos["team/prefs"]["commits"]] == ["main", "v2"]

    refused = runner.invoke(cli, ["export", "push", str(done["id"]), "--repo", "team/other", "--token",
                                  "hf_wrong"])
    assert refused.exit_code == 1
    assert "team/other" in refused.output and "HTTP 403" in refused.output and "token" in refused.output
    assert "team/other" not in hub.repos

    unknown = runner.invoke(cli, ["export", "push", "999999", "--repo", "team/prefs", "--token", TOKEN])
    assert unknown.exit_code == 1 and "no export 999999" in unknown.output
    assert len(hub.repos["team/prefs"]["commits"]) == 2


def test_an_export_still_being_written_is_not_pushed(db, app, make_user, make_project, token_for, api, monkeypatch,
                                                      database_url, hub) -> None:
    from typer.testing import CliRunner

    from app.cli import cli

    _, engineer, project, _ = _seed(db, make_user, make_project)
    client = api(token_for(db, engineer))
    db.commit()
    r = client.post(f"/api/projects/{project.id}/exports", json={"format": "jsonl"})  # queued, no worker runs it
    assert r.status_code == 202, r.text
    settings = app.state.settings
    monkeypatch.setenv("PREFLAB_DATABASE_URL", database_url)
    monkeypatch.setenv("PREFLAB_SECRET_KEY", settings.resolved_secret())
    monkeypatch.setenv("PREFLAB_DATA_DIR", str(settings.data_dir))
    result = CliRunner().invoke(cli, ["export", "push", str(r.json()["export_id"]), "--repo", "team/prefs",
                                      "--endpoint", hub.url, "--token", TOKEN])
    assert result.exit_code == 1 and "is queued, not ready" in result.output, result.output
    assert hub.repos == {}
