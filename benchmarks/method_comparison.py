"""Methods compared on CPU (after DeepSeekMath §5.2.1): SFT, RFT, online RFT, GRPO with outcome or process reward.

The task is verifiable and multi-step: a prompt "a+b+c=" is answered in two lines, "a+b=s" then "s+c=t", each line
a step a script can check. A tiny GPT-2 is fitted by SFT to careless solutions (per problem 2 right, 1 with a slip
in the first line carried on, 2 with a slip in the second line), on every problem. Each method then trains on the
training prompts against the exact match of the final number and is evaluated on held-out prompts it never trained
on, with the same number of samples per method (steps × prompts_per_step × group): GRPO one group per prompt per
step, RFT one round per step. The process reward of `grpo_process` comes from a process reward model
(`training.prm`) trained on a steps export, made the way a team would make one (`_step_project`): SFT samples of the
training prompts (K distinct ones per prompt, at least one right and one wrong) are imported into a project with
step labels on, a scripted annotator takes each task from the queue, ranks its completions (right final answers
first) and labels every line +1 or -1 with the line checker, the export job writes the `steps` export, and the PRM
trains on its train split (the export's held-out split scores it). Those samples are extra, and counted in its
`prm_cpu_s`. The exact match is added on each rollout's last step (`--outcome-weight`, default 1; with 0 the PRM
alone is the reward, and this tiny PRM is then exploited).

Prints one JSON line per method and seed, `{"bench": "methods", "method": ..., "seed": n, "accuracy": ...,
"maj_at_k": ..., "pass_at_k": ..., "kl": ..., "cpu_s": ..., "curve": [[step, accuracy], ...]}`, then a Markdown table
of the means over seeds, and writes the curves (held-out accuracy by training step, mean over seeds; `--curve-k`
samples per prompt, every `--curve-every` steps) as a PNG drawn by `_png` (`--plot`, default
docs/img/method_comparison.png, which the benchmarks page shows).

    .venv/bin/python benchmarks/method_comparison.py [--seeds 0 1 2] [--steps 40] [--k 8] [--plot PATH]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for where in (ROOT, ROOT / "benchmarks"):
    if str(where) not in sys.path:
        sys.path.insert(0, str(where))

import torch  # noqa: E402
from _png import Series, line_chart  # noqa: E402
from _step_project import Item, label_through_project  # noqa: E402

from tests.training.tiny import char_tokenizer, save_tiny, sft, tiny_gpt2  # noqa: E402
from training.config import GRPOConfig, PRMConfig, RFTConfig  # noqa: E402
from training.data import PromptRow, load_steps  # noqa: E402
from training.evaluate import EvalConfig, evaluate  # noqa: E402
from training.grpo import GRPOTrainer  # noqa: E402
from training.policy import Reference, generate_rollouts, load_policy, prepare_tokenizer  # noqa: E402
from training.prm import split_steps, train_prm  # noqa: E402
from training.rewards import build_reward_functions, extract_final_number  # noqa: E402
from training.rft import RFTTrainer  # noqa: E402

METHODS = ("sft", "rft", "online_rft", "grpo_outcome", "grpo_process")
MAX_NEW_TOKENS = 16
LINE = re.compile(r"^(\d+)\+(\d+)=(\d+)$")


# --- the task ---------------------------------------------------------------------------------------


def problems(seed: int, high: int) -> list[tuple[int, int, int]]:
    """Every (a, b, c) with operands in [0, high], in a seeded order."""
    all_ = [(a, b, c) for a in range(high + 1) for b in range(high + 1) for c in range(high + 1)]
    random.Random(seed).shuffle(all_)
    return all_


def prompt_of(p: tuple[int, int, int]) -> str:
    return f"{p[0]}+{p[1]}+{p[2]}="


def solution(a: int, b: int, c: int, slip1: int = 0, slip2: int = 0) -> str:
    s = a + b + slip1
    return f"{a}+{b}={s}\n{s}+{c}={s + c + slip2}"


def careless_set(items: list[tuple[int, int, int]]) -> list[tuple[str, str]]:
    """Per problem: 2 right solutions, 1 whose first line is off by one (carried on), 2 whose second line is."""
    out = []
    for a, b, c in items:
        out += [(prompt_of((a, b, c)), solution(a, b, c))] * 2
        out += [(prompt_of((a, b, c)), solution(a, b, c, slip1=1))]
        out += [(prompt_of((a, b, c)), solution(a, b, c, slip2=1))] * 2
    return out


def check_lines(prompt: str, steps: list[str]) -> list[bool]:
    """The scripted line checker: line 1 must be "a+b=a+b", line 2 "s+c=s+c" with s the sum line 1 wrote (a step is
    judged given the ones before it, as PRM800K's labellers did); any further line is wrong."""
    a, b, c = (int(x) for x in prompt.rstrip("=").split("+"))
    labels, carried = [], None
    for j, step in enumerate(steps):
        m = LINE.match(step.strip())
        if m is None or j > 1:
            labels.append(False)
            continue
        x, y, z = (int(g) for g in m.groups())
        want_x, want_y = (a, b) if j == 0 else (carried, c)
        labels.append(x == want_x and y == want_y and z == x + y)
        carried = z
    return labels


# --- the methods ------------------------------------------------------------------------------------


def final_right(prompt: str, text: str) -> bool:
    """The annotator's and the outcome reward's test: the completion's final number is a + b + c."""
    got = extract_final_number(text)
    return got is not None and got == sum(int(x) for x in prompt.rstrip("=").split("+"))


def pick_completions(prompt: str, texts: list[str], k: int) -> list[str] | None:
    """K distinct non-empty samples with at least one right and one wrong final answer (a ranking needs two tiers),
    in the order sampled; None when the samples do not have them."""
    distinct = list(dict.fromkeys(t.strip() for t in texts if split_steps(t.strip())[0]))
    right = [t for t in distinct if final_right(prompt, t)]
    wrong = [t for t in distinct if not final_right(prompt, t)]
    if not right or not wrong or len(distinct) < k:
        return None
    chosen = [right[0], wrong[0]] + [t for t in distinct if t not in (right[0], wrong[0])][:k - 2]
    return sorted(chosen, key=distinct.index)


def prm_items(sft_path: Path, tok: Any, rows: list[PromptRow], seed: int, samples: int, k: int,
              rounds: int = 4) -> tuple[list[Item], int]:
    """Sample the SFT model on the training prompts (`samples` each, up to `rounds` times for a prompt whose samples
    lack K distinct ones or a right and a wrong one) and pick K completions per prompt; the first 4/5 of the prompts
    are the PRM's train split, the rest its held-out split. Returns (items, prompts left out)."""
    model, _ = load_policy(sft_path)
    pool: dict[str, list[str]] = {str(r.prompt): [] for r in rows}
    picked: dict[str, list[str]] = {}
    for attempt in range(rounds):
        todo = [p for p in pool if p not in picked]
        if not todo:
            break
        rollouts = generate_rollouts(model, tok, todo, n=samples, max_new_tokens=MAX_NEW_TOKENS,
                                     seed=seed + 99 + 1000 * attempt)
        for i, text in enumerate(rollouts.texts):
            pool[todo[i // samples]].append(text)
        for prompt in todo:
            chosen = pick_completions(prompt, pool[prompt], k)
            if chosen is not None:
                picked[prompt] = chosen
    kept = [p for p in pool if p in picked]
    cut = len(kept) * 4 // 5
    items = [Item(prompt=p, completions=picked[p], split="train" if n < cut else "heldout",
                  reference=str(sum(int(x) for x in p.rstrip("=").split("+")))) for n, p in enumerate(kept)]
    return items, len(pool) - len(kept)


def train_step_prm(sft_path: Path, tok: Any, rows: list[PromptRow], out: Path, seed: int, args: argparse.Namespace
                   ) -> tuple[Path, float, dict[str, Any]]:
    """The product path: SFT samples of the training prompts go into a project with step labels on, a scripted
    annotator ranks them and labels each line with the checker, a steps export is made by the export job, and the
    PRM trains on the exported file's train split (its held-out split scores it)."""
    started = time.process_time()
    items, left_out = prm_items(sft_path, tok, rows, seed, args.prm_samples, args.prm_k)
    labelled = label_through_project(items, args.prm_k, check_lines, final_right, workdir=out / "project")
    train, heldout = load_steps(labelled.path, split="train"), load_steps(labelled.path, split="heldout")
    # the PRM starts from the SFT model's body (it can already add) with a new one-output head, as PRMs usually do
    result = train_prm(PRMConfig(model=str(sft_path), out=str(out / "prm"), epochs=args.prm_epochs, batch_size=32,
                                 lr=3e-3, max_length=32, eval_every=0, seed=seed, progress=False),
                       train, heldout)
    report = {k: result.eval[k] for k in ("step_accuracy", "first_error_accuracy", "pair_accuracy")}
    report |= {"export_rows": labelled.rows, "train_rows": len(train), "heldout_rows": len(heldout),
               "tasks": labelled.tasks, "step_labels": labelled.step_labels, "prompts_left_out": left_out}
    return out / "prm" / "model", time.process_time() - started, report


def make_trainers(args: argparse.Namespace, seed: int, tok: Any, rl_rows: list[PromptRow], prm: Path | None
                  ) -> dict[str, Callable[[Any], Any]]:
    outcome = build_reward_functions(["gsm8k_exact_match"])
    grpo = dict(group_size=args.group, prompts_per_step=args.prompts_per_step, lr=1e-3, beta=0.04,
                max_new_tokens=MAX_NEW_TOKENS, steps=args.steps, seed=seed, progress=False)
    rft = dict(prompts_per_round=args.prompts_per_step, samples_per_prompt=args.group, steps_per_round=1,
               batch_size=32, lr=1e-3, max_new_tokens=MAX_NEW_TOKENS, steps=args.steps, seed=seed, distinct=False,
               progress=False)
    trainers: dict[str, Callable[[Any], Any]] = {
        "rft": lambda m: RFTTrainer(RFTConfig(online=False, **rft), m, tok, outcome, rl_rows),
        "online_rft": lambda m: RFTTrainer(RFTConfig(online=True, **rft), m, tok, outcome, rl_rows),
        "grpo_outcome": lambda m: GRPOTrainer(GRPOConfig(**grpo), m, tok, outcome, rl_rows),
    }
    if prm is not None:
        process = build_reward_functions(["gsm8k_exact_match"], weights=[args.outcome_weight],
                                         process_reward_model=str(prm))
        trainers["grpo_process"] = lambda m: GRPOTrainer(GRPOConfig(process_reward_model=str(prm), **grpo), m, tok,
                                                         process, rl_rows)
    return trainers


def train_with_curve(trainer: Any, args: argparse.Namespace, point: Callable[[Any], float], start: float
                     ) -> tuple[float, list[tuple[int, float]]]:
    """Run `args.steps` steps; (CPU seconds in the steps alone, held-out accuracy every `args.curve_every` steps
    and at the end, from `start` at step 0)."""
    cpu, curve = 0.0, [(0, start)]
    for step in range(1, args.steps + 1):
        started = time.process_time()
        trainer.step()
        cpu += time.process_time() - started
        if step == args.steps or (args.curve_every and step % args.curve_every == 0):
            curve.append((step, point(trainer.policy)))
    return cpu, curve


def mean_curves(lines: list[dict[str, Any]]) -> dict[str, list[tuple[float, float]]]:
    """Per method, the mean over seeds of the held-out accuracy at each step every seed has a point for."""
    out = {}
    for name in METHODS:
        curves = [dict((int(x), y) for x, y in r["curve"]) for r in lines if r["method"] == name and r.get("curve")]
        if curves:
            steps = sorted(set.intersection(*(set(c) for c in curves)))
            out[name] = [(float(x), statistics.fmean(c[x] for c in curves)) for x in steps]
    return out


def plot(lines: list[dict[str, Any]], path: Path, args: argparse.Namespace) -> None:
    seeds = sorted({r["seed"] for r in lines})
    line_chart([Series(name, points) for name, points in mean_curves(lines).items()], path,
               title="Held-out accuracy by training step", x_label="training step",
               y_label=f"accuracy, {args.curve_k} samples x {args.heldout_prompts} held-out prompts, "
                       f"mean of {len(seeds)} seed{'s' if len(seeds) > 1 else ''}", y_range=(0.0, 1.0))


def run_seed(args: argparse.Namespace, seed: int) -> list[dict[str, Any]]:
    tok = prepare_tokenizer(char_tokenizer())
    items = problems(seed, args.high)
    rl = items[:args.train_prompts]
    heldout = items[args.train_prompts:args.train_prompts + args.heldout_prompts]
    rl_rows = [PromptRow(prompt=prompt_of(p), reference=str(sum(p))) for p in rl]
    rows = [PromptRow(prompt=prompt_of(p), reference=str(sum(p))) for p in heldout]
    outcome = build_reward_functions(["gsm8k_exact_match"])
    eval_config = EvalConfig(k=args.k, max_new_tokens=MAX_NEW_TOKENS, seed=7, greedy=False)
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(seed)
        started = time.process_time()
        model = tiny_gpt2(tok, seed=seed)
        sft(model, tok, careless_set(items), steps=args.sft_steps, seed=seed)
        sft_cpu = time.process_time() - started
        path = save_tiny(model, tok, Path(tmp) / "sft")
        base, _ = load_policy(path)
        results: dict[str, tuple[dict[str, Any], float, dict[str, Any]]] = {
            "sft": (evaluate(base, tok, rows, outcome, Reference(base), eval_config), sft_cpu, {})}
        prm, prm_cpu, prm_report = None, 0.0, {}
        if "grpo_process" in args.methods:
            prm, prm_cpu, prm_report = train_step_prm(path, tok, rl_rows, Path(tmp), seed, args)
        curve_config = EvalConfig(k=args.curve_k, max_new_tokens=MAX_NEW_TOKENS, seed=11, greedy=False)

        def point(policy: Any) -> float:
            return float(evaluate(policy, tok, rows, outcome, None, curve_config)["policy"]["accuracy"])

        sft_point = point(base)
        curves = {"sft": [(0, sft_point), (args.steps, sft_point)]}
        for name, make in make_trainers(args, seed, tok, rl_rows, prm).items():
            if name not in args.methods:
                continue
            model, _ = load_policy(path)
            trainer = make(model)
            cpu, curves[name] = train_with_curve(trainer, args, point, sft_point)
            extra = {"prm_cpu_s": round(prm_cpu, 1), "prm": prm_report} if name == "grpo_process" else {}
            results[name] = (evaluate(trainer.policy, tok, rows, outcome, trainer.reference, eval_config), cpu,
                             extra)
    for name in METHODS:
        if name not in results:
            continue
        result, cpu, extra = results[name]
        p = result["policy"]
        lines.append({"bench": "methods", "method": name, "seed": seed, "accuracy": p["accuracy"],
                      "maj_at_k": p["maj_at_k"], "pass_at_k": p["pass_at_k"], "kl": result["kl"],
                      "cpu_s": round(cpu, 1), "k": args.k, "steps": 0 if name == "sft" else args.steps,
                      "curve": [[step, round(acc, 4)] for step, acc in curves[name]], **extra})
        print(json.dumps(lines[-1]), flush=True)
    return lines


def table(lines: list[dict[str, Any]], k: int) -> str:
    out = [f"| method | accuracy | Maj@{k} | Pass@{k} | KL to SFT | CPU s | seeds |", "|---|---|---|---|---|---|---|"]
    for name in METHODS:
        rows = [r for r in lines if r["method"] == name]
        if not rows:
            continue

        def cell(key: str, rows: list[dict[str, Any]] = rows) -> str:
            values = [r[key] for r in rows]
            mean = statistics.fmean(values)
            return f"{mean:.3f} ± {statistics.stdev(values):.3f}" if len(values) > 1 else f"{mean:.3f}"

        out.append(f"| {name} | {cell('accuracy')} | {cell('maj_at_k')} | {cell('pass_at_k')} | {cell('kl')} | "
                   f"{statistics.fmean(r['cpu_s'] for r in rows):.0f} | {len(rows)} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=40, help="RL steps of every method (RFT: rounds of one step)")
    parser.add_argument("--prompts-per-step", type=int, default=16)
    parser.add_argument("--group", type=int, default=8, help="samples per prompt per step (GRPO's G, RFT's N)")
    parser.add_argument("--k", type=int, default=8, help="held-out samples per prompt for accuracy, Maj@K, Pass@K")
    parser.add_argument("--high", type=int, default=4, help="operands in [0, high]")
    parser.add_argument("--train-prompts", type=int, default=75)
    parser.add_argument("--heldout-prompts", type=int, default=50)
    parser.add_argument("--sft-steps", type=int, default=600)
    parser.add_argument("--prm-samples", type=int, default=16,
                        help="SFT samples drawn per training prompt (per round) to pick the PRM's completions from")
    parser.add_argument("--prm-k", type=int, default=4,
                        help="completions per prompt in the step-labelled project (its K; distinct, at least 2)")
    parser.add_argument("--prm-epochs", type=int, default=48)
    parser.add_argument("--outcome-weight", type=float, default=1.0,
                        help="weight of the exact-match reward beside the PRM in grpo_process (0: the PRM alone)")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--curve-every", type=int, default=5,
                        help="evaluate held-out accuracy every this many steps for the curves (0: only the end)")
    parser.add_argument("--curve-k", type=int, default=4, help="samples per held-out prompt at each curve point")
    parser.add_argument("--plot", type=Path, default=ROOT / "docs" / "img" / "method_comparison.png",
                        help="where the PNG of the curves goes ('-': no plot)")
    parser.add_argument("--replot", type=Path, default=None,
                        help="read the JSON lines of an earlier run from this file and only redraw the plot and table")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.replot is not None:
        lines = [json.loads(line) for line in args.replot.read_text(encoding="utf-8").splitlines()
                 if line.startswith('{"bench": "methods"')]
        if not lines:
            parser.error(f"--replot: no method lines in {args.replot}")
        if str(args.plot) != "-":
            plot(lines, args.plot, args)
        print(table(lines, lines[0]["k"]))
        return 0
    started = time.perf_counter()
    lines = [line for seed in args.seeds for line in run_seed(args, seed)]
    if str(args.plot) != "-":
        plot(lines, args.plot, args)
    print()
    print(table(lines, args.k))
    print(f"\n{args.heldout_prompts} held-out prompts, K = {args.k} at temperature 1; {args.steps} steps × "
          f"{args.prompts_per_step} prompts × {args.group} samples per method; seeds {args.seeds}; "
          f"{time.perf_counter() - started:.0f} s wall in all.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
