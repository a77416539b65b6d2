"""Training runs from the app: launch on an export, follow live curves, compare, trace lineage, close the loop."""

from __future__ import annotations

import json
from typing import Annotated

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import RedirectResponse, Response

from app import permissions
from app.deps import CurrentUser, PageUser, SessionDep
from app.errors import DomainError, Invalid
from app.models import Export, Job, Project, TrainingRun
from app.schemas import IterateIn, JobAccepted, SampleIntoProjectIn, TrainingRunAccepted, TrainingRunIn, TrainingRunOut
from app.services import charts, jobs, projects, sampling, training_runs
from app.web import render

router = APIRouter()


def _out(db, run: TrainingRun, last: int = 50) -> TrainingRunOut:  # type: ignore[no-untyped-def]
    return TrainingRunOut(
        id=run.id, kind=run.kind, state=run.state, export_id=run.export_id, parent_run_id=run.parent_run_id,
        base_model=run.base_model, job_id=run.job_id, created_at=run.created_at,
        metrics=training_runs.read_metrics(run, last=last), eval=training_runs.read_eval(run),
        human_check=training_runs.read_human_check(run),
        model_dir=run.model_dir if run.state == "succeeded" else None, config=run.config or {},
        lineage=training_runs.lineage(db, run))


@router.post("/api/projects/{project_id}/training-runs", status_code=202, tags=["training"],
             summary="Train on an export (a background job): SFT, a reward model, DPO, RFT, GRPO or PPO")
def create_run(request: Request, project_id: int, body: TrainingRunIn, db: SessionDep,
               user: CurrentUser) -> TrainingRunAccepted:
    project = projects.get_visible(db, project_id, user)
    run, job = training_runs.request_run(db, project, user, data_dir=request.app.state.settings.data_dir,
                                         kind=body.kind, export_id=body.export_id, base_model=body.base_model,
                                         reward_run_id=body.reward_run_id, config=body.config)
    return TrainingRunAccepted(run_id=run.id, job_id=job.id)


@router.get("/api/projects/{project_id}/training-runs", tags=["training"], summary="The project's training runs")
def list_runs(project_id: int, db: SessionDep, user: CurrentUser) -> list[TrainingRunOut]:
    project = projects.get_visible(db, project_id, user)
    return [_out(db, r, last=1) for r in training_runs.list_for_project(db, project)]


@router.get("/api/training-runs/{run_id}", tags=["training"], summary="A run: state, recent metrics, eval, lineage")
def get_run(run_id: int, db: SessionDep, user: CurrentUser,
            last: Annotated[int, Query(ge=1, le=100_000)] = 50) -> TrainingRunOut:
    return _out(db, training_runs.get_visible(db, run_id, user), last=last)


@router.get("/api/training-runs/{run_id}/metrics", tags=["training"], summary="Every metrics row of a run")
def get_metrics(run_id: int, db: SessionDep, user: CurrentUser) -> list[dict]:
    return training_runs.read_metrics(training_runs.get_visible(db, run_id, user))


@router.post("/api/training-runs/{run_id}/cancel", tags=["training"], summary="Stop a queued or running run")
def cancel_run(run_id: int, db: SessionDep, user: CurrentUser) -> TrainingRunOut:
    run = training_runs.get_visible(db, run_id, user)
    return _out(db, training_runs.cancel(db, run, user))


def _sample_into_project(db, run: TrainingRun, user, body: SampleIntoProjectIn):  # type: ignore[no-untyped-def]
    permissions.require(db, user, db.get(Project, run.project_id), "sampling.start",
                        doing="sample into the project")
    if run.kind not in training_runs.POLICY_KINDS:
        raise Invalid(f"only policy runs ({', '.join(training_runs.POLICY_KINDS)}) can sample", field="run_id")
    if run.state != "succeeded" or not run.model_dir:
        raise Invalid("the run has not finished", field="run_id")
    project = db.get(Project, run.project_id)
    resolved = (run.config or {}).get("resolved", {})
    # Sample the way the policy was trained to answer: its own length and temperature unless told otherwise.
    generator = {"backend": "hf", "model": run.model_dir,
                 "max_new_tokens": body.max_new_tokens or int(resolved.get("max_new_tokens") or 256),
                 "temperature": body.temperature if body.temperature is not None
                 else float(resolved.get("temperature", 1.0))}
    job = sampling.request_sampling(db, project, user, generator=generator,
                                    k=body.k, prompt_ids=None, seed=body.seed, resample_duplicates=0,
                                    source=f"policy:{run.id}")
    if body.new_round:
        project.current_round += 1  # every prompt is ranked again, on the new policy's answers
    return job


