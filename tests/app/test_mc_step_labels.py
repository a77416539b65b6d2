"""Monte-Carlo step labels in the app: a run from the API, the page and the CLI samples continuations from every
step and stores the share that reach the reference answer as a labeller of its own (source mc); the labels show on
the step-agreement figures beside humans and the AI judge, and in steps exports that ask for them; bad requests are
refused naming the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, func, inspect, select

from app.annotation import steps
from app.jobs.context import JobContext
from app.judge import monte_carlo, monte_carlo_job
from app.models import Completion, JudgeRun, Pair, Prompt, Ranking, StepLabel
from app.projects import projects
from app.quality import step_agreement
from app.worker import Worker
from tests.app.test_exports import _download, _export, _run_worker
from tests.support.scripted_policy import ScriptedPolicy
from tests.training.tiny import char_tokenizer, save_tiny, silent_gpt2

QUESTION = "Tom has 3 apples and buys 4. He gives 2 away. How many are left?"
RIGHT = "3 + 4 = 7 apples.\nHe gives 2 away: 7 - 2 = 5.\nA: 5"
WRONG = "3 + 4 = 7 apples.\nHe gives 2 away: 7 - 2 = 4.\nA: 4"


@pytest.fixture(scope="module")
def silent_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real policy whose continuations are known: it ends every answer at once, so a prefix leads to its own
    last number (tests/training/tiny.py)."""
    tokenizer = char_tokenizer()
    return save_tiny(silent_gpt2(tokenizer), tokenizer, tmp_path_factory.mktemp("mc-policy") / "model")


def _project(db, make_user, make_project, *, step_labels: bool = True):  # type: ignore[no-untyped-def]
    lead = make_user(db, "lead")
    project = make_project(db, k=2, lead=lead)
    annotator = make_user(db, "annotator")
    projects.add_member(db, project, lead, email=annotator.email, role="annotator")
    if step_labels:
        steps.set_options(db, project, lead, enabled=True, separator=None)
    return lead, annotator, project


def _apples(db, project, reference: str | None = "#### 5", n: int = 0) -> Prompt:  # type: ignore[no-untyped-def]
    prompt = Prompt(project_id=project.id, text=QUESTION if not n else f"{QUESTION} ({n})",
                    text_hash=f"{project.id}-apples-{n}", reference=reference,
                    completions=[Completion(text=RIGHT, steps=steps.split(RIGHT)),
                                 Completion(text=WRONG, steps=steps.split(WRONG))])
    db.add(prompt)
    db.flush()
    return prompt


def _labels(db, run_id: int) -> dict[str, list[tuple[int, float]]]:  # type: ignore[no-untyped-def]
    """The run's step labels by completion text: [(label, p)] in step order."""
    out: dict[str, list[tuple[int, float]]] = {}
    for text, label, p in db.execute(
            select(Completion.text, StepLabel.label, StepLabel.p).join(Completion)
            .join(Ranking, StepLabel.ranking_id == Ranking.id).where(Ranking.judge_run_id == run_id)
            .order_by(StepLabel.completion_id, StepLabel.step_index)):
        out.setdefault(text, []).append((label, p))
    return out


def test_a_run_from_the_api_labels_each_step_by_the_continuations_that_reach_the_answer(
        db, make_user, make_project, token_for, api, app, browser, silent_dir: Path) -> None:
    lead, _, project = _project(db, make_user, make_project)
    _apples(db, project)
    _apples(db, project, reference=None, n=1)  # nothing to check against: passed over
    client = api(token_for(db, lead))
    db.commit()
    pid, email = project.id, lead.email

    r = client.post(f"/api/projects/{pid}/mc-step-labels", json={"model": str(silent_dir), "n": 2})
    assert r.status_code == 202, r.text
    accepted = r.json()
    # Two completions of three steps: N = 2 continuations after each of the first two steps.
    assert accepted["planned_completions"] == 2 and accepted["planned_continuations"] == 2 * 2 * 2
    _run_worker(app)
    job = client.get(f"/api/jobs/{accepted['job_id']}").json()
    assert job["state"] == "succeeded", job
    assert job["progress"] == {"done": 2, "total": 2}
    assert job["result"]["step_labels_written"] == 6 and job["result"]["continuations_sampled"] == 8
    db.expire_all()
    # The policy writes nothing after a prefix, so a prefix's answer is its own last number: 7 after step one (wrong
    # for both), then 5 (right) or 4 (wrong), then the final answer itself.
    assert _labels(db, accepted["run_id"]) == {RIGHT: [(-1, 0.0), (1, 1.0), (1, 1.0)],
                                               WRONG: [(-1, 0.0), (-1, 0.0), (-1, 0.0)]}
    (ranking,) = db.scalars(select(Ranking).where(Ranking.judge_run_id == accepted["run_id"]))
    assert ranking.source == "mc" and ranking.tiers == [] and ranking.annotator_id is None
    assert db.scalar(select(func.count(Pair.id))) == 0  # a labelling run orders nothing
    assert projects.counts(db, project).rankings == 0
    run = db.get(JudgeRun, accepted["run_id"])
    assert run is not None and run.state == "succeeded" and run.constitution_id is None
    db.rollback()  # SQLite: a transaction left open holds the one write lock a login needs

    page = browser()
    page.login(email)
    assert f"Monte-Carlo steps · N=2 · hard · {silent_dir.name}" in page.get(f"/projects/{pid}/judge").text


