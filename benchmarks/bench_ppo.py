"""PPO against GRPO on the same work: steps/s, tokens/s and measured peak memory, one JSON line per tool.

Same tiny GPT-2 as benchmarks/bench_grpo.py (character tokenizer), same prompts, 8 prompts × 8 samples =
64 responses per step, max 8 new tokens, β = 0.04, lr 1e-5, one optimiser step per rollout batch on every
side (GRPO μ = 1; PPO one epoch, one minibatch of 64), so the difference is what PPO adds: the value model
(its forward/backward and optimiser state) and the extra rollout forward for old log-probs and values.
Tools: `grpo`, `ppo` (value head on the policy's hidden states), `ppo-critic` (a separate critic, a second
copy of the model). `--size small` uses a wider model (n_embd 512, 4 layers) so memory differences rise
above the process's fixed cost.

Each run is a fresh subprocess, so its peak is its own: on CUDA `torch.cuda.max_memory_allocated`, on CPU the
process's peak RSS (`ru_maxrss`) and that peak minus the RSS before any model was built (`peak_rss_growth_mb`,
what the run itself needed). Runs alternate (grpo, ppo, ppo-critic, grpo, …); medians are reported.

    .venv/bin/python benchmarks/bench_ppo.py [--steps 6] [--repeats 3] [--size tiny|small]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PROMPTS_PER_STEP = 8
SAMPLES = 8
MAX_NEW_TOKENS = 8
BETA = 0.04
LR = 1e-5
SIZES = {"tiny": {"n_embd": 128, "n_layer": 2}, "small": {"n_embd": 512, "n_layer": 4}}
TOOLS = ("grpo", "ppo", "ppo-critic")


def _rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def worker(tool: str, size: str, steps: int, model_dir: Path) -> dict[str, Any]:
    """One timed run in this process: a warm-up step, then `steps` timed steps."""
    import torch

    from tests.training.tiny import addition_problems
    from training.data import PromptRow
    from training.policy import load_policy
    from training.rewards import build_reward_functions

    cuda = torch.cuda.is_available()
    rows = [PromptRow(prompt=p, reference=a) for p, a in addition_problems(100, seed=0)]
    functions = build_reward_functions(["gsm8k_exact_match"])
    baseline = _rss_mb()
    model, tok = load_policy(model_dir)
    if tool == "grpo":
        from training.grpo import GRPOConfig, GRPOTrainer

        config = GRPOConfig(group_size=SAMPLES, prompts_per_step=PROMPTS_PER_STEP, max_new_tokens=MAX_NEW_TOKENS,
                            beta=BETA, lr=LR, steps=steps + 1, seed=0, mixed_precision="no")
        trainer: Any = GRPOTrainer(config, model, tok, functions, rows)
        params = sum(p.numel() for p in trainer.model.parameters())
    else:
        from training.ppo import PPOConfig, PPOTrainer
        from training.value_head import load_critic

        config = PPOConfig(prompts_per_step=PROMPTS_PER_STEP, samples_per_prompt=SAMPLES,
                           minibatch_size=PROMPTS_PER_STEP * SAMPLES, ppo_epochs=1, max_new_tokens=MAX_NEW_TOKENS,
                           beta=BETA, lr=LR, steps=steps + 1, seed=0, mixed_precision="no", sample_every=0)
        critic = load_critic(model_dir) if tool == "ppo-critic" else None
        trainer = PPOTrainer(config, model, tok, functions, rows, critic=critic)
        params = sum(p.numel() for p in trainer.model.parameters())
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer.step()
    tokens = 0.0
    start = time.perf_counter()
    for _ in range(steps):
        metrics = trainer.step()
        tokens += metrics["response_length"] * PROMPTS_PER_STEP * SAMPLES
    seconds = time.perf_counter() - start
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB
    row = {"s_per_step": seconds / steps, "tokens_per_s": tokens / seconds, "trainable_params": params,
           "peak_rss_mb": peak_rss, "peak_rss_growth_mb": peak_rss - baseline}
    if cuda:
        row["cuda_max_allocated_mb"] = torch.cuda.max_memory_allocated() / 2**20
    return row


def run(steps: int = 6, repeats: int = 3, size: str = "tiny", tools: tuple[str, ...] = TOOLS) -> list[dict]:
    """Alternating subprocess runs per tool; one row per tool with medians, then PPO/GRPO ratio rows."""
    import torch

    runs: dict[str, list[dict[str, Any]]] = {tool: [] for tool in tools}
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "model"
        # built here, not in a worker, so no worker's peak includes building it
        from tests.training.tiny import char_tokenizer, save_tiny, tiny_gpt2

        tok = char_tokenizer()
        save_tiny(tiny_gpt2(tok, seed=0, n_positions=64, **SIZES[size]), tok, model_dir)
        for _ in range(repeats):
            for tool in tools:
                out = subprocess.run([sys.executable, __file__, "--worker", tool, "--size", size, "--steps", str(steps),
                                      "--model-dir", str(model_dir)], capture_output=True, text=True, env=env,
                                     check=False)
                if out.returncode != 0:
                    raise RuntimeError(f"{tool} worker failed:\n{out.stderr[-3000:]}")
                runs[tool].append(json.loads(out.stdout.strip().splitlines()[-1]))
    shape = {"size": size, **SIZES[size], "prompts_per_step": PROMPTS_PER_STEP, "samples_per_prompt": SAMPLES,
             "max_new_tokens": MAX_NEW_TOKENS, "beta": BETA, "steps": steps, "repeats": repeats,
             "device": "cuda" if torch.cuda.is_available() else "cpu", "threads": torch.get_num_threads()}
    rows = []
    for tool, results in runs.items():
        med = {key: statistics.median(r[key] for r in results) for key in results[0]}
        rows.append({"task": "ppo", "tool": tool, "steps_per_s": 1 / med["s_per_step"], **med,
                     "runs_s_per_step": [round(r["s_per_step"], 4) for r in results], **shape})
    by_tool = {r["tool"]: r for r in rows}
    if "grpo" in by_tool:
        for tool in ("ppo", "ppo-critic"):
            if tool in by_tool:
                ratio = {"task": "ppo", "tool": "ratio", "pair": f"{tool}/grpo", "size": size,
                         "time_per_step": by_tool[tool]["s_per_step"] / by_tool["grpo"]["s_per_step"],
                         "peak_rss_growth": by_tool[tool]["peak_rss_growth_mb"] / by_tool["grpo"]["peak_rss_growth_mb"]}
                if "cuda_max_allocated_mb" in by_tool["grpo"]:
                    ratio["cuda_peak"] = (by_tool[tool]["cuda_max_allocated_mb"]
                                          / by_tool["grpo"]["cuda_max_allocated_mb"])
                rows.append(ratio)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--worker", choices=TOOLS, help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.size, args.steps, args.model_dir)), flush=True)
        return 0
    for row in run(args.steps, args.repeats, args.size):
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
