"""A process-reward run's page shows, beside its outcome curve, each step's reward and advantage (the last updates
against the first), how many rollouts reach each step and the share of groups without outcome variance; the API
gives the same figures; a run without step rewards shows no such panel. The training form explains the process
options."""

from __future__ import annotations

import json
import re
from pathlib import Path

from app.models import TrainingRun
from app.runs import step_figures

# Four updates (a window of two): step 1 is not reached in the last one, and a hand-edited line is ignored.
ROWS = [
    {"step": 1, "reward_mean": 0.1, "step_reward/0": 0.2, "step_reward/1": 0.4, "step_adv/0": 1.0, "step_adv/1": -0.5,
     "step_reached/0": 8, "step_reached/1": 6, "outcome_zero_std_frac": 0.5},
    {"step": 2, "reward_mean": 0.2, "step_reward/0": 0.4, "step_reward/1": 0.6, "step_adv/0": 0.5,
     "step_adv/1": -0.25, "step_reached/0": 8, "step_reached/1": 4, "outcome_zero_std_frac": 0.25},
    {"step": 3, "reward_mean": 0.3, "step_reward/0": 0.6, "step_reward/1": 0.8, "step_adv/0": 0.25,
     "step_adv/1": 0.25, "step_reached/0": 8, "step_reached/1": 4, "outcome_zero_std_frac": 0.25},
    {"step": 4, "reward_mean": 0.4, "step_reward/0": 0.8, "step_adv/0": 0.75, "step_reached/0": 8,
     "outcome_zero_std_frac": 0.0, "step_reward/x": "<b>bold</b>"},
]


def _run(db, project, tmp_path: Path, rows: list[dict], kind: str = "grpo") -> TrainingRun:  # type: ignore[no-untyped-def]
    out = tmp_path / f"run-{kind}-{len(rows)}"
    out.mkdir()
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = TrainingRun(project_id=project.id, kind=kind, state="succeeded", config={"user": {}},
                      metrics_path=str(out / "metrics.jsonl"), model_dir=str(out / "model"))
    db.add(run)
    db.commit()
    return run


def test_the_last_updates_are_set_against_the_first_per_step_index() -> None:
    found = step_figures.summary(ROWS)
    assert found is not None
    assert (found["updates"], found["window"], found["early"]) == (4, 2, True)
    first, second = found["steps"]
    # step 0: rewards (0.6 + 0.8) / 2 last, (0.2 + 0.4) / 2 first; every update's 8 rollouts reach it
    assert first == {"index": 0, "reward": 0.7, "advantage": 0.5, "reward_first": 0.30000000000000004,
                     "advantage_first": 0.75, "rollouts": 8.0}
    # step 1: only update 3 of the last two reached it, so its figures are update 3's, and 4 + 0 rollouts a time
    assert (second["reward"], second["advantage"], second["rollouts"]) == (0.8, 0.25, 2.0)
    assert (second["reward_first"], second["advantage_first"]) == (0.5, -0.375)
    assert (found["outcome_zero_std_frac"], found["outcome_zero_std_frac_first"]) == (0.125, 0.375)
    assert step_figures.summary([{"step": 1, "loss": 0.5, "reward_mean": 0.2}]) is None
    one = step_figures.summary([{"step": 1, "step_reward/0": 0.5, "step_adv/0": float("nan")}])
    assert one is not None and one["window"] == 1 and not one["early"]
    assert one["steps"] == [{"index": 0, "reward": 0.5, "advantage": None, "reward_first": None,
                             "advantage_first": None, "rollouts": None}]  # NaN is no number; no counts logged


def _cells(html: str) -> list[list[str]]:
    body = html.split('id="step-table"', 1)[1].split("<tbody>", 1)[1].split("</tbody>", 1)[0]
    return [re.findall(r"<t[hd][^>]*>([^<]*)</t[hd]>", row) for row in body.split("</tr>") if "<t" in row]


def test_a_process_run_page_shows_the_step_panel_beside_its_outcome_curve(db, make_user, make_project, browser,
                                                                          api, token_for, tmp_path) -> None:
    lead = make_user(db, "lead")
    project = make_project(db, lead=lead)
    process = _run(db, project, tmp_path, ROWS)
    plain = _run(db, project, tmp_path, [{"step": s, "loss": 1 / s, "reward_mean": s / 10} for s in (1, 2, 3)])
    token = token_for(db, lead)
    db.commit()
    b = browser()
    b.login(lead.email)
    html = b.get(f"/training-runs/{process.id}").text
    panel = html.split('id="step-stats"', 1)[1].split("</section>", 1)[0]
    # the outcome curve sits in the panel, beside the per-step charts, not again in the grid below
    assert panel.index('data-metric="reward_mean"') < panel.index('data-metric="step_by_index"')
    assert 'data-metric="outcome_zero_std_frac"' in panel and html.count('data-metric="reward_mean"') == 1
    assert "the last 2 of 4 updates" in panel
    assert _cells(html) == [["0", "0.700", "0.300", "0.500", "0.750", "8"],
                            ["1", "0.800", "0.500", "0.250", "-0.375", "2"]]
    assert "Groups with no outcome variance</dt><dd>0.12" in panel and "first 0.38" in panel
    assert "<b>bold</b>" not in html  # the file's stray text is no markup (and no step index)
    assert 'aria-label="By step index, last 2 updates: 2 points, from 0.7 to 0.8"' in panel
    # over the run: the first step's reward and the last step's, each a series
    assert 'aria-label="Step reward over the run: 4 points, from 0.2 to 0.8"' in panel
    assert "step 1 at step 3: 0.8" in panel and "step 1 at step 4" not in panel

    other = b.get(f"/training-runs/{plain.id}").text
    assert 'id="step-stats"' not in other and 'data-metric="reward_mean"' in other

    client = api(token)
    stats = client.get(f"/api/training-runs/{process.id}").json()["step_stats"]
    assert stats["window"] == 2 and stats["steps"][1]["rollouts"] == 2.0 and stats["outcome_zero_std_frac"] == 0.125
    assert client.get(f"/api/training-runs/{plain.id}").json()["step_stats"] is None
    assert all(r["step_stats"] is None for r in client.get(f"/api/projects/{project.id}/training-runs").json())


def test_the_training_form_explains_each_process_option(db, make_user, make_project, browser) -> None:
    lead = make_user(db, "lead")
    project = make_project(db, lead=lead)
    db.commit()
    b = browser()
    b.login(lead.email)
    html = b.get(f"/projects/{project.id}/training").text
    grpo = html.split('class="for-kind kind-fields" data-kind="grpo"', 1)[1].split("</table>", 1)[0]
    rows = {name: meaning for name, meaning in re.findall(
        r"<tr><td><code>(\w+)</code></td><td><code>[^<]*</code></td><td>([^<]*)</td></tr>", grpo)}
    assert rows["process_credit"].startswith("How step rewards become each step&#39;s advantage")
    assert rows["process_outcome_mix"].startswith("α: when set, the advantage is A_outcome + α·A_process")
    assert rows["advantage_clip"].startswith("Clip every token&#39;s advantage to [-c, c]")
