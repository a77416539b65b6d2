"""The `mc_step_labels` job: Monte-Carlo step labels (Math-Shepherd) for a run's completions, prompt by prompt.

For each prompt, N continuations are sampled from every step prefix of each of its completions (one generate call
per prompt), each checked against the prompt's reference answer, and the prompt's labels are written in one
transaction: a stopped or crashed run resumes at the next prompt and never labels a prompt twice. Progress counts
completions; the log says, per completion, the share of right continuations after each step.

When the project's runs go to a cluster, so does the sampling: the prompts and their solutions are written under the
cluster's shared path, `python -m training.step_estimates` estimates them there (the same calls, the same seed, the
same tallies), and the worker writes the labels prompt by prompt as it does for its own estimates.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.jobs.context import JobContext, JobError, JobStopped, job_row
from app.judge import monte_carlo
from app.platform.db import session_scope
from app.runs import cluster_job
from training.generation import GenerationCancelled, GenerationError, GenerationParams, HFGenerator
from training.sample_batch import write_whole
from training.step_estimates import Checker, ContinuingGenerator, Solution, StepEstimate, estimate_steps

Estimated = Iterable[tuple[monte_carlo.PromptToLabel, dict[int, list[StepEstimate]]]]
"""Each prompt to label with its completions' estimates, {completion id: [StepEstimate per step]}."""


def run(ctx: JobContext) -> dict[str, Any]:
    run_id = int(ctx.payload["judge_run_id"])
    with session_scope(ctx.session_factory) as db:
        params = dict(job_row(db, monte_carlo.find_run, run_id, "Monte-Carlo run").params)
    policy = HFGenerator(params["model"])
    try:
        policy.check()
    except (GenerationError, ValueError) as exc:  # the model directory went away since the run was started
        _set_state(ctx, run_id, "failed")
        raise JobError(f"policy: {exc}") from None
    where = dict(ctx.payload.get("where") or {})
    if where.get("cluster"):  # a cluster other than local (the request leaves `where` out for local)
        placed = cluster_job.place(ctx, where, ctx.settings.data_dir / "mc" / str(ctx.job_id))
        cluster_job.hold_slot(ctx, placed)
        plan = _plan(ctx)
        return _label(ctx, plan, _from_cluster(ctx, plan, placed))
    try:
        return label_with(ctx, policy)
    finally:
        policy.close()


def label_with(ctx: JobContext, policy: ContinuingGenerator) -> dict[str, Any]:
    """The job's work with a policy already made: any generator that continues a written prefix."""
    plan = _plan(ctx)
    return _label(ctx, plan, ((item, _estimate(ctx, policy, plan, item)) for item in plan.todo))


@dataclass(frozen=True)
class Plan:
    """What the run still has to label, and how."""

    run_id: int
    project_id: int
    params: dict[str, Any]
    checker: Checker
    todo: list[monte_carlo.PromptToLabel]
    done_before: int
    skipped: int

    @property
    def sampling(self) -> GenerationParams:
        return GenerationParams(temperature=float(self.params["temperature"]),
                                max_new_tokens=int(self.params["max_new_tokens"]), seed=int(self.params["seed"]))


def _plan(ctx: JobContext) -> Plan:
    run_id = int(ctx.payload["judge_run_id"])
    with session_scope(ctx.session_factory) as db:
        mc_run = job_row(db, monte_carlo.find_run, run_id, "Monte-Carlo run")
        params, project_id = dict(mc_run.params), int(mc_run.project_id)
        checker = Checker(params["checker"])
        todo, done_before, skipped = monte_carlo.prompts_to_label(db, mc_run, ctx.payload.get("prompt_ids"),
                                                                  readable=checker.readable)
        monte_carlo.set_run_state(db, run_id, "running")
    return Plan(run_id, project_id, params, checker, todo, done_before, skipped)


def _label(ctx: JobContext, plan: Plan, estimated: Estimated) -> dict[str, Any]:
    """Write each prompt's labels as its estimates come, one transaction a prompt; the run's end state."""
    run_id, n, estimate = plan.run_id, int(plan.params["n"]), str(plan.params["estimate"])
    total = plan.done_before + sum(len(p.completions) for p in plan.todo)
    done, labels_written, sampled = plan.done_before, 0, 0
    ctx.progress(done, total, f"labelling {total - done} completions, {n} continuations per step")
    ctx.log(f"Monte-Carlo run {run_id}: N={n}, {estimate} estimate, checker {plan.checker.name}, policy "
            f"{plan.params['model']}" + (f"; {plan.skipped} prompts passed over: the checker cannot read their "
                                         "reference answer" if plan.skipped else ""))
    try:
        for item, estimates in estimated:
            with session_scope(ctx.session_factory) as db:
                row = monte_carlo.find_run(db, run_id)
                if row is None:
                    raise JobError(f"Monte-Carlo run {run_id} no longer exists")
                labels = {cid: [(e.label(estimate), e.soft) for e in per_step] for cid, per_step in estimates.items()}
                labels_written += monte_carlo.write_labels(db, row, item.prompt_id, labels,
                                                           round_=monte_carlo.current_round(db, plan.project_id),
                                                           job_id=ctx.job_id)
            sampled += sum(e.n for per_step in estimates.values() for e in per_step[:-1])
            done += len(item.completions)
            ctx.progress(done, total, f"{done}/{total} completions labelled, {sampled} continuations sampled")
    except (GenerationCancelled, JobStopped):
        _set_state(ctx, run_id, "cancelled" if ctx.stop_reason == "cancelled" else "queued")
        raise JobStopped(ctx.stop_reason or "stopped") from None
    except Exception:
        _set_state(ctx, run_id, "failed")
        raise
    _set_state(ctx, run_id, "succeeded")
    message = f"{labels_written} step labels on {done - plan.done_before} completions ({sampled} continuations)"
    if plan.skipped:
        message += f"; {plan.skipped} prompts passed over: the checker cannot read their reference answer"
    return {"judge_run_id": run_id, "completions_labelled": done - plan.done_before,
            "step_labels_written": labels_written, "continuations_sampled": sampled,
            "prompts_without_readable_reference": plan.skipped, "message": message}


