"""The engineer's day in the demo, with nothing typed but choices (and tiny step counts): export → a reward model on
the shipped MiniLM → GRPO from the demo's tiny policy → *Sample into project*, through the training page's form,
the real worker and the real trainer processes, on the demo's own data."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from app.accounts import users
from app.demo.seed import DEMO_PROJECT, demo_policy_dir, measure_speed, setup_demo, speed_unmeasured
from app.main import create_app
from app.models import Completion, Export, Job, Project, Prompt, TrainingRun
from app.platform.settings import Settings
from app.runs import training_runs
from app.worker import Worker

CSRF_RE = re.compile(r'name="csrf_token" value="([0-9a-f]{64})"')


class _Page:
    """A logged-in browser: cookies and the page's CSRF token."""

    def __init__(self, app: object, email: str, password: str) -> None:
        self.client = TestClient(app, base_url="http://testserver", follow_redirects=False)  # type: ignore[arg-type]
        self.csrf = ""
        self.get("/login")
        assert self.post("/login", {"email": email, "password": password}).status_code == 303

    def get(self, url: str):  # type: ignore[no-untyped-def]
        response = self.client.get(url)
        if match := CSRF_RE.search(response.text):
            self.csrf = match.group(1)
        return response

    def post(self, url: str, data: dict):  # type: ignore[no-untyped-def]
        return self.client.post(url, data=data | {"csrf_token": self.csrf})


def _work(app) -> None:  # type: ignore[no-untyped-def]
    Worker(app.state.settings, session_factory=app.state.session_factory, heartbeat_s=0.2,
           poll_s=0.05).run(exit_when_idle=True)


@pytest.fixture
def demo(tmp_path: Path):  # type: ignore[no-untyped-def]
    """The demo as `preflab demo` sets it up (its database, accounts, project and tiny policy) and serves it."""
    settings = Settings(env="demo", database_url=f"sqlite:///{tmp_path}/demo.db", data_dir=tmp_path / "data",
                        secret_key="s" * 48)
    accounts, project_id = setup_demo(settings, "tiny")
    assert (demo_policy_dir(settings, "tiny") / "config.json").is_file()
    app = create_app(settings.model_copy(update={"default_policy_model": demo_policy_dir(settings, "tiny")}))
    yield app, {email: password for _, email, password in accounts}, project_id
    app.state.engine.dispose()


def _rank_some(app, accounts: dict[str, str], project_id: int, per_annotator: int = 12) -> None:  # type: ignore[no-untyped-def]
    for email in ("annotator1@example.org", "annotator2@example.org"):
        with app.state.session_factory() as db:
            _, token = users.create_token(db, users.get_by_email(db, email))
            db.commit()
        api = TestClient(app, base_url="http://testserver", headers={"Authorization": f"Bearer {token}"})
        for _ in range(per_annotator):
            task = api.get(f"/api/projects/{project_id}/tasks/next").json()
            ids = [c["id"] for c in task["completions"]]
            assert api.post(f"/api/projects/{project_id}/rankings", json={
                "assignment_id": task["assignment_id"], "tiers": [[i] for i in ids], "rubric_version": 1,
                "submission_id": f"{email}-{task['assignment_id']}"}).status_code == 201


def _export(eng: _Page, app, project_id: int, kind: str) -> int:  # type: ignore[no-untyped-def]
    page = eng.post(f"/projects/{project_id}/exports", {"kind": kind, "format": "jsonl", "aggregation": "raw"})
    assert page.status_code == 303, page.text[-2000:]
    _work(app)
    exports = eng.get(f"/projects/{project_id}/training").text
    return int(re.search(rf'<option value="(\d+)"[^>]*>#\d+ {kind} ', exports).group(1))  # type: ignore[union-attr]


def _train(eng: _Page, app, project_id: int, **form: str) -> TrainingRun:  # type: ignore[no-untyped-def]
    started = eng.post(f"/projects/{project_id}/training", {"base_model": "", "reward_run_id": ""} | form)
    assert started.status_code == 303, started.text[-3000:]
    run_id = int(started.headers["location"].rsplit("/", 1)[1])
    _work(app)
    with app.state.session_factory() as db:
        run = db.get(TrainingRun, run_id)
        db.expunge(run)
    page = eng.get(f"/training-runs/{run_id}").text
    assert run.state == "succeeded", page[page.find('id="run-log"'):][:6000]
    return run


