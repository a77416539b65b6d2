"""Training runs from the app: launch on an export, follow live curves, compare, trace lineage, close the loop."""

from __future__ import annotations

import json
from typing import Annotated

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import RedirectResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from app.accounts import permissions
from app.projects import projects
from app.quality import charts
from app.runs import estimates, iteration, step_figures, training_runs
from app.schemas import (
    DefaultClusterIn,
    DefaultClusterOut,
    IterateIn,
    JobAccepted,
    SampleIntoProjectIn,
    TrainingRunAccepted,
    TrainingRunIn,
    TrainingRunOut,
)
from app.web.deps import MAX_ID, CurrentUser, Id, PageUser, SessionDep
from app.web.form_pages import ProjectPage
from app.web.forms import DefaultClusterForm, IterateForm, SampleIntoProjectForm, TrainingForm
from app.web.rendering import render

router = APIRouter()


def _out(db, run, last: int = 50, steps: bool = True) -> TrainingRunOut:
    """A run as the API shows it; `steps` adds a process-reward run's figures per step (left out of project lists)."""
    metrics = training_runs.read_metrics(run)
    return TrainingRunOut(
        id=run.id, kind=run.kind, state=run.state, export_id=run.export_id, parent_run_id=run.parent_run_id,
        base_model=run.base_model, job_id=run.job_id, created_at=run.created_at,
        metrics=metrics[-last:], eval=training_runs.read_eval(run),
        human_check=training_runs.read_human_check(run),
        step_stats=step_figures.summary(metrics) if steps else None,
        model_dir=run.model_dir if run.state == "succeeded" else None, config=run.config or {},
        lineage=training_runs.lineage(db, run))


def _request_run(request: Request, db, project, user, body: TrainingRunIn):
    """The API's and the page's training request: one mapping of the request model onto the service."""
    settings = request.app.state.settings
    return training_runs.request_run(db, project, user, data_dir=settings.data_dir,
                                     kind=body.kind, export_id=body.export_id, base_model=body.base_model,
                                     reward_run_id=body.reward_run_id, config=body.config,
                                     default_policy=settings.default_policy_model, where=body.where,
                                     resources=body.resources, clusters_file=settings.clusters_file)


@router.post("/api/projects/{project_id}/training-runs", status_code=202, tags=["training"],
             summary="Train on an export (a background job): SFT, a reward model, DPO, RFT, GRPO or PPO")
def create_run(request: Request, project_id: Id, body: TrainingRunIn, db: SessionDep,
               user: CurrentUser) -> TrainingRunAccepted:
    project = projects.get_visible(db, project_id, user)
    run, job = _request_run(request, db, project, user, body)
    return TrainingRunAccepted(run_id=run.id, job_id=job.id)


@router.get("/api/projects/{project_id}/training-runs", tags=["training"], summary="The project's training runs")
def list_runs(project_id: Id, db: SessionDep, user: CurrentUser) -> list[TrainingRunOut]:
    project = projects.get_visible(db, project_id, user)
    return [_out(db, r, last=1, steps=False) for r in training_runs.list_for_project(db, project)]


@router.get("/api/training-runs/{run_id}", tags=["training"], summary="A run: state, recent metrics, eval, lineage")
def get_run(run_id: Id, db: SessionDep, user: CurrentUser,
            last: Annotated[int, Query(ge=1, le=100_000)] = 50) -> TrainingRunOut:
    return _out(db, training_runs.get_visible(db, run_id, user), last=last)


@router.get("/api/training-runs/{run_id}/metrics", tags=["training"], summary="Every metrics row of a run")
def get_metrics(run_id: Id, db: SessionDep, user: CurrentUser) -> list[dict]:
    return training_runs.read_metrics(training_runs.get_visible(db, run_id, user))


@router.post("/api/training-runs/{run_id}/cancel", tags=["training"], summary="Stop a queued or running run")
def cancel_run(run_id: Id, db: SessionDep, user: CurrentUser) -> TrainingRunOut:
    run = training_runs.get_visible(db, run_id, user)
    return _out(db, training_runs.cancel(db, run, user))