def test_the_soft_label_is_the_share_of_known_continuations_that_are_right(
        db, make_user, make_project, app, silent_dir: Path) -> None:
    lead, _, project = _project(db, make_user, make_project)
    _apples(db, project)
    run, job = monte_carlo.request_mc_labels(db, project, lead, model=str(silent_dir), n=4, estimate="soft",
                                             max_completions=10, max_new_tokens=16, temperature=1.0, seed=0)
    run_id, job_id, payload, project_id = run.id, job.id, dict(job.payload), project.id
    db.commit()
    policy = ScriptedPolicy({
        "3 + 4 = 7 apples.\n": ["He gives 2 away: 7 - 2 = 5.\nA: 5", "7 - 2 = 5\n#### 5", "A: 4", "A: 9"],
        "3 + 4 = 7 apples.\nHe gives 2 away: 7 - 2 = 5.\n": ["A: 6", "A: 5", "The answer is 7", "A: 4"],
        "3 + 4 = 7 apples.\nHe gives 2 away: 7 - 2 = 4.\n": ["A: 5", "A: 5", "A: 5", "A: 4"],
    })
    ctx = JobContext(Worker(app.state.settings, session_factory=app.state.session_factory), job_id, "mc_step_labels",
                     payload, project_id, 1)
    result = monte_carlo_job.label_with(ctx, policy)
    assert result["completions_labelled"] == 2 and result["continuations_sampled"] == 4 * 4
    # Soft estimate (+1 at half or more): the two answers share their first step, 2/4 right after it; then 1/4 after
    # the right answer's second step, and 3/4 after the wrong one's, although its own final answer is wrong.
    assert _labels(db, run_id) == {RIGHT: [(1, 0.5), (-1, 0.25), (1, 1.0)], WRONG: [(1, 0.5), (1, 0.75), (-1, 0.0)]}
    db.rollback()
    # Run again (a resumed job): every prompt is labelled already, nothing is sampled or written twice.
    again = monte_carlo_job.label_with(ctx, ScriptedPolicy({}))
    assert again["completions_labelled"] == 0 and again["step_labels_written"] == 0


def test_bad_requests_are_refused_naming_the_field(db, make_user, make_project, token_for, api,
                                                   silent_dir: Path, tmp_path: Path) -> None:
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "config.json").write_text("{}")
    (pickled / "pytorch_model.bin").write_bytes(b"never unpickled")
    lead, annotator, project = _project(db, make_user, make_project)
    _apples(db, project)
    bare_lead, _, bare = _project(db, make_user, make_project)  # a reference-less project
    db.add(Prompt(project_id=bare.id, text="Say hi.", text_hash="hi", completions=[Completion(text="hi")]))
    off_lead, _, off = _project(db, make_user, make_project, step_labels=False)
    _apples(db, off)
    outsider = make_user(db, "lead")
    client, ann, other = api(token_for(db, lead)), api(token_for(db, annotator)), api(token_for(db, outsider))
    bare_client, off_client = api(token_for(db, bare_lead)), api(token_for(db, off_lead))
    db.commit()
    url = f"/api/projects/{project.id}/mc-step-labels"
    ok = {"model": str(silent_dir), "n": 2}
    assert ann.post(url, json=ok).status_code == 403
    assert other.post(url, json=ok).status_code == 404

    def refused(body: dict[str, Any], client=client, url: str = url) -> dict[str, Any]:  # type: ignore[no-untyped-def]
        r = client.post(url, json=body)
        assert r.status_code == 422, r.text
        return r.json()["detail"][0]

    for body, field in [({"n": 0}, "n"), ({"n": 65}, "n"), ({"n": "2"}, "n"), ({"estimate": "mean"}, "estimate"),
                        ({"max_completions": 0}, "max_completions"), ({"max_new_tokens": 5000}, "max_new_tokens"),
                        ({"temperature": 0}, "temperature"), ({"checker": "exec"}, "checker"),
                        ({"model": "/nonexistent"}, "model"), ({"prompt_ids": [10**6]}, "prompt_ids"),
                        ({"kind": "x"}, "kind")]:
        assert refused(ok | body)["field"] == field, body
    assert "pickled weights" in refused(ok | {"model": str(pickled)})["message"]  # refused before any job
    assert "no prompt of this project has a reference answer" in refused(
        ok, client=bare_client, url=f"/api/projects/{bare.id}/mc-step-labels")["message"]
    assert "does not label steps" in refused(ok, client=off_client, url=f"/api/projects/{off.id}/mc-step-labels")[
        "message"]
    assert db.scalar(select(func.count(JudgeRun.id))) == 0  # nothing was started


