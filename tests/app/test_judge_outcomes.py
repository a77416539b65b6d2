"""What becomes of a judge run, seen where the lead started it: comparisons too long for the judge model are judged
on cut answers or skipped by name while the run goes on; a failed run says why; the run can keep to the prompts
people have ranked; and the form offers the default local model."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from sqlalchemy import select

from app.main import create_app
from app.models import Completion, JudgeRun, Pair, Prompt, Ranking
from app.platform.settings import Settings
from app.projects import projects
from app.worker import Worker
from tests.conftest import TEST_SECRET, Browser
from tests.training.tiny import char_tokenizer, save_tiny, tiny_gpt2

pytestmark = pytest.mark.slow

CONTEXT = 512
"""The tiny judge's context, in characters (one token each)."""


@pytest.fixture(scope="module")
def judge_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tokenizer = char_tokenizer()
    return save_tiny(tiny_gpt2(tokenizer, seed=3, n_positions=CONTEXT), tokenizer,
                     tmp_path_factory.mktemp("judge") / "model")


def _project(db, make_user, make_project, texts: list[tuple[str, list[str]]]):  # type: ignore[no-untyped-def]
    lead = make_user(db, "lead")
    project = make_project(db, lead=lead, k=3)
    for n, (prompt, completions) in enumerate(texts):
        row = Prompt(project_id=project.id, text=prompt, text_hash=f"h{n}", split="train")
        db.add(row)
        db.flush()
        db.add_all(Completion(prompt_id=row.id, text=t) for t in completions)
    db.commit()
    return lead, project


def _work(database_url: str, tmp_path: Path, clean_engine) -> int:  # type: ignore[no-untyped-def]
    from app.platform.db import make_session_factory

    settings = Settings(database_url=database_url, data_dir=tmp_path, secret_key=TEST_SECRET)
    return Worker(settings, session_factory=make_session_factory(clean_engine), poll_s=0.05,
                  heartbeat_s=0.2).run(exit_when_idle=True)


def _judge_page(browser, db, lead, project_id: int) -> str:  # type: ignore[no-untyped-def]
    email = lead.email
    db.rollback()  # end the read: on SQLite an open transaction holds the write lock the login needs
    page = browser()
    page.login(email)
    return page.get(f"/projects/{project_id}/judge").text


def test_a_run_judges_what_fits_cuts_long_answers_and_names_what_it_skipped(db, make_user, make_project, api,
                                                                            token_for, browser, judge_dir,
                                                                            database_url, clean_engine,
                                                                            tmp_path) -> None:
    long_answer = "First I add. " + "x" * 600 + " So the answer is 4."
    lead, project = _project(db, make_user, make_project, [
        ("What is 2+2?", ["4", "5", "22"]),
        ("What is 1+1? " + "Think about it. " * 28, ["2", "11", "3"]),  # the question leaves no room for answers
        ("What is 3+1?", [long_answer, "4", "31"]),
    ])
    client = api(token_for(db, lead))
    db.commit()
    run = client.post(f"/api/projects/{project.id}/judge-runs",
                      json={"generator": {"backend": "hf", "model": str(judge_dir)}}).json()
    assert _work(database_url, tmp_path, clean_engine) == 1
    job = client.get(f"/api/jobs/{run['job_id']}").json()
    assert job["state"] == "succeeded", job  # one prompt that does not fit no longer fails the run
    result = job["result"]
    assert (result["rankings_written"], result["skipped_prompts"], result["skipped_comparisons"]) == (2, 1, 3)
    assert result["truncated_comparisons"] == 2  # the long answer's two pairs, judged on it cut in the middle
    crowded = db.scalar(select(Prompt.id).where(Prompt.project_id == project.id, Prompt.text.like("What is 1+1?%")))
    assert {s["prompt_id"] for s in result["skipped"]} == {crowded}
    assert all(f"judge model's context is {CONTEXT}" in s["reason"] for s in result["skipped"])
    ranked = set(db.scalars(select(Ranking.prompt_id).where(Ranking.judge_run_id == run["judge_run_id"])))
    assert crowded not in ranked and len(ranked) == 2  # the skipped prompt stays with the humans
    cut = [p.meta["truncated"] for p in db.scalars(select(Pair).where(Pair.source == "ai"))]
    assert sum(1 for t in cut if t) == 2  # each judged pair says what the judge did not see
    assert db.get(JudgeRun, run["judge_run_id"]).state == "succeeded"
    db.rollback()

    html = _judge_page(browser, db, lead, project.id)
    row = html.split(f'id="judge-run-{run["judge_run_id"]}"')[1].split("</tr>")[0]
    assert "judged 2 of 3 prompts" in row and "2 comparisons judged on answers cut to fit" in row
    assert "3 comparisons skipped, 1 prompt left to humans" in row
    assert f"prompt #{crowded}, completions" in row and f"judge model&#39;s context is {CONTEXT}" in row


