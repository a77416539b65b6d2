"""The training form's time estimate: the chosen method, export, config and model, priced at the speed measured on
that model here; where the figures come from; what to run when they are missing; a smaller first try when the run
is long; and a config the run would refuse named instead of guessed at."""

from __future__ import annotations

import dataclasses
import json
import tomllib
from pathlib import Path

import pytest

from app.models import Export, TrainingRun
from app.runs import estimates
from training.estimate import Speed

# Round unit costs a person can follow: a token trained 3 ms, read 1 ms; a decoding step 20 ms.
UNIT = Speed(start_s=10.0, forward_token_s=0.001, train_token_s=0.003, optimizer_s=0.5, decode_step_s=0.02,
             decode_row_s=0.01, save_s=2.0, chars_per_token=4.0, template_tokens=0.0)


def _measure(data_dir: Path, model: str, speed: Speed = UNIT) -> None:
    path = estimates.speed_file(data_dir, model)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dataclasses.asdict(speed) | {
        "model": model, "device": "cpu", "threads": 2, "measured_at": "2026-12-01T09:30:00+00:00"}))


def _export(db, project, data_dir: Path, kind: str, rows: list[dict], heldout: int = 0) -> Export:  # type: ignore[no-untyped-def]
    export = Export(project_id=project.id, kind=kind, format="jsonl", filters={}, row_count=len(rows),
                    row_counts={"split.train": len(rows) - heldout, "split.heldout": heldout}, sha256="0" * 64,
                    files={f"{kind}.jsonl": "0" * 64})
    db.add(export)
    db.flush()
    folder = data_dir / "exports" / str(export.id)
    folder.mkdir(parents=True)
    (folder / f"{kind}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    export.path = str(folder)
    return export


def _form(db, project, data_dir: Path, export: Export, **chosen):  # type: ignore[no-untyped-def]
    values = {"kind": "grpo", "base_model": "", "config_text": ""} | chosen
    return estimates.for_form(db, project, data_dir=data_dir, default_policy=data_dir / "policy",
                              export_id=str(export.id), **values)


def test_a_policy_run_is_priced_at_its_models_speed_and_its_steps_change_the_estimate(
        db, make_project, tmp_path) -> None:  # type: ignore[no-untyped-def]
    project = make_project(db)
    prompts = _export(db, project, tmp_path, "prompts", [{"prompt": "x" * 400}] * 10)
    _measure(tmp_path, str(tmp_path / "policy"))
    config = "steps = 3\nprompts_per_step = 2\ngroup_size = 4\nmax_new_tokens = 100\neval_max_prompts = 0"
    found = _form(db, project, tmp_path, prompts, config_text=config)
    # As hand-counted in tests/training/test_estimate.py: 10 s start, 3 steps × 17.1 s, 2 s saving = 63.3 s.
    assert found.minutes == 2 and found.problem is None
    assert [p[0] for p in found.phases] == ["start", "training", "saving"]
    assert found.measured == "measured 2026-12-01 09:30 UTC on policy (cpu, 2 threads)"
    longer = _form(db, project, tmp_path, prompts, config_text=config.replace("steps = 3", "steps = 30"))
    assert longer.minutes == 9  # 12 s + 30 × 17.1 s
    assert longer.first_try is None  # under a quarter of an hour: no smaller try offered


def test_a_long_run_offers_a_first_try_of_a_few_minutes(db, make_project, tmp_path) -> None:  # type: ignore[no-untyped-def]
    project = make_project(db)
    prompts = _export(db, project, tmp_path, "prompts", [{"prompt": "x" * 400}] * 100, heldout=20)
    _measure(tmp_path, str(tmp_path / "policy"))
    found = _form(db, project, tmp_path, prompts)  # the method's defaults: 100 steps of 64 answers of 256 tokens
    assert found.minutes is not None and found.minutes > 60
    assert found.first_try is not None and "steps = 5" in found.first_try
    assert found.first_try_minutes is not None and found.first_try_minutes <= 5
    # A run needs a reward to start: a first try of a config that names none checks the final number.
    assert 'reward_fn = ["gsm8k_exact_match"]' in found.first_try
    # What the user wrote stays (their reward, their learning rate); only the size shrinks.
    theirs = _form(db, project, tmp_path, prompts, config_text='lr = 2e-6\nreward_fn = ["format_regex"]\nsteps = 300')
    assert theirs.first_try is not None
    assert tomllib.loads(theirs.first_try) == {**tomllib.loads(found.first_try), "lr": 2e-6,
                                                    "reward_fn": ["format_regex"]}


def test_the_export_texts_lengths_count_and_a_reward_run_uses_the_encoders_figures(
        db, make_project, tmp_path) -> None:  # type: ignore[no-untyped-def]
    project = make_project(db)
    short = _export(db, project, tmp_path, "pairs", [{"prompt": "q" * 40, "chosen": "a" * 40, "rejected": "b"
                                                      * 40}] * 32)
    long = _export(db, project, tmp_path, "pairs", [{"prompt": "q" * 400, "chosen": "a" * 800, "rejected": "b"
                                                     * 800}] * 32)
    missing = _form(db, project, tmp_path, short, kind="reward")
    assert missing.minutes is None and "not measured yet" in (missing.problem or "")
    assert missing.measure_command == ("python -m training speed --encoder --out "
                                       f"{tmp_path / 'speed' / 'encoder.json'}")
    _measure(tmp_path, estimates.ENCODER)
    config = "epochs = 20\nbatch_size = 16"
    quick = _form(db, project, tmp_path, short, kind="reward", config_text=config)
    slow = _form(db, project, tmp_path, long, kind="reward", config_text=config)
    # 40 steps of 16 pairs, two answers each: 20 tokens a text cost 40 × (16 × 2 × 20 × 3 ms + 0.5 s) = 96.8 s;
    # 300 tokens cost 40 × (16 × 2 × 300 × 3 ms + 0.5 s) = 1,172 s.
    assert (quick.minutes, slow.minutes) == (2, 20)


def test_what_stops_an_estimate_is_said(db, make_project, tmp_path) -> None:  # type: ignore[no-untyped-def]
    project = make_project(db)
    prompts = _export(db, project, tmp_path, "prompts", [{"prompt": "hi"}] * 4)
    _measure(tmp_path, str(tmp_path / "policy"))
    wrong = _form(db, project, tmp_path, prompts, config_text="stpes = 3")
    assert wrong.minutes is None and "stpes is not a grpo config field; did you mean steps?" in (wrong.problem or "")
    assert "not valid TOML" in (_form(db, project, tmp_path, prompts, config_text="steps = ").problem or "")
    other_kind = _form(db, project, tmp_path, prompts, kind="dpo")
    assert other_kind.problem == "Choose a pairs export to see how long the run takes."
    unmeasured = _form(db, project, tmp_path, prompts, base_model=str(tmp_path / "other"))
    assert unmeasured.measure_command is not None and f"--model {tmp_path / 'other'}" in unmeasured.measure_command


def test_sampling_a_policy_into_its_project_is_priced_and_sized_to_a_quarter_hour(tmp_path) -> None:  # type: ignore[no-untyped-def]
    _measure(tmp_path, str(tmp_path / "policy"))
    run = TrainingRun(kind="grpo", state="succeeded", base_model=str(tmp_path / "policy"),
                      config={"resolved": {"max_new_tokens": 100}})
    # A batch of 8 prompts × 4 answers: 100 steps × (20 ms + 32 rows × 10 ms) = 34 s; 13 batches and the 10 s start.
    assert estimates.sampling_seconds(UNIT, 100, 4, 100) == pytest.approx(10.0 + 13 * 34.0)
    found = estimates.for_sampling(tmp_path, run, 100, 4)
    assert found is not None and (found.prompts, found.answers, found.max_new_tokens) == (100, 4, 100)
    assert found.minutes == 8 and found.suggested is None  # under a quarter of an hour: all of them
    slow = dataclasses.replace(UNIT, decode_row_s=0.03)  # 98 s a batch: 9 batches (72 prompts) fit 15 min
    _measure(tmp_path, str(tmp_path / "policy"), slow)
    sized = estimates.for_sampling(tmp_path, run, 100, 4)
    assert sized is not None and sized.minutes == 22 and (sized.suggested, sized.suggested_minutes) == (72, 15)
    assert estimates.for_sampling(tmp_path, TrainingRun(kind="grpo", base_model=str(tmp_path / "other")), 100, 4) \
        is None  # not measured: nothing to size by


def test_a_rounds_policy_is_sized_at_the_speed_of_the_model_it_descends_from(db, make_project, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from app.runs import training_runs

    project = make_project(db)
    _measure(tmp_path, str(tmp_path / "policy"))
    first = TrainingRun(project_id=project.id, kind="grpo", state="succeeded", base_model=str(tmp_path / "policy"),
                        model_dir=str(tmp_path / "runs" / "1" / "model"), config={})
    db.add(first)
    db.flush()
    again = TrainingRun(project_id=project.id, kind="grpo", state="succeeded", base_model=first.model_dir,
                        model_dir=str(tmp_path / "runs" / "2" / "model"), config={"resolved": {"max_new_tokens": 100}})
    db.add(again)
    db.flush()
    chain = training_runs.base_models(db, again)
    assert chain == [first.model_dir, str(tmp_path / "policy")]
    assert estimates.for_sampling(tmp_path, again, 100, 4) is None  # its own base model was never measured
    found = estimates.for_sampling(tmp_path, again, 100, 4, models=chain)
    assert found is not None and found.minutes == 8
