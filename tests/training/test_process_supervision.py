"""benchmarks/process_supervision.py --quick: one JSON line per run with the documented fields, a summary line with
per-arm intervals, and a policy that training moved away from its SFT checkpoint; with `--step-rewards prm`, a PRM
trained on the rows of a steps export the app made from its own Monte-Carlo step labels (the benchmark runs in a
subprocess: these tests never import the app)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import process_supervision as bench  # noqa: E402

RUN_FIELDS = {"bench", "arm", "L", "seed", "step_rewards", "accuracy", "accuracy_ood", "pass_at_k", "maj_at_k",
              "trace_error", "kl", "lines", "updates_to_target", "curve"}


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache for the module's runs: the quick SFT checkpoint is fitted once."""
    return tmp_path_factory.mktemp("process-supervision-cache")


def quick_run(cache: Path, *extra: str) -> list[dict[str, Any]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "process_supervision.py"), "--quick",
                          "--cache", str(cache), *extra],
                         capture_output=True, text=True, env=env, cwd=ROOT, check=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


@pytest.mark.slow
def test_quick_run_prints_the_documented_lines_and_trains_the_policy(tmp_path: Path, cache: Path) -> None:
    lines = quick_run(cache, "--plot", str(tmp_path / "curve.png"))
    runs = [line for line in lines if "arm" in line]
    assert {r["arm"] for r in runs} == {"outcome", "min"}
    for run in runs:
        assert RUN_FIELDS <= set(run)
        assert run["bench"] == "process" and run["L"] == 2 and run["step_rewards"] == "checker"
        assert 0.0 <= run["accuracy"] <= 1.0 and 0.0 <= run["accuracy_ood"] <= 1.0
        assert set(run["pass_at_k"]) == set(run["maj_at_k"]) == {"8", "16"}
        assert run["curve"][0][0] == 0 and run["curve"][-1][0] == run["updates"]
        assert run["changed"], f"{run['arm']}: the policy's weights did not move"
    outcome = next(r for r in runs if r["arm"] == "outcome")
    assert outcome["updates_to_target"] is not None  # an arm always reaches its own final accuracy
    summary = lines[-1]
    assert summary["summary"] is True
    mean, low, high = summary["by_arm"]["min"]["2"]["accuracy"]
    assert low <= mean <= high
    assert "accuracy_vs_outcome" in summary["by_arm"]["min"]["2"]
    assert (tmp_path / "curve-L2.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.slow
def test_the_prm_trains_on_the_apps_export_of_its_monte_carlo_step_labels(cache: Path) -> None:
    runs = [line for line in quick_run(cache, "--step-rewards", "prm") if "arm" in line]
    assert {r["arm"] for r in runs} == {"outcome", "min"}
    assert all(r["step_rewards"] == "prm" for r in runs)
    report = next(r for r in runs if r["arm"] == "min")["prm"]
    # every kept prompt's K = 2 completions is one exported row, split by prompt into train and held-out
    assert report["export_rows"] == 2 * report["prompts"] == report["train_rows"] + report["heldout_rows"]
    assert report["train_rows"] > 0 and report["heldout_rows"] > 0
    assert report["export_id"] >= 1 and report["mc_run_id"] >= 1
    assert report["step_labels"] >= report["export_rows"]  # every step of every completion, one at least each
    assert report["continuations"] > 0 and 0.0 <= report["step_accuracy"] <= 1.0
    assert "prm" not in next(r for r in runs if r["arm"] == "outcome")


def test_the_line_checker_judges_each_line_given_the_sum_written_before_it() -> None:
    # 2+3 is slipped to 6, and 6+1=7 is right given the 6 it carries: the outcome (7 ≠ 6) is wrong, line 2 is not
    assert bench.line_labels("2+3+1=", "2+3=6\n6+1=7") == [False, True]
    assert bench.line_labels("2+3+1=", "2+3=5\n5+1=6") == [True, True]
    assert bench.line_labels("2+3+1=", "2+3=5\n5+1=6\n6+0=6") == [True, True, False]  # past the chain's length
    assert bench.line_checker(["2+3=", "2+3="], ["2+3=5\n", "x"]) == [[1.0], [0.0]]


def test_the_bootstrap_interval_holds_the_mean_and_a_constant_has_no_spread() -> None:
    mean, low, high = bench.bootstrap([0.1, 0.4, 0.3, 0.2, 0.5])
    assert low <= mean <= high and mean == pytest.approx(0.3)
    assert bench.bootstrap([0.2, 0.2, 0.2]) == pytest.approx((0.2, 0.2, 0.2))
