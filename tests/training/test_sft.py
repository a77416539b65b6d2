"""SFT: completion-only targets, packing that keeps examples apart, chat messages, and proof that it learns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.training.tiny import addition_split, char_tokenizer, save_tiny, tiny_gpt2
from training.causal_lm import encode_examples, pack, packed_logprobs, target_logprobs
from training.config import SFTConfig
from training.data import PromptRow, SFTRow, load_sft
from training.evaluate import EvalConfig, evaluate
from training.loop import run
from training.policy import load_policy, prepare_tokenizer
from training.rewards import build_reward_functions
from training.run_info import read_metrics
from training.sft import SFTTrainer, main

CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}\n{% endfor %}" \
                "{% if add_generation_prompt %}a:{% endif %}"


@pytest.fixture
def tiny(tmp_path):
    tok = prepare_tokenizer(char_tokenizer())
    return save_tiny(tiny_gpt2(tok, seed=1), tok, tmp_path / "base"), tok


def write_sft(path: Path, train, heldout=()) -> Path:
    with path.open("w") as fh:
        for (p, a), split in [(x, "train") for x in train] + [(x, "heldout") for x in heldout]:
            fh.write(json.dumps({"prompt": p, "completion": a, "split": split, "origin": "best_ranked"}) + "\n")
    return path


def test_targets_are_the_completion_and_eos_and_long_prompts_lose_their_oldest_tokens():
    tok = prepare_tokenizer(char_tokenizer())
    (short, long_) = encode_examples(tok, ["1+2=", "123456789+1="], ["3", "123456790"], max_length=12)
    assert tok.decode(short.prompt) == "1+2=" and short.target == tok("3")["input_ids"] + [tok.eos_token_id]
    assert not short.truncated
    # 12 prompt + 10 target tokens into 12: the target keeps its 10, the prompt its newest 2 ("1=") … but never
    # less than a quarter of max_length (3): the prompt keeps "+1=" and the target loses its last token
    assert long_.truncated and tok.decode(long_.prompt) == "+1=" and len(long_.prompt) + len(long_.target) == 12


def test_packed_rows_score_each_example_as_if_it_were_alone(tiny):
    path, _ = tiny
    model, tok = load_policy(path)
    examples = encode_examples(tok, ["1+2=", "3+4=", "9+9="], ["3", "7", "18"], max_length=16)
    (row,) = pack(examples, max_length=32)
    assert row.positions == [0, 1, 2, 3, 4, 5] * 2 + [0, 1, 2, 3, 4, 5, 6]
    packed, packed_mask = packed_logprobs(model, [row], tok.pad_token_id, torch.device("cpu"))
    alone, alone_mask = target_logprobs(model, examples, tok.pad_token_id, torch.device("cpu"))
    assert packed_mask.sum().item() == alone_mask.sum().item() == 2 + 2 + 3  # answer tokens + EOS, nothing else
    assert packed[packed_mask.bool()].tolist() == pytest.approx(alone[alone_mask.bool()].tolist(), abs=1e-5)


def test_chat_messages_are_rendered_with_the_chat_template_and_only_the_answer_is_a_target(tmp_path):
    tok = prepare_tokenizer(char_tokenizer())
    tok.chat_template = CHAT_TEMPLATE
    data = tmp_path / "chat.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "1+2="},
                                             {"role": "assistant", "content": "3"}]}) + "\n")
    (row,) = load_sft(data)
    assert row.prompt == [{"role": "user", "content": "1+2="}] and row.completion == "3"
    (example,) = encode_examples(tok, [row.prompt], [row.completion], max_length=32)
    assert tok.decode(example.prompt) == "u:1+2=\na:"
    assert example.target == tok("3")["input_ids"] + [tok.eos_token_id]


def test_bad_rows_name_the_line_and_the_field(tmp_path):
    data = tmp_path / "bad.jsonl"
    data.write_text('{"prompt": "a", "completion": "b"}\n{"prompt": "a"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:line 2: missing field 'completion'"):
        load_sft(data)
    assert main(["--train", str(data), "--model", "m", "--out", str(tmp_path / "o")]) == 2


@pytest.mark.slow
def test_sft_learns_addition_and_its_answers_become_right(tiny, tmp_path):
    path, _ = tiny
    train, heldout = addition_split(80, 20, seed=2)
    rows = [SFTRow(prompt=p, completion=a) for p, a in train]
    model, tok = load_policy(path)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    config = SFTConfig(model=str(path), out=str(tmp_path / "out"), steps=300, lr=1e-3, batch_size=32,
                       progress=False, eval_every=50)
    trainer = SFTTrainer(config, rows, [SFTRow(prompt=p, completion=a) for p, a in heldout], model=model,
                         tokenizer=tok)
    before = trainer.evaluate()
    # the reward: exact match of the greedy answer on training prompts
    functions, exact = build_reward_functions(["gsm8k_exact_match"]), EvalConfig(k=1, max_new_tokens=4, seed=0)
    prompts = [PromptRow(prompt=p, reference=a) for p, a in train[:20]]
    accuracy_before = evaluate(model, tok, prompts, functions, None, exact)["policy"]["greedy_accuracy"]
    result = run(trainer)
    accuracy_after = evaluate(trainer.unwrapped(), tok, prompts, functions, None, exact)["policy"]["greedy_accuracy"]
    assert sum(not torch.equal(p, start[n]) for n, p in trainer.unwrapped().named_parameters()) > 0
    assert result.eval["loss"] < before["loss"] - 1.0 and result.eval["split"] == "heldout"
    assert result.eval["perplexity"] == pytest.approx(torch.tensor(result.eval["loss"]).exp().item())
    assert accuracy_before < 0.1 and accuracy_after >= 0.8, (accuracy_before, accuracy_after)
    rows_logged = read_metrics(tmp_path / "out" / "metrics.jsonl")
    assert [r["step"] for r in rows_logged] == list(range(1, 301))  # a short run logs every step, once
    assert {"eval_loss", "eval_perplexity"} <= set(rows_logged[49])


@pytest.mark.slow
def test_cli_end_to_end_packed_with_resume_and_a_model_plain_transformers_loads(tiny, tmp_path):
    path, _ = tiny
    train, heldout = addition_split(40, 10, seed=3)
    data = write_sft(tmp_path / "sft.jsonl", train, heldout)
    out = tmp_path / "run"
    common = ["--train", str(data), "--model", str(path), "--out", str(out), "--set", "batch_size=4",
              "--set", "packing=true", "--set", "max_length=24", "--set", "lr=1e-3", "--set", "save_every=3",
              "--quiet"]
    assert main(common + ["--set", "steps=3"]) == 0
    assert main(common + ["--set", "steps=6", "--resume"]) == 0
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6] and all("loss" in r for r in rows)
    report = json.loads((out / "eval.json").read_text())
    assert report["examples"] == 10 and report["split"] == "heldout" and report["steps"] == 6
    run_info = json.loads((out / "run.json").read_text())
    assert run_info["method"] == "sft" and run_info["resumed_from_step"] == 3 and run_info["config"]["packing"]
    assert len(run_info["data"]["train"]["sha256"]) == 64
    trained = AutoModelForCausalLM.from_pretrained(out / "model")  # plain transformers, no preflab code
    base = AutoModelForCausalLM.from_pretrained(path)
    assert any(not torch.equal(a, b) for a, b in zip(trained.parameters(), base.parameters(), strict=True))


@pytest.mark.slow
def test_lora_sft_saves_the_merged_model_and_the_adapter(tiny, tmp_path):
    path, _ = tiny
    data = write_sft(tmp_path / "sft.jsonl", addition_split(16, 0, seed=4)[0])
    out = tmp_path / "lora"
    assert main(["--train", str(data), "--model", str(path), "--out", str(out), "--set", "steps=3",
                 "--set", "lora=true", "--set", "lora_r=4", "--set", "lr=1e-2", "--set", "batch_size=8",
                 "--quiet"]) == 0
    assert (out / "model" / "adapter" / "adapter_config.json").exists()
    merged = AutoModelForCausalLM.from_pretrained(out / "model")
    base = AutoModelForCausalLM.from_pretrained(path)
    assert any(not torch.equal(a, b) for a, b in zip(merged.parameters(), base.parameters(), strict=True))
