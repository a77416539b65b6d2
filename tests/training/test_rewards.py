"""Reward functions: GSM8K answer matching, format and length rewards, loading by path, combination, process steps."""

from __future__ import annotations

import math
import textwrap

import pytest
import torch

from training.rewards import (
    RewardFunction,
    build_reward_functions,
    compute_rewards,
    extract_final_number,
    format_regex,
    gsm8k_exact_match,
    length_penalty,
    load_reward_fn,
    parse_reference,
    split_steps,
)


@pytest.mark.parametrize(
    ("reference", "expected"),
    [
        ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 72", "72"),
        ("#### 1,234", "1234"),
        ("Q: how many?\nA: 42", "42"),
        ("Answer: -3.50", "-3.5"),
        ("46", "46"),
        (46, "46"),
    ],
)
def test_reference_layouts(reference, expected):
    assert parse_reference(reference) == parse_reference(expected)


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("She has 3 + 4 = 7 apples.\n#### 7", "7"),
        ("First 12, then 30. The answer is 42.", "42"),
        ("The answer is: $1,000.", "1000"),
        ("steps 2 and 3\nA: 5", "5"),
        ("so \\boxed{ 19 } is it", "19"),
        ("we get 10, then 11, finally 12", "12"),
        ("46", "46"),
    ],
)
def test_final_number_extraction(completion, expected):
    assert extract_final_number(completion) == parse_reference(expected)


def test_no_number_means_no_answer():
    assert extract_final_number("I don't know") is None


def test_exact_match_scores_and_none_without_reference():
    completions = ["#### 72", "it is 72.0", "#### 71", "no idea"]
    refs = ["... #### 72"] * 4
    assert gsm8k_exact_match([""] * 4, completions, reference=refs) == [1.0, 1.0, 0.0, 0.0]
    assert gsm8k_exact_match([""], ["3"], reference=[None]) == [None]
    assert gsm8k_exact_match([""], ["3"]) == [None]


def test_format_regex_default_and_custom():
    assert format_regex(["", ""], ["work\n#### 5", "5"]) == [1.0, 0.0]
    assert format_regex([""], ["<a>1</a>"], pattern=r"<a>\d+</a>") == [1.0]


def test_length_penalty_is_dapo_soft_overlong():
    # max 10, cache 4: free up to 6 chars, −(L−6)/4 between, −1 beyond 10
    out = length_penalty([""] * 4, ["x" * 6, "x" * 8, "x" * 10, "x" * 11], max_length=10, cache=4)
    assert out == [0.0, -0.5, -1.0, -1.0]


def test_load_builtin_module_path_and_file(tmp_path, monkeypatch):
    assert load_reward_fn("gsm8k_exact_match") is gsm8k_exact_match
    assert load_reward_fn("training.rewards:length_penalty") is length_penalty
    path = tmp_path / "myreward.py"
    path.write_text(textwrap.dedent("""
        def shout(prompts, completions, **row):
            return [float(c.isupper()) for c in completions]
    """))
    fn = load_reward_fn(f"{path}:shout")
    assert fn(["p", "p"], ["HI", "hi"]) == [1.0, 0.0]
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_reward_fn("myreward:shout")(["p"], ["X"]) == [1.0]


@pytest.mark.parametrize("spec", ["nocolon", "training.rewards:nope", "no_such_module_xyz:f", "/no/file.py:f"])
def test_bad_spec_names_the_spec(spec):
    with pytest.raises(ValueError, match="reward_fn"):
        load_reward_fn(spec)


def test_weighted_combination_with_kwargs_and_none():
    functions = build_reward_functions(
        ["gsm8k_exact_match", "format_regex"], weights=[1.0, 0.5],
        kwargs={"format_regex": {"pattern": r"\d+"}},
    )
    result = compute_rewards(functions, ["q"] * 3, ["12", "twelve", "13"],
                             columns={"reference": ["12", "12", None]})
    # exact: [1, 0, None→0]; format: [1, 0, 1] × 0.5
    assert result.total.tolist() == [1.5, 0.0, 0.5]
    assert math.isnan(result.per_function["gsm8k_exact_match"][2].item())
    assert result.steps is None


def test_reward_function_sees_row_columns():
    seen = {}

    def fn(prompts, completions, reference, topic, **row):
        seen.update(reference=reference, topic=topic)
        return [0.0] * len(completions)

    compute_rewards([RewardFunction("f", fn)], ["a", "b"], ["x", "y"], columns={"reference": ["1", "2"],
                                                                          "topic": ["m", "n"]})
    assert seen == {"reference": ["1", "2"], "topic": ["m", "n"]}


def test_wrong_length_or_no_reward_raises():
    with pytest.raises(ValueError, match="returned 1 scores for 2"):
        compute_rewards([RewardFunction("f", lambda p, c, **r: [1.0])], ["a", "b"], ["x", "y"])
    with pytest.raises(ValueError, match="no reward"):
        build_reward_functions([])
    with pytest.raises(ValueError, match="reward_weights"):
        build_reward_functions(["format_regex"], weights=[1.0, 2.0])


def test_process_rewards_merge_with_outcome_on_last_step():
    def per_step(prompts, completions, **row):
        return [[1.0 if "ok" in line else 0.0 for line in c.split("\n")] for c in completions]

    functions = [RewardFunction("steps", per_step, 2.0), RewardFunction("final", lambda p, c, **r: [1.0, 0.0])]
    result = compute_rewards(functions, ["q", "q"], ["ok\nbad\nok", "bad\nok"])
    assert split_steps("ok\nbad\nok") == [3, 7, 9]
    assert result.step_ends == [[3, 7, 9], [4, 6]]
    # steps ×2, the outcome score added to the last step
    assert result.steps == [[2.0, 0.0, 3.0], [0.0, 2.0]]
    assert torch.allclose(result.total, torch.tensor([5.0, 2.0]))
    # the two kept apart as well, for the credit forms that read them separately
    assert result.process_steps == [[2.0, 0.0, 2.0], [0.0, 2.0]]
    assert result.outcome is not None and result.outcome.tolist() == [1.0, 0.0]
    alone = compute_rewards(functions[:1], ["q"], ["ok"])
    assert alone.outcome is None and alone.steps == alone.process_steps == [[2.0]]


def test_process_step_count_must_match_lines():
    fn = RewardFunction("steps", lambda p, c, **r: [[1.0]])
    with pytest.raises(ValueError, match="2 newline-separated steps"):
        compute_rewards([fn], ["q"], ["a\nb"])
