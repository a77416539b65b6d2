"""Automatic step labels by Monte-Carlo estimation (Math-Shepherd, Wang et al. 2024): how often a policy that goes on
from the end of a step reaches the right answer.

For step i of a solution, N continuations are sampled from its prefix (the solution's text up to where step i+1
begins, so the policy writes the next step) and each finished answer, prefix + continuation, is checked against the
prompt's reference answer. Of the N, c reach it:

- hard estimate  y_HE = 1 if c > 0 else 0 (the step can still lead to the answer);
- soft estimate  y_SE = c / N (how likely the policy is to get there from it).

The last step needs no sampling: its prefix is the whole solution, checked as it stands (c = N = 1). The estimates
depend on the policy: a weak one calls good steps hopeless, so labels from a stronger policy, or more
continuations, are worth their cost, which is N × (steps − 1) samples per solution.

No torch at import: the app's web process reads `ESTIMATES` and `CHECKERS` from here to validate a request.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from training.generation import GenerationParams, Prompt, Sample, ShouldStop

ESTIMATES = ("hard", "soft")
"""Which estimate decides a step's +1 / −1: hard (any continuation right) or soft (at least half of them right)."""
SOFT_THRESHOLD = 0.5
"""A step is labelled correct under the soft estimate when at least this share of its continuations is right."""
CHECKERS = ("gsm8k_exact_match",)
"""Checkers that read a reference answer: `gsm8k_exact_match` compares the answer's final number (`#### x`, `A: x`,
"the answer is x", `\\boxed{x}`, else the last number) with the reference's."""


class ContinuingGenerator(Protocol):
    """A generator that continues a written prefix (training.generation.HFGenerator does)."""

    def generate(self, prompts: Sequence[Prompt], n: int, params: GenerationParams, *,
                 should_stop: ShouldStop | None = None, prefixes: Sequence[str] | None = None
                 ) -> list[list[Sample]]: ...


@dataclass(frozen=True)
class Solution:
    """One completion to label: its prompt, its text and stored steps, and the prompt's reference answer."""

    prompt: Prompt
    text: str
    steps: Sequence[str]
    reference: str


@dataclass(frozen=True)
class StepEstimate:
    """One step's Monte-Carlo tally."""

    correct: int
    """Continuations from the step's prefix that reached the reference answer (for the last step: 1 if the solution
    itself does)."""
    n: int
    """Continuations sampled (1 for the last step: the solution itself)."""

    @property
    def soft(self) -> float:
        """y_SE = c / N."""
        return self.correct / self.n

    @property
    def hard(self) -> int:
        """y_HE = 1 if any of the N continuations is right, else 0."""
        return 1 if self.correct > 0 else 0

    def label(self, estimate: str) -> int:
        """The step label the chosen estimate gives: +1 correct, −1 wrong."""
        if estimate not in ESTIMATES:
            raise ValueError(f"estimate must be one of {', '.join(ESTIMATES)}, got {estimate!r}")
        right = self.hard == 1 if estimate == "hard" else self.soft >= SOFT_THRESHOLD
        return 1 if right else -1


class Checker:
    """Is an answer right? `readable(reference)` says whether the checker can read a reference at all."""

    def __init__(self, name: str) -> None:
        if name not in CHECKERS:
            raise ValueError(f"checker must be one of {', '.join(CHECKERS)}, got {name!r}")
        from training import rewards  # torch: imported by the worker that runs the estimate, not the web process

        self.name = name
        self._parse = rewards.parse_reference
        self._answer = rewards.extract_final_number

    def readable(self, reference: str | None) -> bool:
        return self._parse(reference) is not None

    def __call__(self, answer: str, reference: str) -> bool:
        expected = self._parse(reference)
        return expected is not None and self._answer(answer) == expected


def step_prefixes(text: str, steps: Sequence[str]) -> list[str]:
    """For each step but the last, the solution's text up to where the next step begins (its separator included,
    so a continuation starts the next step). Steps are found in the text in order; a completion whose stored steps
    are not in its text as they are (imported labelled steps) falls back to the steps one a line."""
    starts: list[int] = []
    at = 0
    for step in steps:
        found = text.find(step, at)
        if found < 0:
            return ["\n".join(steps[: i + 1]) + "\n" for i in range(len(steps) - 1)]
        starts.append(found)
        at = found + len(step)
    return [text[:start] for start in starts[1:]]


