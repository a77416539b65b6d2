"""The file formats preflab reads and writes and the kinds of export, named once: schemas, services and pages
import these instead of spelling the lists again."""

from __future__ import annotations

from typing import Literal, get_args

ExportKind = Literal["pairs", "rankings", "prompts", "sft", "steps"]
ExportFormat = Literal["jsonl", "parquet", "hf"]
Aggregation = Literal["raw", "aggregated"]
Conflicts = Literal["keep", "drop"]
StepNeutral = Literal["positive", "negative", "truncate"]
"""How a steps export turns neutral (0) steps into TRL's bool labels (app/exports/steps.py)."""
Flagged = Literal["include", "exclude", "only"]
ImportFormat = Literal["jsonl", "csv", "parquet"]
ImportPreset = Literal["preflab", "ultrafeedback", "trl", "hh-rlhf", "label-studio", "argilla", "trl-stepwise",
                       "prm800k"]
"""Layouts an import can be read in; "preflab" is preflab's own (the fields the import page lists)."""
ExportLayout = Literal["standard", "conversational"]

EXPORT_KINDS: tuple[str, ...] = get_args(ExportKind)
EXPORT_FORMATS: tuple[str, ...] = get_args(ExportFormat)
AGGREGATIONS: tuple[str, ...] = get_args(Aggregation)
CONFLICTS: tuple[str, ...] = get_args(Conflicts)
STEP_NEUTRAL: tuple[str, ...] = get_args(StepNeutral)
FLAGGED: tuple[str, ...] = get_args(Flagged)
IMPORT_FORMATS: tuple[str, ...] = get_args(ImportFormat)
IMPORT_PRESETS: tuple[str, ...] = get_args(ImportPreset)
EXPORT_LAYOUTS: tuple[str, ...] = get_args(ExportLayout)

# What a person reads for each format (the exports page's picker, import messages).
EXPORT_FORMAT_NAMES = {"jsonl": "JSONL", "parquet": "Parquet", "hf": "Hugging Face datasets directory"}
IMPORT_FORMAT_NAMES = {"jsonl": "JSON Lines", "csv": "CSV", "parquet": "Parquet"}
