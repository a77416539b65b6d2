"""Process supervision from the app: a prm run on a steps export, then GRPO with that finished PRM run as its process
reward, with the lineage back to the steps export; the wrong pairings are refused before any job exists.

The steps export is written here in its documented layout (TRL's stepwise supervision: `prompt`, `completions` =
the steps, `labels` = one boolean per step, plus provenance columns), as the export job will write it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from app.models import Export, Job, Prompt, TrainingRun
from app.projects import projects
from app.worker import Worker
from tests.conftest import only_on
from tests.training.tiny import char_tokenizer, save_tiny, tiny_gpt2


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tok = char_tokenizer()
    return save_tiny(tiny_gpt2(tok, n_positions=64), tok, tmp_path_factory.mktemp("policy"))


def _work(app) -> None:  # type: ignore[no-untyped-def]
    Worker(app.state.settings, session_factory=app.state.session_factory, heartbeat_s=0.2,
           poll_s=0.05).run(exit_when_idle=True)


def _project(db, make_user, make_project, api, token_for):  # type: ignore[no-untyped-def]
    lead, engineer = make_user(db, "lead"), make_user(db, "engineer")
    project = make_project(db, lead=lead, k=2)
    projects.add_member(db, project, lead, email=engineer.email, role="engineer")
    for i in range(8):
        db.add(Prompt(project_id=project.id, text=f"what is {i}", text_hash=f"h{i}",
                      split="heldout" if i % 4 == 3 else "train"))
    eng = api(token_for(db, engineer))
    db.commit()
    return project, engineer, eng


def _steps_export(db, app, project, engineer) -> int:  # type: ignore[no-untyped-def]
    """A finished steps export of the project, its JSONL in the export directory."""
    export = Export(project_id=project.id, kind="steps", format="jsonl", created_by_id=engineer.id)
    db.add(export)
    db.flush()
    root = Path(app.state.settings.data_dir) / "exports" / str(export.id)
    root.mkdir(parents=True, exist_ok=True)  # the data directory outlives a test; export ids start again
    lines = []
    for i in range(16):
        labels = [True, i % 3 != 0, i % 3 != 0 and i % 2 == 0]
        lines.append(json.dumps({"prompt": f"what is {i % 8}", "completions": ["first add", "then carry", "answer"],
                                 "labels": labels, "split": "heldout" if i % 4 == 3 else "train",
                                 "completion_id": 100 + i, "annotators": 2}))
    data = ("\n".join(lines) + "\n").encode()
    (root / "steps.jsonl").write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    export.path, export.files, export.sha256, export.row_count = str(root), {"steps.jsonl": digest}, digest, 16
    db.commit()
    return export.id


def _prompts_export(eng, app, project_id: int) -> int:  # type: ignore[no-untyped-def]
    r = eng.post(f"/api/projects/{project_id}/exports", json={"kind": "prompts", "format": "jsonl"})
    assert r.status_code == 202, r.text
    _work(app)
    return r.json()["export_id"]


def test_a_prm_run_then_grpo_on_it_with_lineage(db, app, make_user, make_project, token_for, api,
                                                policy_dir) -> None:
    only_on(db, "postgresql", "the trainer is the same; jobs and runs are tested on both")
    project, engineer, eng = _project(db, make_user, make_project, api, token_for)
    project.settings = dict(project.settings or {}) | {"step_labels": True, "step_separator": ";"}
    steps = _steps_export(db, app, project, engineer)
    url = f"/api/projects/{project.id}/training-runs"
    # base model left blank: the shipped MiniLM, as for a reward model
    r = eng.post(url, json={"kind": "prm", "export_id": steps,
                            "config": {"steps": 3, "batch_size": 4, "max_length": 32, "log_every": 1}})
    assert r.status_code == 202, r.text
    prm_id = r.json()["run_id"]
    _work(app)
    prm = eng.get(f"/api/training-runs/{prm_id}").json()
    assert prm["state"] == "succeeded", eng.get(f"/api/jobs/{r.json()['job_id']}").json()
    assert {"step_accuracy", "first_error_accuracy", "pairs"} <= set(prm["eval"])
    assert prm["eval"]["split"] == "heldout" and prm["eval"]["completions"] == 4  # the export's held-out rows
    assert [m["step"] for m in prm["metrics"]] == [1, 2, 3]
    # the project's step separator is the rule the PRM keeps, so GRPO cuts rollouts the way the labels were cut
    assert json.loads((Path(prm["model_dir"]) / "preflab_prm.json").read_text())["step_pattern"] == ";"

    prompts = _prompts_export(eng, app, project.id)
    r = eng.post(url, json={"kind": "grpo", "export_id": prompts, "base_model": str(policy_dir),
                            "reward_run_id": prm_id, "config": {
                                "steps": 2, "group_size": 2, "prompts_per_step": 2, "max_new_tokens": 4,
                                "eval_k": 2, "process_reward_weight": 0.5, "reward_fn": ["length_penalty"]}})
    assert r.status_code == 202, r.text
    grpo_id = r.json()["run_id"]
    _work(app)
    page = eng.get(f"/projects/{project.id}/training")
    assert page.status_code == 200 and f"#{prm_id} prm (process reward, GRPO only)" in page.text
    grpo = eng.get(f"/api/training-runs/{grpo_id}").json()
    resolved = grpo["config"]["resolved"]
    assert resolved["process_reward_model"] == prm["model_dir"] and resolved["reward_model"] is None
    assert grpo["state"] == "succeeded", eng.get(f"/api/jobs/{r.json()['job_id']}").json()
    assert "reward/process_reward_model" in grpo["metrics"][-1] and "reward/length_penalty" in grpo["metrics"][-1]
    lineage = grpo["lineage"]
    assert lineage["parent_run_id"] == prm_id
    assert lineage["ancestors"] == [{"run_id": prm_id, "kind": "prm", "export_id": steps}]



def test_wrong_pairings_are_refused_before_any_job_exists(db, app, make_user, make_project, token_for, api,
                                                          policy_dir) -> None:
    project, engineer, eng = _project(db, make_user, make_project, api, token_for)
    steps = _steps_export(db, app, project, engineer)
    prompts = _prompts_export(eng, app, project.id)
    done_prm = TrainingRun(project_id=project.id, kind="prm", export_id=steps, state="succeeded",
                           model_dir=str(policy_dir), created_by_id=engineer.id)
    db.add(done_prm)
    db.commit()
    prm_id = done_prm.id
    url = f"/api/projects/{project.id}/training-runs"
    before = (db.scalar(select(func.count(Job.id))), db.scalar(select(func.count(TrainingRun.id))))
    db.rollback()
    policy = str(policy_dir)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"kind": "prm", "export_id": prompts}, "export_id"),  # a prm run needs a steps export
        ({"kind": "reward", "export_id": steps}, "export_id"),  # and a reward model a pairs export
        ({"kind": "prm", "export_id": steps, "reward_run_id": prm_id}, "reward_run_id"),
        ({"kind": "rft", "export_id": prompts, "base_model": policy, "reward_run_id": prm_id}, "reward_run_id"),
        ({"kind": "ppo", "export_id": prompts, "base_model": policy, "reward_run_id": prm_id}, "reward_run_id"),
        ({"kind": "grpo", "export_id": prompts, "base_model": policy, "reward_run_id": prm_id,
          "config": {"process_reward_model": "/elsewhere"}}, "config.process_reward_model"),
        ({"kind": "prm", "export_id": steps, "config": {"step_pattern": "("}}, "config.step_pattern"),
        ({"kind": "prm", "export_id": steps, "config": {"threshold": 1.5}}, "config.threshold"),
    ]
    for body, field in cases:
        r = eng.post(url, json=body)
        assert r.status_code == 422, (body, r.text)
        assert r.json()["detail"][0]["field"] == field, (body, r.json())
    assert (db.scalar(select(func.count(Job.id))), db.scalar(select(func.count(TrainingRun.id)))) == before