def estimate_steps(policy: ContinuingGenerator, solutions: Sequence[Solution], n: int, params: GenerationParams,
                   check: Callable[[str, str], bool], *, should_stop: ShouldStop | None = None
                   ) -> list[list[StepEstimate]]:
    """Per solution, per step, the Monte-Carlo tally of `n` continuations sampled by `policy` (one generate call
    for every prefix of every solution given). `check(answer, reference)` says whether an answer is right."""
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    prompts: list[Prompt] = []
    prefixes: list[str] = []
    owners: list[int] = []
    for k, solution in enumerate(solutions):
        for prefix in step_prefixes(solution.text, solution.steps):
            prompts.append(solution.prompt)
            prefixes.append(prefix)
            owners.append(k)
    samples = policy.generate(prompts, n, params, should_stop=should_stop, prefixes=prefixes) if prompts else []
    out: list[list[StepEstimate]] = [[] for _ in solutions]
    for k, prefix, drawn in zip(owners, prefixes, samples, strict=True):
        reference = solutions[k].reference
        out[k].append(StepEstimate(sum(check(prefix + s.text, reference) for s in drawn), len(drawn)))
    for k, solution in enumerate(solutions):
        if solution.steps:
            out[k].append(StepEstimate(int(check(solution.text, solution.reference)), 1))
    return out



def main(argv: list[str] | None = None) -> int:
    """`python -m training.step_estimates --spec SPEC.json --prompts IN.jsonl --out OUT.jsonl`: the estimates of a
    list of prompts' solutions where the model work is done (the app's Monte-Carlo job sends them to its project's
    cluster). SPEC: the policy's `model` directory, `n`, `temperature`, `max_new_tokens`, `seed`, `checker`. IN, one
    prompt a line: `{"prompt_id", "prompt", "reference", "solutions": [{"completion_id", "text", "steps"}]}`, each
    prompt's solutions estimated in one generate call, as the app's job does it (so the same seed gives the same
    tallies). OUT, written whole (`training.sample_batch.write_whole`): `{"prompt_id", "estimates": {completion id:
    [[correct, n] per step]}}`."""
    import argparse
    import json
    import sys
    from pathlib import Path

    from training.generation import GenerationError, HFGenerator
    from training.hold import hold
    from training.sample_batch import write_whole

    parser = argparse.ArgumentParser(prog="python -m training.step_estimates", description=main.__doc__)
    for name in ("spec", "prompts", "out"):
        parser.add_argument(f"--{name}", type=Path, required=True)
    args = parser.parse_args(argv)
    spec = json.loads(args.spec.read_text(encoding="utf-8"))
    rows = [json.loads(line) for line in args.prompts.read_text(encoding="utf-8").splitlines() if line.strip()]
    out = []
    try:
        policy = HFGenerator(spec["model"])
        policy.check()
        checker = Checker(spec["checker"])
        params = GenerationParams(temperature=float(spec["temperature"]), max_new_tokens=int(spec["max_new_tokens"]),
                                  seed=int(spec["seed"]))
        for i, row in enumerate(rows, 1):
            solutions = [Solution(row["prompt"], s["text"], s["steps"], row["reference"]) for s in row["solutions"]]
            tallies = estimate_steps(policy, solutions, int(spec["n"]), params, checker)
            out.append({"prompt_id": row["prompt_id"], "estimates": {
                str(s["completion_id"]): [[e.correct, e.n] for e in per_step]
                for s, per_step in zip(row["solutions"], tallies, strict=True)}})
            print(f"labelled {i}/{len(rows)} prompts", flush=True)
            hold(f"step_estimates.prompts.{i}")  # crash tests stop here, OUT not yet written
    except (GenerationError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    write_whole(args.out, out)
    print(f"wrote the estimates of {len(out)} prompts to {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
