"""The `steps` export: one row per step-labelled completion in TRL's stepwise-supervision layout.

`{"prompt": str, "completions": [step, ...], "labels": [bool, ...]}` is what TRL's PRMTrainer reads; preflab adds
provenance columns beside it (ids, the ternary labels, votes, labellers, split), which TRL ignores.

Aggregation across annotators is by majority, step by step: each ranking that labelled a completion votes +1, 0
or −1 on every step it covered; the most votes win, and a tie goes to the worse label (−1 before 0 before +1), so
a step one of two annotators calls wrong is not trained as correct. By default a row ends at its first wrong step
(labels after an error describe a solution already off course, and annotators may stop there; a verifier that ranks
answers by their weakest step needs no more). The `every_step` option writes every labelled step instead, the
right steps after a wrong one included, which a process reward model used as a dense reward for RL has to score
too. Either way every labelled completion is its own row, completions that share a prompt included. How neutral (0)
steps become booleans is the export's `neutral` option:

- `positive` (default): a neutral step is not an error → True (PRM800K's neutral steps "neither help nor harm");
- `negative`: a neutral step is not progress → False;
- `truncate`: the row ends before its first neutral step (only steps with a clear label are trained on; a row
  left without steps is dropped).

The AI judge's step labels (a judge run with `label_steps`) vote like a labeller once the lead allowed them
(`judge_steps`; until then the export request leaves them out); the judge's soft labels ride along in `judge_p`.
Monte-Carlo step labels (source `mc`, app.judge.monte_carlo) vote like a labeller when the export's `source` filter
names `mc`, and only then: an export without a source filter leaves them out, so labels a policy estimated never
mix into humans' unasked. Their soft labels, the share of continuations that reached the answer, ride along in
`mc_p`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import pyarrow as pa
from sqlalchemy import Connection, Select, select

from app.exports.queries import ExportSpec, chunks, id_in, ranking_filters
from app.models import Completion, Constitution, Prompt, Ranking, Rubric, StepLabel
from app.platform.formats import STEP_NEUTRAL


class StepRun(Protocol):
    """What the steps rows need of the writer's run: its snapshot, counters and streaming (the writer's `_Run`
    offers them; a protocol keeps this module below the writer, which calls it)."""

    spec: ExportSpec
    total: int
    batch_size: int
    sources: Counter[str]
    splits: Counter[str]
    rubric_versions: set[int]

    @property
    def conn(self) -> Connection: ...

    def annotator(self, annotator_id: int | None, judge_run_id: int | None) -> str | None: ...

    def count(self, stmt: Select[*tuple[Any, ...]]) -> int: ...

    def stream(self, stmt: Select[*tuple[Any, ...]]) -> Iterator[Sequence[Any]]: ...

    def advance(self, n: int) -> None: ...

COLUMNS = ("prompt_id", "completion_id", "prompt", "completions", "labels", "step_labels", "first_error",
           "ranking_ids", "annotators", "source", "rubric_versions", "votes", "total_votes", "agreement", "judge_p",
           "mc_p", "split")

COLUMN_DOCS = {
    "completion_id": "the labelled completion",
    "prompt": "the prompt as text (chat prompts as `role: content` lines), as TRL's PRMTrainer reads it",
    "completions": "the completion's steps, in order (TRL's stepwise layout: `completions` are the steps)",
    "labels": "per step: is it correct? (majority label, neutral treated as the `neutral` option says)",
    "step_labels": "per step: the majority label, +1 correct, 0 neutral, -1 wrong",
    "first_error": "index of the first wrong step (the row's last unless every_step), or empty when no step is "
                   "wrong",
    "ranking_ids": "the rankings whose step labels were aggregated",
    "annotators": "pseudonymous ids of the labellers of those rankings (`judge-run-N` for the AI judge, `mc-run-N` "
                  "for Monte-Carlo estimation)",
    "source": "human, ai, mc or imported (mixed when the rankings came from several)",
    "rubric_versions": "rubric versions of those rankings",
    "votes": "per step: votes for the majority label", "total_votes": "per step: votes on the step",
    "agreement": "mean over the row's steps of votes / total_votes",
    "judge_p": "per step: the AI judge's mean soft label p(correct) over the judge rankings aggregated (null where "
               "no judge labelled the step); empty when none did",
    "mc_p": "per step: the mean share of Monte-Carlo continuations from the step that reached the right answer "
            "(null where no Monte-Carlo run labelled the step); empty when none did",
}


def schema() -> pa.Schema:
    ints = pa.list_(pa.int64())
    return pa.schema([
        ("prompt_id", pa.int64()), ("completion_id", pa.int64()), ("prompt", pa.string()),
        ("completions", pa.list_(pa.string())), ("labels", pa.list_(pa.bool_())), ("step_labels", ints),
        ("first_error", pa.int64()), ("ranking_ids", ints), ("annotators", pa.list_(pa.string())),
        ("source", pa.string()), ("rubric_versions", ints), ("votes", ints), ("total_votes", ints),
        ("agreement", pa.float64()), ("judge_p", pa.list_(pa.float64())), ("mc_p", pa.list_(pa.float64())),
        ("split", pa.string())])


def labels_select(spec: ExportSpec) -> Select[*tuple[Any, ...]]:
    """Every step label of the project's (filtered, not skipped) rankings, grouped by completion, then ranking."""
    stmt = (select(StepLabel.completion_id, StepLabel.ranking_id, StepLabel.label, StepLabel.p, Ranking.source,
                   Ranking.annotator_id, Ranking.judge_run_id, Rubric.version.label("rubric_version"))
            .join(Ranking, StepLabel.ranking_id == Ranking.id)
            .join(Prompt, Ranking.prompt_id == Prompt.id)
            .outerjoin(Rubric, Ranking.rubric_id == Rubric.id)
            .where(Ranking.project_id == spec.project_id, Ranking.skipped.is_(False)))
    if "constitution_versions" in spec.filters:
        stmt = stmt.outerjoin(Constitution, Ranking.constitution_id == Constitution.id)
    if "source" not in spec.filters:
        stmt = stmt.where(Ranking.source != "mc")  # Monte-Carlo labels only when asked for by name
    return ranking_filters(stmt, spec.filters, pair_level=False).order_by(
        StepLabel.completion_id, StepLabel.ranking_id, StepLabel.step_index)


