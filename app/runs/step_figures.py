"""A process-reward run's figures per step index, read from its metrics rows: the run page's panel and the API's.

A GRPO run whose reward scores steps logs, each update, `step_reward/j` and `step_adv/j` (the mean step reward and
advantage over the rollouts that reach step j), `step_reached/j` (how many of them do) and `outcome_zero_std_frac`
(training/grpo.py). The file is the trainer's, so every value is checked to be a finite number before it counts.
"""

from __future__ import annotations

import math
from typing import Any

from app.quality import charts

REWARD, ADVANTAGE, REACHED = "step_reward/", "step_adv/", "step_reached/"
ZERO_STD = "outcome_zero_std_frac"
WINDOW = 20
"""Updates averaged at most: the last ones say where the run ended, the first as many where it began."""
MAX_INDICES = 64
"""Step indices shown at most (the trainer logs 16): a hand-edited file cannot make the page as long as it likes."""


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _mean(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [v for v in (_number(m.get(key)) for m in rows) if v is not None]
    return sum(values) / len(values) if values else None


def _indices(rows: list[dict[str, Any]]) -> list[int]:
    found = {int(k[len(REWARD):]) for m in rows for k in m if k.startswith(REWARD) and k[len(REWARD):].isdigit()}
    return sorted(found)[:MAX_INDICES]


def summary(metrics: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Per step index, the mean step reward and advantage over the last `window` updates (and the first as many,
    when the run has more than one), how many rollouts reached the step, and the share of groups whose outcome did
    not vary; None for a run that logged no step rewards."""
    rows = [m for m in metrics if isinstance(m, dict) and _indices([m])]
    if not rows:
        return None
    window = min(WINDOW, max(1, len(rows) // 2))
    last, first = rows[-window:], rows[:window]
    early = len(rows) > 1
    counted = any(k.startswith(REACHED) for m in rows for k in m)
    steps = []
    for j in _indices(rows):
        reached = [_number(m.get(f"{REACHED}{j}")) or 0.0 for m in last]  # absent: no rollout got that far
        steps.append({
            "index": j,
            "reward": _mean(last, f"{REWARD}{j}"), "advantage": _mean(last, f"{ADVANTAGE}{j}"),
            "reward_first": _mean(first, f"{REWARD}{j}") if early else None,
            "advantage_first": _mean(first, f"{ADVANTAGE}{j}") if early else None,
            "rollouts": sum(reached) / len(reached) if counted else None,
        })
    return {"updates": len(rows), "window": window, "early": early, "steps": steps,
            "outcome_zero_std_frac": _mean(last, ZERO_STD),
            "outcome_zero_std_frac_first": _mean(first, ZERO_STD) if early else None}


def panel_charts(metrics: list[dict[str, Any]], found: dict[str, Any]) -> list[charts.Chart]:
    """The panel's charts beside the outcome curve: reward and advantage by step index over the last updates, the
    first and the last step's reward over the run, and the share of groups without outcome variance over it."""
    steps = found["steps"]
    by_index = charts.line_chart(
        "step_by_index", f"By step index, last {found['window']} updates",
        {"step reward": [(s["index"], s["reward"]) for s in steps if s["reward"] is not None],
         "advantage": [(s["index"], s["advantage"]) for s in steps if s["advantage"] is not None]},
        x_label="step index", y_label="mean over the rollouts that reach the step")
    shown = [s["index"] for s in steps if s["reward"] is not None]
    ends = sorted({shown[0], shown[-1]}) if shown else []
    over_time = charts.line_chart(
        "step_reward_over_time", "Step reward over the run",
        {f"step {j}": [(m.get("step", i), m.get(f"{REWARD}{j}")) for i, m in enumerate(metrics)
                       if isinstance(m, dict)] for j in ends},
        y_label="mean step reward")
    zero = charts.line_chart(
        ZERO_STD, "Groups with no outcome variance",
        {"share of groups": [(m.get("step", i), m.get(ZERO_STD)) for i, m in enumerate(metrics)
                              if isinstance(m, dict) and ZERO_STD in m]},
        y_label="share of groups", y_range=(0.0, 1.0))
    return [c for c in (by_index, over_time, zero) if c is not None]
