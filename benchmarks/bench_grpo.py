"""GRPO throughput: preflab's GRPOTrainer against TRL's GRPOTrainer on the same tiny GPT-2 and the same work.

Same model weights, prompts, G, completions per step, max new tokens, β, learning rate, temperature;
dropout off on both sides; runs alternate (preflab, TRL, preflab, …) and medians are reported.
Prints one JSON line per tool and a ratio line; `run()` returns those rows for bench_training.py.

    .venv/bin/python benchmarks/bench_grpo.py [--steps 8] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from tests.training.tiny import addition_problems, char_tokenizer, save_tiny, tiny_gpt2  # noqa: E402

G = 8
PROMPTS_PER_STEP = 8
MAX_NEW_TOKENS = 8
BETA = 0.04
LR = 1e-5


def _model_dir(tmp: Path) -> Path:
    tok = char_tokenizer()
    return save_tiny(tiny_gpt2(tok, seed=0, n_embd=128, n_layer=2, n_positions=64), tok, tmp / "model")


def _problems() -> list[tuple[str, str]]:
    return addition_problems(100, seed=0)


def time_preflab(model_dir: Path, steps: int) -> tuple[float, float]:
    """(wall, CPU) seconds per step over `steps` steps after one warm-up step."""
    from training.data import PromptRow
    from training.grpo import GRPOConfig, GRPOTrainer
    from training.policy import load_policy
    from training.rewards import build_reward_functions

    model, tok = load_policy(model_dir)
    rows = [PromptRow(prompt=p, reference=a) for p, a in _problems()]
    config = GRPOConfig(group_size=G, prompts_per_step=PROMPTS_PER_STEP, max_new_tokens=MAX_NEW_TOKENS, beta=BETA,
                        lr=LR, steps=steps + 1, seed=0, mixed_precision="no")
    trainer = GRPOTrainer(config, model, tok, build_reward_functions(["gsm8k_exact_match"]), rows)
    trainer.step()
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        trainer.step()
    return (time.perf_counter() - start) / steps, (time.process_time() - cpu) / steps


def time_trl(model_dir: Path, steps: int, out: Path) -> tuple[float, float]:
    """(wall, CPU) seconds per step of TRL's GRPOTrainer, timed between the ends of step 1 and step 1 + steps."""
    import datasets
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from training.rewards import gsm8k_exact_match

    stamps: list[tuple[float, float]] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001 - TRL's callback signature
            stamps.append((time.perf_counter(), time.process_time()))

    problems = _problems()
    data = datasets.Dataset.from_dict({"prompt": [p for p, _ in problems], "reference": [a for _, a in problems]})
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    config = GRPOConfig(
        output_dir=str(out), per_device_train_batch_size=G * PROMPTS_PER_STEP, num_generations=G,
        max_completion_length=MAX_NEW_TOKENS, beta=BETA, learning_rate=LR, temperature=1.0, max_steps=steps + 1,
        use_cpu=not torch.cuda.is_available(), report_to="none", save_strategy="no", logging_steps=1000,
        disable_dropout=True, bf16=False, seed=0, loss_type="grpo", scale_rewards="group",
    )
    trainer = GRPOTrainer(model=model, reward_funcs=gsm8k_exact_match, args=config, train_dataset=data,
                          processing_class=tok, callbacks=[Clock()])
    trainer.train()
    return (stamps[-1][0] - stamps[0][0]) / steps, (stamps[-1][1] - stamps[0][1]) / steps


def run(steps: int = 8, repeats: int = 3) -> list[dict]:
    """Alternating runs; rows as printed."""
    try:
        import trl  # noqa: F401
    except ImportError:
        trl_available = False
    else:
        trl_available = True
    ours, theirs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = _model_dir(Path(tmp))
        for i in range(repeats):
            ours.append(time_preflab(model_dir, steps))
            if trl_available:
                theirs.append(time_trl(model_dir, steps, Path(tmp) / f"trl{i}"))
    shape = {"group_size": G, "prompts_per_step": PROMPTS_PER_STEP, "max_new_tokens": MAX_NEW_TOKENS, "beta": BETA,
             "steps": steps, "repeats": repeats, "device": "cuda" if torch.cuda.is_available() else "cpu",
             "threads": torch.get_num_threads(), "load_average": [round(x, 2) for x in os.getloadavg()]}

    def row(tool: str, runs: list[tuple[float, float]]) -> dict:
        # CPU seconds (this process, all threads) next to wall seconds: on a shared machine the wall clock also
        # counts the time other jobs held the cores, the CPU clock mostly does not
        return {"task": "grpo", "tool": tool, "steps_per_s": 1 / statistics.median(w for w, _ in runs),
                "s_per_step": [round(w, 4) for w, _ in runs], "cpu_s_per_step": [round(c, 4) for _, c in runs],
                **shape}

    rows = [row("preflab", ours)]
    if theirs:
        rows.append(row("trl", theirs))
        wall = statistics.median(w for w, _ in theirs) / statistics.median(w for w, _ in ours)
        cpu = statistics.median(c for _, c in theirs) / statistics.median(c for _, c in ours)
        rows.append({"task": "grpo", "tool": "ratio", "preflab_over_trl": wall, "cpu_preflab_over_trl": cpu})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.threads:
        torch.set_num_threads(args.threads)
    for row in run(args.steps, args.repeats):
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
