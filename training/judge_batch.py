"""`python -m training.judge_batch --spec SPEC.json --prompts IN.jsonl --out OUT.jsonl`: the AI judge's verdicts on
every pair of a list of prompts' completions, where the model work is done (a cluster node, or the app's worker
itself, which calls `judge_chunk` directly).

The app's judge job sends its prompts here when its judge is a local model and its project runs on a cluster.
SPEC.json: `{"generator": hf spec, "config": JudgeConfig fields, "principles": [...], "label_steps": bool}`.
IN.jsonl, one prompt a line: `{"prompt_id", "prompt": "…" or [messages], "completions": [[id, text]…], "steps":
{completion id: [step…]}}` (`steps` only when the run labels steps). Prompts are judged `PROMPTS_PER_CALL` at a time
in the worker's order, so the same run gives the same verdicts on either. OUT.jsonl, one line per prompt,
`{"prompt_id", "verdicts": [[i, j, Verdict fields or {"skipped": reason}]…], "steps": {completion id: [p(Yes)…]}}`,
appears whole (`training.sample_batch.write_whole`): a run killed half-way leaves no OUT.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict
from itertools import combinations
from typing import Any

from training.generation import GenerationError, ShouldStop
from training.hold import hold
from training.judge import Judge, JudgeConfig, Skipped, Verdict
from training.judge_prompts import format_conversation
from training.sample_batch import run_batch

PROMPTS_PER_CALL = 4
"""Prompts whose comparisons go to the judge in one call (the judge job's chunk, on the worker and on a node)."""

Chunk = Sequence[tuple[int, Any, Sequence[tuple[int, str]]]]
"""[(prompt id, its text or chat messages, [(completion id, text)])]."""
ByPrompt = dict[int, dict[tuple[int, int], Verdict | Skipped]]
"""Per prompt, per compared pair (i, j) of completion ids, the judge's verdict (or why it left the pair)."""
StepsByPrompt = dict[int, dict[int, list[float]]]
"""Per prompt, per completion, p(step correct) for each of its first steps."""


def judge_chunk(judge: Judge, chunk: Chunk, principles: Sequence[dict[str, Any]], *,
                steps: Mapping[int, Sequence[str]] | None = None, should_stop: ShouldStop | None = None
                ) -> tuple[ByPrompt, StepsByPrompt]:
    """Every pair of the chunk's prompts compared in one call; with `steps` ({completion id: stored steps}), each
    completion's steps labelled too (its first steps only, when a later question is too long for the context)."""
    items, keys = [], []
    for prompt_id, prompt, completions in chunk:
        conversation = format_conversation(prompt)
        for (i, text_i), (j, text_j) in combinations(completions, 2):
            items.append((conversation, text_i, text_j))
            keys.append((prompt_id, i, j))
    verdicts = judge.compare(items, principles, keys=keys, should_stop=should_stop)
    by_prompt: ByPrompt = {}
    for (prompt_id, i, j), verdict in zip(keys, verdicts, strict=True):
        by_prompt.setdefault(prompt_id, {})[(i, j)] = verdict
    step_ps: StepsByPrompt = {}
    if steps is not None:
        asked, owners = [], []
        for prompt_id, prompt, completions in chunk:
            conversation = format_conversation(prompt)
            for cid, _ in completions:
                asked.append((conversation, steps.get(cid, [])))
                owners.append((prompt_id, cid))
        for (prompt_id, cid), ps in zip(owners, judge.label_steps(asked, should_stop=should_stop), strict=True):
            step_ps.setdefault(prompt_id, {})[cid] = ps
    return by_prompt, step_ps


def chunks(rows: Sequence[Any]) -> Iterator[Sequence[Any]]:
    for start in range(0, len(rows), PROMPTS_PER_CALL):
        yield rows[start:start + PROMPTS_PER_CALL]


def verdict_line(prompt_id: int, verdicts: Mapping[tuple[int, int], Verdict | Skipped],
                 step_ps: Mapping[int, list[float]]) -> dict[str, Any]:
    """One prompt's verdicts as an OUT line."""
    return {"prompt_id": prompt_id, "steps": {str(cid): ps for cid, ps in step_ps.items()},
            "verdicts": [[i, j, {"skipped": v.reason} if isinstance(v, Skipped) else asdict(v)]
                         for (i, j), v in verdicts.items()]}


def read_line(line: Mapping[str, Any]) -> tuple[dict[tuple[int, int], Verdict | Skipped], dict[int, list[float]]]:
    """An OUT line back as the verdicts and step labels `judge_chunk` gave (floats round-trip exactly in JSON)."""
    verdicts: dict[tuple[int, int], Verdict | Skipped] = {
        (int(i), int(j)): Skipped(v["skipped"]) if "skipped" in v else Verdict(**v) for i, j, v in line["verdicts"]}
    return verdicts, {int(cid): [float(p) for p in ps] for cid, ps in line["steps"].items()}


def judge_all(judge: Judge, rows: list[dict[str, Any]], principles: Sequence[dict[str, Any]], *,
              label_steps: bool) -> list[dict[str, Any]]:
    """Every row judged, `PROMPTS_PER_CALL` at a time in the rows' order, as OUT's lines."""
    out: list[dict[str, Any]] = []
    done = 0
    for batch in chunks(rows):
        chunk = [(int(r["prompt_id"]), r["prompt"], [(int(cid), text) for cid, text in r["completions"]])
                 for r in batch]
        steps = ({int(cid): s for r in batch for cid, s in (r.get("steps") or {}).items()} if label_steps
                 else None)
        by_prompt, step_ps = judge_chunk(judge, chunk, principles, steps=steps)
        out += [verdict_line(prompt_id, by_prompt.get(prompt_id, {}), step_ps.get(prompt_id, {}))
                for prompt_id, _, _ in chunk]
        done += len(batch)
        print(f"judged {done}/{len(rows)} prompts", flush=True)
        hold(f"judge.prompts.{done}")  # crash tests stop the judging here, OUT not yet written
    return out


def _judged(spec: dict[str, Any], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if spec["generator"].get("backend") != "hf":
        raise GenerationError("only a local model (backend hf) judges here; a server is asked by the app")
    try:
        judge = Judge(spec["generator"], JudgeConfig(**spec["config"]))
    except TypeError as exc:
        raise ValueError(f"spec: {exc}") from None
    judge.generator.check()
    return judge_all(judge, rows, spec["principles"], label_steps=bool(spec.get("label_steps")))


def main(argv: list[str] | None = None) -> int:
    return run_batch(argv, "python -m training.judge_batch", __doc__.split("\n\n")[0],
                     ("the judge's hf spec, config and principles", "JSONL: prompt_id, prompt, completions, steps",
                      "JSONL written whole: prompt_id, verdicts, steps"),
                     _judged, lambda out, path: f"wrote the verdicts on {len(out)} prompts to {path}")


if __name__ == "__main__":
    sys.exit(main())