def _sample_into_project(db, run, user, body: SampleIntoProjectIn):
    return training_runs.sample_into_project(db, run, user, k=body.k, seed=body.seed, new_round=body.new_round,
                                             max_new_tokens=body.max_new_tokens, temperature=body.temperature,
                                             max_prompts=body.max_prompts)


@router.post("/api/training-runs/{run_id}/human-check", status_code=202, tags=["training"],
             summary="Re-score a reward model against the project's human pairs now (drift check)")
def recheck_against_humans(run_id: Id, db: SessionDep, user: CurrentUser) -> JobAccepted:
    run = training_runs.get_visible(db, run_id, user)
    return JobAccepted(job_id=training_runs.request_human_check(db, run, user).id)


@router.post("/api/training-runs/{run_id}/iterate", status_code=202, tags=["training"],
             summary="Run one automated RLHF round from a finished policy run (each step a job)")
def iterate(request: Request, run_id: Id, body: IterateIn, db: SessionDep, user: CurrentUser) -> JobAccepted:
    run = training_runs.get_visible(db, run_id, user)
    job = iteration.start(db, run, user, replay_share=body.replay_share, k=body.k, max_prompts=body.max_prompts,
                          where=body.where, clusters_file=request.app.state.settings.clusters_file)
    return JobAccepted(job_id=job.id)


@router.post("/api/training-runs/{run_id}/sample-into-project", status_code=202, tags=["training"],
             summary="Sample the policy's answers into the project for the next round of ranking")
def sample_into_project(run_id: Id, body: SampleIntoProjectIn, db: SessionDep, user: CurrentUser) -> JobAccepted:
    run = training_runs.get_visible(db, run_id, user)
    return JobAccepted(job_id=_sample_into_project(db, run, user, body).id)


# --- pages --------------------------------------------------------------------------------------

def _list_context(db, project, user, default_policy=None, clusters_file=None) -> dict:
    runs = training_runs.list_for_project(db, project)
    rows = [(r, training_runs.read_eval(r), (training_runs.read_metrics(r, last=1) or [{}])[-1]) for r in runs]
    exports = training_runs.ready_exports(db, project)
    return {"project": project, "rows": rows, "exports": exports, "form": {},
            "small_data": training_runs.small_data_advice(exports),
            "preferred": training_runs.preferred_exports(exports),
            "export_kind": training_runs.EXPORT_KIND,
            "reward_runs": [r for r in runs if r.kind in ("reward", "prm") and r.state == "succeeded"],
            "can_train": permissions.may(db, user, project, "training.start"),
            "kinds": training_runs.KINDS, "fields": {k: training_runs.config_fields(k) for k in training_runs.KINDS},
            "defaults": {k: training_runs.default_model(k, default_policy) for k in training_runs.KINDS},
            "policy_kinds": training_runs.POLICY_KINDS, "clusters": training_runs.cluster_names(db, clusters_file),
            "default_cluster": projects.default_cluster(project) or "local",
            "can_choose_cluster": permissions.may(db, user, project, "cluster.choose")}


class EstimateQuery(BaseModel):
    """What the training form holds so far, sent for its time estimate (each field as the form names it)."""

    model_config = ConfigDict(extra="forbid")

    kind: str = Field("reward", max_length=20)
    export_id: str = Field("", max_length=20)
    base_model: str = Field("", max_length=1000)
    config: str = Field("", max_length=20_000)
    reward_run_id: str = Field("", max_length=20)
    """Not priced; carried so that taking up the first try keeps the reward model chosen."""


def _estimate(request: Request, db, project, chosen: EstimateQuery) -> dict:
    """The form's values as the page shows them (the export it would choose filled in) and their time estimate."""
    settings = request.app.state.settings
    shown = chosen.model_dump()
    if not shown["export_id"]:
        preferred = training_runs.preferred_exports(training_runs.ready_exports(db, project))
        first = preferred.get(training_runs.EXPORT_KIND.get(chosen.kind, ""))
        shown["export_id"] = str(first) if first else ""
    found = estimates.for_form(db, project, data_dir=settings.data_dir, default_policy=settings.default_policy_model,
                               kind=shown["kind"], export_id=shown["export_id"], base_model=shown["base_model"],
                               config_text=shown["config"])
    return {"estimate": found, "estimate_form": shown}


