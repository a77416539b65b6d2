"""The `mc_step_labels` job: Monte-Carlo step labels (Math-Shepherd) for a run's completions, prompt by prompt.

For each prompt, N continuations are sampled from every step prefix of each of its completions (one generate call
per prompt), each checked against the prompt's reference answer, and the prompt's labels are written in one
transaction: a stopped or crashed run resumes at the next prompt and never labels a prompt twice. Progress counts
completions; the log says, per completion, the share of right continuations after each step.
"""

from __future__ import annotations

from typing import Any

from app.jobs.context import JobContext, JobError, JobStopped, job_row
from app.judge import monte_carlo
from app.platform.db import session_scope
from training.generation import GenerationCancelled, GenerationError, GenerationParams, HFGenerator
from training.step_estimates import Checker, ContinuingGenerator, Solution, StepEstimate, estimate_steps


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
    try:
        return label_with(ctx, policy)
    finally:
        policy.close()


def label_with(ctx: JobContext, policy: ContinuingGenerator) -> dict[str, Any]:
    """The job's work with a policy already made: any generator that continues a written prefix."""
    run_id = int(ctx.payload["judge_run_id"])
    with session_scope(ctx.session_factory) as db:
        mc_run = job_row(db, monte_carlo.find_run, run_id, "Monte-Carlo run")
        params, project_id = dict(mc_run.params), mc_run.project_id
        checker = Checker(params["checker"])
        todo, done_before, skipped = monte_carlo.prompts_to_label(db, mc_run, ctx.payload.get("prompt_ids"),
                                                                  readable=checker.readable)
        monte_carlo.set_run_state(db, run_id, "running")
    n, estimate = int(params["n"]), str(params["estimate"])
    sampling = GenerationParams(temperature=float(params["temperature"]), max_new_tokens=int(params["max_new_tokens"]),
                                seed=int(params["seed"]))
    total = done_before + sum(len(p.completions) for p in todo)
    done, labels_written, sampled = done_before, 0, 0
    ctx.progress(done, total, f"labelling {total - done} completions, {n} continuations per step")
    ctx.log(f"Monte-Carlo run {run_id}: N={n}, {estimate} estimate, checker {checker.name}, policy {params['model']}"
            + (f"; {skipped} prompts passed over: the checker cannot read their reference answer" if skipped else ""))
    try:
        for item in todo:
            ctx.check()
            estimates, drawn = _estimate(ctx, policy, project_id, item, n, sampling, checker)
            with session_scope(ctx.session_factory) as db:
                row = monte_carlo.find_run(db, run_id)
                if row is None:
                    raise JobError(f"Monte-Carlo run {run_id} no longer exists")
                labels = {cid: [(e.label(estimate), e.soft) for e in per_step] for cid, per_step in estimates.items()}
                labels_written += monte_carlo.write_labels(db, row, item.prompt_id, labels,
                                                           round_=monte_carlo.current_round(db, project_id),
                                                           job_id=ctx.job_id)
            sampled += drawn
            done += len(item.completions)
            ctx.progress(done, total, f"{done}/{total} completions labelled, {sampled} continuations sampled")
    except (GenerationCancelled, JobStopped):
        _set_state(ctx, run_id, "cancelled" if ctx.stop_reason == "cancelled" else "queued")
        raise JobStopped(ctx.stop_reason or "stopped") from None
    except Exception:
        _set_state(ctx, run_id, "failed")
        raise
    _set_state(ctx, run_id, "succeeded")
    message = f"{labels_written} step labels on {done - done_before} completions ({sampled} continuations)"
    if skipped:
        message += f"; {skipped} prompts passed over: the checker cannot read their reference answer"
    return {"judge_run_id": run_id, "completions_labelled": done - done_before, "step_labels_written": labels_written,
            "continuations_sampled": sampled, "prompts_without_readable_reference": skipped, "message": message}


def _estimate(ctx: JobContext, policy: ContinuingGenerator, project_id: int, item: monte_carlo.PromptToLabel, n: int,
              sampling: GenerationParams, checker: Checker) -> tuple[dict[int, list[StepEstimate]], int]:
    """One prompt's completions estimated step by step, and how many continuations that sampled."""
    with session_scope(ctx.session_factory) as db:
        stored = monte_carlo.stored_steps(db, project_id, [cid for cid, _ in item.completions])
    solutions = [Solution(item.prompt, text, stored[cid], item.reference) for cid, text in item.completions]
    try:
        per_solution = estimate_steps(policy, solutions, n, sampling, checker, should_stop=ctx.should_stop)
    except GenerationError as exc:  # a prompt longer than the model's context, say: the user's to fix
        raise JobError(f"prompt {item.prompt_id}: {exc}") from None
    out = {}
    for (cid, _), estimates in zip(item.completions, per_solution, strict=True):
        out[cid] = estimates
        ctx.log(f"completion {cid}: right continuations after each step "
                + " ".join(f"{e.correct}/{e.n}" for e in estimates))
    return out, sum(e.n for estimates in per_solution for e in estimates[:-1])


def _set_state(ctx: JobContext, run_id: int, state: str) -> None:
    with session_scope(ctx.session_factory) as db:
        monte_carlo.set_run_state(db, run_id, state)