def _estimate(ctx: JobContext, policy: ContinuingGenerator, plan: Plan, item: monte_carlo.PromptToLabel
              ) -> dict[int, list[StepEstimate]]:
    """One prompt's completions estimated step by step, here."""
    ctx.check()
    solutions = [Solution(item.prompt, text, steps, item.reference) for (_, text), steps in
                 zip(item.completions, _stored_steps(ctx, plan, item), strict=True)]
    try:
        per_solution = estimate_steps(policy, solutions, int(plan.params["n"]), plan.sampling, plan.checker,
                                      should_stop=ctx.should_stop)
    except GenerationError as exc:  # a prompt longer than the model's context, say: the user's to fix
        raise JobError(f"prompt {item.prompt_id}: {exc}") from None
    return _logged(ctx, {cid: estimates for (cid, _), estimates in zip(item.completions, per_solution, strict=True)})


def _stored_steps(ctx: JobContext, plan: Plan, item: monte_carlo.PromptToLabel) -> list[list[str]]:
    with session_scope(ctx.session_factory) as db:
        stored = monte_carlo.stored_steps(db, plan.project_id, [cid for cid, _ in item.completions])
    return [stored[cid] for cid, _ in item.completions]


def _logged(ctx: JobContext, estimates: dict[int, list[StepEstimate]]) -> dict[int, list[StepEstimate]]:
    for cid, per_step in estimates.items():
        ctx.log(f"completion {cid}: right continuations after each step "
                + " ".join(f"{e.correct}/{e.n}" for e in per_step))
    return estimates


PROMPTS_FILE, SPEC_FILE, OUT_FILE = "prompts.jsonl", "spec.json", "estimates.jsonl"


def _from_cluster(ctx: JobContext, plan: Plan, placed: cluster_job.Placed) -> Iterator[
        tuple[monte_carlo.PromptToLabel, dict[int, list[StepEstimate]]]]:
    """The estimates drawn on the cluster (`python -m training.step_estimates`), prompt by prompt, once its job
    succeeded; a prompt labelled since (by an earlier attempt that wrote part of them) is passed over."""
    workdir = placed.workdir
    if not (workdir / PROMPTS_FILE).exists():  # once: a cluster job may be reading it already
        workdir.mkdir(parents=True, exist_ok=True)
        keys = ("model", "n", "temperature", "max_new_tokens", "seed", "checker")
        (workdir / SPEC_FILE).write_text(json.dumps({k: plan.params[k] for k in keys}), encoding="utf-8")
        write_whole(workdir / PROMPTS_FILE, [
            {"prompt_id": item.prompt_id, "prompt": item.prompt, "reference": item.reference,
             "solutions": [{"completion_id": cid, "text": text, "steps": steps} for (cid, text), steps in
                           zip(item.completions, _stored_steps(ctx, plan, item), strict=True)]}
            for item in plan.todo])
    if not plan.todo:
        return
    cluster_job.carry_out(ctx, placed, module="training.step_estimates", what="Monte-Carlo labelling",
                          reads=(Path(plan.params["model"]),),
                          args=["--spec", str(workdir / SPEC_FILE), "--prompts", str(workdir / PROMPTS_FILE),
                                "--out", str(workdir / OUT_FILE)])
    try:
        lines = [json.loads(line) for line in (workdir / OUT_FILE).read_text(encoding="utf-8").splitlines()]
    except (OSError, ValueError) as exc:
        raise JobError(f"the cluster's job ended without its estimates in {workdir / OUT_FILE}: {exc}") from None
    items = {item.prompt_id: item for item in plan.todo}
    for line in lines:
        item = items.get(int(line["prompt_id"]))
        if item is not None:
            ctx.check()
            yield item, _logged(ctx, {int(cid): [StepEstimate(int(c), int(n)) for c, n in per_step]
                                      for cid, per_step in line["estimates"].items()})


def _set_state(ctx: JobContext, run_id: int, state: str) -> None:
    with session_scope(ctx.session_factory) as db:
        monte_carlo.set_run_state(db, run_id, state)
