"""Training from the app: bad configs refused before any job; the whole loop on CPU with tiny models
(rank → export → reward model → GRPO → evaluate → sample into project) with its lineage; cancel; a crash."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from sqlalchemy import func, select
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast

from app.models import Completion, Job, Project, Prompt, TrainingRun, User
from app.projects import projects
from app.runs import iteration
from app.worker import Worker
from tests.conftest import only_on
from tests.support.clusters import use_clusters
from tests.training.tiny import char_tokenizer, save_tiny, tiny_gpt2

WORDS = ["what", "is", "the", "answer", "good", "bad", "wrong", "right", "it", "a", "b", "c"]


def _tiny_reward_base(path: Path) -> Path:
    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", *WORDS])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]",
                                        cls_token="[CLS]", sep_token="[SEP]")
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128, num_labels=1, pad_token_id=0)
    BertForSequenceClassification(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    tok = char_tokenizer()
    return {"policy": save_tiny(tiny_gpt2(tok, n_positions=64), tok, root / "policy"),
            "reward": _tiny_reward_base(root / "reward")}


def _ranked_project(db, make_user, make_project, api, token_for, n: int = 12):  # type: ignore[no-untyped-def]
    lead, annotator, engineer = make_user(db, "lead"), make_user(db, "annotator"), make_user(db, "engineer")
    project = make_project(db, lead=lead, k=2)
    projects.add_member(db, project, lead, email=annotator.email, role="annotator")
    projects.add_member(db, project, lead, email=engineer.email, role="engineer")
    for i in range(n):
        prompt = Prompt(project_id=project.id, text=f"what is {i}", text_hash=f"h{i}",
                        split="heldout" if i % 4 == 3 else "train")
        db.add(prompt)
        db.flush()
        db.add_all([Completion(prompt_id=prompt.id, text="good right answer"),
                    Completion(prompt_id=prompt.id, text="bad wrong")])
    ann, eng = api(token_for(db, annotator)), api(token_for(db, engineer))
    db.commit()
    while True:
        r = ann.get(f"/api/projects/{project.id}/tasks/next")
        if r.status_code == 204:
            break
        task = r.json()
        good = next(c["id"] for c in task["completions"] if c["text"].startswith("good"))
        bad = next(c["id"] for c in task["completions"] if c["text"].startswith("bad"))
        assert ann.post(f"/api/projects/{project.id}/rankings", json={
            "assignment_id": task["assignment_id"], "tiers": [[good], [bad]], "rubric_version": 1,
            "submission_id": f"s{task['assignment_id']}"}).status_code == 201
    return project.id, eng


def _work(app) -> None:  # type: ignore[no-untyped-def]
    Worker(app.state.settings, session_factory=app.state.session_factory, heartbeat_s=0.2,
           poll_s=0.05).run(exit_when_idle=True)


def _export(client, app, project_id: int, kind: str) -> int:  # type: ignore[no-untyped-def]
    r = client.post(f"/api/projects/{project_id}/exports", json={"kind": kind, "format": "jsonl"})
    assert r.status_code == 202, r.text
    _work(app)
    return r.json()["export_id"]


def test_bad_runs_are_refused_before_any_job_exists(db, app, make_user, make_project, token_for, api,
                                                    models_dir) -> None:
    project_id, eng = _ranked_project(db, make_user, make_project, api, token_for, n=4)
    pairs = _export(eng, app, project_id, "pairs")
    url = f"/api/projects/{project_id}/training-runs"
    before = db.scalar(select(func.count(Job.id)))
    db.rollback()
    cases: list[tuple[dict[str, Any], str]] = [
        ({"kind": "reward", "export_id": pairs, "config": {"learning_rate": -1}}, "config.learning_rate"),
        ({"kind": "reward", "export_id": pairs, "config": {"no_such_field": 1}}, "config.no_such_field"),
        ({"kind": "reward", "export_id": pairs, "config": {"out": "/etc"}}, "config.out"),
        ({"kind": "grpo", "export_id": pairs, "base_model": str(models_dir["policy"])}, "export_id"),
        ({"kind": "reward", "export_id": 99999}, "export_id"),
        ({"kind": "reward", "export_id": pairs, "base_model": "/nonexistent"}, "base_model"),
    ]
    for body, field in cases:
        r = eng.post(url, json=body)
        assert r.status_code == 422, (body, r.text)
        assert r.json()["detail"][0]["field"] == field, (body, r.json())
    assert db.scalar(select(func.count(Job.id))) == before
    assert db.scalar(select(func.count(TrainingRun.id))) == 0


def test_a_full_round_with_no_pairs_to_retrain_on_is_refused_before_any_job(db, app, make_user, make_project,
                                                                            token_for, api, browser, tmp_path) -> None:
    project_id, eng = _ranked_project(db, make_user, make_project, api, token_for, n=4)
    pairs = _export(eng, app, project_id, "pairs")  # after every ranking: nothing is new since
    reward = TrainingRun(project_id=project_id, kind="reward", state="succeeded", export_id=pairs, config={},
                         model_dir=str(tmp_path / "rm"))
    db.add(reward)
    db.flush()
    policy = TrainingRun(project_id=project_id, kind="grpo", state="succeeded", parent_run_id=reward.id, config={},
                         model_dir=str(tmp_path / "policy"))
    db.add(policy)
    db.commit()
    policy_id, before = policy.id, db.scalar(select(func.count(Job.id)))
    db.rollback()  # no read left open: on SQLite it would hold off the app's writes
    r = eng.post(f"/api/training-runs/{policy_id}/iterate", json={"replay_share": 0})
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["message"].startswith(f"no pairs to retrain the reward model on: none labelled "
                                                       f"since its export #{pairs}")
    assert db.scalar(select(func.count(Job.id))) == before
    db.rollback()
    # Replaying every earlier pair gives the reward model something to train on: the round starts, and the jobs
    # page says which step of it each job is.
    r = eng.post(f"/api/training-runs/{policy_id}/iterate", json={"replay_share": 1})
    assert r.status_code == 202
    email = db.scalar(select(User.email).where(User.role == "engineer"))
    db.rollback()
    page = browser()
    page.login(email)
    row = next(row for row in page.get(f"/projects/{project_id}/jobs").text.split("<tr>")
               if f"#{r.json()['job_id']}<" in row)
    assert "full round, step 1 of 5: export the new pairs" in row


def test_a_full_round_goes_where_the_engineer_chooses_or_where_its_runs_went(db, app, make_user, make_project,
                                                                            token_for, api, browser, tmp_path,
                                                                            monkeypatch) -> None:
    use_clusters(app, monkeypatch, tmp_path / "clusters.toml", {"hpc": {"kind": "slurm", "shared_dir": str(tmp_path)}})
    project_id, eng = _ranked_project(db, make_user, make_project, api, token_for, n=4)
    pairs = _export(eng, app, project_id, "pairs")
    on_hpc = {"cluster": "hpc", "kind": "slurm", "resources": {}}
    reward = TrainingRun(project_id=project_id, kind="reward", state="succeeded", export_id=pairs, config={},
                         model_dir=str(tmp_path / "rm"))
    db.add(reward)
    db.flush()
    policy = TrainingRun(project_id=project_id, kind="grpo", state="succeeded", parent_run_id=reward.id,
                         config={"where": on_hpc}, model_dir=str(tmp_path / "policy"))
    db.add(policy)
    db.commit()
    policy_id = policy.id
    db.rollback()
    url = f"/api/training-runs/{policy_id}/iterate"
    refused = eng.post(url, json={"replay_share": 1, "where": "nowhere"})
    assert refused.status_code == 422 and refused.json()["detail"][0]["field"] == "where", refused.text
    # The run page offers the choice, the run's own place first.
    email = db.scalar(select(User.email).where(User.role == "engineer"))
    db.rollback()
    page = browser()
    page.login(email)
    form = page.get(f"/training-runs/{policy_id}").text.split('action="/training-runs/' + str(policy_id) + '/iterate"')[1]
    assert '<option value="">as this run (hpc)</option>' in form.split("</form>")[0]
    r = eng.post(url, json={"replay_share": 1, "where": "local"})
    assert r.status_code == 202, r.text
    assert db.get(Job, r.json()["job_id"]).payload["iteration"]["placed"] == {}
    db.rollback()
    # A round's runs: the chosen place (local: none), or else where the run each continues went.
    chosen, kept = (TrainingRun(project_id=project_id, kind="reward", config={"user": {}, "where": on_hpc})
                    for _ in range(2))
    iteration._place(chosen, policy, {})
    iteration._place(kept, policy, None)
    assert "where" not in chosen.config and kept.config["where"] == on_hpc


@pytest.mark.slow
def test_the_loop_from_labels_to_a_policy_and_back_with_lineage(db, app, make_user, make_project, token_for, api,
                                                                models_dir) -> None:
    only_on(db, "postgresql", "the trainer is the same; jobs and runs are tested on both")
    project_id, eng = _ranked_project(db, make_user, make_project, api, token_for, n=12)
    pairs = _export(eng, app, project_id, "pairs")
    r = eng.post(f"/api/projects/{project_id}/training-runs", json={
        "kind": "reward", "export_id": pairs, "base_model": str(models_dir["reward"]),
        "config": {"steps": 6, "batch_size": 4, "eval_every": 3, "lr": 1e-3, "log_every": 1}})
    assert r.status_code == 202, r.text
    rm_id = r.json()["run_id"]
    _work(app)
    rm = eng.get(f"/api/training-runs/{rm_id}").json()
    assert rm["state"] == "succeeded", eng.get(f"/api/jobs/{r.json()['job_id']}").json()
    assert rm["metrics"] and rm["eval"]["pairs"] > 0 and "accuracy" in rm["eval"]
    assert rm["lineage"]["export_id"] == pairs
    check = rm["human_check"]  # the 3 held-out prompts' human pairs, scored by the new reward model
    assert check["heldout_human_pairs"] == 3 and 0.0 <= check["heldout_accuracy"] <= 1.0
    assert check["pairs_after_export"] == 0 and check["accuracy_after_export"] is None
    recheck = eng.post(f"/api/training-runs/{rm_id}/human-check")
    assert recheck.status_code == 202
    _work(app)
    assert eng.get(f"/api/jobs/{recheck.json()['job_id']}").json()["state"] == "succeeded"

    prompts_export = _export(eng, app, project_id, "prompts")
    r = eng.post(f"/api/projects/{project_id}/training-runs", json={
        "kind": "grpo", "export_id": prompts_export, "base_model": str(models_dir["policy"]), "reward_run_id": rm_id,
        "config": {"steps": 2, "group_size": 2, "prompts_per_step": 2, "max_new_tokens": 4, "eval_k": 2}})
    assert r.status_code == 202, r.text
    policy_id = r.json()["run_id"]
    _work(app)
    policy = eng.get(f"/api/training-runs/{policy_id}").json()
    assert policy["state"] == "succeeded", eng.get(f"/api/jobs/{r.json()['job_id']}").json()
    assert [m["step"] for m in policy["metrics"]][-1] >= 1 and {"reward_mean", "kl", "loss"} <= set(policy["metrics"][-1])
    assert policy["eval"] is not None and Path(policy["model_dir"]).is_dir()

    r = eng.post(f"/api/training-runs/{policy_id}/sample-into-project", json={"k": 2, "seed": 1})
    assert r.status_code == 202, r.text
    _work(app)
    sampled = eng.get(f"/api/jobs/{r.json()['job_id']}").json()
    assert sampled["state"] == "succeeded"
    produced = db.scalar(select(func.count(Completion.id)).where(Completion.source == f"policy:{policy_id}"))
    db.rollback()
    # The tiny random policy writes an empty or repeated answer now and then, which the job drops and counts.
    dropped = sampled["result"]["dropped_empty"] + sampled["result"]["dropped_identical"]
    assert produced + dropped == 12 * 2 and produced >= 12 * 2 * 0.75, (produced, sampled["result"])

    lineage = eng.get(f"/api/training-runs/{policy_id}").json()["lineage"]
    assert lineage["export_id"] == prompts_export and lineage["parent_run_id"] == rm_id
    assert lineage["ancestors"][0] == {"run_id": rm_id, "kind": "reward", "export_id": pairs}
    assert lineage["completions_produced"] == produced

    # One automated round from here: export new pairs (+ replay) → reward model from the previous one → prompts
    # export → policy from the current one → sample the next round. Each step is a job with its own record.
    r = eng.post(f"/api/training-runs/{policy_id}/iterate", json={"replay_share": 0.5, "k": 2})
    assert r.status_code == 202, r.text
    first_job = r.json()["job_id"]
    _work(app)  # runs every step: each one starts the next when it succeeds
    steps = []
    job_id: int | None = first_job
    while job_id is not None:
        job = eng.get(f"/api/jobs/{job_id}").json()
        assert job["state"] == "succeeded", job
        steps.append(job["kind"])
        job_id = (job["result"] or {}).get("next_job_id")
    assert steps == ["export", "train", "export", "train", "sample_completions"]
    runs = {r["id"]: r for r in eng.get(f"/api/projects/{project_id}/training-runs").json()}
    new_rm = next(r for r in runs.values() if r["kind"] == "reward" and r["id"] != rm_id)
    new_policy = next(r for r in runs.values() if r["kind"] == "grpo" and r["id"] != policy_id)
    assert new_rm["parent_run_id"] == rm_id and new_rm["state"] == "succeeded"
    assert new_policy["parent_run_id"] == new_rm["id"] and new_policy["base_model"].endswith(f"runs/{policy_id}/model")
    assert new_policy["lineage"]["ancestors"][:2] == [
        {"run_id": new_rm["id"], "kind": "reward", "export_id": new_rm["export_id"]},
        {"run_id": rm_id, "kind": "reward", "export_id": pairs}]
    produced = db.scalar(select(func.count(Completion.id)).where(Completion.source == f"policy:{new_policy['id']}"))
    db.rollback()
    dropped = job["result"]["dropped_empty"] + job["result"]["dropped_identical"]  # the last job: the sampling
    assert produced + dropped == 12 * 2 and produced >= 12 * 2 * 0.75, (produced, job["result"])


@pytest.mark.slow
def test_a_finished_reward_run_reprioritises_a_project_that_serves_by_uncertainty(db, app, make_user, make_project,
                                                                                 token_for, api, models_dir) -> None:
    only_on(db, "postgresql", "the trainer is the same; jobs and runs are tested on both")
    project_id, eng = _ranked_project(db, make_user, make_project, api, token_for, n=8)
    project = db.get(Project, project_id)
    project.settings = dict(project.settings or {}) | {"selection": "uncertainty"}  # as the lead's switch writes it
    db.commit()
    pairs = _export(eng, app, project_id, "pairs")
    r = eng.post(f"/api/projects/{project_id}/training-runs", json={
        "kind": "reward", "export_id": pairs, "base_model": str(models_dir["reward"]),
        "config": {"steps": 2, "batch_size": 4, "lr": 1e-3, "ensemble": 3}})
    assert r.status_code == 202, r.text
    _work(app)  # the reward run, then the priorities job it queues
    job = eng.get(f"/api/jobs/{r.json()['job_id']}").json()
    assert job["state"] == "succeeded" and job["result"]["priorities_job_id"], job
    assert eng.get(f"/api/jobs/{job['result']['priorities_job_id']}").json()["state"] == "succeeded"
    state = eng.get(f"/api/projects/{project_id}/selection").json()
    # the six train prompts (every fourth is held out) scored by the spread across the run's three heads
    assert (state["training_run_id"], state["prompts"], state["measure"]) == (r.json()["run_id"], 6, "spread")


def test_cancel_stops_the_trainer_and_a_crash_fails_with_the_log(db, app, make_user, make_project, token_for, api,
                                                                 models_dir, tmp_path) -> None:
    only_on(db, "sqlite", "the trainer is the same; jobs and runs are tested on both")
    project_id, eng = _ranked_project(db, make_user, make_project, api, token_for, n=8)
    pairs = _export(eng, app, project_id, "pairs")
    long = eng.post(f"/api/projects/{project_id}/training-runs", json={
        "kind": "reward", "export_id": pairs, "base_model": str(models_dir["reward"]),
        "config": {"steps": 100000, "batch_size": 2, "log_every": 1, "eval_every": 1000000,
                   "epochs": 100000}}).json()
    worker = Worker(app.state.settings, session_factory=app.state.session_factory, heartbeat_s=0.2)
    thread = threading.Thread(target=worker.run_one)
    thread.start()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not eng.get(f"/api/training-runs/{long['run_id']}").json()["metrics"]:
        time.sleep(0.2)
    assert eng.post(f"/api/training-runs/{long['run_id']}/cancel").json()["state"] == "cancelled"
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert eng.get(f"/api/jobs/{long['job_id']}").json()["state"] == "cancelled"

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "bert"}')
    (broken / "model.safetensors").write_bytes(b"not weights")
    crash = eng.post(f"/api/projects/{project_id}/training-runs", json={
        "kind": "reward", "export_id": pairs, "base_model": str(broken), "config": {"steps": 2}}).json()
    _work(app)
    job = eng.get(f"/api/jobs/{crash['job_id']}").json()
    assert job["state"] == "failed" and "exited with code" in job["error"]
    # why, in one line (the exception's last line); the traceback stays in the job's log
    reason = job["error"].split("exited with code 1: ", 1)[1]
    assert "\n" not in job["error"] and "Error" in reason, job["error"]
    assert eng.get(f"/api/training-runs/{crash['run_id']}").json()["state"] == "failed"


@pytest.mark.slow
def test_sft_dpo_and_rft_runs_from_the_app_train_and_sample_back(db, app, make_user, make_project, token_for, api,
                                                                  models_dir) -> None:
    only_on(db, "sqlite", "the trainer is the same; jobs and runs are tested on both")
    from transformers import AutoModelForCausalLM

    project_id, eng = _ranked_project(db, make_user, make_project, api, token_for, n=8)
    exports = {kind: _export(eng, app, project_id, kind) for kind in ("sft", "pairs", "prompts")}
    policy = str(models_dir["policy"])
    bodies = {
        "sft": {"export_id": exports["sft"], "config": {"steps": 3, "batch_size": 2, "lr": 1e-3}},
        "dpo": {"export_id": exports["pairs"], "config": {"steps": 3, "batch_size": 2, "lr": 1e-3}},
        "rft": {"export_id": exports["prompts"], "config": {
            "steps": 2, "steps_per_round": 1, "prompts_per_round": 2, "samples_per_prompt": 2, "batch_size": 2,
            "max_new_tokens": 4, "keep": "top_k", "reward_fn": ["length_penalty"], "eval_k": 2}},
    }
    runs = {}
    for kind, body in bodies.items():
        r = eng.post(f"/api/projects/{project_id}/training-runs", json={"kind": kind, "base_model": policy, **body})
        assert r.status_code == 202, (kind, r.text)
        runs[kind] = r.json()
    wrong = eng.post(f"/api/projects/{project_id}/training-runs", json={"kind": "dpo", "export_id": exports["sft"],
                                                                         "base_model": policy})
    assert wrong.status_code == 422 and "a dpo run needs a pairs export" in wrong.text
    _work(app)
    for kind, ids in runs.items():
        run = eng.get(f"/api/training-runs/{ids['run_id']}").json()
        assert run["state"] == "succeeded", (kind, eng.get(f"/api/jobs/{ids['job_id']}").json())
        assert [m["step"] for m in run["metrics"]] == list(range(1, len(run["metrics"]) + 1)) and run["metrics"]
        assert "loss" in run["metrics"][-1] and run["eval"]["steps"] == len(run["metrics"])
        assert AutoModelForCausalLM.from_pretrained(run["model_dir"]).config.model_type == "gpt2"
        assert eng.get(f"/api/jobs/{ids['job_id']}").json()["progress"] == {"done": len(run["metrics"]),
                                                                            "total": len(run["metrics"])}
    assert {"accuracy", "margin"} <= set(eng.get(f"/api/training-runs/{runs['dpo']['run_id']}").json()["metrics"][-1])
    assert {"reward_mean", "kept_fraction"} <= set(
        eng.get(f"/api/training-runs/{runs['rft']['run_id']}").json()["metrics"][-1])
    # an SFT model samples into the project like any policy
    r = eng.post(f"/api/training-runs/{runs['sft']['run_id']}/sample-into-project", json={"k": 2, "seed": 1})
    assert r.status_code == 202, r.text


def test_cli_queues_a_run_with_the_same_checks(db, app, make_user, make_project, token_for, api, models_dir,
                                               database_url, monkeypatch) -> None:
    from typer.testing import CliRunner

    from app.cli import cli

    project_id, eng = _ranked_project(db, make_user, make_project, api, token_for, n=4)
    pairs = _export(eng, app, project_id, "pairs")
    email = eng.get("/api/me").json()["email"]
    monkeypatch.setenv("PREFLAB_DATABASE_URL", database_url)
    monkeypatch.setenv("PREFLAB_DATA_DIR", str(app.state.settings.data_dir))
    runner = CliRunner()
    bad = runner.invoke(cli, ["train", "reward", "--project", str(project_id), "--export", str(pairs),
                              "--user", email, "--set", "learning_rate=-1"])
    assert bad.exit_code == 1 and "config.learning_rate" in bad.output
    ok = runner.invoke(cli, ["train", "reward", "--project", str(project_id), "--export", str(pairs),
                             "--user", email, "--base-model", str(models_dir["reward"]), "--set", "max_steps=2"])
    assert ok.exit_code == 0, ok.output
    runs = eng.get(f"/api/projects/{project_id}/training-runs").json()
    assert len(runs) == 1 and runs[0]["state"] == "queued" and runs[0]["config"]["user"] == {"max_steps": 2}


def test_compare_page_shows_two_runs_and_their_config_difference(db, app, make_user, make_project, token_for, api,
                                                                 models_dir, browser) -> None:
    project_id, eng = _ranked_project(db, make_user, make_project, api, token_for, n=4)
    pairs = _export(eng, app, project_id, "pairs")
    ids = [eng.post(f"/api/projects/{project_id}/training-runs", json={
        "kind": "reward", "export_id": pairs, "base_model": str(models_dir["reward"]),
        "config": {"steps": steps}}).json()["run_id"] for steps in (2, 3)]
    lead_email = eng.get("/api/me").json()["email"]
    page = browser()
    page.login(lead_email)
    html = page.get(f"/projects/{project_id}/training/compare?a={ids[0]}&b={ids[1]}").text
    assert f"Run #{ids[0]} and run #{ids[1]}" in html
    import re

    assert re.search(r'<span class="d-del">-\s+&#34;steps&#34;: 2,</span>', html)
    assert re.search(r'<span class="d-add">\+\s+&#34;steps&#34;: 3,</span>', html)


def test_validating_a_run_config_does_not_import_torch() -> None:
    # The web process checks every run's config against the trainer's dataclass; importing torch for that took
    # 3 s (12 s under load) of GIL-holding work on the first training request, stalling every annotator.
    code = ("import sys\n"
            "from app.runs import training_runs\n"
            "for kind, cfg in (('reward', {'epochs': 2}), ('grpo', {'group_size': 4}), ('ppo', {'samples_per_prompt': 2})):\n"
            "    training_runs._validate_config(kind, cfg, {})\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
