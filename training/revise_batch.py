"""`python -m training.revise_batch --spec SPEC.json --prompts IN.jsonl --out OUT.jsonl`: critique and revise a list of
completions with a local model (the supervised CAI stage, `training.judge.critique_and_revise`), where the model
work is done (a cluster node).

The app's revise job sends its completions here when its generator is a local model and its project runs on a
cluster. SPEC.json: `{"generator": hf spec}` (its sampling parameters read by `revision_params`, as the worker reads
them, so the same spec gives the same texts on either). IN.jsonl, one completion a line: `{"completion_id", "prompt":
"…" or [messages], "text", "principle": {name, critique, revision…}}`. OUT.jsonl, one line each, `{"completion_id",
"critique", "revision"}`, appears whole (`training.sample_batch.write_whole`): a run killed half-way leaves no OUT.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from training.generation import GenerationError, GenerationParams, HFGenerator, make_generator, params_from_spec
from training.hold import hold
from training.judge import critique_and_revise
from training.judge_prompts import format_conversation
from training.sample_batch import run_batch


def revision_params(spec: dict[str, Any]) -> GenerationParams:
    """The sampling parameters of a critique and its revision: the spec's, else greedy, 256 new tokens, seed 0."""
    return params_from_spec({"temperature": 0.0, "max_new_tokens": 256, "seed": 0} | spec)


def revise(generator: Any, prompt: Any, text: str, principle: dict[str, Any], params: GenerationParams
           ) -> tuple[str, str]:
    """(critique, revision) of one completion of `prompt` under `principle`."""
    return critique_and_revise(generator, format_conversation(prompt), text, principle, params=params)


def _revised(spec: dict[str, Any], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    generator = make_generator(spec["generator"])
    if not isinstance(generator, HFGenerator):
        raise GenerationError("only a local model (backend hf) revises here; a server is asked by the app")
    generator.check()
    params = revision_params(spec["generator"])
    out = []
    for i, row in enumerate(rows, 1):
        critique, revision = revise(generator, row["prompt"], row["text"], row["principle"], params)
        out.append({"completion_id": row["completion_id"], "critique": critique, "revision": revision})
        print(f"revised {i}/{len(rows)} completions", flush=True)
        hold(f"revise.completions.{i}")  # crash tests stop here, OUT not yet written
    return out


OPTIONS = ("the generator's hf spec", "JSONL: completion_id, prompt, text, principle",
           "JSONL written whole: completion_id, critique, revision")
"""The help of --spec, --prompts and --out."""


def main(argv: list[str] | None = None) -> int:
    def said(out: list[dict[str, Any]], path: Path) -> str:
        return f"wrote {len(out)} revisions to {path}"

    return run_batch(argv, "python -m training.revise_batch", __doc__.split("\n\n")[0], OPTIONS, _revised, said)


if __name__ == "__main__":
    sys.exit(main())
