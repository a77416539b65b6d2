"""`preflab demo` end to end: a real server on a free port, real HTTP, the accounts it prints."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from app.runs import estimates
from training.base_model import smollm2_dir

CSRF_RE = re.compile(r'name="csrf_token" value="([0-9a-f]{64})"')
SPEED = {"start_s": 4.0, "forward_token_s": 0.002, "train_token_s": 0.006, "optimizer_s": 0.4, "decode_step_s": 0.04,
         "decode_row_s": 0.001, "save_s": 0.4, "device": "cpu", "threads": 2}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def demo_server(tmp_path: Path, smollm2: Path):  # type: ignore[no-untyped-def]
    port = _free_port()
    # The session's prepared SmolLM2 stands in for the demo's first-run conversion (a minute), which
    # tests/training/test_base_model.py covers.
    (tmp_path / "data" / "models").mkdir(parents=True)
    (tmp_path / "data" / "models" / smollm2.name).symlink_to(smollm2, target_is_directory=True)
    # So do figures for its speed measurement (a minute, or several on a busy machine), which
    # tests/app/test_training_demo.py covers on the tiny policy.
    for model in (str(smollm2_dir(tmp_path / "data")), estimates.ENCODER):
        figures = estimates.speed_file(tmp_path / "data", model)
        figures.parent.mkdir(parents=True, exist_ok=True)
        figures.write_text(json.dumps(SPEED | {"model": model, "measured_at": "2026-12-01T09:30:00+00:00"}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFLAB_")}
    env.update(PREFLAB_DATA_DIR=str(tmp_path / "data"), PREFLAB_DATABASE_URL=f"sqlite:///{tmp_path}/data/demo.db")
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "demo", "--port", str(port)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = ""
    deadline = time.monotonic() + 90
    try:
        while time.monotonic() < deadline:
            line = proc.stdout.readline()  # type: ignore[union-attr]
            if not line and proc.poll() is not None:
                pytest.fail(f"demo exited early:\n{output}")
            output += line
            if "Uvicorn running" in line or "Application startup complete" in line:
                break
        accounts = {m.group(1): (m.group(2), m.group(3)) for m in
                    re.finditer(r"^\s+(\w+)\s+(\S+@example\.org)\s+(\S+)$", output, re.M) if m.group(1) != "annotator"}
        accounts["annotator"] = next((m.group(1), m.group(2)) for m in
                                     re.finditer(r"^\s+annotator\s+(\S+)\s+(\S+)$", output, re.M))
        yield f"http://127.0.0.1:{port}", accounts, output, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def _login(base: str, email: str, password: str) -> tuple[httpx.Client, str]:
    client = httpx.Client(base_url=base, follow_redirects=True, timeout=10)
    csrf = CSRF_RE.search(client.get("/login").text).group(1)  # type: ignore[union-attr]
    page = client.post("/login", data={"email": email, "password": password, "csrf_token": csrf})
    assert page.status_code == 200 and "Log out" in page.text, page.text[:500]
    return client, CSRF_RE.search(page.text).group(1)  # type: ignore[union-attr]


@pytest.mark.slow
def test_demo_serves_a_working_project(demo_server) -> None:  # type: ignore[no-untyped-def]
    base, accounts, output, _ = demo_server
    assert "Log in at" in output and set(accounts) == {"admin", "lead", "annotator", "engineer"}
    assert httpx.get(f"{base}/healthz").json() == {"status": "ok", "database": "ok"}

    annotator, _ = _login(base, *accounts["annotator"])
    projects = annotator.get("/projects").text
    assert "GSM8K solutions (demo)" in projects
    project_path = re.search(r'href="(/projects/\d+)"', projects).group(1)  # type: ignore[union-attr]
    page = annotator.get(project_path).text
    assert '<dd id="count-prompts">100</dd>' in page and '<dd id="count-completions">400</dd>' in page
    assert "Correct first" in page

    # The lead edits the rubric (a new version shows in the history) and imports a file.
    lead, csrf = _login(base, *accounts["lead"])
    editor = lead.get(f"{project_path}/rubric").text
    csrf = CSRF_RE.search(editor).group(1)  # type: ignore[union-attr]
    saved = lead.post(f"{project_path}/rubric", data={"text": "Correct answers first, always.", "criteria": "Correct",
                                                      "base_version": "1", "csrf_token": csrf, "note": "shorter"})
    assert saved.status_code == 200 and 'id="v2"' in saved.text and "shorter" in saved.text
    rows = "\n".join(json.dumps({"prompt": f"What is {i}+{i}?", "completions": [str(2 * i), str(2 * i + 1)]})
                     for i in range(3))
    imported = lead.post(f"{project_path}/import", data={"csrf_token": csrf, "on_duplicate": "error"},
                         files={"file": ("extra.jsonl", rows.encode())})
    assert imported.status_code == 201 and "Imported 3 prompts, 6 completions" in imported.text, imported.text[-1500:]
    assert '<dd id="count-prompts">103</dd>' in lead.get(project_path).text

    # The engineer is a member with the engineer's role: exports and training, not the rubric.
    engineer, csrf = _login(base, *accounts["engineer"])
    assert engineer.get(f"{project_path}/exports").status_code == 200
    training = engineer.get(f"{project_path}/training")
    assert training.status_code == 200
    # The demo prepares SmolLM2-135M-Instruct once under its data directory: policy runs default to it.
    policy = re.search(r"Policy runs start from (\S+) ", output).group(1)  # type: ignore[union-attr]
    assert Path(policy, "config.json").is_file() and Path(policy, "model.safetensors").is_file()
    assert f'data-kind="grpo"><strong>grpo</strong>: <code>{policy}</code>' in training.text
    # Its first reward run is on the pre-made pairs, and the form says how long it takes at the measured speed.
    assert re.search(r"selected>#\d+ pairs · jsonl · 266 rows · pre-made</option>", training.text)
    assert re.search(r'data-minutes="\d+">About .* on this machine</strong>', training.text)
    assert "Measuring this machine's speed" not in output  # measured already: once is enough
    refused = engineer.post(f"{project_path}/rubric", data={"text": "x", "criteria": "", "base_version": "2",
                                                            "csrf_token": csrf, "note": ""})
    assert refused.status_code == 403


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="the worker is tied to the demo with Linux's PR_SET_PDEATHSIG")
def test_stopping_the_demo_stops_its_worker(demo_server) -> None:  # type: ignore[no-untyped-def]
    """uvicorn re-raises the SIGTERM it handled, so the demo's own clean-up never runs: the kernel stops the worker
    (one left behind would keep polling the database and writing into the data directory)."""
    _, _, output, proc = demo_server
    worker = int(re.search(r"job worker is running beside the server \(pid (\d+)\)", output).group(1))  # type: ignore[union-attr]

    def alive() -> bool:
        try:
            return Path(f"/proc/{worker}/stat").read_text().split(")")[-1].split()[0] != "Z"
        except OSError:
            return False

    assert alive()
    proc.terminate()
    proc.wait(timeout=10)
    deadline = time.monotonic() + 20
    while alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(), "the demo's worker outlived the demo"