def majority(votes: Counter[int]) -> int:
    """The most voted label; a tie goes to the worse one (−1, then 0, then +1)."""
    return max(votes, key=lambda label: (votes[label], -label))


def aggregate(per_ranking: list[list[int]], neutral: str, every_step: bool = False
              ) -> tuple[list[int], list[int], list[int]] | None:
    """(majority label, its votes, all votes) per step of one completion, ended at its first wrong step unless
    `every_step` (and, with neutral="truncate", before its first neutral one); None when no step is left."""
    if neutral not in STEP_NEUTRAL:
        raise ValueError(f"neutral must be one of {', '.join(STEP_NEUTRAL)}, got {neutral!r}")
    n = max((len(labels) for labels in per_ranking), default=0)
    out: tuple[list[int], list[int], list[int]] = ([], [], [])
    for i in range(n):
        votes = Counter(labels[i] for labels in per_ranking if i < len(labels))
        label = majority(votes)
        if label == 0 and neutral == "truncate":
            break
        out[0].append(label)
        out[1].append(votes[label])
        out[2].append(sum(votes.values()))
        if label == -1 and not every_step:
            break
    return out if out[0] else None


def as_bools(step_labels: list[int], neutral: str) -> list[bool]:
    return [label == 1 or (label == 0 and neutral == "positive") for label in step_labels]


class _Group:
    """The step labels of one completion, ranking by ranking, as they stream in."""

    def __init__(self, completion_id: int) -> None:
        self.completion_id = completion_id
        self.rankings: dict[int, list[int]] = {}
        self.soft: dict[str, dict[int, list[float]]] = {"ai": {}, "mc": {}}
        """The AI judge's and Monte-Carlo rankings' soft labels, by source and ranking, in step order."""
        self.meta: dict[int, tuple[str, int | None, int | None, int | None]] = {}

    def add(self, r: Any) -> None:
        self.rankings.setdefault(r.ranking_id, []).append(r.label)
        if r.p is not None and r.source in self.soft:
            self.soft[r.source].setdefault(r.ranking_id, []).append(r.p)
        self.meta[r.ranking_id] = (r.source, r.annotator_id, r.judge_run_id, r.rubric_version)

    def mean_p(self, source: str, n: int) -> list[float | None] | None:
        """Per step of n, the mean soft label of the source's rankings; None when none of them labelled a step."""
        soft = self.soft[source]
        if not soft:
            return None
        out: list[float | None] = []
        for i in range(n):
            ps = [values[i] for values in soft.values() if i < len(values)]
            out.append(round(sum(ps) / len(ps), 6) if ps else None)
        return out


def _row(run: StepRun, group: _Group, steps: list[str], prompt: tuple[int, str, str]) -> dict[str, Any] | None:
    neutral = run.spec.neutral
    agg = aggregate(list(group.rankings.values()), neutral, run.spec.every_step)
    if agg is None:
        return None
    step_labels, votes, total = agg
    n = min(len(step_labels), len(steps))
    if n == 0:  # labels on a completion with no stored steps (an empty text): nothing a step row could hold
        return None
    ranking_ids = sorted(group.rankings)
    metas = [group.meta[rid] for rid in ranking_ids]
    sources = sorted({m[0] for m in metas})
    annotators = [a for m in metas if (a := _labeller(run, m)) is not None]
    first_error = next((j for j in range(n) if step_labels[j] == -1), None)
    return {"prompt_id": prompt[0], "completion_id": group.completion_id, "prompt": prompt[1],
            "completions": steps[:n], "labels": as_bools(step_labels[:n], neutral), "step_labels": step_labels[:n],
            "first_error": first_error, "ranking_ids": ranking_ids, "annotators": annotators,
            "source": sources[0] if len(sources) == 1 else "mixed",
            "rubric_versions": sorted({m[3] for m in metas if m[3] is not None}), "votes": votes[:n],
            "total_votes": total[:n], "agreement": sum(v / t for v, t in zip(votes[:n], total[:n], strict=True)) / n,
            "judge_p": group.mean_p("ai", n), "mc_p": group.mean_p("mc", n), "split": prompt[2]}