def _page(request: Request, chosen: EstimateQuery | None = None) -> ProjectPage:
    """The training page of this app: the form names the default policy model the settings give, and says how long
    the run it holds would take."""
    settings = request.app.state.settings

    def context(db, project, user) -> dict:
        found = _estimate(request, db, project, chosen or EstimateQuery())
        form = {k: v for k, v in (chosen.model_dump() if chosen else {}).items() if v}
        return _list_context(db, project, user, settings.default_policy_model, settings.clusters_file) | found | {
            "form": form}

    return ProjectPage("training.html", context)


@router.put("/api/projects/{project_id}/default-cluster", tags=["training"],
            summary="Set the cluster the project's runs go to when they name none (lead)")
def set_default_cluster(request: Request, project_id: Id, body: DefaultClusterIn, db: SessionDep,
                        user: CurrentUser) -> DefaultClusterOut:
    project = projects.get_visible(db, project_id, user)
    training_runs.set_default_cluster(db, project, user, body.default_cluster, request.app.state.settings.clusters_file)
    return DefaultClusterOut(default_cluster=projects.default_cluster(project) or "local")


@router.post("/projects/{project_id}/training/default-cluster", include_in_schema=False)
def default_cluster_from_page(request: Request, project_id: Id, db: SessionDep, user: PageUser,
                              form: Annotated[DefaultClusterForm, Form()]) -> Response:
    clusters_file = request.app.state.settings.clusters_file
    return _page(request).submit(request, db, user, project_id, form,
                                 lambda db, project, user, body: training_runs.set_default_cluster(
                                     db, project, user, body.default_cluster, clusters_file),
                                 redirect="/projects/{project_id}/training")


@router.get("/projects/{project_id}/training", include_in_schema=False)
def training_page(request: Request, project_id: Id, db: SessionDep, user: PageUser,
                  chosen: Annotated[EstimateQuery, Query()]) -> Response:
    # A form sent with the no-script "Update the estimate" button comes back filled in, with its estimate.
    return _page(request, chosen).show(request, db, user, project_id)


@router.get("/projects/{project_id}/training/estimate", include_in_schema=False)
def training_estimate(request: Request, project_id: Id, db: SessionDep, user: PageUser,
                      chosen: Annotated[EstimateQuery, Query()]) -> Response:
    """The form's estimate panel alone, re-rendered as the form changes."""
    project = projects.get_visible(db, project_id, user)
    return render(request, "_training_estimate.html", {"project": project, **_estimate(request, db, project, chosen)})


@router.post("/projects/{project_id}/training", include_in_schema=False)
def launch_from_page(request: Request, project_id: Id, db: SessionDep, user: PageUser,
                     form: Annotated[TrainingForm, Form()]) -> Response:
    # Not mounted like the other project pages: the run's data directory comes from the request.
    chosen = EstimateQuery(kind=form.kind[:20], export_id=form.export_id[:20], base_model=form.base_model,
                           config=form.config, reward_run_id=form.reward_run_id[:20])
    if form.action == "estimate":  # the no-script "Update the estimate" button: the form again, priced, no run
        return _page(request, chosen).show(request, db, user, project_id)
    return _page(request, chosen).submit(request, db, user, project_id, form,
                                         lambda db, project, user, body: _request_run(request, db, project, user,
                                                                                      body),
                                         redirect=lambda started: f"/training-runs/{started[0].id}")


def _curves(metrics: list[dict]) -> dict:
    """The run's curves; a process-reward run's outcome curve moves into the panel of its figures per step, beside
    them."""
    curves = charts.charts_for(metrics)
    found = step_figures.summary(metrics)
    if found is None:
        return {"charts": curves, "step_stats": None, "step_charts": []}
    outcome = [c for c in curves if c.key == "reward_mean"]
    return {"charts": [c for c in curves if c.key != "reward_mean"], "step_stats": found,
            "step_charts": outcome + step_figures.panel_charts(metrics, found)}


