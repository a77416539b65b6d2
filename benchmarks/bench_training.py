"""Training throughput and quality, preflab against TRL on the same model, data and batch: one JSON line per result.

    .venv/bin/python benchmarks/bench_training.py [--tasks reward,reward-hh,grpo,dpo,ppo] [--quick] [--repeats N]

Every task prints `{"task": ..., "tool": "preflab" | "trl", ...}` per tool and, when TRL is installed,
`{"task": ..., "tool": "ratio", "preflab_over_trl": float}` (throughput ratio; above 1 means preflab is faster).
Runs alternate (preflab, TRL, preflab, …) and medians are reported, so drifting machine load hits both sides.

Fairness: TRL's RewardTrainer gets exactly the token ids preflab trains on (prompt + response, truncated from
the left to max_length), the same initial weights, batch size, learning rate, schedule, epochs, fp32, dropout off
and no gradient checkpointing; both sides are timed over their training loop only. Held-out accuracy of both
models is measured by the same scoring code on the same held-out token ids. (Given raw text instead, TRL drops
every pair longer than max_length rather than truncating it.)

Add a task by writing `def task_x(args) -> list[dict]` and registering it in TASKS.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from training.data import PairRow, load_pairs  # noqa: E402
from training.reward_model import (  # noqa: E402
    PairEncoder,
    RewardConfig,
    default_model_path,
    encode_pairs,
    prepare_tokenizer_and_model,
    score_ids,
    train_reward_model,
)

HH = ROOT.parent / "shared" / "datasets" / "hh-rlhf" / "harmless-base-test.jsonl.gz"


SKIP_TRL = False  # set by --tools preflab


def trl_available() -> bool:
    if SKIP_TRL:
        return False
    try:
        import trl  # noqa: F401
    except ImportError:
        return False
    return True


def machine() -> dict[str, Any]:
    import os

    return {"device": "cuda" if torch.cuda.is_available() else "cpu", "threads": torch.get_num_threads(),
            "load_average": [round(x, 2) for x in os.getloadavg()]}


# ----------------------------------------------------------------------------------------------
# reward models: one preflab run and one TRL run on identical inputs


def run_preflab_reward(model_dir: str, train: list[PairRow], heldout: list[PairRow], config: RewardConfig
                       ) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as out:
        result = train_reward_model(config, train, heldout, out)
    return {"pairs_per_s": result.pairs_per_second, "seconds": result.seconds,
            "cpu_pairs_per_s": result.train_pairs * config.epochs / max(result.cpu_seconds, 1e-9),
            "accuracy": result.eval["accuracy"],
            "heldout_pairs": result.eval["pairs"], "truncated_train": result.train_truncated,
            "truncated_heldout": result.eval["truncated"], "steps": result.steps}


def run_trl_reward(model_dir: str, train: list[PairRow], heldout: list[PairRow], config: RewardConfig
                   ) -> dict[str, Any]:
    import datasets
    from accelerate.utils import set_seed
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, TrainerCallback
    from trl import RewardConfig as TRLRewardConfig
    from trl import RewardTrainer

    set_seed(config.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=1)
    prepare_tokenizer_and_model(tokenizer, model)
    encoder = PairEncoder(tokenizer, config.max_length)
    # the very token ids preflab trains on, so both sides do identical work
    enc_train, enc_heldout = encode_pairs(train, encoder, config), encode_pairs(heldout, encoder, config)
    dataset = datasets.Dataset.from_dict({"chosen_ids": enc_train.chosen, "rejected_ids": enc_train.rejected})
    with tempfile.TemporaryDirectory() as out:
        args = TRLRewardConfig(
            output_dir=out, per_device_train_batch_size=config.batch_size, learning_rate=config.lr,
            num_train_epochs=config.epochs, lr_scheduler_type=config.lr_schedule, warmup_steps=config.warmup_ratio,
            weight_decay=config.weight_decay, max_grad_norm=config.max_grad_norm, max_length=config.max_length,
            seed=config.seed, bf16=False, fp16=False, gradient_checkpointing=False, disable_dropout=True,
            logging_steps=10_000, save_strategy="no", eval_strategy="no", report_to="none",
            dataloader_num_workers=0, use_cpu=not torch.cuda.is_available(), disable_tqdm=True,
        )
        cpu: list[float] = []

        class CPUClock(TrainerCallback):  # CPU time of the training loop, as preflab's
            def on_train_begin(self, *args, **kwargs):  # noqa: ANN002, ANN003 - the Trainer's callback signature
                cpu.append(time.process_time())

            def on_train_end(self, *args, **kwargs):  # noqa: ANN002, ANN003
                cpu.append(time.process_time())

        trainer = RewardTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer,
                                callbacks=[CPUClock()])
        output = trainer.train()
    seconds = float(output.metrics["train_runtime"])
    trained = trainer.model.eval()
    device = next(trained.parameters()).device
    r_c = score_ids(trained, enc_heldout.chosen, tokenizer.pad_token_id, config.eval_batch_size, device)
    r_r = score_ids(trained, enc_heldout.rejected, tokenizer.pad_token_id, config.eval_batch_size, device)
    correct = torch.where(r_c == r_r, torch.full_like(r_c, 0.5), (r_c > r_r).float())
    return {"pairs_per_s": len(dataset) * config.epochs / seconds, "seconds": seconds,
            "cpu_pairs_per_s": len(dataset) * config.epochs / max(cpu[-1] - cpu[0], 1e-9),
            "accuracy": correct.mean().item(), "heldout_pairs": len(heldout), "steps": output.global_step}


def compare_reward(task: str, model_dir: str, train: list[PairRow], heldout: list[PairRow], config: RewardConfig,
                   repeats: int, shape: dict[str, Any]) -> list[dict[str, Any]]:
    """Alternating runs of both tools; one row per tool with medians, and the ratio row."""
    ours, theirs = [], []
    with_trl = trl_available()
    for _ in range(repeats):
        ours.append(run_preflab_reward(model_dir, train, heldout, config))
        if with_trl:
            theirs.append(run_trl_reward(model_dir, train, heldout, config))
    rows = []
    for tool, runs in (("preflab", ours), ("trl", theirs)):
        if not runs:
            continue
        rows.append({"task": task, "tool": tool,
                     "pairs_per_s": statistics.median(r["pairs_per_s"] for r in runs),
                     "cpu_pairs_per_s": statistics.median(r["cpu_pairs_per_s"] for r in runs),
                     "accuracy": statistics.median(r["accuracy"] for r in runs),
                     "runs_pairs_per_s": [round(r["pairs_per_s"], 2) for r in runs],
                     **{k: v for k, v in runs[0].items()
                        if k not in {"pairs_per_s", "cpu_pairs_per_s", "accuracy", "seconds"}},
                     **shape, **machine()})
    if theirs:
        rows.append({"task": task, "tool": "ratio", "preflab_over_trl": rows[0]["pairs_per_s"] / rows[1]["pairs_per_s"],
                     "cpu_preflab_over_trl": rows[0]["cpu_pairs_per_s"] / rows[1]["cpu_pairs_per_s"],
                     "accuracy_difference": rows[0]["accuracy"] - rows[1]["accuracy"]})
    return rows


# ----------------------------------------------------------------------------------------------
# tasks


def task_reward(args: argparse.Namespace) -> list[dict[str, Any]]:
    """A tiny BERT built here, on synthetic pairs with a learnable rule and varied lengths."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast

    good, bad, neutral = ["great", "kind", "clear", "helpful"], ["rude", "wrong", "vague", "lazy"], \
        [f"w{i}" for i in range(200)]
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "q"] + good + bad + neutral
    vocab = {w: i for i, w in enumerate(words)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]",
                                                           special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]",
                                        cls_token="[CLS]", sep_token="[SEP]")
    rng = random.Random(0)

    def response(worth: int) -> str:
        # lengths from 4 to 120 words: the long tail is what length grouping saves padding on
        out = [rng.choice(neutral) for _ in range(int(rng.paretovariate(1.2) * 4) % 120 + 4)]
        for _ in range(abs(worth)):
            out.insert(rng.randrange(len(out) + 1), rng.choice(good if worth > 0 else bad))
        return " ".join(out)

    def pairs(n: int) -> list[PairRow]:
        rows = []
        for _ in range(n):
            hi, lo = sorted(rng.sample(range(-2, 3), 2), reverse=True)
            rows.append(PairRow(prompt="q " + " ".join(rng.choice(neutral) for _ in range(rng.randint(2, 20))),
                                chosen=response(hi), rejected=response(lo)))
        return rows

    n_train = 512 if args.quick else 2048
    train, heldout = pairs(n_train), pairs(256)
    config = RewardConfig(batch_size=16, lr=1e-3, max_length=160, epochs=2, eval_every=0, progress=False,
                          lr_schedule="linear")
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        model = BertForSequenceClassification(BertConfig(
            vocab_size=len(vocab), hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=256, max_position_embeddings=256, num_labels=1, pad_token_id=0))
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        config.model = tmp
        shape = {"model": "bert-2x128 (built in code)", "train_pairs": len(train), "batch_size": config.batch_size,
                 "max_length": config.max_length, "epochs": config.epochs, "repeats": args.repeats}
        return compare_reward("reward", tmp, train, heldout, config, args.repeats, shape)


