"""The AI judge in the app: starting judge runs, what the judge job reads and records, and the lead's decision on AI
labels (the agreement it is judged on is quality's: `app.quality.judge_agreement`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.accounts import permissions
from app.annotation.queue import task_completion_ids
from app.jobs import queue as jobs
from app.judge import endpoints
from app.models import Completion, Job, JudgeRun, Project, Prompt, Ranking, User
from app.platform import audit
from app.platform.errors import Invalid
from app.projects import constitutions, projects
from app.quality import judge_agreement, rollups
from app.webhooks import service as webhooks

PromptToJudge = tuple[int, Any, list[tuple[int, str]]]
"""(prompt id, its text or chat messages, [(completion id, text)] of the completions a task shows)."""


def request_judge_run(db: Session, project: Project, actor: User, *, constitution_version: int | None,
                      generator: dict[str, Any], mode: str, principles: str, prompt_ids: list[int] | None,
                      seed: int, low_confidence: float, route_low_confidence: bool,
                      label_steps: bool = False, scope: str = "all") -> tuple[JudgeRun, Job]:
    """A JudgeRun and its queued `judge` job, or Invalid naming the field when something can be checked now.

    `scope` "human_ranked" keeps the prompts an annotator has ranked (of `prompt_ids`, when given), as they are now:
    the quickest way to measure the judge against humans, where a small local model judges a few comparisons a
    second."""
    permissions.require(db, actor, project, "judge.start")
    if label_steps and not (project.settings or {}).get("step_labels", False):
        raise Invalid("this project does not label steps: turn step labels on first", field="label_steps")
    if constitution_version is None:
        constitution = constitutions.ensure_default(db, project, actor)
    else:
        constitution = constitutions.get_version(db, project, constitution_version, field="constitution_version")
    # An openai generator names an admin's model endpoint; the job keeps the id, never a URL or key.
    generator = endpoints.prepare(db, actor, generator)
    if prompt_ids:
        found = set(db.scalars(select(Prompt.id).where(Prompt.project_id == project.id, Prompt.id.in_(prompt_ids))))
        missing = sorted(set(prompt_ids) - found)
        if missing:
            raise Invalid(f"not prompts of this project: {', '.join(map(str, missing[:10]))}", field="prompt_ids")
    if scope == "human_ranked":
        prompt_ids = _human_ranked(db, project, prompt_ids)
    params = {"mode": mode, "principles": principles, "seed": seed, "low_confidence": low_confidence, "scope": scope,
              "route_low_confidence": route_low_confidence, "label_steps": bool(label_steps),
              "generator": {k: v for k, v in generator.items() if k != "api_key"}}
    run = JudgeRun(project_id=project.id, constitution_id=constitution.id, params=params, state="queued",
                   created_by_id=actor.id, name=f"constitution v{constitution.version} · {mode} · {principles}"
                   + (" · steps" if label_steps else ""))
    db.add(run)
    db.flush()
    payload: dict[str, Any] = {"judge_run_id": run.id, "generator": generator, "prompt_ids": prompt_ids}
    cluster = projects.default_cluster(project)
    if cluster is not None and generator.get("backend") == "hf":
        # A local judge model's work is heavy: it goes where the project's runs go. A server's stays on the worker.
        payload["where"] = {"cluster": cluster}
    job = jobs.enqueue(db, "judge", payload, project=project, actor=actor)
    return run, job


def _human_ranked(db: Session, project: Project, prompt_ids: list[int] | None) -> list[int]:
    """The project's prompts with a human ranking (not a skip), of `prompt_ids` when given; Invalid when none."""
    query = (select(Ranking.prompt_id).distinct()
             .where(Ranking.project_id == project.id, Ranking.source == "human", Ranking.skipped.is_(False)))
    if prompt_ids:
        query = query.where(Ranking.prompt_id.in_(prompt_ids))
    ranked = sorted(db.scalars(query))
    if not ranked:
        raise Invalid("no prompt of this project has a human ranking yet: rank some first, or judge all prompts",
                      field="scope")
    return ranked


def runs_with_jobs(db: Session, project: Project) -> list[tuple[JudgeRun, Job | None]]:
    """The project's judge runs, newest first, each with the job that ran it (its progress, result or reason)."""
    runs = list_runs(db, project)
    by_run: dict[int, Job] = {}
    for job in db.scalars(select(Job).where(Job.project_id == project.id, Job.kind == "judge").order_by(Job.id)):
        run_id = (job.payload or {}).get("judge_run_id")
        if isinstance(run_id, int):
            by_run[run_id] = job  # the newest job of a run wins
    return [(run, by_run.get(run.id)) for run in runs]


