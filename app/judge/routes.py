"""The AI judge: start judge runs, read human–AI agreement, and the lead's decision on AI labels."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response

from app.accounts import permissions
from app.annotation import steps
from app.jobs import queue as jobs
from app.judge import endpoints, judging, monte_carlo, revisions
from app.judge import steps as judge_steps
from app.projects import constitutions, projects
from app.quality import judge_agreement as human_ai
from app.quality import rollups
from app.quality.charts import reliability_diagram
from app.schemas import (
    AILabelsIn,
    AIStepLabelsIn,
    JobAccepted,
    JudgeAgreementOut,
    JudgeRunAccepted,
    JudgeRunIn,
    JudgeStepAgreementOut,
    MCStepLabelsAccepted,
    MCStepLabelsIn,
    RevisionDecisionIn,
    RevisionJobIn,
    RevisionOut,
)
from app.web.deps import MAX_ID, CurrentUser, Id, PageUser, SessionDep
from app.web.form_pages import ProjectPage, default_model
from app.web.forms import AILabelsForm, AIStepLabelsForm, DecisionForm, JudgeForm, MCStepLabelsForm, RevisionsForm
from app.web.rendering import render

router = APIRouter()


def _request_judge_run(db, project, user, body: JudgeRunIn):
    """The API's and the page's judge run: one mapping of the request model onto the service."""
    return judging.request_judge_run(
        db, project, user, constitution_version=body.constitution_version, generator=body.generator.model_dump(),
        mode=body.mode, principles=body.principles, prompt_ids=body.prompt_ids, seed=body.seed,
        low_confidence=body.low_confidence, route_low_confidence=body.route_low_confidence,
        label_steps=body.label_steps, scope=body.scope)


def _request_mc_labels(request: Request, db, project, user, body: MCStepLabelsIn):
    """The API's and the page's Monte-Carlo run: a blank model is the app's default policy."""
    return monte_carlo.request_mc_labels(
        db, project, user, model=body.model, n=body.n, estimate=body.estimate, max_completions=body.max_completions,
        max_new_tokens=body.max_new_tokens, temperature=body.temperature, seed=body.seed, prompt_ids=body.prompt_ids,
        checker=body.checker, default_model=request.app.state.settings.default_policy_model)


def _request_revisions(db, project, user, body: RevisionJobIn):
    return revisions.request_revisions(db, project, user, generator=body.generator.model_dump(),
                                       constitution_version=body.constitution_version, prompt_ids=body.prompt_ids,
                                       limit=body.limit, seed=body.seed)


@router.post("/api/projects/{project_id}/judge-runs", status_code=202, tags=["judge"],
             summary="Run the AI judge over the project's prompts (a background job)")
def create_judge_run(project_id: Id, body: JudgeRunIn, db: SessionDep, user: CurrentUser) -> JudgeRunAccepted:
    project = projects.get_visible(db, project_id, user)
    run, job = _request_judge_run(db, project, user, body)
    return JudgeRunAccepted(judge_run_id=run.id, job_id=job.id)


@router.post("/api/projects/{project_id}/mc-step-labels", status_code=202, tags=["judge"],
             summary="Label steps by Monte-Carlo estimation (Math-Shepherd): a background job",
             description="For every step of each completion labelled, N continuations are sampled with the policy "
                         "from the step's prefix and checked against the prompt's reference answer; the step's label "
                         "is the hard estimate (any right) or the soft one (at least half right), and the share "
                         "right is kept as its soft label. The labels are a labeller of their own (source `mc`): "
                         "on the step-agreement figures beside humans and the judge, and in steps exports whose "
                         "`source` filter names `mc`. The answer says what the run will cost.",
             responses={422: {"description": "A bad field, named in `detail` (`model`, `n`, `prompt_ids`, …); a "
                                             "project without step labels, or without a reference answer to check "
                                             "against"}})
def create_mc_step_labels(request: Request, project_id: Id, body: MCStepLabelsIn, db: SessionDep,
                          user: CurrentUser) -> MCStepLabelsAccepted:
    project = projects.get_visible(db, project_id, user)
    run, job = _request_mc_labels(request, db, project, user, body)
    return MCStepLabelsAccepted(run_id=run.id, job_id=job.id, planned_completions=run.params["planned_completions"],
                                planned_continuations=run.params["planned_continuations"])


@router.get("/api/projects/{project_id}/judge-agreement", tags=["judge"], response_model=JudgeAgreementOut,
            summary="Human–AI agreement, calibration and judge position bias",
            description="Over all the judge's rankings, a large project's figures come from its rollup (`computed`, "
                        "`as_of`, `age_seconds` say how fresh); one constitution version's or judge run's are "
                        "computed on the request.",
            responses={503: {"description": "A large project's first rollup is still being computed: retry"}})
