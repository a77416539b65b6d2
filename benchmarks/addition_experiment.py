"""The addition experiment: SFT, then RFT (offline and online), GRPO and GSPO on single-digit addition, on CPU.

A tiny GPT-2 is fitted by SFT to targets with a systematic slip (3 of 5 answers are a+b+1), on all
100 problems. Each method then trains on 60 prompts with the exact-match reward; the other 40 are held out.
Every method samples the same number of answers (steps × 16 prompts × 8): GRPO/GSPO one group per prompt per
step, RFT one round per step (`steps_per_round` = 1) keeping the right answers. Prints a JSON line per method
and a Markdown table: sampled accuracy, Pass@K, Maj@K, greedy accuracy, KL to the SFT model, CPU seconds.
The expected order (DeepSeekMath §5.2.1) is SFT < RFT < online RFT < GRPO; Maj@K should move much more than
Pass@K (DeepSeekMath §5.2.2).

    .venv/bin/python benchmarks/addition_experiment.py [--steps 80] [--k 16]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.training.tiny import addition_split, careless_sft_set, char_tokenizer, save_tiny, sft, tiny_gpt2  # noqa: E402
from training.config import RFTConfig  # noqa: E402
from training.data import PromptRow  # noqa: E402
from training.evaluate import EvalConfig, evaluate  # noqa: E402
from training.grpo import GRPOConfig, GRPOTrainer  # noqa: E402
from training.policy import Reference, load_policy, prepare_tokenizer  # noqa: E402
from training.rewards import build_reward_functions  # noqa: E402
from training.rft import RFTTrainer  # noqa: E402


def grpo_config(args: argparse.Namespace, loss_type: str) -> GRPOConfig:
    return GRPOConfig(loss_type=loss_type, group_size=8, prompts_per_step=16, lr=1e-3, beta=0.04, max_new_tokens=4,
                      steps=args.steps, seed=args.seed, progress=False)


def rft_config(args: argparse.Namespace, online: bool) -> RFTConfig:
    # the same samples as GRPO: a round of 16 prompts × 8 answers per step; one fine-tuning step on what it kept
    return RFTConfig(online=online, prompts_per_round=16, samples_per_prompt=8, steps_per_round=1,
                     batch_size=32, lr=1e-3, max_new_tokens=4, steps=args.steps, seed=args.seed, distinct=False,
                     progress=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--k", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    tok = prepare_tokenizer(char_tokenizer())
    rl, heldout = addition_split(60, 40, seed=args.seed)
    rl_rows = [PromptRow(prompt=p, reference=a) for p, a in rl]
    rows = [PromptRow(prompt=p, reference=a) for p, a in heldout]
    functions = build_reward_functions(["gsm8k_exact_match"])
    eval_config = EvalConfig(k=args.k, max_new_tokens=4, seed=7)
    table = []
    with tempfile.TemporaryDirectory() as tmp:
        started = time.process_time()
        model = tiny_gpt2(tok, seed=args.seed)
        sft(model, tok, careless_sft_set(rl + heldout), steps=300, seed=args.seed)
        sft_cpu = time.process_time() - started
        path = save_tiny(model, tok, Path(tmp) / "sft")
        base, _ = load_policy(path)
        result = evaluate(base, tok, rows, functions, Reference(base), eval_config)
        table.append(("SFT", result, sft_cpu))
        methods = {
            "RFT (offline)": lambda model: RFTTrainer(rft_config(args, online=False), model, tok, functions, rl_rows),
            "RFT (online)": lambda model: RFTTrainer(rft_config(args, online=True), model, tok, functions, rl_rows),
            "GRPO": lambda model: GRPOTrainer(grpo_config(args, "grpo"), model, tok, functions, rl_rows),
            "GSPO": lambda model: GRPOTrainer(grpo_config(args, "gspo"), model, tok, functions, rl_rows),
        }
        for name, make in methods.items():
            model, _ = load_policy(path)
            trainer = make(model)
            started = time.process_time()
            for _ in range(args.steps):
                trainer.step()
            cpu = time.process_time() - started
            result = evaluate(trainer.policy, tok, rows, functions, trainer.reference, eval_config)
            table.append((f"SFT → {name} ({args.steps} steps)", result, cpu))
    k = args.k
    for name, result, cpu in table:
        p = result["policy"]
        print(json.dumps({"bench": "addition", "method": name, "seed": args.seed, "accuracy": p["accuracy"],
                          "pass_at_k": p["pass_at_k"], "maj_at_k": p["maj_at_k"],
                          "greedy_accuracy": p["greedy_accuracy"], "kl": result["kl"], "cpu_s": round(cpu, 1),
                          "k": k}))
    print(f"| model | accuracy (sampled) | Pass@{k} | Maj@{k} | greedy accuracy | KL to SFT | CPU s (training) |")
    print("|---|---|---|---|---|---|---|")
    for name, result, cpu in table:
        p = result["policy"]
        print(f"| {name} | {p['accuracy']:.3f} | {p['pass_at_k']:.3f} | {p['maj_at_k']:.3f} | "
              f"{p['greedy_accuracy']:.3f} | {result['kl']:.3f} | {cpu:.1f} |")
    print(f"\n40 held-out prompts (never trained on by RL), K = {k} samples at temperature 1, seed {args.seed}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
