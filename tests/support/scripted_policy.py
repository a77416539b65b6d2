"""A policy whose samples are known in advance: a real generator over fixed texts, for Monte-Carlo step labels."""

from __future__ import annotations

from collections.abc import Sequence

from training.generation import GenerationParams, Prompt, Sample, ShouldStop


class ScriptedPolicy:
    """For each prefix, the continuations written for it, handed out in order (sample i of a prefix is its i-th
    text); a prefix without a script is an error, so a test names every prefix it expects."""

    def __init__(self, script: dict[str, list[str]]) -> None:
        self.script = script
        self.asked: list[tuple[Prompt, str, int]] = []

    def generate(self, prompts: Sequence[Prompt], n: int, params: GenerationParams, *,
                 should_stop: ShouldStop | None = None, prefixes: Sequence[str] | None = None) -> list[list[Sample]]:
        assert prefixes is not None and len(prefixes) == len(prompts)
        out = []
        for prompt, prefix in zip(prompts, prefixes, strict=True):
            self.asked.append((prompt, prefix, n))
            texts = self.script[prefix]
            assert len(texts) >= n, f"{len(texts)} continuations written for {prefix!r}, {n} asked"
            out.append([Sample(text=t, finish_reason="stop", prompt_tokens=None, completion_tokens=None,
                               seed=(params.seed or 0) + i) for i, t in enumerate(texts[:n])])
        return out
