"""`python -m training.sample_batch --spec SPEC.json --prompts IN.jsonl --out OUT.jsonl`: sample completions for a
list of prompts with a local model, where the model work is done (a cluster node, or the app's worker itself).

The app's sampling job sends its prompts here when its project runs on a cluster: IN.jsonl has one prompt a line,
`{"prompt_id": 3, "prompt": "…" or [messages], "need": 2, "existing": ["…"]}`; SPEC.json is the hf generator's spec
with its sampling parameters and `seed` (`training.generation.make_generator`, `params_from_spec`), plus
`resample_duplicates`. Prompts go `BATCH_PROMPTS` at a time, `need` samples each, and blank or repeated samples are
drawn again (`resample`) exactly as the worker does it, so the same seed gives the same texts on either. OUT.jsonl
has one line per prompt, `{"prompt_id": 3, "samples": [Sample…], "resampled": 1}`, and appears whole (written
beside it, then renamed): a run killed half-way leaves no OUT, and running it again gives the same file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from training.generation import (
    GenerationError,
    GenerationParams,
    Prompt,
    Sample,
    SampleGenerator,
    make_generator,
    near_duplicates,
    params_from_spec,
)
from training.hold import hold

BATCH_PROMPTS = 8
"""Prompts per generate call (the sampling job's batch); a sample's text does not depend on it (seeds are per
sample), only the memory a call takes."""
RETRY_STRIDE = 7919
"""Round r of resampling draws from `seed + RETRY_STRIDE * r`: streams far from the first draw's."""


def bad_slots(existing: Sequence[str], chosen: Sequence[Sample]) -> list[int]:
    """Indices into `chosen` to sample again: blank ones, and repeats of an earlier text (near ones too)."""
    texts = [*existing, *(s.text for s in chosen)]
    repeats = {i - len(existing) for i in near_duplicates(texts) if i >= len(existing)}
    return sorted(repeats | {i for i, s in enumerate(chosen) if not s.text.strip()})


def resample(generator: SampleGenerator, prompt: Prompt, existing: Sequence[str], chosen: list[Sample], tries: int,
             params: GenerationParams) -> tuple[list[Sample], int]:
    """`chosen` with its blank and repeated samples drawn again, up to `tries` rounds; and how many were redrawn."""
    redrawn = 0
    for attempt in range(tries):
        slots = bad_slots(existing, chosen)
        if not slots:
            break
        seed = None if params.seed is None else params.seed + RETRY_STRIDE * (attempt + 1)
        again = generator.generate([prompt], len(slots), replace(params, seed=seed, stop=list(params.stop)))[0]
        redrawn += len(slots)
        for slot, sample in zip(slots, again, strict=False):
            chosen[slot] = sample
    return chosen, redrawn


def sample_all(generator: SampleGenerator, rows: list[dict[str, Any]], params: GenerationParams, tries: int,
               ) -> list[dict[str, Any]]:
    """Every row's `need` samples (blank and repeated ones drawn again), in the rows' order, as OUT's lines."""
    out: list[dict[str, Any]] = []
    for start in range(0, len(rows), BATCH_PROMPTS):
        batch = rows[start:start + BATCH_PROMPTS]
        n = max(int(row["need"]) for row in batch)
        samples = generator.generate([row["prompt"] for row in batch], n, params)
        for row, outs in zip(batch, samples, strict=True):
            chosen, redrawn = resample(generator, row["prompt"], row["existing"], list(outs[: int(row["need"])]),
                                       tries, params)
            out.append({"prompt_id": row["prompt_id"], "samples": [asdict(s) for s in chosen],
                        "resampled": redrawn})
        print(f"sampled {start + len(batch)}/{len(rows)} prompts", flush=True)
        hold(f"sample.prompts.{start + len(batch)}")  # crash tests stop the sampling here, OUT not yet written
    return out


def write_whole(path: Path, lines: list[dict[str, Any]]) -> None:
    """`lines` as JSONL at `path`, all or nothing: a reader sees no file or the complete one."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        for line in lines:
            fh.write(json.dumps(line, ensure_ascii=False) + "\n")
        fh.flush()
        os.fsync(fh.fileno())  # on a shared file system the rename must not overtake the data
    os.replace(tmp, path)


def run_batch(argv: list[str] | None, prog: str, description: str, helps: tuple[str, str, str],
              work: Callable[[dict[str, Any], list[dict[str, Any]]], list[dict[str, Any]]],
              said: Callable[[list[dict[str, Any]], Path], str]) -> int:
    """`python -m PROG --spec SPEC.json --prompts IN.jsonl --out OUT.jsonl`: OUT's lines are `work(spec, IN's
    lines)`, written whole, and `said(lines, OUT)` printed; a GenerationError or ValueError is printed as
    `error: …` and OUT is not written (exit status 1). `helps`: the three options' help."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    for name, help_ in zip(("spec", "prompts", "out"), helps, strict=True):
        parser.add_argument(f"--{name}", type=Path, required=True, help=help_)
    args = parser.parse_args(argv)
    spec = json.loads(args.spec.read_text(encoding="utf-8"))
    rows = [json.loads(line) for line in args.prompts.read_text(encoding="utf-8").splitlines() if line.strip()]
    try:
        out = work(spec, rows)
    except (GenerationError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    write_whole(args.out, out)
    print(said(out, args.out), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.sample_batch", description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", type=Path, required=True, help="the hf generator's spec and sampling parameters")
    parser.add_argument("--prompts", type=Path, required=True, help="JSONL: prompt_id, prompt, need, existing")
    parser.add_argument("--out", type=Path, required=True, help="JSONL written whole: prompt_id, samples, resampled")
    args = parser.parse_args(argv)
    spec = json.loads(args.spec.read_text(encoding="utf-8"))
    tries = int(spec.pop("resample_duplicates", 0) or 0)
    rows = [json.loads(line) for line in args.prompts.read_text(encoding="utf-8").splitlines() if line.strip()]
    try:
        generator = make_generator(spec)
        params = params_from_spec(spec)
        if generator.backend != "hf":
            raise GenerationError("only a local model (backend hf) samples here; a server is asked by the app")
        generator.check()
        out = sample_all(generator, rows, params, tries)
    except (GenerationError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    write_whole(args.out, out)
    print(f"wrote {sum(len(line['samples']) for line in out)} completions for {len(out)} prompts to {args.out}",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