def judge_agreement(project_id: Id, db: SessionDep, user: CurrentUser,
                    constitution_version: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None,
                    judge_run_id: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None
                    ) -> JudgeAgreementOut | Response:
    project = projects.get_visible(db, project_id, user)
    if constitution_version is not None or judge_run_id is not None:
        report = human_ai.judge_agreement(db, project, constitution_version=constitution_version,
                                         judge_run_id=judge_run_id)
        return JudgeAgreementOut(**report.as_dict(), computed="live", as_of=datetime.now(UTC), age_seconds=0.0)
    found, fresh = rollups.judge_report(db, project, user, exact_before_first=False)
    if found is None:  # returned, not raised: the request commits the rollup job it queued
        return JSONResponse({"detail": [{"message": fresh.describe()}]}, status_code=503,
                            headers={"Retry-After": "10"})
    return _judge_out(found, fresh)


def _judge_out(report: human_ai.JudgeAgreement, fresh: rollups.Freshness) -> JudgeAgreementOut:
    return JudgeAgreementOut(**report.as_dict(), computed=fresh.method, as_of=fresh.as_of,
                             age_seconds=fresh.age_seconds)


@router.put("/api/projects/{project_id}/ai-labels", tags=["judge"],
            summary="The lead's decision: may AI labels be used for training?",
            description="Allowing them needs the gate's evidence, judged on the figures `GET .../judge-agreement` "
                        "shows (a large project's from its rollup); the answer is those figures.")
def set_ai_labels(project_id: Id, body: AILabelsIn, db: SessionDep, user: CurrentUser) -> JudgeAgreementOut:
    project = projects.get_visible(db, project_id, user)
    return _judge_out(*judging.decide_ai_labels(db, project, user, body.enabled))


@router.get("/api/projects/{project_id}/judge-agreement/steps", tags=["judge"],
            summary="The judge's step labels against the human majority: agreement, Brier score, the step gate")
def judge_step_agreement(project_id: Id, db: SessionDep, user: CurrentUser,
                         judge_run_id: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None) -> JudgeStepAgreementOut:
    project = projects.get_visible(db, project_id, user)
    report = judge_steps.judge_step_agreement(db, project, judge_run_id=judge_run_id)
    return JudgeStepAgreementOut(**report.as_dict())


@router.put("/api/projects/{project_id}/ai-step-labels", tags=["judge"],
            summary="The lead's decision: may the judge's step labels be used for training (steps exports)?")
def set_ai_step_labels(project_id: Id, body: AIStepLabelsIn, db: SessionDep, user: CurrentUser
                       ) -> JudgeStepAgreementOut:
    project = projects.get_visible(db, project_id, user)
    judge_steps.set_ai_step_labels(db, project, user, body.enabled)
    return JudgeStepAgreementOut(**judge_steps.judge_step_agreement(db, project).as_dict())


# --- pages --------------------------------------------------------------------------------------

def _context(db, project, user) -> dict:
    report, fresh = rollups.judge_report(db, project, user)
    assert report is not None  # exact_before_first: computed on the view while there is no rollup yet
    runs = judging.runs_with_jobs(db, project)
    return {"project": project, "runs": runs, "report": report, "fresh": fresh, "active": _active(runs),
            "calibration_chart": reliability_diagram(human_ai.reliability_bins(report.calibration)),
            "constitution": constitutions.current(db, project), "form": {},
            "can_judge": permissions.may(db, user, project, "judge.start"),
            "can_manage": permissions.may(db, user, project, "labels.decide"),
            "can_add_endpoints": permissions.may_account(user, "endpoints.manage"),
            "gate": {"min_prompts": human_ai.GATE_MIN_PROMPTS, "min_agreement": human_ai.GATE_MIN_AGREEMENT},
            "step_labels_on": steps.options(project).enabled,
            "step_report": judge_steps.judge_step_agreement(db, project),
            "endpoints": endpoints.list_endpoints(db)}


def _active(runs: list) -> bool:
    return any(run.state in ("queued", "running") for run, _ in runs)


JUDGE_PAGE = ProjectPage("judge.html", _context, from_settings=default_model)


JUDGE_PAGE.mount(router, "/projects/{project_id}/judge", post_path="/projects/{project_id}/judge/runs",
                 form=JudgeForm, action=_request_judge_run, redirect="/projects/{project_id}/jobs")


@router.get("/projects/{project_id}/judge/runs", include_in_schema=False)
def judge_runs_fragment(request: Request, project_id: Id, db: SessionDep, user: PageUser) -> Response:
    """The runs table alone, which the judge page polls while a run is under way: no figures are computed for it."""
    project = projects.get_visible(db, project_id, user)
    runs = judging.runs_with_jobs(db, project)
    return render(request, "_judge_runs.html", {"project": project, "runs": runs, "active": _active(runs),
                                                "polled": True})