def test_a_failed_run_says_why_on_the_judge_page_escaped(db, make_user, make_project, api, token_for, browser,
                                                         judge_dir, database_url, clean_engine, tmp_path) -> None:
    lead, project = _project(db, make_user, make_project, [("What is 2+2?", ["4", "5", "22"])])
    client = api(token_for(db, lead))
    db.commit()
    gone = tmp_path / "<b>gone"  # its name in markup: the page must show it as text
    shutil.copytree(judge_dir, gone)
    run = client.post(f"/api/projects/{project.id}/judge-runs",
                      json={"generator": {"backend": "hf", "model": str(gone)}}).json()
    shutil.rmtree(gone)  # removed before a worker got to the run
    pid, email = project.id, lead.email
    db.rollback()
    page = browser()
    page.login(email)
    # While the run waits, the page polls its runs table (and only that: no figures are computed for a poll).
    assert f'hx-get="/projects/{pid}/judge/runs"' in page.get(f"/projects/{pid}/judge").text
    assert _work(database_url, tmp_path, clean_engine) == 1
    job = client.get(f"/api/jobs/{run['job_id']}").json()
    assert (job["state"], job["attempts"]) == ("failed", 1)  # nothing to retry: the directory is missing
    polled = page.get(f"/projects/{pid}/judge/runs").text
    assert 'id="judge-run-ended"' in polled and "hx-get" not in polled  # the last poll: it says so, and stops
    row = page.get(f"/projects/{pid}/judge").text.split(f'id="judge-run-{run["judge_run_id"]}"')[1].split("</tr>")[0]
    assert '<span class="state state-failed">failed</span>' in row
    assert "&lt;b&gt;gone does not exist" in row and "<b>gone" not in row
    assert f'href="/jobs/{run["job_id"]}"' in row


def test_a_run_can_keep_to_the_prompts_people_ranked(db, make_user, make_project, api, token_for, judge_dir,
                                                     database_url, clean_engine, tmp_path) -> None:
    lead, project = _project(db, make_user, make_project, [(f"What is {i}+1?", [f"{i + 1}", f"{i + 2}", "no"])
                                                           for i in range(3)])
    annotator = make_user(db, "annotator")
    projects.add_member(db, project, lead, email=annotator.email, role="annotator")
    client, ann = api(token_for(db, lead)), api(token_for(db, annotator))
    pid = project.id
    db.commit()
    spec = {"generator": {"backend": "hf", "model": str(judge_dir)}, "scope": "human_ranked"}
    refused = client.post(f"/api/projects/{pid}/judge-runs", json=spec)
    assert refused.status_code == 422 and refused.json()["detail"][0]["field"] == "scope"
    task = ann.get(f"/api/projects/{pid}/tasks/next").json()
    assert ann.post(f"/api/projects/{pid}/rankings", json={
        "assignment_id": task["assignment_id"], "tiers": [[c["id"]] for c in task["completions"]],
        "rubric_version": 1, "submission_id": "s1"}).status_code == 201
    run = client.post(f"/api/projects/{pid}/judge-runs", json=spec).json()
    _work(database_url, tmp_path, clean_engine)
    ranked = set(db.scalars(select(Ranking.prompt_id).where(Ranking.judge_run_id == run["judge_run_id"])))
    db.rollback()
    assert ranked == {task["prompt"]["id"]}
    figures = client.get(f"/api/projects/{pid}/judge-agreement?judge_run_id={run['judge_run_id']}")
    assert figures.status_code == 200, figures.text
    figures = figures.json()
    assert figures["n_prompts"] == 1 and figures["pair_agreement"] is not None


def test_the_model_forms_offer_the_default_local_model(db, make_user, make_project, database_url, clean_engine,
                                                       tmp_path) -> None:
    lead, project = _project(db, make_user, make_project, [])
    model = tmp_path / "models" / "smollm2-135m-instruct"
    app = create_app(Settings(env="dev", database_url=database_url, secret_key=TEST_SECRET, data_dir=tmp_path,
                              default_policy_model=model))
    try:
        page = Browser(app)
        page.login(lead.email)
        for path in ("judge", "jobs", "revisions"):
            assert f'name="model" value="{model}"' in page.get(f"/projects/{project.id}/{path}").text, path
        # The scope offered first measures the judge against people.
        judge = page.get(f"/projects/{project.id}/judge").text
        assert 'name="scope" value="human_ranked" checked' in judge
    finally:
        app.state.engine.dispose()


def test_a_failed_revision_job_says_why_on_the_revisions_page(db, make_user, make_project, api, token_for, browser,
                                                              judge_dir, database_url, clean_engine,
                                                              tmp_path) -> None:
    lead, project = _project(db, make_user, make_project, [("What is 2+2?", ["4", "5", "22"])])
    client = api(token_for(db, lead))
    pid, email = project.id, lead.email
    db.commit()
    model = tmp_path / "reviser"
    shutil.copytree(judge_dir, model)
    job = client.post(f"/api/projects/{pid}/revision-jobs",
                      json={"generator": {"backend": "hf", "model": str(model)}, "limit": 1}).json()
    shutil.rmtree(model)
    _work(database_url, tmp_path, clean_engine)
    page = browser()
    page.login(email)
    line = page.get(f"/projects/{pid}/revisions").text.split('id="last-revise-job"')[1].split("</p>")[0]
    assert "failed" in line and f"{model} does not exist" in line and f'href="/jobs/{job["job_id"]}"' in line