def read_hh_lines(first: int, last: int) -> list[dict[str, Any]]:
    """Lines first..last (1-based, inclusive) of the HH-RLHF harmless test file."""
    with gzip.open(HH, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for number, line in enumerate(fh, start=1) if first <= number <= last]


def task_reward_hh(args: argparse.Namespace) -> list[dict[str, Any]]:
    """MiniLM on HH-RLHF harmless: train on lines 1–1800, held-out accuracy on 1801–2312, max length 256."""
    if not HH.exists():
        return [{"task": "reward-hh", "tool": "preflab", "skipped": f"{HH} not found"}]
    with tempfile.TemporaryDirectory() as tmp:
        # through the product's own reader (implicit prompt: the shared transcript prefix)
        train_path, heldout_path = Path(tmp) / "train.jsonl", Path(tmp) / "heldout.jsonl"
        train_lines, heldout_lines = (1, 1800), (1801, 2312)
        if args.quick:  # a short run for slow machines: a slice of each split
            train_lines, heldout_lines = (1, 400), (1801, 2056)
        for path, (a, b) in ((train_path, train_lines), (heldout_path, heldout_lines)):
            path.write_text("".join(json.dumps(r) + "\n" for r in read_hh_lines(a, b)), encoding="utf-8")
        train, heldout = load_pairs(train_path), load_pairs(heldout_path)
    model_dir = default_model_path()
    config = RewardConfig(model=model_dir, batch_size=8, eval_batch_size=32, lr=5e-5, max_length=256,
                          epochs=1, eval_every=0, progress=False, seed=args.seed)
    shape = {"model": "all-MiniLM-L6-v2", "seed": args.seed, "train_lines": list(train_lines),
             "heldout_lines": list(heldout_lines),
             "batch_size": config.batch_size, "max_length": config.max_length, "lr": config.lr,
             "epochs": config.epochs, "repeats": args.repeats, "quick": args.quick}
    return compare_reward("reward-hh", model_dir, train, heldout, config, args.repeats, shape)


