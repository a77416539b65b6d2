"""A finished run's page leads with its outcome, from its evaluation: whether a policy beat its reference (and by
how much), or how a reward model ranks held-out pairs against chance; its samples come a page of prompts at a time,
each prompt once with the policy's answers beside the reference's."""

from __future__ import annotations

from app.models import TrainingRun
from app.runs import training_runs


def _run(kind: str = "grpo", state: str = "succeeded") -> TrainingRun:
    return TrainingRun(kind=kind, state=state, config={})


def test_a_policy_that_wins_more_often_than_not_beats_its_reference() -> None:
    evaluation = {"prompts": 40, "reward_mean": {"policy": 0.52, "reference": 0.31}, "win_rate": 0.64, "kl": 0.031}
    found = training_runs.verdict(_run(), evaluation)
    assert found is not None and found["headline"] == "Beats its reference on 40 held-out prompts" and found["good"]
    assert found["figures"] == [("reward", "0.520", "+0.210 on the reference's 0.310"),
                                ("win rate", "0.64", "against the reference; 0.5 is a tie"),
                                ("KL", "0.031", "how far it moved from the reference")]
    lost = training_runs.verdict(_run(), evaluation | {"win_rate": 0.4})
    assert lost is not None and lost["headline"].startswith("Worse than its reference")
    tied = training_runs.verdict(_run(), {"policy": {"reward_mean": 0.3}, "reference": {"reward_mean": 0.3}})
    assert tied is not None and tied["headline"] == "No better than its reference on the held-out prompts"


def test_no_verdict_before_the_run_succeeded_and_a_reward_model_is_held_against_chance() -> None:
    assert training_runs.verdict(_run(state="running"), {"win_rate": 0.9}) is None
    assert training_runs.verdict(_run(), None) is None
    coin = training_runs.verdict(_run("reward"), {"accuracy": 0.52})
    assert coin is not None and coin["headline"] == "Ranks held-out pairs about as well as a coin"
    assert training_runs.verdict(_run("reward"), {"accuracy": 0.71})["good"]  # type: ignore[index]


def test_samples_come_a_page_of_prompts_at_a_time_each_prompt_once() -> None:
    samples = [{"prompt": f"q{i}", "model": model, "sample": s, "answer": f"{model} {s}", "reward": float(s)}
               for i in range(12) for s in range(2) for model in ("policy", "reference")]
    first = training_runs.sample_page(samples, 1)
    assert (first["pages"], first["prompts"], first["has_reference"]) == (3, 12, True)
    assert [r["prompt"] for r in first["rows"]] == ["q0", "q1", "q2", "q3", "q4"]
    assert first["rows"][0]["policy"] == [{"answer": "policy 0", "reward": 0.0}, {"answer": "policy 1", "reward": 1.0}]
    assert [r["prompt"] for r in training_runs.sample_page(samples, 99)["rows"]] == ["q10", "q11"]  # the last page
    alone = training_runs.sample_page([{"prompt": "p", "response": "r"}], 1)
    assert alone["rows"][0]["policy"] == [{"answer": "r", "reward": None}] and not alone["has_reference"]


def test_a_policy_on_prompts_with_answers_is_judged_by_its_final_numbers_before_and_after() -> None:
    # A first try on GSM8K: one of 16 answers right against none, while the reward model's scores lose more pairs.
    evaluation = {"prompts": 8, "k": 2, "reward_mean": {"policy": 0.078, "reference": 0.020}, "win_rate": 0.41,
                  "kl": 0.012, "accuracy": {"policy": 0.0625, "reference": 0.0},
                  "pass_at_k": {"policy": 0.125, "reference": 0.0}, "maj_at_k": {"policy": 0.125, "reference": 0.0}}
    found = training_runs.verdict(_run(), evaluation)
    assert found is not None and found["good"]
    assert found["headline"] == "More final answers right than its reference on 8 held-out prompts"
    assert found["figures"][:3] == [
        ("exact match", "0.000 → 0.062", "before → after; final number, every sample"),
        ("Pass@2", "0.000 → 0.125", "before → after; any of K right"),
        ("Maj@2", "0.000 → 0.125", "before → after; the most common answer right")]
    same = training_runs.verdict(_run(), evaluation | {"accuracy": {"policy": 0.0, "reference": 0.0}})
    assert same is not None and same["headline"].startswith("Worse than its reference")  # a tie: the win rate says
    fewer = training_runs.verdict(_run(), evaluation | {"accuracy": {"policy": 0.1, "reference": 0.3}, "win_rate": 0.7})
    assert fewer is not None and not fewer["good"]
    assert fewer["headline"] == "Fewer final answers right than its reference on 8 held-out prompts"
