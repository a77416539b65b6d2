"""Sampling throughput of the hf backend: completions/s and tokens/s, batched against one row at a time.

Same tiny GPT-2 (2 layers, character tokenizer), prompts, K, seed and max new tokens on both sides;
the seeded per-sample streams make both produce the same texts, which is checked. Prints one JSON
line; `measure_hf()` returns it as a dict so the job-system part can be added beside it.

    .venv/bin/python benchmarks/bench_sampling.py [--prompts 16] [--k 4] [--max-new-tokens 32]
                                                  [--batch-size 64] [--repeats 3] [--threads N] [--model DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from tests.training.tiny import addition_problems, char_tokenizer, save_tiny, tiny_gpt2  # noqa: E402
from training.generation import GenerationParams, HFGenerator  # noqa: E402


def _tiny_model(directory: Path) -> Path:
    tok = char_tokenizer()
    return save_tiny(tiny_gpt2(tok, seed=0, n_embd=64, n_layer=2, n_positions=128), tok, directory / "model")


def _timed(generator: HFGenerator, prompts: list[str], k: int, params: GenerationParams) -> tuple[float, list]:
    start = time.perf_counter()
    out = generator.generate(prompts, k, params)
    return time.perf_counter() - start, out


def measure_hf(model_dir: str | Path | None = None, prompts: int = 16, k: int = 4, max_new_tokens: int = 32,
               batch_size: int = 64, repeats: int = 3, device: str = "auto") -> dict[str, Any]:
    """Median completions/s and tokens/s of `HFGenerator` with `batch_size` rows per forward vs one row.

    Without `model_dir` the tiny GPT-2 is built in a temporary directory. Runs alternate (batched,
    sequential, …) after one warm-up each, so a noisy neighbour hits both alike.
    """
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(model_dir) if model_dir is not None else _tiny_model(Path(tmp))
        texts = [p for p, _ in addition_problems(prompts, seed=0)]
        params = GenerationParams(temperature=1.0, max_new_tokens=max_new_tokens, seed=0)
        batched = HFGenerator(path, batch_size=batch_size, device=device)
        sequential = HFGenerator(path, batch_size=1, device=device)
        batched.generate(texts[:2], 1, params)
        sequential.generate(texts[:2], 1, params)
        times: dict[str, list[float]] = {"batched": [], "sequential": []}
        tokens = 0
        for _ in range(repeats):
            seconds, out_b = _timed(batched, texts, k, params)
            times["batched"].append(seconds)
            seconds, out_s = _timed(sequential, texts, k, params)
            times["sequential"].append(seconds)
            same = [[s.text for s in g] for g in out_b] == [[s.text for s in g] for g in out_s]
            tokens = sum(s.completion_tokens or 0 for g in out_b for s in g)
        device_used = str(batched._device)
        batched.close()
        sequential.close()
    completions = prompts * k
    t_b, t_s = statistics.median(times["batched"]), statistics.median(times["sequential"])
    return {
        "bench": "sampling", "backend": "hf", "device": device_used, "threads": torch.get_num_threads(),
        "prompts": prompts, "k": k, "max_new_tokens": max_new_tokens, "batch_size": batch_size,
        "completion_tokens": tokens,
        "hf_batched_completions_per_s": round(completions / t_b, 2),
        "hf_sequential_completions_per_s": round(completions / t_s, 2),
        "tokens_per_s": round(tokens / t_b, 1),
        "sequential_tokens_per_s": round(tokens / t_s, 1),
        "batched_speedup": round(t_s / t_b, 2),
        "same_texts": same,
        "batched_s_runs": [round(t, 3) for t in times["batched"]],
        "sequential_s_runs": [round(t, 3) for t in times["sequential"]],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--model", default=None, help="a local model directory instead of the tiny GPT-2")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--jobs", type=int, default=2000, help="empty jobs for the job-system part (0 skips it)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    result = measure_hf(args.model, args.prompts, args.k, args.max_new_tokens, args.batch_size, args.repeats,
                        args.device)
    if args.jobs:
        # The job system's own overhead on Postgres (2 worker processes): see bench_jobs.py.
        from bench_jobs import measure_jobs

        result |= {f"jobs_{k}": v for k, v in measure_jobs(n_jobs=args.jobs).items()}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