@router.get("/training-runs/{run_id}", include_in_schema=False)
def run_page(request: Request, run_id: Id, db: SessionDep, user: PageUser,
             samples_page: Annotated[int, Query(ge=1, le=100_000)] = 1) -> Response:
    run = training_runs.get_visible(db, run_id, user)
    project = training_runs.project_of(db, run)
    metrics = training_runs.read_metrics(run)
    evaluation = training_runs.read_eval(run)
    samples = training_runs.read_samples(run) if run.kind in training_runs.POLICY_KINDS else []
    last = metrics[-1] if metrics else {}
    # One progress figure: the job's own progress line (the log's); a run from before it has only its last step.
    shown = training_runs.progress(run) or ({"step": last["step"], "total": None, "eta_s": None}
                                            if isinstance(last.get("step"), int) else None)
    ctx = {"run": run, "project": project, "progress": shown, **_curves(metrics), "last": last,
           "eval": evaluation, "eval_charts": charts.eval_charts(evaluation, samples),
           "eval_rows": charts.eval_table(evaluation), "lineage": training_runs.lineage(db, run),
           "job": training_runs.job_of(db, run), "human_check": training_runs.read_human_check(run),
           "log": training_runs.log_tail(request.app.state.settings.data_dir, run.job_id),
           "small_data": training_runs.run_small_data(db, run),
           "samples": training_runs.sample_page(samples, samples_page),
           "verdict": training_runs.verdict(run, evaluation),
           "config_json": json.dumps((run.config or {}).get("user", {}), indent=2),
           "can_train": permissions.may(db, user, project, "training.start"),
           "trackers": training_runs.read_trackers(run), "policy_kinds": training_runs.POLICY_KINDS,
           "iterating_kinds": training_runs.ITERATING_KINDS,
           "clusters": training_runs.cluster_names(db, request.app.state.settings.clusters_file),
           "where_now": training_runs.where_of(run),
           "sampling": _sampling_size(request, db, run, project)}
    return render(request, "training_run.html", ctx, block="live")


def _sampling_size(request: Request, db, run, project) -> estimates.SamplingSize | None:
    """How long *Sample into project* takes on this machine, for a finished policy run (every prompt is short of the
    new policy's own answers)."""
    if run.kind not in training_runs.POLICY_KINDS or run.state != "succeeded":
        return None
    prompts = training_runs.prompt_count(db, project)
    return estimates.for_sampling(request.app.state.settings.data_dir, run, prompts, project.completions_per_prompt,
                                  models=training_runs.base_models(db, run))


@router.post("/training-runs/{run_id}/cancel", include_in_schema=False)
def cancel_from_page(run_id: Id, db: SessionDep, user: PageUser) -> Response:
    run = training_runs.get_visible(db, run_id, user)
    training_runs.stop(db, run, user)
    return RedirectResponse(f"/training-runs/{run.id}", status_code=303)


@router.post("/training-runs/{run_id}/sample", include_in_schema=False)
def sample_from_page(run_id: Id, db: SessionDep, user: PageUser,
                     form: Annotated[SampleIntoProjectForm, Form()]) -> Response:
    run = training_runs.get_visible(db, run_id, user)
    _sample_into_project(db, run, user, form.to_api())
    return RedirectResponse(f"/projects/{run.project_id}/jobs", status_code=303)


@router.post("/training-runs/{run_id}/iterate", include_in_schema=False)
def iterate_from_page(request: Request, run_id: Id, db: SessionDep, user: PageUser,
                      form: Annotated[IterateForm, Form()]) -> Response:
    run = training_runs.get_visible(db, run_id, user)
    body = form.to_api()
    iteration.start(db, run, user, replay_share=body.replay_share, k=body.k, max_prompts=body.max_prompts,
                    where=body.where, clusters_file=request.app.state.settings.clusters_file)
    return RedirectResponse(f"/projects/{run.project_id}/jobs", status_code=303)


@router.get("/projects/{project_id}/training/compare", include_in_schema=False)
def compare_page(request: Request, project_id: Id, db: SessionDep, user: PageUser,
                 a: Annotated[int, Query(ge=1, le=MAX_ID)], b: Annotated[int, Query(ge=1, le=MAX_ID)]) -> Response:
    project = projects.get_visible(db, project_id, user)
    runs = [training_runs.get_visible(db, rid, user) for rid in (a, b)]
    return render(request, "training_compare.html", {"project": project, **training_runs.compare(db, project, runs)})