def test_a_run_too_costly_is_refused_before_it_starts(db, make_user, make_project, token_for, api,
                                                      silent_dir: Path) -> None:
    lead, _, project = _project(db, make_user, make_project)
    long = "\n".join(f"step {i}: 1 + 1 = 2" for i in range(99)) + "\nA: 2"
    for i in range(40):  # 80 completions of 100 steps: 64 × 99 × 80 = 506880 continuations at N = 64
        db.add(Prompt(project_id=project.id, text=f"q{i}", text_hash=f"long{i}", reference="2",
                      completions=[Completion(text=long), Completion(text=long + " ")]))
    client = api(token_for(db, lead))
    db.commit()
    r = client.post(f"/api/projects/{project.id}/mc-step-labels",
                    json={"model": str(silent_dir), "n": 64, "max_completions": 80})
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "n"
    assert "would sample 506880 continuations" in r.json()["detail"][0]["message"]
    r = client.post(f"/api/projects/{project.id}/mc-step-labels",
                    json={"model": str(silent_dir), "n": 63, "max_completions": 80})
    assert r.status_code == 202 and r.json()["planned_continuations"] == 63 * 99 * 80


def test_the_page_form_starts_a_run_with_csrf_and_shows_a_refusal_beside_it(db, make_user, make_project, browser,
                                                                            silent_dir: Path) -> None:
    lead, annotator, project = _project(db, make_user, make_project)
    _apples(db, project)
    _, _, off = _project(db, make_user, make_project, step_labels=False)
    pid, off_id, emails = project.id, off.id, (lead.email, annotator.email)
    db.commit()
    page = browser()
    page.login(emails[0])
    html = page.get(f"/projects/{pid}/judge").text
    assert 'id="mc-form"' in html and f'action="/projects/{pid}/judge/mc-step-labels"' in html
    url = f"/projects/{pid}/judge/mc-step-labels"
    assert page.post(url, {"model": str(silent_dir), "n": "2"}, csrf=False).status_code == 403
    refused = page.post(url, {"model": str(silent_dir), "n": "100"})
    assert refused.status_code == 422
    assert "Continuations per step (N)" in refused.text and "must be at most 64" in refused.text
    assert 'name="n" value="100"' in refused.text  # what was typed stays
    started = page.post(url, {"model": str(silent_dir), "n": "2", "estimate": "soft"})
    assert started.status_code == 303 and started.headers["location"] == f"/projects/{pid}/jobs"
    assert "mc_step_labels" in page.get(f"/projects/{pid}/jobs").text
    run = db.scalar(select(JudgeRun).where(JudgeRun.project_id == pid))
    assert run is not None and run.params["estimate"] == "soft" and run.params["n"] == 2
    db.rollback()
    # Offered only where steps are labelled; annotators never see it.
    assert 'id="mc-form"' not in page.get(f"/projects/{off_id}/judge").text
    ann = browser()
    ann.login(emails[1])
    assert ann.post(url, {"model": str(silent_dir), "n": "2"}).status_code == 403


