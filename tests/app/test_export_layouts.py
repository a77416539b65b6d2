"""Pairs exports in TRL's layouts: standard (text) or conversational (message lists), loaded by `datasets` and
trained on by TRL's own DPOTrainer and RewardTrainer, unchanged."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session

from app.exports import writer as export_writer
from app.imports.service import import_file
from app.models import Project, User
from tests.support.chat import assistant, user

PRESETS = Path(__file__).parent / "data" / "imports" / "presets"
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant: {% endif %}")




def _export(engine: Any, project: Project, tmp_path: Path, fmt: str, layout: str | None) -> Path:
    out = tmp_path / f"{fmt}-{layout}"
    export_writer.write_export(engine, export_writer.ExportSpec(project.id, "pairs", fmt, layout=layout), out,
                               secret="s" * 40)
    return out


def test_layouts_write_text_or_messages_and_keep_multi_turn_responses(db: Session, engine: Any, project: Project,
                                                                      tmp_path: Path):
    lead = db.get(User, project.created_by_id)
    chosen = [assistant("Which city?"), user("Rome"), assistant("Day 1: the Forum.")]
    import_file(db, project, "c.jsonl", (json.dumps(
        {"prompt": [user("Plan a trip")], "chosen": chosen, "rejected": [assistant("No.")]}) + "\n").encode(),
        actor=lead)
    db.commit()
    (row,) = [json.loads(x) for x in (_export(engine, project, tmp_path, "jsonl", None) / "pairs.jsonl")
              .read_text().splitlines()]
    assert row["prompt"] == [user("Plan a trip")] and row["chosen"] == chosen
    assert row["rejected"] == [assistant("No.")]
    (row,) = [json.loads(x) for x in (_export(engine, project, tmp_path, "jsonl", "standard") / "pairs.jsonl")
              .read_text().splitlines()]
    assert row["prompt"] == "user: Plan a trip" and row["rejected"] == "No."
    assert row["chosen"] == "assistant: Which city?\nuser: Rome\nassistant: Day 1: the Forum."
    out = tmp_path / "aggregated"
    export_writer.write_export(engine, export_writer.ExportSpec(project.id, "pairs", "jsonl", aggregation="aggregated"),
                               out, secret="s" * 40)
    (row,) = [json.loads(x) for x in (out / "pairs.jsonl").read_text().splitlines()]
    assert row["chosen"] == chosen and row["rejected"] == [assistant("No.")]


def test_a_text_project_exports_conversational_when_asked(db: Session, engine: Any, project: Project,
                                                          tmp_path: Path):
    lead = db.get(User, project.created_by_id)
    import_file(db, project, "t.jsonl", (PRESETS / "trl_standard_explicit.jsonl").read_bytes(), actor=lead)
    db.commit()
    rows = [json.loads(x) for x in (_export(engine, project, tmp_path, "jsonl", "conversational") / "pairs.jsonl")
            .read_text().splitlines()]
    assert rows[0]["prompt"] == [user("The sky is")] and rows[0]["chosen"] == [assistant(" blue.")]


def test_the_api_takes_a_layout_and_refuses_an_unknown_one(
    db: Session, api: Callable[..., Any], token_for: Callable[..., str], project: Project
):
    client = api(token_for(db, db.get(User, project.created_by_id)))
    db.commit()
    url = f"/api/projects/{project.id}/exports"
    response = client.post(url, json={"kind": "pairs", "format": "jsonl", "layout": "conversational"})
    assert response.status_code == 202, response.text
    export = client.get(f"/api/exports/{response.json()['export_id']}").json()
    assert export["filters"]["layout"] == "conversational"
    response = client.post(url, json={"kind": "pairs", "format": "jsonl", "layout": "chat"})
    assert response.status_code == 422 and "layout" in response.text


@pytest.mark.slow
def test_trl_dpo_and_reward_trainers_train_on_a_conversational_export(db: Session, engine: Any, project: Project,
                                                                      tmp_path: Path):
    pytest.importorskip("trl")
    import datasets
    import torch
    from transformers import GPT2Config, GPT2ForSequenceClassification
    from trl import DPOConfig, DPOTrainer, RewardConfig, RewardTrainer

    from tests.training.tiny import char_tokenizer, tiny_gpt2

    if engine.dialect.name != "sqlite":
        pytest.skip(reason="one backend is enough for the trainers")
    lead = db.get(User, project.created_by_id)
    for name in ("ultrafeedback.jsonl", "trl_conversational_explicit.jsonl", "trl_conversational_implicit.jsonl"):
        import_file(db, project, name, (PRESETS / name).read_bytes(), actor=lead, on_duplicate="skip")
    db.commit()
    dataset = datasets.load_from_disk(str(_export(engine, project, tmp_path, "hf", "conversational") / "pairs"))
    assert len(dataset) == 6 and dataset[0]["prompt"][0]["role"] == "user"
    tokenizer = char_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE

    policy = tiny_gpt2(tokenizer, n_positions=256)
    before = [p.detach().clone() for p in policy.parameters()]
    dpo = DPOTrainer(model=policy, ref_model=tiny_gpt2(tokenizer, n_positions=256), args=DPOConfig(
        output_dir=str(tmp_path / "dpo"), max_steps=6, per_device_train_batch_size=6, learning_rate=5e-3,
        report_to="none", save_strategy="no", logging_steps=1, use_cpu=True, max_length=256, beta=0.1),
        train_dataset=dataset, processing_class=tokenizer)
    dpo.train()
    losses = [e["loss"] for e in dpo.state.log_history if "loss" in e]
    assert any(not torch.equal(a, b) for a, b in zip(before, policy.parameters(), strict=True))
    assert losses[-1] < losses[0]

    torch.manual_seed(0)
    scorer = GPT2ForSequenceClassification(GPT2Config(vocab_size=len(tokenizer), n_positions=256, n_embd=32,
                                                      n_layer=1, n_head=2, num_labels=1,
                                                      pad_token_id=tokenizer.pad_token_id))
    before = [p.detach().clone() for p in scorer.parameters()]
    reward = RewardTrainer(model=scorer, args=RewardConfig(
        output_dir=str(tmp_path / "rm"), max_steps=6, per_device_train_batch_size=6, learning_rate=5e-3,
        report_to="none", save_strategy="no", logging_steps=1, use_cpu=True, max_length=256, disable_dropout=True),
        train_dataset=dataset, processing_class=tokenizer)
    reward.train()
    losses = [e["loss"] for e in reward.state.log_history if "loss" in e]
    assert any(not torch.equal(a, b) for a, b in zip(before, scorer.parameters(), strict=True))
    assert losses[-1] < losses[0]
