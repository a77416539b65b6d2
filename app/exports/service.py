"""Export requests: validate kind, format and an allowlist of filters, then record the Export and enqueue its job.

The writing itself is `app.exports.writer`, run by the `export` job (or the CLI, synchronously).
"""

from __future__ import annotations

import functools
import shutil
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.accounts import permissions
from app.exports.writer import ExportSpec, WriteResult
from app.jobs import queue as jobs
from app.judge import steps as judge_steps
from app.models import RANKING_SOURCES, SPLITS, Constitution, Export, Job, Project, Rubric, User, utcnow
from app.platform import audit, formats
from app.platform.db import after_commit
from app.platform.errors import DomainError, Invalid, NotFound
from app.projects import projects
from app.webhooks import service as webhooks

KINDS = formats.EXPORT_KINDS
FORMATS = formats.EXPORT_FORMATS
AGGREGATIONS = formats.AGGREGATIONS
EXPORT_LAYOUTS = formats.EXPORT_LAYOUTS
CONFLICTS = formats.CONFLICTS
FLAGGED = formats.FLAGGED

# Which filters each kind understands; anything else is refused by name.
_LABEL_FILTERS = ("source", "rubric_versions", "constitution_versions", "flagged", "created_after", "created_before",
                  "split")
FILTERS: dict[str, tuple[str, ...]] = {
    "pairs": _LABEL_FILTERS + ("min_agreement", "min_confidence", "replay_share"),
    "rankings": _LABEL_FILTERS,
    "sft": _LABEL_FILTERS,
    "prompts": ("split",),
    "steps": _LABEL_FILTERS,
}


class Gone(DomainError):
    """The export existed and was deleted: its row is a tombstone, its files are gone."""

    status_code = 410


def _as_list(name: str, value: Any) -> list[Any]:
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    if isinstance(value, list | tuple):
        return list(value)
    raise Invalid("must be a list (or a comma-separated string)", field=f"filters.{name}")


def _versions(db: Session, project: Project, name: str, value: Any, model: type[Rubric] | type[Constitution]
              ) -> list[int]:
    try:
        versions = sorted({int(v) for v in _as_list(name, value)})
    except (TypeError, ValueError):
        raise Invalid("must be whole version numbers", field=f"filters.{name}") from None
    if not versions:
        raise Invalid("must name at least one version", field=f"filters.{name}")
    known = set(db.scalars(select(model.version).where(model.project_id == project.id)))
    missing = [v for v in versions if v not in known]
    if missing:
        raise Invalid(f"this project has no such version: {', '.join(map(str, missing))}", field=f"filters.{name}")
    return versions


