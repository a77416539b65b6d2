"""DPO throughput and memory: preflab's DPOTrainer against TRL's DPOTrainer on the same tiny GPT-2 and the same work.

Same model weights, pairs, batch size, β, learning rate, schedule, lengths and fp32; dropout off on both sides;
the reference is a frozen copy of the model on both. Each run is its own process, so its peak RSS is its own;
runs alternate (preflab, TRL, preflab, …) and medians are reported. Quality at equal steps: both final models
are scored by the same code (the DPO loss and implicit-reward accuracy on the same held-out pairs, against the
same starting model as reference).

    .venv/bin/python benchmarks/bench_dpo.py [--steps 40] [--repeats 3]

Prints `{"task": "dpo", "tool": "preflab" | "trl", ...}` per tool and `{"task": "dpo", "tool": "ratio",
"preflab_over_trl": x}` (steps/s; above 1 means preflab is faster); `run()` returns the rows for bench_training.py.
"""

from __future__ import annotations

import argparse
import json
import os
import random
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

import torch  # noqa: E402

BATCH = 8
BETA = 0.1
LR = 1e-4
MAX_LENGTH = 64
WORDS = ["the", "sum", "is", "so", "we", "add", "and", "get", "answer"]


def _model_dir(tmp: Path, vocab: int) -> Path:
    """The tiny GPT-2 (2 layers × 128) with a character tokenizer; `vocab` rows in its LM head (≥ the tokenizer's:
    32,000 is a real model's, Llama 2's, whose output layer costs what it costs in practice)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from tests.training.tiny import char_tokenizer, save_tiny

    tok = char_tokenizer()
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=max(vocab, len(tok)), n_positions=MAX_LENGTH, n_embd=128, n_layer=2, n_head=4,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=tok.eos_token_id,
                        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    return save_tiny(GPT2LMHeadModel(config), tok, tmp / "model")


def pairs(n: int, seed: int) -> list[dict[str, str]]:
    """Addition with worded answers of varied length (10–40 characters): the right sum over a sum off by one."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(0, 49), rng.randint(0, 49)
        filler = " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 5)))
        rows.append({"prompt": f"{a}+{b}=", "chosen": f"{filler} {a + b}".strip(),
                     "rejected": f"{filler} {a + b + rng.choice([-1, 1])}".strip()})
    return rows


def heldout_scores(model: torch.nn.Module, model_dir: Path, rows: list[dict[str, str]]) -> dict[str, float]:
    """DPO loss and implicit-reward accuracy of a trained model on held-out pairs, by preflab's scoring code."""
    from training.causal_lm import encode_examples, sequence_logprobs
    from training.losses import dpo_logits, dpo_loss
    from training.policy import load_policy

    reference, tok = load_policy(model_dir)
    prompts = [r["prompt"] for r in rows]
    chosen = encode_examples(tok, prompts, [r["chosen"] for r in rows], MAX_LENGTH)
    rejected = encode_examples(tok, prompts, [r["rejected"] for r in rows], MAX_LENGTH)
    device = next(model.parameters()).device
    model.eval()
    lp = sequence_logprobs(model, chosen + rejected, tok.pad_token_id, device, 64)
    ref = sequence_logprobs(reference.to(device), chosen + rejected, tok.pad_token_id, device, 64)
    n = len(rows)
    h = dpo_logits(lp[:n], lp[n:], ref[:n], ref[n:])
    return {"heldout_loss": dpo_loss(h, BETA).item(), "heldout_accuracy": (h > 0).float().mean().item()}


def train_preflab(model_dir: Path, steps: int, out: Path) -> dict[str, Any]:
    from training.config import DPOConfig
    from training.data import PairRow
    from training.dpo import DPOTrainer

    rows = [PairRow(**r) for r in pairs(512, seed=0)]
    config = DPOConfig(model=str(model_dir), out=str(out), steps=steps + 1, lr=LR, beta=BETA, batch_size=BATCH,
                       max_length=MAX_LENGTH, lr_schedule="linear", mixed_precision="no", progress=False,
                       group_by_length=False, seed=0)
    trainer = DPOTrainer(config, rows)
    trainer.step()  # warm-up, as TRL's first step is left out of its timing
    start, cpu = time.perf_counter(), time.process_time()
    losses = [trainer.step()["loss"] for _ in range(steps)]
    wall, cpu_s = time.perf_counter() - start, time.process_time() - cpu
    return {"s_per_step": wall / steps, "cpu_s_per_step": cpu_s / steps, "last_loss": losses[-1],
            **heldout_scores(trainer.unwrapped(), model_dir, pairs(128, seed=1))}