@router.post("/api/training-runs/{run_id}/human-check", status_code=202, tags=["training"],
             summary="Re-score a reward model against the project's human pairs now (drift check)")
def recheck_against_humans(run_id: int, db: SessionDep, user: CurrentUser) -> JobAccepted:
    run = training_runs.get_visible(db, run_id, user)
    project = db.get(Project, run.project_id)
    permissions.require(db, user, project, "training.start", doing="check reward models")
    if run.kind != "reward" or run.state != "succeeded":
        raise Invalid("only a finished reward-model run can be checked", field="run_id")
    job = jobs.enqueue(db, "rm_check", {"training_run_id": run.id}, project=project, actor=user)
    return JobAccepted(job_id=job.id)


@router.post("/api/training-runs/{run_id}/iterate", status_code=202, tags=["training"],
             summary="Run one automated RLHF round from a finished policy run (each step a job)")
def iterate(request: Request, run_id: int, body: IterateIn, db: SessionDep, user: CurrentUser) -> JobAccepted:
    from app.services import iteration

    run = training_runs.get_visible(db, run_id, user)
    job = iteration.start(db, run, user, replay_share=body.replay_share, k=body.k)
    return JobAccepted(job_id=job.id)


@router.post("/api/training-runs/{run_id}/sample-into-project", status_code=202, tags=["training"],
             summary="Sample the policy's answers into the project for the next round of ranking")
def sample_into_project(run_id: int, body: SampleIntoProjectIn, db: SessionDep, user: CurrentUser) -> JobAccepted:
    run = training_runs.get_visible(db, run_id, user)
    return JobAccepted(job_id=_sample_into_project(db, run, user, body).id)


# --- pages --------------------------------------------------------------------------------------

def _exports(db, project):  # type: ignore[no-untyped-def]
    from sqlalchemy import select

    return list(db.scalars(select(Export).where(Export.project_id == project.id, Export.deleted_at.is_(None),
                                                Export.sha256.is_not(None)).order_by(Export.id.desc())))


def _list_context(db, project, user) -> dict:  # type: ignore[no-untyped-def]
    runs = training_runs.list_for_project(db, project)
    rows = [(r, training_runs.read_eval(r), (training_runs.read_metrics(r, last=1) or [{}])[-1]) for r in runs]
    return {"project": project, "rows": rows, "exports": _exports(db, project), "form": {},
            "reward_runs": [r for r in runs if r.kind == "reward" and r.state == "succeeded"],
            "can_train": permissions.may(db, user, project, "training.start"),
            "kinds": training_runs.KINDS, "fields": {k: training_runs.config_fields(k) for k in training_runs.KINDS}}


@router.get("/projects/{project_id}/training", include_in_schema=False)
def training_page(request: Request, project_id: int, db: SessionDep, user: PageUser) -> Response:
    project = projects.get_visible(db, project_id, user)
    return render(request, "training.html", _list_context(db, project, user))


@router.post("/projects/{project_id}/training", include_in_schema=False)
def launch_from_page(request: Request, project_id: int, db: SessionDep, user: PageUser,
                     kind: Annotated[str, Form()] = "reward", export_id: Annotated[str, Form()] = "",
                     base_model: Annotated[str, Form(max_length=1000)] = "",
                     reward_run_id: Annotated[str, Form()] = "",
                     config: Annotated[str, Form(max_length=20_000)] = "") -> Response:
    import tomllib

    project = projects.get_visible(db, project_id, user)
    form = {"kind": kind, "export_id": export_id, "base_model": base_model, "reward_run_id": reward_run_id,
            "config": config}
    try:
        try:
            parsed = tomllib.loads(config) if config.strip() else {}
        except tomllib.TOMLDecodeError as exc:
            raise Invalid(f"not valid TOML: {exc}", field="config") from None
        if not export_id.isdigit():
            raise Invalid("choose an export", field="export_id")
        with db.begin_nested():
            run, _ = training_runs.request_run(
                db, project, user, data_dir=request.app.state.settings.data_dir, kind=kind, export_id=int(export_id),
                base_model=base_model or None, reward_run_id=int(reward_run_id) if reward_run_id.isdigit() else None,
                config=parsed)
    except DomainError as exc:
        return render(request, "training.html", _list_context(db, project, user) | {"error": exc, "form": form},
                      status_code=exc.status_code)
    return RedirectResponse(f"/training-runs/{run.id}", status_code=303)