def _labeller(run: StepRun, meta: tuple[str, int | None, int | None, int | None]) -> str | None:
    """A ranking's labeller as the row names it: a Monte-Carlo run by its own name, anyone else as every export
    does."""
    source, annotator_id, judge_run_id, _ = meta
    if source == "mc":
        return f"mc-run-{judge_run_id}"
    return run.annotator(annotator_id, judge_run_id)


def _lookups(run: StepRun, completion_ids: list[int]) -> tuple[dict[int, list[str]], dict[int, tuple[int, str, str]]]:
    """completion id → stored steps, and → (prompt id, prompt text, split), for one batch."""
    steps, prompts = {}, {}
    for chunk in chunks(completion_ids):
        for cid, stored, pid, text, split in run.conn.execute(
                select(Completion.id, Completion.steps, Prompt.id, Prompt.text, Prompt.split)
                .join(Prompt, Completion.prompt_id == Prompt.id).where(id_in(run.conn, Completion.id, chunk))):
            steps[cid], prompts[cid] = list(stored or []), (pid, text, split)
    return steps, prompts


def _emit(run: StepRun, groups: list[_Group]) -> dict[str, list[Any]]:
    steps, prompts = _lookups(run, [g.completion_id for g in groups])
    cols: dict[str, list[Any]] = {name: [] for name in COLUMNS}
    for group in groups:
        row = _row(run, group, steps.get(group.completion_id, []), prompts[group.completion_id])
        if row is None or not row["completions"]:
            continue
        for name in COLUMNS:
            cols[name].append(row[name])
        run.sources[row["source"]] += 1
        run.splits[row["split"]] += 1
        run.rubric_versions.update(row["rubric_versions"])
    return cols


def rows(run: StepRun) -> Iterator[dict[str, list[Any]]]:
    """The steps export's column batches, in completion id order."""
    stmt = labels_select(run.spec)
    run.total = run.count(stmt)
    done: list[_Group] = []
    current: _Group | None = None
    for batch in run.stream(stmt):
        for r in batch:
            if current is None or current.completion_id != r.completion_id:
                if current is not None:
                    done.append(current)
                current = _Group(r.completion_id)
            current.add(r)
        if len(done) >= run.batch_size:
            yield _emit(run, done)
            done = []
        run.advance(len(batch))
    if current is not None:
        done.append(current)
    if done:
        yield _emit(run, done)


def card_section(spec: ExportSpec) -> list[str]:
    """The card's words on how step labels were aggregated."""
    treatment = {"positive": "neutral (0) steps are labelled True (not an error)",
                 "negative": "neutral (0) steps are labelled False (not progress)",
                 "truncate": "each row ends before its first neutral (0) step"}[spec.neutral]
    return ["## Step labels", "",
            "TRL's stepwise-supervision layout: `prompt`, `completions` (the steps) and `labels` (one bool per "
            "step) load unchanged into `trl.PRMTrainer`; the other columns are provenance.", "",
            "Each completion's labels are the majority over its rankings, step by step; a tie goes to the worse "
            f"label (-1, then 0, then +1). {_cut(spec)} With `neutral: {spec.neutral}`, {treatment}.", "",
            "AI judge step labels (source `ai`, labeller `judge-run-N`) are included only when the lead allowed "
            "them for training; each votes its hard label (p >= 0.5: correct) and `judge_p` keeps the soft label.",
            "",
            "Monte-Carlo step labels (source `mc`, labeller `mc-run-N`: N continuations sampled by a policy from "
            "each step and checked against the reference answer, as in Math-Shepherd) are included only when the "
            "export's `source` filter names `mc`; each votes its run's hard or soft estimate and `mc_p` keeps the "
            "share of continuations that reached the answer.",
            ""]


def _cut(spec: ExportSpec) -> str:
    """The card's sentence on where a row ends."""
    if spec.every_step:
        return ("`every_step: true`: a row holds every labelled step of its completion, the steps after a wrong one "
                "included (training-grade: a process reward model used as a dense reward must score those too); "
                "completions that share a prompt are each their own row.")
    return ("A row ends at its first wrong step (the default: labels after an error describe a solution already off "
            "course and annotators may stop there; `every_step: true` keeps them); completions that share a prompt "
            "are each their own row.")