def train_trl(model_dir: Path, steps: int, out: Path) -> dict[str, Any]:
    import datasets
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import DPOConfig, DPOTrainer

    stamps: list[tuple[float, float]] = []
    losses: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001 - TRL's callback signature
            stamps.append((time.perf_counter(), time.process_time()))

        def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001
            if logs and "loss" in logs:
                losses.append(float(logs["loss"]))

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    config = DPOConfig(
        output_dir=str(out), per_device_train_batch_size=BATCH, learning_rate=LR, beta=BETA, max_length=MAX_LENGTH,
        max_steps=steps + 1, lr_scheduler_type="linear", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
        use_cpu=not torch.cuda.is_available(), report_to="none", save_strategy="no", logging_steps=1,
        disable_dropout=True, bf16=False, fp16=False, seed=0, dataloader_num_workers=0, disable_tqdm=True,
        gradient_checkpointing=False,
    )
    trainer = DPOTrainer(model=model, args=config, train_dataset=datasets.Dataset.from_list(pairs(512, seed=0)),
                         processing_class=tok, callbacks=[Clock()])
    trainer.train()
    return {"s_per_step": (stamps[-1][0] - stamps[0][0]) / steps,
            "cpu_s_per_step": (stamps[-1][1] - stamps[0][1]) / steps, "last_loss": losses[-1] if losses else None,
            **heldout_scores(trainer.model, model_dir, pairs(128, seed=1))}


def peak_rss_mb() -> float:
    """This process's peak resident set (VmHWM). Not getrusage's ru_maxrss: Linux carries that over from the
    parent this process was forked from, so a big parent would set every worker's figure."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # not Linux: the closest figure there is


def one_run(tool: str, model_dir: Path, steps: int) -> dict[str, Any]:
    """A run of `tool` in a process of its own: its timings, held-out scores and peak RSS."""
    done = subprocess.run([sys.executable, __file__, "--worker", tool, "--model", str(model_dir),
                           "--steps", str(steps)], capture_output=True, text=True, timeout=1800,
                          env=dict(os.environ, TOKENIZERS_PARALLELISM="false"))
    if done.returncode != 0:
        raise RuntimeError(f"{tool} run failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(steps: int = 40, repeats: int = 3, vocab: int = 32_000) -> list[dict[str, Any]]:
    """Alternating runs; rows as printed."""
    try:
        import trl  # noqa: F401
    except ImportError:
        tools = ["preflab"]
    else:
        tools = ["preflab", "trl"]
    results: dict[str, list[dict[str, Any]]] = {t: [] for t in tools}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = _model_dir(Path(tmp), vocab)
        for _ in range(repeats):
            for tool in tools:
                results[tool].append(one_run(tool, model_dir, steps))
    shape = {"batch_size": BATCH, "beta": BETA, "lr": LR, "max_length": MAX_LENGTH, "steps": steps,
             "repeats": repeats, "model": "gpt2-2x128 (built in code)", "vocab": vocab,
             "device": "cuda" if torch.cuda.is_available() else "cpu", "threads": torch.get_num_threads(),
             "load_average": [round(x, 2) for x in os.getloadavg()]}
    rows = []
    for tool, runs in results.items():
        rows.append({"task": "dpo", "tool": tool,
                     "steps_per_s": 1 / statistics.median(r["s_per_step"] for r in runs),
                     "cpu_steps_per_s": 1 / statistics.median(r["cpu_s_per_step"] for r in runs),
                     "heldout_loss": statistics.median(r["heldout_loss"] for r in runs),
                     "heldout_accuracy": statistics.median(r["heldout_accuracy"] for r in runs),
                     "peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in runs),
                     "s_per_step": [round(r["s_per_step"], 4) for r in runs], **shape})
    if len(rows) == 2:
        ours, theirs = rows
        rows.append({"task": "dpo", "tool": "ratio", "preflab_over_trl": ours["steps_per_s"] / theirs["steps_per_s"],
                     "cpu_preflab_over_trl": ours["cpu_steps_per_s"] / theirs["cpu_steps_per_s"],
                     "heldout_loss_difference": ours["heldout_loss"] - theirs["heldout_loss"],
                     "peak_rss_mb_difference": ours["peak_rss_mb"] - theirs["peak_rss_mb"]})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--vocab", type=int, default=32_000, help="rows of the LM head (the tokenizer's own: 80)")
    parser.add_argument("--worker", choices=["preflab", "trl"], help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        with tempfile.TemporaryDirectory() as out:
            train = train_preflab if args.worker == "preflab" else train_trl
            result = train(Path(args.model), args.steps, Path(out))
        result["peak_rss_mb"] = peak_rss_mb()
        print(json.dumps(result))
        return 0
    for row in run(args.steps, args.repeats, args.vocab):
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
