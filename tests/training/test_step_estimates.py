"""Monte-Carlo step estimation (Math-Shepherd): the soft and hard estimates of prefixes whose continuations are
known, where a prefix ends, and the estimate on a real model that ends every answer at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.scripted_policy import ScriptedPolicy
from tests.training.tiny import char_tokenizer, save_tiny, silent_gpt2
from training.generation import GenerationParams, HFGenerator
from training.step_estimates import Checker, Solution, StepEstimate, estimate_steps, step_prefixes

SOLUTION = "3 + 4 = 7 apples.\nHe gives 2 away: 7 - 2 = 5.\nA: 5"
STEPS = ["3 + 4 = 7 apples.", "He gives 2 away: 7 - 2 = 5.", "A: 5"]


def test_a_step_is_labelled_by_the_share_of_its_continuations_that_reach_the_answer() -> None:
    policy = ScriptedPolicy({
        # After step 1, two of four continuations reach 5: y_SE = 2/4, y_HE = 1.
        "3 + 4 = 7 apples.\n": ["He gives 2 away: 7 - 2 = 5.\nA: 5", "7 - 2 = 5\n#### 5",
                                "He gives 2: 7 - 2 = 4.\nA: 4", "A: 9"],
        # After step 2, one of four: y_SE = 1/4 (soft calls it wrong), y_HE = 1 (hard calls it right).
        "3 + 4 = 7 apples.\nHe gives 2 away: 7 - 2 = 5.\n": ["A: 6", "A: 5", "The answer is 7", "A: 4"],
    })
    (estimates,) = estimate_steps(policy, [Solution("Tom has 3 apples and buys 4. He gives 2 away. How many?",
                                                    SOLUTION, STEPS, "#### 5")],
                                  4, GenerationParams(seed=0), Checker("gsm8k_exact_match"))
    assert estimates == [StepEstimate(2, 4), StepEstimate(1, 4), StepEstimate(1, 1)]  # the last: the answer itself
    assert [e.soft for e in estimates] == [0.5, 0.25, 1.0]
    assert [e.hard for e in estimates] == [1, 1, 1]
    assert [e.label("hard") for e in estimates] == [1, 1, 1]
    assert [e.label("soft") for e in estimates] == [1, -1, 1]  # soft: at least half of them right
    # Each prefix was continued N = 4 times, the last step not at all.
    assert [(prefix, n) for _, prefix, n in policy.asked] == [(STEPS[0] + "\n", 4), (SOLUTION.removesuffix("A: 5"), 4)]


def test_no_right_continuation_is_wrong_under_both_estimates_and_a_wrong_answer_ends_wrong() -> None:
    solution = Solution("q", "7 - 2 = 4.\nA: 4", ["7 - 2 = 4.", "A: 4"], "A: 5")
    policy = ScriptedPolicy({"7 - 2 = 4.\n": ["A: 4", "so 4", "A: 3"]})
    (estimates,) = estimate_steps(policy, [solution], 3, GenerationParams(), Checker("gsm8k_exact_match"))
    assert [(e.correct, e.n, e.soft, e.hard) for e in estimates] == [(0, 3, 0.0, 0), (0, 1, 0.0, 0)]
    assert [e.label("hard") for e in estimates] == [-1, -1] == [e.label("soft") for e in estimates]
    with pytest.raises(ValueError, match="estimate must be one of hard, soft"):
        estimates[0].label("mean")


def test_a_prefix_ends_where_the_next_step_begins() -> None:
    # Lines: the newline after a step belongs to its prefix, so the policy starts the next step.
    assert step_prefixes("a\n\nb\nc", ["a", "b", "c"]) == ["a\n\n", "a\n\nb\n"]
    # A separator of the project's own ("Step n:") stays with the next step, as the split left it.
    assert step_prefixes("Step 1: x. Step 2: y.", ["Step 1: x.", "Step 2: y."]) == ["Step 1: x. "]
    # Stored steps that are not in the text as they are (imported labelled steps): one a line.
    assert step_prefixes("x\ny", ["X", "y"]) == ["X\n"]
    assert step_prefixes("only", ["only"]) == []


def test_the_checker_reads_gsm8k_answers_and_says_when_a_reference_is_unreadable() -> None:
    check = Checker("gsm8k_exact_match")
    assert check("so it is 1,234.", "#### 1234") and not check("A: 12", "#### 1234")
    assert check.readable("She makes 9 * 2 = 18.\nA: 18") and not check.readable("no number here")
    with pytest.raises(ValueError, match="checker must be one of gsm8k_exact_match"):
        Checker("exec")


@pytest.fixture(scope="module")
def silent_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tokenizer = char_tokenizer()
    return save_tiny(silent_gpt2(tokenizer), tokenizer, tmp_path_factory.mktemp("silent") / "model")


def test_a_real_policy_continues_each_prefix(silent_dir: Path) -> None:
    # This model ends every answer at once, so each of the N continuations leaves the prefix as it is: 3 + 4 = 7
    # reaches no answer of 5, the prefix that ends on 5 reaches it every time.
    policy = HFGenerator(silent_dir)
    (estimates,) = estimate_steps(policy, [Solution("How many?", SOLUTION, STEPS, "#### 5")], 3,
                                  GenerationParams(seed=1), Checker("gsm8k_exact_match"))
    assert estimates == [StepEstimate(0, 3), StepEstimate(3, 3), StepEstimate(1, 1)]
    samples = policy.generate(["How many?"], 2, GenerationParams(seed=1), prefixes=["3 + 4 = 7"])
    assert [(s.text, s.finish_reason) for s in samples[0]] == [("", "stop"), ("", "stop")]