def _ranking(db, project, prompt, source: str, *, annotator=None, run=None) -> Ranking:  # type: ignore[no-untyped-def]
    ids = [c.id for c in prompt.completions]
    ranking = Ranking(project_id=project.id, prompt_id=prompt.id, source=source,
                      annotator_id=annotator.id if annotator else None, judge_run_id=run.id if run else None,
                      tiers=[] if source == "mc" else [[ids[0]], [ids[1]]], display_order=ids)
    db.add(ranking)
    db.flush()
    return ranking


def _three_labellers(db, make_user, make_project):  # type: ignore[no-untyped-def]
    """One completion of three steps labelled by two annotators, the AI judge and a Monte-Carlo run."""
    lead, annotator, project = _project(db, make_user, make_project)
    second = make_user(db, "annotator")
    projects.add_member(db, project, lead, email=second.email, role="annotator")
    prompt = _apples(db, project)
    cid = prompt.completions[0].id
    judge = JudgeRun(project_id=project.id, name="judge", state="succeeded", params={"label_steps": True})
    mc = JudgeRun(project_id=project.id, name="mc", state="succeeded", params={"method": "monte_carlo"})
    db.add_all([judge, mc])
    db.flush()
    # Humans: [+1, +1, +1] and [+1, −1, 0] → majority [+1, −1 (a tie, the worse), 0 → +1/0 tie → 0].
    for who, labels in ((annotator, [1, 1, 1]), (second, [1, -1, 0])):
        steps.write(db, _ranking(db, project, prompt, "human", annotator=who).id, {cid: labels})
    ai = _ranking(db, project, prompt, "ai", run=judge)
    db.add_all([StepLabel(ranking_id=ai.id, completion_id=cid, step_index=i, label=label, p=p)
                for i, (label, p) in enumerate([(1, 0.9), (1, 0.6), (1, 0.8)])])
    mc_ranking = _ranking(db, project, prompt, "mc", run=mc)
    db.add_all([StepLabel(ranking_id=mc_ranking.id, completion_id=cid, step_index=i, label=label, p=p)
                for i, (label, p) in enumerate([(-1, 0.0), (-1, 0.25), (1, 1.0)])])
    db.flush()
    return lead, project, prompt, judge, mc