@router.post("/projects/{project_id}/judge/ai-labels", include_in_schema=False)
def ai_labels_from_page(request: Request, project_id: Id, db: SessionDep, user: PageUser,
                        form: Annotated[AILabelsForm, Form()]) -> Response:
    # A refusal (the gate's evidence is missing) shows the page again with what is missing.
    return JUDGE_PAGE.submit(request, db, user, project_id, form,
                             lambda db, project, user, body: judging.decide_ai_labels(db, project, user, body.enabled),
                             redirect="/projects/{project_id}/judge")


@router.post("/projects/{project_id}/judge/ai-step-labels", include_in_schema=False)
def ai_step_labels_from_page(request: Request, project_id: Id, db: SessionDep, user: PageUser,
                             form: Annotated[AIStepLabelsForm, Form()]) -> Response:
    # A refusal shows the page again, the missing evidence beside the step switch (step_gate_error).
    return JUDGE_PAGE.submit(request, db, user, project_id, form,
                             lambda db, project, user, body: judge_steps.set_ai_step_labels(db, project, user,
                                                                                           body.enabled),
                             redirect="/projects/{project_id}/judge", shown={"step_gate_error": True})


@router.post("/projects/{project_id}/judge/mc-step-labels", include_in_schema=False)
def mc_step_labels_from_page(request: Request, project_id: Id, db: SessionDep, user: PageUser,
                             form: Annotated[MCStepLabelsForm, Form()]) -> Response:
    # A refusal shows the page again with the error beside this form (mc_form_error), not the judge run's.
    return JUDGE_PAGE.submit(request, db, user, project_id, form,
                             lambda db, project, user, body: _request_mc_labels(request, db, project, user, body),
                             redirect="/projects/{project_id}/jobs", shown={"mc_form_error": True})


# --- supervised CAI stage: critique → revision --------------------------------------------------

@router.post("/api/projects/{project_id}/revision-jobs", status_code=202, tags=["judge"],
             summary="Critique and revise completions under the constitution (supervised CAI stage)",
             description="Each completion without a revision yet (oldest first, at most `limit`) is critiqued under "
                         "one principle and rewritten; a lead accepts it (an SFT row in exports) or rejects it.",
             responses={422: {"description": "A bad field, named in `detail`; `constitution_version` when no "
                                             "principle has both a critique and a revision request"}})
def create_revision_job(project_id: Id, body: RevisionJobIn, db: SessionDep, user: CurrentUser) -> JobAccepted:
    project = projects.get_visible(db, project_id, user)
    return JobAccepted(job_id=_request_revisions(db, project, user, body).id)


@router.get("/api/projects/{project_id}/revisions", tags=["judge"], summary="Revisions with their critique")
def list_revisions(project_id: Id, db: SessionDep, user: CurrentUser,
                   status: Annotated[Literal["pending", "accepted", "rejected"] | None, Query()] = None
                   ) -> list[RevisionOut]:
    project = projects.get_visible(db, project_id, user)
    return [RevisionOut.from_model(r, o) for r, o in revisions.list_revisions(db, project, status)]


@router.post("/api/projects/{project_id}/revisions/{revision_id}/decision", tags=["judge"],
             summary="Accept (it becomes an SFT row in exports) or reject a revision")
def decide_revision(project_id: Id, revision_id: Id, body: RevisionDecisionIn, db: SessionDep,
                    user: CurrentUser) -> RevisionOut:
    project = projects.get_visible(db, project_id, user)
    revision = revisions.decide(db, project, user, revision_id, body.accept)
    return RevisionOut.from_model(revision, revisions.original_of(db, revision))


def _revisions_context(db, project, user) -> dict:
    return {"project": project, "items": revisions.list_revisions(db, project), "form": {},
            "last_job": jobs.latest(db, project, "revise"),
            "can_manage": permissions.may(db, user, project, "labels.decide"),
            "can_revise": permissions.may(db, user, project, "revisions.start")}


REVISIONS_PAGE = ProjectPage("revisions.html", _revisions_context, from_settings=default_model)


# A refused start keeps the form on screen with the error (can_revise).
REVISIONS_PAGE.mount(router, "/projects/{project_id}/revisions", post_path="/projects/{project_id}/revisions/start",
                     form=RevisionsForm, action=_request_revisions, redirect="/projects/{project_id}/jobs",
                     shown={"can_revise": True})


@router.post("/projects/{project_id}/revisions/{revision_id}/decision", include_in_schema=False)
def decide_from_page(project_id: Id, revision_id: Id, db: SessionDep, user: PageUser,
                     form: Annotated[DecisionForm, Form()]) -> Response:
    project = projects.get_visible(db, project_id, user)
    revisions.decide(db, project, user, revision_id, form.to_api().accept)
    return RedirectResponse(f"/projects/{project.id}/revisions#r{revision_id}", status_code=303)