@pytest.mark.slow
def test_an_engineer_trains_a_reward_model_and_a_policy_in_the_demo_with_the_defaults(demo) -> None:  # type: ignore[no-untyped-def]
    app, accounts, project_id = demo
    _rank_some(app, accounts, project_id)
    eng = _Page(app, "engineer@example.org", accounts["engineer@example.org"])

    form = eng.get(f"/projects/{project_id}/training").text
    policy = str(demo_policy_dir(app.state.settings, "tiny"))
    assert f'<span class="for-kind" data-kind="grpo"><strong>grpo</strong>: <code>{policy}</code>' in form
    assert "shipped MiniLM" in form

    pairs = _export(eng, app, project_id, "pairs")
    reward = _train(eng, app, project_id, kind="reward", export_id=str(pairs),
                    config="steps = 2\nbatch_size = 4\nmax_length = 128")
    assert reward.base_model is None  # the shipped MiniLM
    page = eng.get(f"/training-runs/{reward.id}").text
    assert 'id="eval-table"' in page and "Calibration (reliability diagram)" in page
    assert "Rubric versions: 1 " in page  # the export's labels were all given under version 1

    prompts = _export(eng, app, project_id, "prompts")
    grpo = _train(eng, app, project_id, kind="grpo", export_id=str(prompts), reward_run_id=str(reward.id),
                  config="steps = 2\ngroup_size = 2\nprompts_per_step = 2\nmax_new_tokens = 8\n"
                         "eval_max_prompts = 3\neval_k = 2")
    assert grpo.base_model == policy  # the default, recorded on the run
    page = eng.get(f"/training-runs/{grpo.id}").text
    assert re.search(r'id="run-progress">2/2 ', page), page[:3000]
    # log_every's default: a metrics row (a chart point) for every step of a short run
    assert [row["step"] for row in training_runs.read_metrics(grpo)] == [1, 2]
    assert "2 points" in page.split('data-metric="reward_mean"', 1)[1].split("</svg>", 1)[0]
    assert "Pass@K" in page and "Reward of held-out samples, before and after" in page
    log = html.unescape(page.split('id="run-log"', 1)[1].split(">", 1)[1].split("</pre>", 1)[0])
    lines = [line for line in log.splitlines() if line.strip()]
    assert any(line.endswith("progress: step 2/2") for line in lines), log
    assert len(lines) == len(set(lines)) and "it/s]" not in log, log  # no line twice, no progress-bar redraws

    assert eng.post(f"/training-runs/{grpo.id}/sample", {}).status_code == 303
    _work(app)
    with app.state.session_factory() as db:
        project = db.scalar(select(Project).where(Project.name == DEMO_PROJECT))
        produced = db.scalar(select(func.count(Completion.id)).join(Prompt).where(
            Prompt.project_id == project.id, Completion.source == f"policy:{grpo.id}"))
        sampled = db.scalars(select(Job).where(Job.kind == "sample_completions").order_by(Job.id.desc())).first()
        assert sampled is not None and sampled.state == "succeeded", sampled and sampled.error
        dropped = sampled.result["dropped_empty"] + sampled.result["dropped_identical"]
    # Every demo prompt, K answers each, for the next round of ranking; the empty or repeated answers a random
    # tiny model writes now and then are never queued, and the job counts them.
    assert produced + dropped == 100 * 4 and produced >= 100 * 4 * 0.9, (produced, sampled.result)


@pytest.mark.slow
def test_the_demo_measures_its_policy_once_and_the_training_form_says_how_long_a_run_takes(demo) -> None:  # type: ignore[no-untyped-def]
    app, accounts, project_id = demo
    settings = app.state.settings
    eng = _Page(app, "engineer@example.org", accounts["engineer@example.org"])
    prompts = _export(eng, app, project_id, "prompts")
    before = eng.get(f"/projects/{project_id}/training?kind=grpo").text
    assert "not measured yet" in before and "python -m training speed --model" in before
    assert measure_speed(settings, "tiny", encoder=False) == []
    assert speed_unmeasured(settings, "tiny", encoder=False) == []  # once: a second start measures nothing
    page = eng.get(f"/projects/{project_id}/training?kind=grpo&export_id={prompts}").text
    found = re.search(r'id="estimate-minutes" data-minutes="(\d+)">About ', page)
    assert found and int(found.group(1)) >= 1, page[page.find('id="estimate"'):][:2000]
    assert "on demo-policy (cpu" in page


def test_the_demo_ships_pairs_to_learn_from_and_the_form_offers_them_over_a_first_days_few(demo) -> None:  # type: ignore[no-untyped-def]
    app, accounts, project_id = demo
    with app.state.session_factory() as db:
        premade = db.scalars(select(Export).where(Export.project_id == project_id)).one()
        assert (premade.kind, premade.row_counts) == ("pairs", {"split.train": 220, "split.heldout": 46})
        rows = [json.loads(line) for line in Path(training_runs.export_file(app.state.settings.data_dir, premade))
                .read_text().splitlines()]
        assert len(rows) == 266 and {"prompt", "chosen", "rejected", "split"} <= set(rows[0])
        premade_id = premade.id
    eng = _Page(app, "engineer@example.org", accounts["engineer@example.org"])
    form = eng.get(f"/projects/{project_id}/training").text
    assert re.search(rf'<option value="{premade_id}"[^>]*data-preferred[^>]*selected>#{premade_id} pairs · jsonl · 266 '
                     r'rows · pre-made</option>', form)
    _rank_some(app, accounts, project_id, per_annotator=3)
    mine = _export(eng, app, project_id, "pairs")  # a first day's few pairs, newer than the pre-made ones
    form = html.unescape(eng.get(f"/projects/{project_id}/training").text)
    chosen = re.search(r'<option value="(\d+)"[^>]*selected>#\d+ pairs', form)
    assert chosen and int(chosen.group(1)) == premade_id  # still the pre-made pairs: there is too little of one's own
    warning = re.search(rf'<option value="{mine}"[^>]*data-warning="([^"]*)"', form)
    assert warning and "too few to learn from" in warning.group(1)
    assert f"For a first reward model, train on export #{premade_id}: the demo's 220 pre-made training pairs" in (
        warning.group(1))


def test_a_run_on_a_first_days_few_pairs_says_so_and_names_the_pre_made_ones(demo) -> None:  # type: ignore[no-untyped-def]
    app, accounts, project_id = demo
    _rank_some(app, accounts, project_id, per_annotator=3)
    eng = _Page(app, "engineer@example.org", accounts["engineer@example.org"])
    mine = _export(eng, app, project_id, "pairs")
    started = eng.post(f"/projects/{project_id}/training", {"kind": "reward", "export_id": str(mine), "base_model": "",
                                                            "reward_run_id": "", "config": "steps = 1"})
    assert started.status_code == 303, started.text[-2000:]
    page = html.unescape(eng.get(started.headers["location"]).text)  # queued: nothing needs to run for this
    warning = page.split('id="small-data">', 1)[1].split("</p>", 1)[0]
    assert "too few to learn from" in warning and "the demo's 220 pre-made training pairs" in warning
