"""The worker's bookkeeping slot and the reasons of failed jobs where they were started: real `preflab worker`
processes and real jobs. A long model job holds the main slot on a hold point the test lets go, never a timer."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from app.models import Completion, Prompt
from app.platform.settings import Settings
from app.worker import Worker
from tests.conftest import TEST_SECRET
from tests.support.server import preflab_env, wait_for
from tests.training.tiny import char_tokenizer, save_tiny, tiny_gpt2
from training.hold import ENV as HOLD_ENV

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def judge_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tokenizer = char_tokenizer()
    return save_tiny(tiny_gpt2(tokenizer, seed=3, n_positions=256), tokenizer,
                     tmp_path_factory.mktemp("judge") / "model")


def _project(db, make_user, make_project, token_for, api):  # type: ignore[no-untyped-def]
    lead = make_user(db, "lead")
    project = make_project(db, lead=lead, k=2)
    for n in range(2):
        prompt = Prompt(project_id=project.id, text=f"What is {n}+1?", text_hash=f"h{n}", split="train")
        db.add(prompt)
        db.flush()
        db.add_all(Completion(prompt_id=prompt.id, text=t) for t in (f"{n + 1}", "no idea"))
    client = api(token_for(db, lead))
    pid = project.id
    db.commit()
    return pid, client, lead.email


def _state(client, job_id: int) -> str:  # type: ignore[no-untyped-def]
    return client.get(f"/api/jobs/{job_id}").json()["state"]


def test_an_export_is_written_while_a_judge_run_holds_the_main_slot(db, app, make_user, make_project, token_for,
                                                                    api, judge_dir, tmp_path) -> None:
    pid, client, _ = _project(db, make_user, make_project, token_for, api)
    judge = client.post(f"/api/projects/{pid}/judge-runs",
                        json={"generator": {"backend": "hf", "model": str(judge_dir)}}).json()
    release = tmp_path / "release"
    settings = app.state.settings
    env = preflab_env(settings.database_url, settings.data_dir, **{HOLD_ENV: f"job.judge.progress.0={release}"})
    output = tmp_path / "worker.log"
    with output.open("wb") as out:  # `preflab worker` as an operator (or the demo) starts it: default options
        proc = subprocess.Popen([sys.executable, "-m", "app.cli", "worker", "--poll", "0.1", "--heartbeat", "0.2"],
                                env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for("the judge run to hold the main slot", Path(f"{release}.held").exists, timeout=120,
                 detail=lambda: output.read_text(errors="replace")[-3000:])
        export = client.post(f"/api/projects/{pid}/exports", json={"kind": "prompts", "format": "jsonl"}).json()
        wait_for("the export to be written beside the judge run",
                 lambda: client.get(f"/api/exports/{export['export_id']}").json()["status"] == "ready", timeout=60,
                 every=0.1, detail=lambda: output.read_text(errors="replace")[-3000:])
        assert _state(client, judge["job_id"]) == "running"  # still held: the export did not wait for it
        release.touch()
        wait_for("the judge run to finish", lambda: _state(client, judge["job_id"]) == "succeeded", timeout=120,
                 every=0.1, detail=lambda: output.read_text(errors="replace")[-3000:])
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, output.read_text(errors="replace")[-3000:]


def test_a_failed_export_says_why_on_the_exports_page(db, make_user, make_project, token_for, api, browser,
                                                      database_url, clean_engine, tmp_path) -> None:
    from app.platform.db import make_session_factory

    pid, client, email = _project(db, make_user, make_project, token_for, api)
    export = client.post(f"/api/projects/{pid}/exports", json={"kind": "prompts", "format": "jsonl"}).json()
    (tmp_path / "exports").write_text("a file where the exports folder should be")  # the disk is not as it should be
    settings = Settings(database_url=database_url, data_dir=tmp_path, secret_key=TEST_SECRET, job_retry_base_s=0)
    Worker(settings, session_factory=make_session_factory(clean_engine), poll_s=0.05,
           heartbeat_s=0.2).run(exit_when_idle=True)
    assert client.get(f"/api/exports/{export['export_id']}").json()["status"] == "failed"
    page = browser()
    page.login(email)
    html = page.get(f"/projects/{pid}/exports").text
    row = html.split(f"#{export['export_id']} (")[1].split("</tr>")[0]
    assert '<span class="state state-failed">failed</span>' in row
    assert 'class="error-text job-reason"' in row and "exports" in row.split("job-reason")[1]