def task_grpo(args: argparse.Namespace) -> list[dict[str, Any]]:
    """GRPO steps/s on a tiny GPT-2 (benchmarks/bench_grpo.py)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_grpo

    return bench_grpo.run(steps=4 if args.quick else 8, repeats=args.repeats)


def task_dpo(args: argparse.Namespace) -> list[dict[str, Any]]:
    """DPO steps/s, peak RSS and held-out loss on a tiny GPT-2 (benchmarks/bench_dpo.py), with a real model's
    32,000-row output layer and with the character tokenizer's own 80 rows."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_dpo

    steps = 10 if args.quick else 40
    return bench_dpo.run(steps=steps, repeats=args.repeats) + bench_dpo.run(steps=steps, repeats=args.repeats,
                                                                           vocab=0)


def task_ppo(args: argparse.Namespace) -> list[dict[str, Any]]:
    """PPO (value head, separate critic) against GRPO on the same work: time and peak memory
    (benchmarks/bench_ppo.py)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_ppo

    return bench_ppo.run(steps=3 if args.quick else 6, repeats=args.repeats)


TASKS: dict[str, Callable[[argparse.Namespace], list[dict[str, Any]]]] = {
    "reward": task_reward,
    "reward-hh": task_reward_hh,
    "grpo": task_grpo,
    "dpo": task_dpo,
    "ppo": task_ppo,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default=",".join(TASKS), help=f"comma-separated, from: {', '.join(TASKS)}")
    parser.add_argument("--quick", action="store_true", help="short runs (subsets, fewer steps)")
    parser.add_argument("--repeats", type=int, default=None, help="alternating runs per tool (default 3, quick 1)")
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    parser.add_argument("--tools", default="preflab,trl", help="preflab,trl (default) or preflab alone")
    parser.add_argument("--seed", type=int, default=0,
                        help="reward-hh: the seed of both tools (head initialisation, shuffling)")
    args = parser.parse_args(argv)
    global SKIP_TRL
    SKIP_TRL = "trl" not in args.tools.split(",")
    args.repeats = args.repeats or (1 if args.quick else 3)
    if args.threads:
        torch.set_num_threads(args.threads)
    names = [t.strip() for t in args.tasks.split(",") if t.strip()]
    unknown = [t for t in names if t not in TASKS]
    if unknown:
        parser.error(f"unknown task(s) {', '.join(unknown)}; known: {', '.join(TASKS)}")
    for name in names:
        started = time.perf_counter()
        for row in TASKS[name](args):
            print(json.dumps({**row, "wall_s": round(time.perf_counter() - started, 1)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