@router.get("/training-runs/{run_id}", include_in_schema=False)
def run_page(request: Request, run_id: int, db: SessionDep, user: PageUser) -> Response:
    run = training_runs.get_visible(db, run_id, user)
    project = db.get(Project, run.project_id)
    metrics = training_runs.read_metrics(run)
    job = db.get(Job, run.job_id) if run.job_id else None
    samples = _latest_samples(run)
    eta = None
    if job is not None and job.state == "running" and job.started_at is not None:
        done, total = int((job.result or {}).get("done", 0)), int((job.result or {}).get("total", 0))
        if 0 < done < total:
            from app.models import utcnow

            elapsed = (utcnow() - job.started_at).total_seconds()
            eta = round(elapsed / done * (total - done))
    ctx = {"eta_s": eta, "run": run, "project": project, "charts": charts.charts_for(metrics),
           "last": metrics[-1] if metrics else {},
           "eval": training_runs.read_eval(run), "lineage": training_runs.lineage(db, run), "job": job,
           "human_check": training_runs.read_human_check(run),
           "log": jobs.log_tail(request.app.state.settings.data_dir, run.job_id) if run.job_id else "",
           "samples": samples, "config_json": json.dumps((run.config or {}).get("user", {}), indent=2),
           "can_train": permissions.may(db, user, project, "training.start"),
           "trackers": training_runs.read_trackers(run), "policy_kinds": training_runs.POLICY_KINDS}
    return render(request, "training_run.html", ctx, block="live")


def _latest_samples(run: TrainingRun, limit: int = 8) -> list[dict]:
    from pathlib import Path

    if not run.model_dir:
        return []
    for name in ("samples.jsonl", "eval_samples.jsonl"):
        path = Path(run.model_dir).parent / name
        if path.exists():
            rows = []
            for line in path.read_text(encoding="utf-8", errors="replace").splitlines()[-limit:]:
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
            return rows
    return []


@router.post("/training-runs/{run_id}/cancel", include_in_schema=False)
def cancel_from_page(run_id: int, db: SessionDep, user: PageUser) -> Response:
    run = training_runs.get_visible(db, run_id, user)
    permissions.require(db, user, db.get(Project, run.project_id), "training.start",
                        doing="cancel training runs")
    if run.state not in ("succeeded", "failed", "cancelled"):
        training_runs.cancel(db, run, user)
    return RedirectResponse(f"/training-runs/{run.id}", status_code=303)


@router.post("/training-runs/{run_id}/sample", include_in_schema=False)
def sample_from_page(run_id: int, db: SessionDep, user: PageUser) -> Response:
    run = training_runs.get_visible(db, run_id, user)
    _sample_into_project(db, run, user, SampleIntoProjectIn())
    return RedirectResponse(f"/projects/{run.project_id}/jobs", status_code=303)


@router.post("/training-runs/{run_id}/iterate", include_in_schema=False)
def iterate_from_page(run_id: int, db: SessionDep, user: PageUser,
                      replay_share: Annotated[float, Form(ge=0, le=1)] = 0.1) -> Response:
    from app.services import iteration

    run = training_runs.get_visible(db, run_id, user)
    iteration.start(db, run, user, replay_share=replay_share, k=None)
    return RedirectResponse(f"/projects/{run.project_id}/jobs", status_code=303)


@router.get("/projects/{project_id}/training/compare", include_in_schema=False)
def compare_page(request: Request, project_id: int, db: SessionDep, user: PageUser,
                 a: Annotated[int, Query(ge=1)], b: Annotated[int, Query(ge=1)]) -> Response:
    from app.services import versions

    project = projects.get_visible(db, project_id, user)
    runs = [training_runs.get_visible(db, rid, user) for rid in (a, b)]
    if any(r.project_id != project.id for r in runs):
        raise Invalid("both runs must belong to this project", field="b")

    def lines(run: TrainingRun) -> list[str]:
        return json.dumps((run.config or {}).get("resolved", {}), indent=1, sort_keys=True).splitlines()

    rows = []
    for run in runs:
        last = (training_runs.read_metrics(run, last=1) or [{}])[-1]
        rows.append({"run": run, "eval": training_runs.read_eval(run) or {}, "last": last,
                     "lineage": training_runs.lineage(db, run)})
    keys = sorted({k for r in rows for k, v in r["eval"].items() if isinstance(v, int | float)})
    return render(request, "training_compare.html", {
        "project": project, "rows": rows, "eval_keys": keys,
        "diff": versions.diff_lines(lines(runs[0]), lines(runs[1]))})
