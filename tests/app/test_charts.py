"""Run-page charts: axes with round ticks, every logged point drawn with its value, evaluation drawn for people."""

from __future__ import annotations

import re

from app.quality import charts
from app.web.rendering import templates


def _svg(chart: charts.Chart) -> str:
    macro = templates.env.from_string('{% from "_chart.html" import chart %}{{ chart(c) }}')
    return macro.render(c=chart)


def test_nice_ticks_are_round_and_cover_the_range() -> None:
    assert charts.nice_ticks(0.0, 1.0) == [0.0, 0.25, 0.5, 0.75, 1.0]
    ticks = charts.nice_ticks(0.137, 0.912)
    assert ticks[0] <= 0.137 and ticks[-1] >= 0.912 and len(ticks) <= 7
    assert charts.nice_ticks(3.0, 3.0)  # a flat series still gets an axis


def test_every_metric_row_is_a_point_with_its_value_on_hover() -> None:
    rows = [{"step": s, "loss": 1.0 / s, "reward_mean": 0.1 * s} for s in range(1, 21)]
    drawn = {c.key: c for c in charts.charts_for(rows)}
    assert set(drawn) == {"loss", "reward_mean"}
    svg = _svg(drawn["reward_mean"])
    assert svg.count("<circle") == 20
    assert "<title>reward_mean at step 20: 2</title>" in svg
    assert "20 points" in re.search(r'aria-label="([^"]+)"', svg).group(1)
    # Axes: tick labels on both, an axis title under x.
    assert len(drawn["reward_mean"].x_ticks) >= 3 and len(drawn["reward_mean"].y_ticks) >= 3
    assert '>step</text>' in svg


def test_a_single_point_still_draws_axes() -> None:
    (chart,) = charts.charts_for([{"step": 1, "loss": 0.7}])
    assert chart.x_ticks and chart.y_ticks and len(chart.series[0].points) == 1


def test_reliability_diagram_accuracy_by_length_and_before_after() -> None:
    evaluation = {
        "accuracy": 0.71, "ece": 0.04,
        "calibration": [{"confidence": [0.5, 0.6], "pairs": 10, "mean_confidence": 0.55, "accuracy": 0.5},
                        {"confidence": [0.6, 0.7], "pairs": 0},
                        {"confidence": [0.9, 1.0], "pairs": 4, "mean_confidence": 0.95, "accuracy": 1.0}],
        "accuracy_by_length": [{"tokens": [3, 40], "pairs": 8, "accuracy": 0.625},
                               {"tokens": [40, 200], "pairs": 8, "accuracy": 0.875}],
        "curves": {"pass_at": {"policy": {"1": 0.2, "2": 0.3, "4": 0.45}, "reference": {"1": 0.1, "2": 0.15}}},
    }
    samples = [{"model": "policy", "reward": r} for r in (0.5, 0.9, 1.2)] + \
              [{"model": "reference", "reward": r} for r in (0.1, 0.2, 0.6)]
    drawn = {c.key: c for c in charts.eval_charts(evaluation, samples)}
    assert set(drawn) == {"calibration", "accuracy_by_length", "pass_at", "reward_before_after"}
    calibration = _svg(drawn["calibration"])
    assert 'class="ref"' in calibration and calibration.count("<circle") == 2  # the empty bin is not a point
    assert "accuracy 1 over 4 pairs" in calibration
    bars = _svg(drawn["accuracy_by_length"])
    assert bars.count("<rect class=\"bar") == 2 and "40–200: 0.875 (8 pairs)" in bars
    assert [s.name for s in drawn["pass_at"].series] == ["policy", "reference"]
    assert [s.name for s in drawn["reward_before_after"].series] == ["before", "after"]
    assert ("accuracy", "0.71", "") in charts.eval_table(evaluation)


def test_chart_text_is_escaped() -> None:
    chart = charts.line_chart("x", "<script>alert(1)</script>", {"<b>": [(1, 1.0), (2, 2.0)]})
    svg = _svg(chart)
    assert "<script>" not in svg and "&lt;script&gt;" in svg and "<b>" not in svg
