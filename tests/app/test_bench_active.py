"""benchmarks/bench_active.py and bench_disagreement.py: the same arguments print the same figures, the summary
carries what a reader needs to compare two runs, the figure of merit and its interval are computed as documented,
and no selection rule reads the label it is about to ask for."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import _active_stats as stats  # noqa: E402
from _active_select import STRATEGIES, bald, gradient_embedding, kmeans_pp, pick, spread  # noqa: E402
from bench_active import hh_path  # noqa: E402
from bench_disagreement import PAIRS, label_accuracy  # noqa: E402

from app.annotation.selection import disagreement_share  # noqa: E402


def _run(script: str, *args: str) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args], capture_output=True, text=True,
                         env=env, cwd=ROOT, check=True).stdout
    return [json.loads(line) for line in out.splitlines()]


def _figures(lines: list[dict]) -> list[dict]:
    """Every line without the run's timing (seconds and load differ from run to run by nature)."""
    return [{k: v for k, v in line.items() if k != "timing"} for line in lines]


@pytest.fixture(scope="module")
def features(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Pair features for --quick's 240 pool and 120 held-out pairs: chosen is preferred along one direction, with
    label noise, so the orders have something to find."""
    gen = torch.Generator().manual_seed(0)
    n, dim = 360, 12
    chosen, rejected = torch.randn(n, dim, generator=gen), torch.randn(n, dim, generator=gen)
    swap = (chosen - rejected)[:, 0] + 0.8 * torch.randn(n, generator=gen) < 0
    chosen[swap], rejected[swap] = rejected[swap].clone(), chosen[swap].clone()
    path = tmp_path_factory.mktemp("features") / "features.pt"
    torch.save({"chosen": chosen, "rejected": rejected}, path)
    return path


def test_two_runs_with_the_same_arguments_print_the_same_figures(features: Path, tmp_path: Path) -> None:
    args = ("--quick", "--features", str(features), "--threads", "1", "--lbfgs-steps", "30", "--strategies", *STRATEGIES,
            "--plot")
    first = _run("bench_active.py", *args, str(tmp_path / "a.svg"))
    second = _run("bench_active.py", *args, str(tmp_path / "b.svg"))
    assert _figures(first) == _figures(second)
    assert (tmp_path / "a.svg").read_bytes() == (tmp_path / "b.svg").read_bytes()
    summary = first[-1]
    assert summary["seeds"] == [0, 1, 2] and summary["threads"] == 1
    lo, hi = summary["ci95"]
    assert hi is not None and (lo is None or lo <= summary["random_over_uncertainty"] <= hi)
    assert {"torch", "transformers", "numpy", "python"} <= set(summary["versions"])
    assert len(summary["features_sha256"]) == 64
    assert set(summary["detail"]) == set(STRATEGIES) - {"random"}
    # every order starts from the same labels per seed: the first round's accuracy is the same for all of them
    starts = {(row["seed"], row["accuracy"]) for row in first if row.get("round") == 0}
    assert len(starts) == 3


@pytest.mark.parametrize(("args", "field"), [(["--round", "0"], "--round"), (["--rounds", "60"], "--rounds"),
                                             (["--strategies", "uncertainty"], "--strategies"),
                                             (["--seeds", "3"], "--seeds")])
def test_a_bad_argument_is_refused_by_name(args: list[str], field: str) -> None:
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_active.py"), *args], capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT)
    assert run.returncode == 2 and f"error: {field}" in run.stderr


def test_labels_to_reach_interpolates_between_rounds() -> None:
    # 0.55 lies a quarter of the way from 0.54 (at 64 labels) to 0.58 (at 96): 64 + 8 = 72
    assert stats.labels_to_reach([32, 64, 96], [0.50, 0.54, 0.58], 0.55) == pytest.approx(72.0)
    assert stats.labels_to_reach([32, 64, 96], [0.60, 0.54, 0.58], 0.55) == 32.0
    assert stats.labels_to_reach([32, 64], [0.50, 0.54], 0.55) is None


def test_the_ratio_is_random_labels_over_the_orders_labels_on_the_mean_curves() -> None:
    labels = [32, 64, 96]
    random = np.array([[0.50, 0.52, 0.56], [0.50, 0.54, 0.56]])  # mean 0.50, 0.53, 0.56: its final 0.56 at 96
    faster = np.array([[0.50, 0.56, 0.57], [0.50, 0.56, 0.57]])  # reaches 0.56 at 64
    x, target, needed = stats.ratio(labels, random, faster)
    assert (x, target, needed) == (pytest.approx(1.5), pytest.approx(0.56), pytest.approx(64.0))


def test_the_interval_ranks_an_order_that_never_got_there_lowest() -> None:
    values = [None] * 10 + [float(v) for v in range(90)]
    assert stats.interval(values) == [None, 87.0]
    assert stats.interval([float(v) for v in range(101)]) == [2.0, 98.0]


def test_the_paired_resamples_are_the_same_every_run() -> None:
    assert (stats.resamples(10, 50, 0) == stats.resamples(10, 50, 0)).all()
    assert not (stats.resamples(10, 50, 0) == stats.resamples(10, 50, 1)).all()


def test_bald_asks_where_the_heads_disagree_not_where_every_head_shrugs() -> None:
    heads = torch.tensor([[0.9, 0.1], [0.5, 0.5], [0.9, 0.9]])
    # H(0.5) − (H(0.9) + H(0.1)) / 2 = 0.6931 − 0.3251; a shared coin flip and a shared certainty teach nothing
    assert bald(heads).tolist() == pytest.approx([0.6931 - 0.3251, 0.0, 0.0], abs=1e-4)
    assert spread(heads).tolist() == pytest.approx([0.4, 0.0, 0.0])


@pytest.mark.parametrize("strategy", [s for s in STRATEGIES if s != "random"])
def test_no_rule_reads_the_label_it_is_about_to_ask_for(strategy: str) -> None:
    gen = torch.Generator().manual_seed(3)
    p_heads, emb = torch.rand(40, 6, generator=gen), torch.randn(40, 5, generator=gen)
    asked = pick(strategy, p_heads, emb, 8, torch.Generator().manual_seed(0))
    swapped = pick(strategy, 1 - p_heads, -emb, 8, torch.Generator().manual_seed(0))
    assert asked == swapped and len(set(asked)) == 8


def test_badge_does_not_spend_a_batch_on_near_duplicates() -> None:
    emb = torch.tensor([[1.0, 0.0], [1.0, 0.001], [0.999, 0.0], [0.0, 0.8]])
    p_heads = torch.full((4, 2), 0.3)  # equal doubt everywhere: only the directions differ
    chosen = kmeans_pp(gradient_embedding(p_heads, emb), 2, torch.Generator().manual_seed(0))
    assert 3 in chosen and len([i for i in chosen if i < 3]) == 1


def test_the_disagreement_share_is_the_votes_against_each_pairs_majority() -> None:
    # two pairs: 2 for, 1 against; 3 for, none against: 1 of 6 votes went against the majority
    assert disagreement_share([[2, 1], [3, 0]]) == pytest.approx(1 / 6)
    assert disagreement_share([[1, 1]]) == 0.5 and disagreement_share([]) == 0.0


def test_label_accuracy_counts_a_split_vote_as_a_coin_flip() -> None:
    correct = np.array([[True, False, False, False]])  # solution 0 right: three true pairs (0, 1), (0, 2), (0, 3)
    votes = np.zeros((1, len(PAIRS), 2), dtype=np.int64)
    votes[0, PAIRS.index((0, 1))] = [2, 0]  # right
    votes[0, PAIRS.index((0, 2))] = [1, 1]  # no majority: 0.5
    votes[0, PAIRS.index((0, 3))] = [0, 1]  # wrong
    votes[0, PAIRS.index((1, 2))] = [0, 3]  # both wrong solutions: no true order, not counted
    assert label_accuracy(correct, votes) == pytest.approx(1.5 / 3)


def test_the_disagreement_replay_prints_the_same_figures_twice() -> None:
    args = ("--demo", "--seeds", "0", "1", "2", "--round", "4", "--rounds", "3", "--bootstrap", "100")
    first, second = _run("bench_disagreement.py", *args), _run("bench_disagreement.py", *args)
    assert first == second
    summary = first[-1]
    assert summary["items"] == 80 and summary["seeds"] == [0, 1, 2] and len(summary["items_sha256"]) == 64
    assert summary["random_over_disagreement"] is None or math.isfinite(summary["random_over_disagreement"])


@pytest.mark.slow
def test_the_real_features_are_the_same_bits_when_computed_twice(tmp_path: Path) -> None:
    try:
        hh_path()
    except SystemExit:
        pytest.skip(reason="the HH-RLHF file is not next to the repository")
    args = ("--quick", "--threads", "1", "--strategies", "random", "uncertainty", "--lbfgs-steps", "30")
    first = _run("bench_active.py", *args, "--cache", str(tmp_path / "a"))
    second = _run("bench_active.py", *args, "--cache", str(tmp_path / "b"))
    assert first[-1]["timing"]["features"] == second[-1]["timing"]["features"] == "computed"
    assert first[-1]["features_sha256"] == second[-1]["features_sha256"]
    assert _figures(first) == _figures(second)


@pytest.mark.slow
def test_the_fine_tuned_learner_repeats_its_dropout_and_its_training(tmp_path: Path) -> None:
    try:
        hh_path()
    except SystemExit:
        pytest.skip(reason="the HH-RLHF file is not next to the repository")
    args = ("--quick", "--learner", "finetuned", "--max-length", "32", "--seeds", "0", "1", "--rounds", "1",
            "--strategies", "random", "bald", "--candidates", "16", "--mc-samples", "2", "--cache", str(tmp_path))
    first, second = _run("bench_active.py", *args), _run("bench_active.py", *args)
    assert first[-1]["timing"]["features"] == "computed" and second[-1]["timing"]["features"] == "cached"
    assert _figures(first) == _figures(second)
    assert len(first[-1]["states_sha256"]) == 64 and first[-1]["learner"] == "finetuned"
