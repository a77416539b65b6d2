"""Evaluation: Pass@K / Maj@K by hand, a policy against itself (KL 0, win rate ½), and the CLI."""

from __future__ import annotations

import json

import pytest

from tests.training.tiny import char_tokenizer, save_tiny, tiny_gpt2
from training.data import PromptRow
from training.evaluate import EvalConfig, evaluate, main, majority_correct, pass_at_k, public
from training.policy import Reference, load_policy
from training.rewards import build_reward_functions


def test_pass_at_k_by_hand():
    # n = 4, c = 1, k = 2: 1 − C(3,2)/C(4,2) = 1 − 3/6 = 0.5
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    assert pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 1, 4) == 1.0


def test_majority_vote_uses_final_numbers():
    assert majority_correct(["so 7", "#### 7", "8"], "A: 7")
    assert not majority_correct(["8", "8.0", "7"], "#### 7")


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="k must"):
        EvalConfig(k=0)
    with pytest.raises(ValueError, match="top_p"):
        EvalConfig(top_p=0)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    tok = char_tokenizer()
    return save_tiny(tiny_gpt2(tok, seed=0), tok, tmp_path_factory.mktemp("tiny"))


def test_policy_against_itself(tiny_dir, tmp_path):
    model, tok = load_policy(tiny_dir)
    rows = [PromptRow(prompt="1+2=", reference="3"), PromptRow(prompt="4+4=", reference="8"),
            PromptRow(prompt="say hi")]
    functions = build_reward_functions(["gsm8k_exact_match", "length_penalty"],
                                       kwargs={"length_penalty": {"max_length": 4, "cache": 2}})
    result = evaluate(model, tok, rows, functions, Reference(model), EvalConfig(k=3, max_new_tokens=5),
                      samples_path=tmp_path / "samples.jsonl")
    # same weights, same seed: identical samples, so no KL and every comparison a tie
    assert result["kl"] == pytest.approx(0.0, abs=1e-6) and result["win_rate"] == 0.5
    assert result["reward_mean"]["policy"] == result["reward_mean"]["reference"]
    assert 0.0 <= result["pass_at_k"]["policy"] <= 1.0 and "maj_at_k" in result
    # The run page's curves: Pass@j and Maj@j for j = 1..k, Pass@k the headline figure, never falling with j.
    pass_at = result["curves"]["pass_at"]["policy"]
    assert list(pass_at) == ["1", "2", "3"] and pass_at["3"] == pytest.approx(result["pass_at_k"]["policy"])
    assert pass_at["1"] <= pass_at["2"] <= pass_at["3"]
    assert result["curves"]["maj_at"]["reference"]["3"] == pytest.approx(result["maj_at_k"]["reference"])
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 3 * 3 * 2 and {"prompt", "reference", "answer", "reward"} <= set(samples[0])
    assert "_rewards" not in public(result)["reference"]


def test_cli_writes_eval_json(tiny_dir, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"{a}+1=", "reference": str(a + 1), "split": s}) + "\n"
                               for a, s in [(1, "train"), (2, "heldout"), (3, "heldout")]))
    out = tmp_path / "eval"
    assert main(["--policy", str(tiny_dir), "--reference", str(tiny_dir), "--prompts", str(prompts),
                 "--reward-fn", "gsm8k_exact_match", "--k", "2", "--out", str(out),
                 "--set", "max_new_tokens=3"]) == 0
    result = json.loads((out / "eval.json").read_text())
    assert result["prompts"] == 2 and result["k"] == 2
    assert set(result["reward_mean"]) == {"policy", "reference"}
    assert {"kl", "win_rate", "pass_at_k", "maj_at_k"} <= set(result)
    assert (out / "run.json").exists() and (out / "samples.jsonl").exists()