def _fraction(name: str, value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise Invalid("must be a number between 0 and 1", field=f"filters.{name}") from None
    if isinstance(value, bool) or not 0.0 <= number <= 1.0:
        raise Invalid("must be a number between 0 and 1", field=f"filters.{name}")
    return number


def _instant(name: str, value: Any) -> str:
    try:
        moment = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        raise Invalid("must be an ISO 8601 date or date-time", field=f"filters.{name}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)  # a bare date or time means UTC
    return moment.astimezone(UTC).isoformat()


def validate_filters(db: Session, project: Project, kind: str, filters: dict[str, Any] | None) -> dict[str, Any]:
    """The filters normalised (sorted lists, UTC instants, numbers), or Invalid naming the first bad one."""
    if filters is None:
        return {}
    if not isinstance(filters, dict):
        raise Invalid("must be an object", field="filters")
    allowed = FILTERS[kind]
    out: dict[str, Any] = {}
    for name in sorted(filters):
        value = filters[name]
        if name not in allowed:
            known = ", ".join(allowed)
            raise Invalid(f"unknown filter {name!r} for {kind} exports; known: {known}", field=f"filters.{name}")
        if value is None or value == "" or value == []:
            continue  # an empty form field means "no filter"
        out[name] = _FILTER_VALUE[name](db, project, name, value)
    _check_filters_together(out)
    return out


def _sources(db: Session, project: Project, name: str, value: Any) -> list[str]:
    sources = sorted(set(map(str, _as_list(name, value))))
    bad = [s for s in sources if s not in RANKING_SOURCES]
    if bad or not sources:
        raise Invalid(f"must be among {', '.join(RANKING_SOURCES)}", field="filters.source")
    return sources


def _one_of(options: tuple[str, ...]) -> Callable[[Session, Project, str, Any], str]:
    def check(db: Session, project: Project, name: str, value: Any) -> str:
        if value not in options:
            raise Invalid(f"must be one of {', '.join(options)}", field=f"filters.{name}")
        return value

    return check


_FILTER_VALUE: dict[str, Callable[[Session, Project, str, Any], Any]] = {
    "source": _sources,
    "rubric_versions": lambda db, project, name, value: _versions(db, project, name, value, Rubric),
    "constitution_versions": lambda db, project, name, value: _versions(db, project, name, value, Constitution),
    "min_agreement": lambda db, project, name, value: _fraction(name, value),
    "min_confidence": lambda db, project, name, value: _fraction(name, value),
    "replay_share": lambda db, project, name, value: _fraction(name, value),
    "flagged": _one_of(FLAGGED),
    "created_after": lambda db, project, name, value: _instant(name, value),
    "created_before": lambda db, project, name, value: _instant(name, value),
    "split": _one_of(SPLITS),
}
"""Each filter's check and normal form, given (session, project, filter name, value)."""


def _check_filters_together(out: dict[str, Any]) -> None:
    if "replay_share" in out and "created_after" not in out:
        raise Invalid("replays earlier pairs, so it needs created_after", field="filters.replay_share")
    if "created_after" in out and "created_before" in out and out["created_after"] >= out["created_before"]:
        raise Invalid("must be later than created_after", field="filters.created_before")


def _choice(name: str, value: str, options: tuple[str, ...]) -> str:
    if value not in options:
        raise Invalid(f"unknown {name} {value!r}; one of {', '.join(options)}", field=name)
    return value


def create_export(db: Session, project: Project, actor: User | None, *, kind: str, format: str,
                  filters: dict[str, Any] | None = None, aggregation: str = "raw", conflicts: str = "keep",
                  layout: str | None = None, neutral: str = "positive", every_step: bool = False) -> Export:
    """A validated Export row (no job): the caller writes it, the job or the CLI. Filters are stored normalised,
    with the aggregation options beside them, so the row alone says how to reproduce the export."""
    kind = _choice("kind", kind, KINDS)
    fmt = _choice("format", format, FORMATS)
    aggregation = _choice("aggregation", aggregation, AGGREGATIONS)
    conflicts = _choice("conflicts", conflicts, CONFLICTS)
    if layout is not None:
        layout = _choice("layout", layout, EXPORT_LAYOUTS)
    neutral = _choice("neutral", neutral, formats.STEP_NEUTRAL)
    if kind != "steps" and neutral != "positive":
        raise Invalid("only steps exports treat neutral steps", field="neutral")
    if kind != "steps" and every_step:
        raise Invalid("only steps exports have steps to keep", field="every_step")
    if kind != "pairs" and aggregation != "raw":
        raise Invalid("only pairs exports can be aggregated", field="aggregation")
    stored = validate_filters(db, project, kind, filters)
    if kind != "steps" and "mc" in stored.get("source", []):
        raise Invalid("mc names Monte-Carlo step labels, which only steps exports hold", field="filters.source")
    if kind == "steps":
        stored = _gate_ai_step_labels(project, stored)
    elif kind in ("pairs", "rankings") and "source" not in stored and \
            not (project.settings or {}).get("ai_labels_for_training", False):
        # The lead has not allowed AI labels for training: leave them out unless asked for by name. The
        # default is written into the filters, so the row says exactly what the export holds.
        stored["source"] = ["human", "imported"]
    if kind == "pairs":
        stored = stored | {"aggregation": aggregation, "conflicts": conflicts}
    if layout is not None:
        stored["layout"] = layout
    if kind == "steps":
        # every_step is stored only when on, so an export made before the option reads as it was written
        stored = stored | {"neutral": neutral} | ({"every_step": True} if every_step else {})
    export = Export(project_id=project.id, kind=kind, format=fmt, filters=stored,
                    created_by_id=actor.id if actor else None)
    db.add(export)
    db.flush()
    return export


def _gate_ai_step_labels(project: Project, stored: dict[str, Any]) -> dict[str, Any]:
    """A steps export holds the judge's step labels only once the lead allowed them (their own switch, beside the
    one for AI pairs); until then they are left out, and a `source` filter naming them is refused."""
    if (project.settings or {}).get(judge_steps.SETTING, False):
        return stored
    if "ai" in stored.get("source", []):
        raise Invalid("the lead has not allowed AI step labels for training (judge page), so filters.source "
                      "cannot name ai in a steps export", field="filters.source")
    return stored | {"source": stored.get("source", ["human", "imported"])}


def request_export(db: Session, project: Project, actor: User, kind: str, format: str,
                   filters: dict[str, Any] | None = None, aggregation: str = "raw", conflicts: str = "keep",
                   layout: str | None = None, neutral: str = "positive", every_step: bool = False) -> Export:
    """Record the Export and enqueue its `export` job in the caller's transaction (leads, engineers, admins)."""
    permissions.require(db, actor, project, "export.create")
    export = create_export(db, project, actor, kind=kind, format=format, filters=filters, aggregation=aggregation,
                           conflicts=conflicts, layout=layout, neutral=neutral, every_step=every_step)
    job = jobs.enqueue(db, "export", {"export_id": export.id}, project=project, actor=actor, max_attempts=2)
    export.job_id = job.id
    audit.record(db, actor, "export.request", project_id=project.id, object_type="export", object_id=export.id,
                 kind=export.kind, format=export.format, filters=export.filters)
    return export


def spec_of(export: Export) -> ExportSpec:
    filters = dict(export.filters or {})
    aggregation = filters.pop("aggregation", "raw")
    conflicts = filters.pop("conflicts", "keep")
    layout = filters.pop("layout", None)
    neutral = filters.pop("neutral", "positive")
    every_step = bool(filters.pop("every_step", False))
    return ExportSpec(project_id=export.project_id, kind=export.kind, format=export.format, filters=filters,
                      aggregation=aggregation, conflicts=conflicts, layout=layout, neutral=neutral,
                      every_step=every_step)


# How the exports page names each stored filter (the API keeps the stored names and values as they are).
FILTER_LABELS = {"source": "Sources", "split": "Split", "rubric_versions": "Rubric versions",
                 "constitution_versions": "Constitution versions", "flagged": "Flagged items",
                 "min_agreement": "Minimum agreement", "min_confidence": "Minimum confidence",
                 "replay_share": "Replay share", "created_after": "Created after", "created_before": "Created before",
                 "aggregation": "Aggregation", "conflicts": "Conflicts", "layout": "Layout",
                 "neutral": "Neutral steps", "every_step": "Every labelled step"}


def describe_filters(filters: dict[str, Any] | None) -> list[tuple[str, str]]:
    """The stored filters as (label, value) for people: lists joined with commas, instants as dates and times,
    e.g. [("Sources", "human, imported"), ("Aggregation", "raw")]."""
    out = []
    for name, value in (filters or {}).items():
        if isinstance(value, list | tuple):
            text = ", ".join(str(v) for v in value)
        elif isinstance(value, float):
            text = f"{value:g}"
        elif name.startswith("created_") and isinstance(value, str):
            text = value.replace("T", " ").removesuffix("+00:00") + " UTC"
        else:
            text = str(value)
        out.append((FILTER_LABELS.get(name, name.replace("_", " ").capitalize()), text))
    return out


def describe_snapshot(snapshot: str | None) -> str:
    """Where the export read its rows, for people: Postgres names its snapshot; SQLite has no snapshot id, the
    export read everything inside one deferred read transaction."""
    if not snapshot:
        return ""
    if snapshot.startswith("postgres "):
        return f"Postgres snapshot {snapshot.removeprefix('postgres ')}"
    if snapshot.startswith("sqlite"):
        return "one SQLite read transaction"
    return snapshot


def export_dir(data_dir: Path, export_id: int) -> Path:
    return Path(data_dir) / "exports" / str(export_id)


def find(db: Session, export_id: int) -> Export | None:
    """The export with this id, deleted or not, or None; no permission check (the export job acts for its requester)."""
    return db.get(Export, export_id)


def record_files(db: Session, export_id: int, result: WriteResult) -> str | None:
    """Record the files the writer published on the export (locked on Postgres) and announce export.ready, once.

    Returns why nothing was recorded: "deleted" (the export is gone or was deleted while it was written) or
    "published" (an earlier attempt recorded it and its one export.ready already: its files stand); None when
    recorded now."""
    export = db.get(Export, export_id, with_for_update=db.get_bind().dialect.name == "postgresql")
    if export is None or export.deleted_at is not None:
        return "deleted"
    if export.sha256:
        return "published"
    export.files = result.files
    export.sha256 = result.sha256
    export.snapshot = result.snapshot
    export.row_count = result.row_count
    export.row_counts = result.row_counts
    export.path = str(result.path)
    webhooks.fire(db, export.project_id, "export.ready", {
        "export_id": export_id, "kind": export.kind, "format": export.format, "rows": result.row_count,
        "sha256": result.sha256, "files": sorted(result.files), "url": f"/api/exports/{export_id}"})
    return None


def get_visible(db: Session, export_id: int, user: User) -> Export:
    """The export, or NotFound when it does not exist or its project is not the user's."""
    export = db.get(Export, export_id)
    if export is None:
        raise NotFound("no such export")
    try:
        projects.get_visible(db, export.project_id, user)
    except NotFound:
        raise NotFound("no such export") from None
    return export


def list_for_project(db: Session, project: Project, limit: int = 100) -> list[Export]:
    return list(db.scalars(select(Export).where(Export.project_id == project.id).order_by(Export.id.desc())
                           .limit(limit)))


def status(db: Session, export: Export) -> str:
    """deleted, ready (files written), or the job's state (queued, running, failed, cancelled)."""
    if export.deleted_at is not None:
        return "deleted"
    if export.sha256:
        return "ready"
    job = db.get(Job, export.job_id) if export.job_id else None
    if job is None:
        return "failed"
    return "running" if job.state == "succeeded" else job.state


def file_path(export: Export, name: str) -> Path:
    """The file's path, only for a name listed on the Export row (never a path the caller made up)."""
    if export.deleted_at is not None:
        raise Gone("this export was deleted; its files are gone (the row keeps its hashes)")
    if not export.path or name not in (export.files or {}):
        raise NotFound("no such file in this export")
    root = Path(export.path).resolve()
    path = (root / name).resolve()
    if root not in path.parents or not path.is_file():
        raise NotFound("no such file in this export")
    return path


def _remove(paths: list[Path]) -> None:
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)


def delete(db: Session, export: Export, actor: User, *, data_dir: Path | None = None) -> Export:
    """Keep the row as a tombstone (filters, counts, hashes stay on record) and remove the files once that commits:
    a failed commit leaves the export and its files as they were.

    With `data_dir`, also the temp directory a killed, never-retried attempt left behind."""
    project = db.get(Project, export.project_id)
    assert project is not None
    permissions.require(db, actor, project, "export.delete")
    if export.deleted_at is not None:
        return export
    export.deleted_at = utcnow()
    job = db.get(Job, export.job_id) if export.job_id else None
    if job is not None and job.state not in jobs.TERMINAL:
        jobs.cancel(db, job, actor)  # the handler sees the tombstone and removes what it wrote
    doomed = [Path(export.path)] if export.path else []
    if data_dir is not None and (job is None or job.state in jobs.TERMINAL):
        # nothing writes this export any more: a temp directory beside it is a dead attempt's
        doomed.extend(export_dir(data_dir, export.id).parent.glob(f".tmp-{export.id}-*"))
    if doomed:
        after_commit(db, functools.partial(_remove, doomed))
    audit.record(db, actor, "export.delete", project_id=project.id, object_type="export", object_id=export.id,
                 sha256=export.sha256)
    return export
