"""The dataset card (README.md) of an export: what the rows are, how they were selected, what the labels mean.

Deterministic on purpose (no export id, date or snapshot), so the card hashes the same on every re-run.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pyarrow as pa
from sqlalchemy import Connection, case, func, or_, select
from sqlalchemy.orm import Session

from app.exports import steps as export_steps
from app.exports.queries import ExportSpec, lo_hi
from app.models import Constitution, Pair, Project, Ranking, Rubric
from app.quality.agreement import project_report

COLUMN_DOCS = {
    "pair_id": "preflab pair id (aggregated: the first pair voting for the majority direction)",
    "prompt_id": "preflab prompt id", "ranking_id": "the ranking the pair was expanded from",
    "ranking_ids": "every ranking that voted for this direction",
    "prompt": "the prompt (text, or chat messages in a conversational export)",
    "chosen": "the preferred response", "rejected": "the other response",
    "chosen_id": "completion id of `chosen`", "rejected_id": "completion id of `rejected`",
    "source": "human, ai or imported (aggregated: mixed when the votes came from several)",
    "annotator": "pseudonymous labeller id (see below); judge-run-N for an AI judge; empty for imports",
    "annotators": "pseudonymous ids of the majority voters",
    "rubric_version": "rubric version the label was given under", "rubric_versions": "rubric versions of the votes",
    "constitution_version": "constitution version of an AI label",
    "constitution_versions": "constitution versions of the votes",
    "margin": "tiers between chosen and rejected (aggregated: mean over the votes)",
    "weight": "loss weight (aggregated: the agreement)", "p": "soft label p(chosen ≻ rejected)",
    "votes": "votes for this direction", "total_votes": "votes on this pair in either direction",
    "agreement": "votes / total_votes",
    "split": "train or heldout, by prompt: a held-out prompt's rows are all heldout",
    "completion_ids": "the ranked completion ids, ascending", "completions": "their texts, in the same order",
    "tiers": "completion ids, best tier first; ids in one tier are tied",
    "flags": "JSON: completion id → flags the labeller raised", "reference": "reference answer, if any",
    "completion": "the SFT target response", "completion_id": "its completion id",
    "origin": "where the SFT row comes from (best_ranked: most often in the top tier)",
    "rankings": "rankings of the prompt considered",
}


def _quote(text: str) -> str:
    return "\n".join("> " + line if line else ">" for line in (text or "").splitlines()) or "> (empty)"


FULL_REPORT_MAX_RANKINGS = 20_000
"""Above this many human rankings the card leaves the per-ranking report (Krippendorff's alpha, Kendall's tau,
computed in Python) to the agreement dashboard, so that an export stays a streaming pass over the data."""


def _fig(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4f}"


def agreement_section(conn: Connection, project_id: int) -> list[str]:
    """Agreement of the project's human labels at the snapshot: vote agreement per completion pair (in SQL,
    any size) and, for projects up to FULL_REPORT_MAX_RANKINGS rankings, the dashboard's full report."""
    lo, hi = lo_hi(conn, Pair.chosen_id, Pair.rejected_id)
    forward = func.sum(case((Pair.chosen_id < Pair.rejected_id, 1), else_=0))
    votes = (select(forward.label("f"), func.count().label("n"))
             .join(Ranking, Pair.ranking_id == Ranking.id)
             .where(Ranking.project_id == project_id, Ranking.source == "human")
             .group_by(Pair.prompt_id, lo, hi).having(func.count() >= 2).subquery())
    majority = case((votes.c.f * 2 >= votes.c.n, votes.c.f), else_=votes.c.n - votes.c.f)
    shared, mean_share, unanimous = conn.execute(select(
        func.count(), func.avg(majority * 1.0 / votes.c.n),
        func.sum(case((or_(votes.c.f == 0, votes.c.f == votes.c.n), 1), else_=0)))).one()
    lines = ["## Agreement (human labels of the whole project, at export time)", "",
             f"- completion pairs with two or more human votes: {shared}",
             f"- mean share of votes for the majority direction: {_fig(mean_share)}",
             f"- unanimous pairs: {int(unanimous or 0)}"]
    human = conn.execute(select(func.count(Ranking.id)).where(Ranking.project_id == project_id,
                                                                Ranking.source == "human")).scalar() or 0
    if human > FULL_REPORT_MAX_RANKINGS:
        lines += [f"- per-ranking figures (Kendall tau-b, Krippendorff alpha): see the agreement dashboard "
                  f"({human} human rankings is above the {FULL_REPORT_MAX_RANKINGS} the card computes)", ""]
        return lines
    with Session(bind=conn) as session:
        project = session.get(Project, project_id)
        report = project_report(session, project) if project is not None else None
    if report is not None:
        lines += [f"- human rankings: {report.human_rankings} ({report.skipped} skipped)",
                  f"- prompts ranked by two or more annotators: {report.shared_prompts}",
                  f"- ranking pairs compared: {report.comparisons}",
                  f"- mean pairwise agreement: {_fig(report.mean_agreement)}",
                  f"- mean Kendall tau-b: {_fig(report.mean_kendall_tau)}",
                  f"- Krippendorff alpha (ordinal): {_fig(report.krippendorff_alpha)}"]
    return lines + [""]


