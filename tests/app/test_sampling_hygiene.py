"""Data hygiene: empty, whitespace-only and identical completions never reach annotators.

The remote server is a real OpenAI-compatible HTTP server on this machine (tests/support/openai_server.py) that,
like transformers' `serve`, answers one choice whatever `n` asks, and is told which texts to answer, so it can
return the empty and repeated completions a real server returned.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select

from app.jobs import queue as jobs
from app.models import Completion, Prompt
from app.projects import projects
from tests.app.test_sampling import _project_with_prompts, _trusted_endpoint, _worker, tiny_model_dir  # noqa: F401
from tests.support.openai_server import OpenAICompatibleServer


@pytest.fixture
def transformers_like(tiny_model_dir: Path):  # noqa: F811 - the fixture imported above
    with OpenAICompatibleServer(tiny_model_dir, model_name="tiny", ignore_n=True) as server:
        yield server


def _sample(client, project_id: int, endpoint_id: int, resample: int) -> int:  # type: ignore[no-untyped-def]
    # concurrency 1: requests are answered in a known order, so the scripted texts land where the test says
    generator = {"backend": "openai", "endpoint_id": endpoint_id, "concurrency": 1, "max_new_tokens": 4}
    r = client.post(f"/api/projects/{project_id}/sampling-jobs",
                    json={"generator": generator, "seed": 5, "resample_duplicates": resample})
    assert r.status_code == 202, r.text
    return int(r.json()["job_id"])


def _texts(db, prompt_id: int) -> list[str]:  # type: ignore[no-untyped-def]
    out = list(db.scalars(select(Completion.text).where(Completion.prompt_id == prompt_id).order_by(Completion.id)))
    db.rollback()
    return out


def test_blank_and_identical_answers_are_resampled_or_dropped_and_counted(
        db, make_user, make_project, token_for, api, transformers_like, database_url, clean_engine,
        tmp_path) -> None:
    server = transformers_like
    lead, project = _project_with_prompts(db, make_user, make_project, n=2, k=3)
    annotator = make_user(db, "annotator")
    projects.add_member(db, project, lead, email=annotator.email, role="annotator")
    first, second = db.scalars(select(Prompt.id).where(Prompt.project_id == project.id).order_by(Prompt.id)).all()
    endpoint_id = _trusted_endpoint(db, make_user, api, token_for, server.url, "tiny")
    client, ann = api(token_for(db, lead)), api(token_for(db, annotator))
    db.commit()
    # ids only from here: the rollbacks below expire the ORM objects, and reloading one would open a transaction
    # that holds SQLite's write lock against the app's requests
    project_id = project.id

    # One request per sample (the server ignores n), in this order: the first prompt's three, the second's three,
    # then the resampling rounds of the first prompt (two bad slots, then one), then of the second (one, then one).
    server.texts_next(["", "answer A", "answer A",
                       " \n ", "x plus y", "z times w",
                       "answer B", "",
                       "answer C",
                       "\t", ""])
    job_id = _sample(client, project_id, endpoint_id, resample=2)
    assert _worker(database_url, tmp_path, clean_engine).run(exit_when_idle=True) == 1

    status = client.get(f"/api/jobs/{job_id}").json()
    assert status["state"] == "succeeded", status
    result = status["result"]
    assert (result["resampled"], result["dropped_empty"], result["dropped_identical"]) == (5, 1, 0)
    assert result["prompts_short_of_k"] == 1 and result["completions_created"] == 5
    assert "dropped 1 empty" in status["message"] and result["server_n_cap"] == 1
    assert sorted(_texts(db, first)) == ["answer A", "answer B", "answer C"]
    assert sorted(_texts(db, second)) == ["x plus y", "z times w"]  # the blank one never came back good: dropped
    # the server was asked for three at first, then for one at a time
    assert server.requests[0]["n"] == 3 and {r["n"] for r in server.requests[1:]} == {1}
    log = jobs.log_tail(tmp_path, job_id, lines=200)  # the worker's data directory
    assert "answered 1 choice(s) to a request for n=3" in log and "one request per sample" in log
    assert "hygiene: 5 empty or duplicate completions resampled" in log and "1 prompts are short of K" in log

    # Only the full prompt reaches the annotator; the short one waits for the next job to top it up.
    task = ann.get(f"/api/projects/{project_id}/tasks/next")
    assert task.status_code == 200 and task.json()["prompt"]["id"] == first
    assert all(c["text"].strip() for c in task.json()["completions"])


def test_without_resampling_blank_and_identical_answers_are_dropped_and_a_second_job_tops_up(
        db, make_user, make_project, token_for, api, transformers_like, database_url, clean_engine,
        tmp_path) -> None:
    server = transformers_like
    lead, project = _project_with_prompts(db, make_user, make_project, n=1, k=3)
    [prompt_id] = db.scalars(select(Prompt.id).where(Prompt.project_id == project.id)).all()
    endpoint_id = _trusted_endpoint(db, make_user, api, token_for, server.url, "tiny")
    client = api(token_for(db, lead))
    db.commit()
    project_id = project.id

    server.texts_next(["same answer", "same   answer ", "   "])
    job_id = _sample(client, project_id, endpoint_id, resample=0)
    _worker(database_url, tmp_path, clean_engine).run(exit_when_idle=True)
    result = client.get(f"/api/jobs/{job_id}").json()["result"]
    assert (result["resampled"], result["dropped_empty"], result["dropped_identical"]) == (0, 1, 1)
    assert _texts(db, prompt_id) == ["same answer"]

    # The next job samples only what is missing, and an answer identical to a stored one is dropped too.
    server.texts_next(["same answer", "another answer"])
    again = _sample(client, project_id, endpoint_id, resample=0)
    _worker(database_url, tmp_path, clean_engine).run(exit_when_idle=True)
    result = client.get(f"/api/jobs/{again}").json()["result"]
    assert result["dropped_identical"] == 1 and result["completions_created"] == 1
    assert _texts(db, prompt_id) == ["same answer", "another answer"]
    assert client.get(f"/api/jobs/{again}").json()["state"] == "succeeded"
