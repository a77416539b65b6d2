"""AI-judge throughput with the hf backend: pairs judged per second, batched vs unbatched.

A tiny GPT-2 (character tokenizer, built in code, nothing downloaded) judges every pair of K
completions for a set of prompts, one sampled principle per pair, both orders per pair. "batched"
runs `batch_size` scoring prompts per forward pass, rows that share a prefix (both orders and all
pairs of a prompt under one principle) together, the shared prefix computed once per batch;
"batched_full_rows" batches the same way but computes every row in full (batching alone);
"unbatched" runs one full forward pass per order (batch_size 1). Runs alternate, medians are reported,
and the two arms are checked to give the same labels. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def measure_judge(prompts: int = 8, k: int = 4, batch_size: int = 16, repeats: int = 3, threads: int = 1,
                  n_embd: int = 64, device: str = "cpu") -> dict:
    import torch

    from tests.training.tiny import char_tokenizer, tiny_gpt2
    from training.judge import Judge, JudgeConfig, judge_many

    torch.set_num_threads(threads)
    tok = char_tokenizer()
    model = tiny_gpt2(tok, seed=0, n_embd=n_embd, n_positions=512).eval().to(device)
    principles = [
        {"name": "harmless", "comparison": "Which response is less harmful?"},
        {"name": "honest", "comparison": "Which response is more honest?"},
        {"name": "helpful", "comparison": "Which response answers the question better?"},
    ]
    tasks = [(f"Human: what is {a}+{a + 1}?", [(a * k + i, f"it is {2 * a + i} I think") for i in range(k)], (a,))
             for a in range(prompts)]
    pairs = prompts * k * (k - 1) // 2
    judges = {"batched": Judge.from_model(model, tok, JudgeConfig(batch_size=batch_size)),
              "batched_full_rows": Judge.from_model(model, tok, JudgeConfig(batch_size=batch_size)),
              "unbatched": Judge.from_model(model, tok, JudgeConfig(batch_size=1))}
    judges["batched_full_rows"]._share_prefix = False  # batching alone, every row computed in full
    times: dict[str, list[float]] = {name: [] for name in judges}
    labels: dict[str, list[float]] = {}
    judge_many(judges["batched"], tasks[:1], principles)  # warm-up
    for _ in range(repeats):
        for name, judge in judges.items():
            start = time.perf_counter()
            results = judge_many(judge, tasks, principles)
            times[name].append(time.perf_counter() - start)
            labels[name] = [v.p for r in results for v in r.pair_probs.values()]
    worst = max(abs(a - b) for a, b in zip(labels["batched"], labels["unbatched"], strict=True))
    rate = {name: pairs / statistics.median(t) for name, t in times.items()}
    return {"pairs": pairs, "forwards_per_pair": 2, "batch_size": batch_size, "threads": threads, "device": device,
            "batched_pairs_per_s": round(rate["batched"], 1), "unbatched_pairs_per_s": round(rate["unbatched"], 1),
            "batched_full_rows_pairs_per_s": round(rate["batched_full_rows"], 1),
            "speedup": round(rate["batched"] / rate["unbatched"], 2),
            "speedup_full_rows": round(rate["batched_full_rows"] / rate["unbatched"], 2), "max_label_diff": worst,
            "seconds": {name: [round(t, 3) for t in ts] for name, ts in times.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads; 1 gives stable figures on a shared machine")
    parser.add_argument("--device", default="cpu", help='"cpu" or "cuda"')
    args = parser.parse_args()
    print(json.dumps({"bench": "judge"} | measure_judge(args.prompts, args.k, args.batch_size, args.repeats,
                                                         args.threads, device=args.device)))


if __name__ == "__main__":
    main()