def test_the_step_agreement_figures_hold_humans_the_judge_and_monte_carlo(db, make_user, make_project, token_for,
                                                                         api, browser) -> None:
    lead, project, prompt, _, _ = _three_labellers(db, make_user, make_project)
    report = step_agreement.report(db, project)
    figures = {(r.first, r.second): (r.completions, r.steps, r.agreement, r.first_wrong_caught)
               for r in report.labellers}
    # Humans [+1, −1, 0], judge [+1, +1, +1], Monte-Carlo [−1, −1, +1]; the neutral third step is left out with
    # humans. Humans–judge: step 1 agrees, step 2 not, and the judge misses the one human-wrong step.
    # Humans–MC: step 2 agrees (−1), step 1 not; MC catches the human-wrong step. Judge–MC: only step 3 agrees.
    assert figures == {("human", "ai"): (1, 2, 0.5, 0.0), ("human", "mc"): (1, 2, 0.5, 1.0),
                       ("ai", "mc"): (1, 3, pytest.approx(1 / 3), None)}
    assert report.labelled_completions == 1 and report.compared_steps == 3  # the human figures are the humans'
    client = api(token_for(db, lead))
    pid, email = project.id, lead.email
    db.commit()
    body = client.get(f"/api/projects/{pid}/agreement/steps").json()
    assert {(r["first"], r["second"]): r["steps"] for r in body["labellers"]} == {
        ("human", "ai"): 2, ("human", "mc"): 2, ("ai", "mc"): 3}
    page = browser()
    page.login(email)
    html = page.get(f"/projects/{pid}/agreement").text
    assert '<tr data-pair="human-mc"><td>Humans · Monte-Carlo</td>' in html
    assert '<td class="labeller-agreement">50.0%</td>' in html and '<td class="labeller-agreement">33.3%</td>' in html


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_steps_exports_hold_monte_carlo_labels_when_asked_for_by_name(db, make_user, make_project, token_for, api,
                                                                     app, tmp_path: Path) -> None:
    lead, project, prompt, _, mc = _three_labellers(db, make_user, make_project)
    other = _apples(db, project, n=1)  # labelled by Monte-Carlo alone
    only_mc = _ranking(db, project, other, "mc", run=mc)
    db.add_all([StepLabel(ranking_id=only_mc.id, completion_id=other.completions[1].id, step_index=i, label=label,
                          p=p) for i, (label, p) in enumerate([(1, 0.5), (-1, 0.0), (-1, 0.0)])])
    client = api(token_for(db, lead))
    pid, mc_id, first_id, second_id = project.id, mc.id, prompt.completions[0].id, other.completions[1].id
    db.commit()

    default = _export(client, app, pid, kind="steps", format="jsonl")
    rows = _rows(_download(client, default, tmp_path / "default") / "steps.jsonl")
    assert [r["source"] for r in rows] == ["human"] and rows[0]["mc_p"] is None  # never unasked

    asked = _export(client, app, pid, kind="steps", format="jsonl", filters={"source": ["mc"]})
    assert asked["filters"]["source"] == ["mc"]
    rows = _rows(_download(client, asked, tmp_path / "mc") / "steps.jsonl")
    by_completion = {r["completion_id"]: r for r in rows}
    first, second = by_completion[first_id], by_completion[second_id]
    # A row ends at its first wrong step; mc_p keeps the share of right continuations per step.
    assert first["step_labels"] == [-1] and first["mc_p"] == [0.0] and first["annotators"] == [f"mc-run-{mc_id}"]
    assert second["step_labels"] == [1, -1] and second["labels"] == [True, False] and second["mc_p"] == [0.5, 0.0]
    assert second["source"] == "mc" and second["judge_p"] is None
    card = (tmp_path / "mc" / "README.md").read_text(encoding="utf-8")
    assert "`mc_p`" in card and "Monte-Carlo" in card

    mixed = _export(client, app, pid, kind="steps", format="jsonl", filters={"source": ["human", "mc"]})
    rows = _rows(_download(client, mixed, tmp_path / "mixed") / "steps.jsonl")
    row = next(r for r in rows if r["completion_id"] == first_id)
    # Humans [+1, +1, +1] and [+1, −1, 0], Monte-Carlo [−1, …]: step 1 has two +1 votes to one −1.
    assert row["source"] == "mixed" and row["votes"][0] == 2 and row["total_votes"][0] == 3
    assert row["mc_p"][:2] == [0.0, 0.25]

    r = client.post(f"/api/projects/{pid}/exports", json={"kind": "pairs", "format": "jsonl",
                                                          "filters": {"source": ["mc"]}})
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "filters.source"
    # With AI labels allowed, a rankings export without a source filter takes every labeller's rankings but
    # Monte-Carlo's, which order nothing.
    project.settings = dict(project.settings or {}) | {"ai_labels_for_training": True}
    db.commit()
    rankings = _export(client, app, pid, kind="rankings", format="jsonl")
    assert "source" not in rankings["filters"] and rankings["row_count"] == 3  # two humans and the judge


def test_the_cli_queues_a_run_that_a_worker_carries_out(db, make_user, make_project, app, database_url: str,
                                                        silent_dir: Path, monkeypatch, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from app.cli import cli

    lead, _, project = _project(db, make_user, make_project)
    _apples(db, project)
    pid, email = project.id, lead.email
    db.commit()
    monkeypatch.setenv("PREFLAB_DATABASE_URL", database_url)
    monkeypatch.setenv("PREFLAB_DATA_DIR", str(tmp_path))
    runner = CliRunner()
    base = ["mc-step-labels", str(pid), "--user", email, "--model", str(silent_dir)]
    bad = runner.invoke(cli, [*base, "--n", "0"])
    assert bad.exit_code == 1 and "n: must be at least 1" in bad.output
    assert runner.invoke(cli, ["mc-step-labels", "999999", "--user", email]).exit_code == 1
    queued = runner.invoke(cli, [*base, "--n", "3", "--estimate", "soft"])
    assert queued.exit_code == 0, queued.output
    assert "2 completions, 12 continuations; `preflab worker` runs it" in queued.output
    _run_worker(app)
    run = db.scalar(select(JudgeRun).where(JudgeRun.project_id == pid))
    assert run is not None and run.state == "succeeded"
    assert _labels(db, run.id)[RIGHT] == [(-1, 0.0), (1, 1.0), (1, 1.0)]


def test_the_database_allows_monte_carlo_rankings(tmp_path: Path) -> None:
    from app.platform.migrate import upgrade

    url = f"sqlite:///{tmp_path}/checks.db"
    upgrade(url)
    engine = create_engine(url)
    checks = {c["name"]: c["sqltext"] for c in inspect(engine).get_check_constraints("rankings")}
    engine.dispose()
    assert "'mc'" in checks["ck_rankings_source"] and "'mc'" in checks["ck_rankings_labeller"]
