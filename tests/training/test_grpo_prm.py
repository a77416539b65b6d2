"""GRPO scored step by step by a process reward model: the PRM's steps and scores reach the rewards, the outcome
rewards land on the last step with their weight, and a policy trained against the PRM alone pleases it more."""

import json
import random
import string

import pytest
import torch

from tests.training.tiny import char_tokenizer, save_tiny, tiny_gpt2
from training.config import GRPOConfig, PRMConfig
from training.data import PromptRow, StepRow
from training.evaluate import best_of_n
from training.grpo import GRPOTrainer, main
from training.policy import load_policy, prepare_tokenizer
from training.prm import ProcessRewardModel, train_prm
from training.rewards import build_reward_functions, compute_rewards

pytestmark = pytest.mark.usefixtures("one_thread")

LETTERS = string.ascii_lowercase


def _step(rng: random.Random, good: bool) -> str:
    body = "".join(rng.choice(LETTERS) for _ in range(rng.randint(1, 3)))
    return body + (rng.choice(string.digits) if good else rng.choice(LETTERS))


def synthetic_steps(n: int, seed: int) -> list[StepRow]:
    """The rule the PRM learns: a step is correct when it ends with a digit."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        labels = [rng.random() < 0.5 for _ in range(rng.randint(1, 3))]
        rows.append(StepRow(prompt="go:", completions=[_step(rng, ok) for ok in labels], labels=labels))
    return rows




@pytest.fixture(scope="module")
def char_prm(tmp_path_factory):
    """A tiny causal PRM on characters that learned "a step ending in a digit is correct" (steps cut at ',')."""
    from transformers import GPT2ForTokenClassification

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a module fixture is made before the per-test one_thread fixture runs
    tok = prepare_tokenizer(char_tokenizer())
    base = tmp_path_factory.mktemp("prm-base")
    lm = tiny_gpt2(tok, seed=0, n_embd=32)
    lm.config.num_labels = 1
    GPT2ForTokenClassification(lm.config).save_pretrained(base)  # a fresh token-classification head, same body size
    tok.save_pretrained(base)
    out = tmp_path_factory.mktemp("prm")
    result = train_prm(PRMConfig(model=str(base), out=str(out), epochs=20, batch_size=16, lr=3e-3, max_length=32,
                                 step_separator=",", step_pattern=",", eval_every=0, progress=False),
                       synthetic_steps(240, seed=1), synthetic_steps(60, seed=2))
    torch.set_num_threads(threads)
    assert result.eval["step_accuracy"] >= 0.95
    return out / "model"


def test_the_prm_cuts_and_scores_rollouts_and_outcomes_land_on_the_last_step(char_prm):
    prm = ProcessRewardModel.load(char_prm, device="cpu")
    completions = ["ab1,cd,e7", "x", ",,"]
    functions = build_reward_functions(["tests.training.tiny:digit_share"], weights=[2.0],
                                       process_reward_model=str(char_prm), process_reward_weight=0.5)
    rewards = compute_rewards(functions, ["go:"] * 3, completions)
    expected = prm.score_text(["go:"] * 3, completions)
    # steps cut at ',' as the PRM was trained, not at newlines; a completion without a step is one step scored 0
    assert rewards.step_ends == [[4, 7, 9], [1], [2]]
    # A score per step, in (0, 1); how well they separate is the fixture's held-out step accuracy (≥ 0.95), not
    # one hand-picked completion's (a PRM trained on another machine's floats may miss any single step).
    assert len(expected[0]) == 3 and all(0.0 < s < 1.0 for s in expected[0]) and expected[2] == []
    digits = [2 / 9, 0.0, 0.0]
    for i, steps in enumerate(rewards.steps):
        prm_steps = expected[i] or [0.0]
        # every step carries 0.5 × its PRM score; the last also 2 × the outcome reward (digit share)
        assert steps[:-1] == pytest.approx([0.5 * s for s in prm_steps[:-1]], abs=1e-5)
        assert steps[-1] == pytest.approx(0.5 * prm_steps[-1] + 2.0 * digits[i], abs=1e-5)
    assert rewards.per_function["process_reward_model"][0].item() == pytest.approx(sum(expected[0]), abs=1e-5)


def test_grpo_against_the_prm_alone_raises_its_step_scores(char_prm, tmp_path):
    tok = prepare_tokenizer(char_tokenizer())
    path = save_tiny(tiny_gpt2(tok, seed=3), tok, tmp_path / "policy")
    model, tok = load_policy(path)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    functions = build_reward_functions(process_reward_model=str(char_prm))
    config = GRPOConfig(group_size=8, prompts_per_step=4, lr=3e-3, beta=0.0, max_new_tokens=6, steps=40, seed=0,
                        process_reward_model=str(char_prm), progress=False)
    rows = [PromptRow(prompt="go:")] * 4
    trainer = GRPOTrainer(config, model, tok, functions, rows)
    history = [trainer.step() for _ in range(config.steps)]
    assert sum(not torch.equal(p, start[n]) for n, p in model.named_parameters()) > 0
    first = sum(h["reward_mean"] for h in history[:8]) / 8
    last = sum(h["reward_mean"] for h in history[-8:]) / 8
    assert last > first + 0.2, (first, last)


def test_cli_runs_grpo_with_a_prm_beside_an_outcome_reward(char_prm, tmp_path, capsys):
    tok = prepare_tokenizer(char_tokenizer())
    policy = save_tiny(tiny_gpt2(tok, seed=4), tok, tmp_path / "policy")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p, "reference": "1", "split": s}) + "\n"
                               for p, s in [("go:", "train"), ("run:", "train"), ("go:", "heldout")]))
    out = tmp_path / "run"
    code = main(["--prompts", str(prompts), "--model", str(policy), "--out", str(out), "--process-reward-model",
                 str(char_prm), "--reward-fn", "tests.training.tiny:digit_share", "--set", "process_reward_weight=0.5",
                 "--set", "group_size=4", "--set", "prompts_per_step=2", "--set", "max_new_tokens=6", "--set",
                 "steps=2", "--set", "eval_k=2", "--set", "process_credit=min", "--set", "process_outcome_mix=0.3",
                 "--set", "advantage_clip=2", "--quiet"])
    assert code == 0, capsys.readouterr().err
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert "reward/process_reward_model" in rows[0] and "reward/digit_share" in rows[0]
    # the step figures beside the outcome's: mean step reward and advantage by step index, the advantage's scale
    assert 0.0 <= rows[0]["step_reward/0"] <= 0.5 and "step_adv/0" in rows[0]
    # and how many of the 8 rollouts reach each step index: fewer or as many at each next one
    reached = [rows[0][f"step_reached/{j}"] for j in range(16) if f"step_reached/{j}" in rows[0]]
    assert 0 < reached[0] <= 8 and reached == sorted(reached, reverse=True)
    assert 0.0 < rows[0]["adv_rms"] and 0.0 <= rows[0]["outcome_zero_std_frac"] <= 1.0
    run = json.loads((out / "run.json").read_text())["config"]
    assert run["process_reward_model"] == str(char_prm) and run["process_reward_weight"] == 0.5
    assert (run["process_credit"], run["process_outcome_mix"], run["advantage_clip"]) == ("min", 0.3, 2.0)
    # the PRM alone is a reward; a directory that is no PRM is refused naming the field
    assert main(["--prompts", str(prompts), "--model", str(policy), "--out", str(tmp_path / "bad"),
                 "--process-reward-model", str(policy), "--quiet"]) == 2
    assert "process_reward_model:" in capsys.readouterr().err


# --- best-of-N ----------------------------------------------------------------------------------


def test_best_of_n_by_hand():
    rows = [PromptRow(prompt="a", reference="3"), PromptRow(prompt="b", reference="5"), PromptRow(prompt="c")]
    texts = ["2", "3", "3",   # prompt a: the first sample is wrong, the majority right
             "5", "6", "6",   # prompt b: the first right, the majority wrong
             "1", "1", "1"]   # prompt c has no reference: not graded
    step_scores = {"2": [0.9, 0.9], "3": [0.95, 0.1], "5": [0.5, 0.6], "6": [0.8, 0.7], "1": [0.0]}
    # prm_min picks per prompt: a → "2" (min 0.9 vs 0.1); b → "6" (0.7 vs 0.5, the first "6" wins the tie)
    # prm_product: a → "2" (0.81 vs 0.095); b → "6" (0.56 vs 0.30)
    prm_calls = []

    def prm(prompts, completions):
        prm_calls.append(list(prompts))
        return [step_scores[c] for c in completions]

    def orm(prompts, completions):  # the ORM prefers the right answers
        return [1.0 if c in ("3", "5") else 0.0 for c in completions]

    result = best_of_n(rows, texts, 3, prm=prm, orm=orm)
    assert result["n"] == 3 and result["prompts"] == 2
    assert result["accuracy"] == {"first": 0.5, "majority": 0.5, "prm_min": 0.0, "prm_product": 0.0, "orm": 1.0,
                                  "oracle": 1.0}
    assert prm_calls == [["a"] * 3 + ["b"] * 3]  # one batched call, only the graded prompts
    assert set(best_of_n(rows, texts, 3)["accuracy"]) == {"first", "majority", "oracle"}


def test_evaluate_cli_reranks_by_the_prm(char_prm, tmp_path, capsys):
    from training.evaluate import main as evaluate_main
    from training.prm import aggregate

    tok = prepare_tokenizer(char_tokenizer())
    policy = save_tiny(tiny_gpt2(tok, seed=5), tok, tmp_path / "policy")
    prompts = tmp_path / "prompts.jsonl"
    # reference answers a random tiny policy sometimes writes as its last number
    prompts.write_text("".join(json.dumps({"prompt": p, "reference": r}) + "\n"
                               for p, r in [("go:", "1"), ("run:", "2"), ("up:", "3"), ("do:", "4")]))
    out = tmp_path / "eval"
    code = evaluate_main(["--policy", str(policy), "--prompts", str(prompts), "--k", "6", "--out", str(out),
                          "--reward-fn", "tests.training.tiny:digit_share", "--best-of-n",
                          "--process-reward-model", str(char_prm), "--set", "max_new_tokens=6"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    report = json.loads((out / "eval.json").read_text())["best_of_n"]
    assert summary["best_of_n"] == report["accuracy"] and report["n"] == 6 and report["prompts"] == 4
    # the PRM picks recomputed from the written samples agree with the report
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    prm = ProcessRewardModel.load(char_prm, device="cpu")
    for how in ("min", "product"):
        right = 0
        for g in range(4):
            group = samples[g * 6:(g + 1) * 6]
            scores = [aggregate(s, how) for s in prm.score_text([x["prompt"] for x in group],
                                                                [x["answer"] for x in group])]
            right += group[max(range(6), key=lambda j: (scores[j], -j))]["correct"]
        assert report["accuracy"][f"prm_{how}"] == pytest.approx(right / 4)
    assert report["accuracy"]["oracle"] == pytest.approx(sum(any(x["correct"] for x in samples[g * 6:(g + 1) * 6])
                                                             for g in range(4)) / 4)