MIXED_SPLIT = "train_and_heldout"
"""The Hub split name of a data file that holds rows of both splits. Not "all": `datasets` reserves that name for
the union of every split."""


def hub_split(splits: Counter[str], spec: ExportSpec) -> str:
    """The split the card's front matter gives the one data file, from the rows written: theirs when they all share
    one (an export filtered to a split, or a project without held-out prompts), else MIXED_SPLIT. Calling the whole
    file `train` would hand held-out rows to whoever trains on the Hub's train split."""
    present = sorted(name for name, n in splits.items() if n)
    if not present and spec.filters.get("split"):
        present = [str(spec.filters["split"])]
    return present[0] if len(present) == 1 else MIXED_SPLIT


def render_card(conn: Connection, spec: ExportSpec, *, project_name: str, description: str, license_id: str,
                schema: pa.Schema, rows: int, sources: Counter[str], splits: Counter[str],
                rubric_versions: list[int], constitution_versions: list[int], data_files: dict[str, str],
                conversational: bool, agreement: list[str] | None = None) -> str:
    """README.md for the export: what the rows are, how they were selected, and what the labels mean.

    `agreement`: the agreement section's lines when the caller computed them already (`agreement_section` on
    another connection in the same snapshot); otherwise they are computed here.

    Deterministic on purpose (no export id, date or snapshot), so the card hashes the same on every re-run.
    """

    lines = ["---", f"license: {json.dumps(license_id)}", f"pretty_name: {json.dumps('preflab: ' + project_name)}"]
    data_file = next((n for n in data_files if n.endswith((".jsonl", ".parquet"))), None)
    file_split = hub_split(splits, spec)
    if data_file:
        lines += ["configs:", "- config_name: default", "  data_files:", f"  - split: {file_split}",
                  f"    path: {json.dumps(data_file)}"]
    lines += ["---", "", f"# {project_name}: {spec.kind} export", ""]
    if description:
        lines += [description, ""]
    options: dict[str, Any] = {"kind": spec.kind, "format": spec.format, "filters": spec.filters}
    if spec.kind == "pairs":
        options |= {"aggregation": spec.aggregation, "conflicts": spec.conflicts}
    if spec.kind == "steps":
        options |= {"neutral": spec.neutral, "every_step": spec.every_step}
    lines += ["## Selection", "", "```json", json.dumps(options, indent=2, sort_keys=True), "```", ""]
    lines += ["## Counts", "", f"- rows: {rows}" + ("  (empty: the filters select nothing)" if rows == 0 else "")]
    lines += [f"- source {k}: {v}" for k, v in sorted(sources.items())]
    lines += [f"- split {k}: {v}" for k, v in sorted(splits.items())]
    lines += ["", "Splits are by prompt: every row of a held-out prompt is `heldout`, so held-out prompts never "
              "reach the train split."]
    if data_file and file_split == MIXED_SPLIT:
        lines += ["", f"The data file holds both splits, so the Hub loads it as `{MIXED_SPLIT}`: keep the rows whose "
                  "`split` column is `train` to train, and the `heldout` ones to evaluate."]
    lines += [""]
    lines += ["## Columns", "", "| column | type | meaning |", "|---|---|---|"]
    docs = COLUMN_DOCS | (export_steps.COLUMN_DOCS if spec.kind == "steps" else {})
    lines += [f"| `{f.name}` | `{f.type}` | {docs.get(f.name, '')} |" for f in schema]
    lines += [""]
    if spec.kind == "steps":
        lines += export_steps.card_section(spec)
    if conversational:
        lines += ["Conversational layout: `prompt` is a list of chat messages and responses are one assistant "
                  "message each (TRL's conversational preference format).", ""]
    lines += ["## Labellers", "", "`annotator` is a pseudonym: the first 64 bits of HMAC-SHA256 over the project "
              "and user ids, keyed with the deployment's secret. It is stable within this project and cannot be "
              "mapped back to a person without that secret.", ""]
    for version in rubric_versions:
        text = conn.execute(select(Rubric.text).where(Rubric.project_id == spec.project_id,
                                                      Rubric.version == version)).scalar() or ""
        lines += [f"## Rubric version {version}", "", _quote(text), ""]
    for version in constitution_versions:
        principles = conn.execute(select(Constitution.principles).where(
            Constitution.project_id == spec.project_id, Constitution.version == version)).scalar() or []
        lines += [f"## Constitution version {version}", ""]
        for p in principles:
            lines += [f"- **{p.get('name', '')}** (priority {p.get('priority', '')}): {p.get('rationale', '')}"]
        lines += [""]
    lines += agreement_section(conn, spec.project_id) if agreement is None else agreement
    lines += ["## Files", "", "```"] + [f"{h}  {n}" for n, h in sorted(data_files.items())] + ["```", ""]
    return "\n".join(lines)
