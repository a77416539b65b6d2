"""One round of iterative RLHF, automated: each step is a job with its own record, started when the one before it
succeeds (in the same transaction), so the round survives worker restarts and every artefact keeps its lineage.

export the new pairs (+ a replay share of earlier ones) → retrain the reward model from the previous one →
export the prompts → train the policy again from the current one (so its reference is the current policy) with
the new reward model (evaluation is part of the run) → sample the new policy into the next annotation round.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from app.accounts import permissions
from app.exports import service as exports
from app.judge import sampling
from app.models import Export, Job, Pair, Project, Ranking, TrainingRun, User
from app.platform.errors import Invalid
from app.runs import training_runs

STEPS = ("export_pairs", "reward", "export_prompts", "policy", "sample")


def start(db: Session, run: TrainingRun, actor: User, *, replay_share: float, k: int | None,
          max_prompts: int | None = None, where: str | None = None, clusters_file: Path | None = None) -> Job:
    """Begin a round from a finished policy run; returns the first step's job. `where` names the cluster the round's
    two runs go to (`local`: the worker's host); none: each goes where the run it continues went."""
    project = db.get_one(Project, run.project_id)
    permissions.require(db, actor, project, "training.start", doing="start an iteration")
    if run.kind not in training_runs.ITERATING_KINDS or run.state != "succeeded":
        kinds = " or ".join(kind.upper() for kind in training_runs.ITERATING_KINDS)
        raise Invalid(f"iterate from a finished {kinds} run", field="run_id")
    reward = db.get(TrainingRun, run.parent_run_id) if run.parent_run_id else None
    if reward is None or reward.kind != "reward" or reward.state != "succeeded":
        raise Invalid("the policy run has no finished reward-model run to retrain", field="run_id")
    if not 0.0 <= replay_share <= 1.0:
        raise Invalid("must be between 0 and 1", field="replay_share")
    placed = training_runs.placement(db, project, where, clusters_file) if where and where.strip() else None
    previous = db.get(Export, reward.export_id) if reward.export_id else None
    filters: dict[str, Any] = {}
    if previous is not None:
        filters["created_after"] = previous.created_at.isoformat()
        if replay_share > 0:
            filters["replay_share"] = replay_share
    if not _pairs_to_export(db, project, previous, replay_share):
        # Refused now rather than two steps in, where the reward model would fail on an empty export.
        since = f" since its export #{previous.id}" if previous is not None else ""
        raise Invalid(f"no pairs to retrain the reward model on: none labelled{since}, and none earlier to replay "
                      "(a pre-made export's pairs are not in the project). Rank the policy's answers first: "
                      "Sample into project starts that round", field="run_id")
    export = exports.request_export(db, project, actor, "pairs", "jsonl", filters=filters)
    job = db.get_one(Job, export.job_id)
    job.payload = dict(job.payload) | {"iteration": {"step": "export_pairs", "actor_id": actor.id,
                                                     "policy_run_id": run.id, "reward_run_id": reward.id, "k": k,
                                                     "max_prompts": max_prompts, "placed": placed}}
    return job


def _pairs_to_export(db: Session, project: Project, previous: Export | None, replay_share: float) -> bool:
    """Whether the round's first export would hold any pair: one labelled since the reward model's export, or an
    earlier one its replay share picks (the same pseudo-random rule as the export's)."""
    query = select(Pair.id).join(Ranking, Pair.ranking_id == Ranking.id).where(Ranking.project_id == project.id)
    if previous is not None:
        recent = Ranking.created_at >= previous.created_at
        replayed = (Pair.id * 7919) % 1000 < int(round(1000 * replay_share)) if replay_share > 0 else None
        query = query.where(recent if replayed is None else or_(recent, replayed))
    return db.scalar(query.limit(1)) is not None


def advance(db: Session, job: Job, data_dir: Path) -> Job | None:
    """After `job` succeeded: start the round's next step, or None when the round is complete (or not a round)."""
    plan = dict((job.payload or {}).get("iteration") or {})
    if not plan or plan.get("step") not in STEPS[:-1]:
        return None
    actor = db.get_one(User, plan["actor_id"])
    project = db.get_one(Project, job.project_id)
    step = plan["step"]
    nxt: Job
    if step == "export_pairs":
        previous = db.get_one(TrainingRun, plan["reward_run_id"])
        assert previous.model_dir is not None  # `start` took a finished run: its model is saved
        run, nxt = training_runs.request_run(
            db, project, actor, data_dir=data_dir, kind="reward", export_id=int(job.payload["export_id"]),
            base_model=str(Path(previous.model_dir)), reward_run_id=previous.id,
            config=dict((previous.config or {}).get("user") or {}))
        _place(run, previous, plan.get("placed"))
        plan |= {"step": "reward", "new_reward_run_id": run.id}
    elif step == "reward":
        export = exports.request_export(db, project, actor, "prompts", "jsonl")
        nxt = db.get_one(Job, export.job_id)
        plan |= {"step": "export_prompts"}
    elif step == "export_prompts":
        policy = db.get_one(TrainingRun, plan["policy_run_id"])
        assert policy.model_dir is not None  # `start` took a finished run: its model is saved
        run, nxt = training_runs.request_run(
            db, project, actor, data_dir=data_dir, kind=policy.kind, export_id=int(job.payload["export_id"]),
            base_model=str(Path(policy.model_dir)), reward_run_id=plan["new_reward_run_id"],
            config=dict((policy.config or {}).get("user") or {}))
        _place(run, policy, plan.get("placed"))
        plan |= {"step": "policy", "new_policy_run_id": run.id}
    else:  # "policy": the new policy's answers become the next round
        new_policy = db.get_one(TrainingRun, plan["new_policy_run_id"])
        nxt = sampling.request_policy_sampling(db, project, actor, new_policy, k=plan.get("k"), seed=None,
                                               max_prompts=plan.get("max_prompts"))
        project.current_round += 1
        plan |= {"step": "sample"}
    nxt.payload = dict(nxt.payload) | {"iteration": plan}
    job.result = dict(job.result or {}) | {"next_job_id": nxt.id, "iteration_step": plan["step"]}
    return nxt


def _place(run: TrainingRun, previous: TrainingRun, placed: dict[str, Any] | None) -> None:
    """A round's run executes where the engineer chose for the round (`placed`: a cluster's placement, {} for the
    worker's host), or else where the run it continues did (its cluster and resources); checked again when the job
    starts."""
    if placed is None:
        where = (previous.config or {}).get("where")
        if where:
            run.config = dict(run.config or {}) | {"where": where}
        return
    config = {k: v for k, v in (run.config or {}).items() if k != "where"}
    run.config = config | ({"where": placed["where"]} if placed.get("where") else {})