def find_run(db: Session, run_id: int) -> JudgeRun | None:
    """The judge run with this id, or None; no permission check (the judge job acts for whoever started the run)."""
    return db.get(JudgeRun, run_id)


def set_run_state(db: Session, run_id: int, state: str) -> None:
    """Move the judge run (if it still exists) to `state`; a run that newly succeeded or failed is announced."""
    judge_run = db.get(JudgeRun, run_id)
    if judge_run is not None:
        announce = state in ("succeeded", "failed") and judge_run.state != state
        judge_run.state = state
        if announce:  # told once, in the transaction that records the end
            webhooks.fire(db, judge_run.project_id, "judge_run.finished",
                          {"judge_run_id": run_id, "name": judge_run.name, "state": state})


def prompts_to_judge(db: Session, project_id: int, run_id: int, prompt_ids: list[int] | None
                     ) -> tuple[list[PromptToJudge], int]:
    """Prompts with ≥ 2 completions the run has not ranked yet (resume), oldest first, and how many it already has."""
    n_completions = (select(func.count(Completion.id))
                     .where(Completion.prompt_id == Prompt.id, Completion.source != "revision").scalar_subquery())
    query = select(Prompt).where(Prompt.project_id == project_id, n_completions >= 2).order_by(Prompt.id)
    if prompt_ids:
        query = query.where(Prompt.id.in_(prompt_ids))
    prompts = list(db.scalars(query))
    judged = set(db.scalars(select(Ranking.prompt_id).where(Ranking.judge_run_id == run_id)))
    k = db.scalar(select(Project.completions_per_prompt).where(Project.id == project_id)) or 2
    todo = []
    for p in prompts:
        if p.id in judged:
            continue
        # The same completions a human task shows: the K newest rankable ones (no CAI revisions).
        shown = set(task_completion_ids(db, p.id, k))
        todo.append((p.id, p.messages or p.text, [(c.id, c.text) for c in p.completions if c.id in shown]))
    return todo, len(prompts) - len(todo)


def current_round(db: Session, project_id: int) -> int:
    """The project's labelling round as stored now (the round a judge ranking written now belongs to)."""
    return int(db.scalar(select(Project.current_round).where(Project.id == project_id)) or 1)


def set_ai_labels(db: Session, project: Project, actor: User, enabled: bool,
                  evidence: judge_agreement.JudgeAgreement | None = None) -> None:
    """The lead's explicit decision whether AI labels may be used for training (exports exclude them otherwise).
    Allowing them needs the gate's evidence (`judge_agreement.gate_missing`; `evidence`: the figures to judge it on,
    e.g. a large project's
    rollup, else computed now); stopping them is always possible."""
    permissions.require(db, actor, project, "labels.decide")
    if enabled and not judge_agreement.ai_labels_enabled(project):
        report = evidence if evidence is not None else judge_agreement.judge_agreement(db, project)
        if report.gate_missing:
            raise Invalid("AI labels cannot be allowed yet: " + "; ".join(report.gate_missing), field="enabled")
    project.settings = dict(project.settings or {}) | {"ai_labels_for_training": bool(enabled)}
    audit.record(db, actor, "ai_labels.set", project_id=project.id, object_type="project", object_id=project.id,
                 enabled=bool(enabled))


def decide_ai_labels(db: Session, project: Project, actor: User, enabled: bool
                     ) -> tuple[judge_agreement.JudgeAgreement, rollups.Freshness]:
    """The lead's decision on AI labels, the gate judged on the figures judge_report shows (a large project's from
    its rollup, said how fresh); returns them with the decision in."""
    permissions.require(db, actor, project, "labels.decide")  # before any figure is computed for this caller
    report, fresh = rollups.judge_report(db, project, actor)
    assert report is not None  # exact_before_first: there is always a report to decide on
    set_ai_labels(db, project, actor, enabled, evidence=report)
    return dataclasses.replace(report, ai_labels_enabled=judge_agreement.ai_labels_enabled(project)), fresh


def list_runs(db: Session, project: Project) -> list[JudgeRun]:
    """The project's judge runs, newest first (the judge page's table)."""
    return list(db.scalars(select(JudgeRun).where(JudgeRun.project_id == project.id).order_by(JudgeRun.id.desc())))
