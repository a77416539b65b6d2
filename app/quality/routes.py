"""Agreement and annotator quality: the JSON report, gold tasks, and the lead's dashboard page."""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Form, Query, Request, Response
from fastapi.responses import JSONResponse, RedirectResponse
from pydantic import TypeAdapter

from app.accounts import permissions
from app.annotation import rankings, steps
from app.platform.errors import DomainError
from app.projects import projects
from app.quality import flags as agreement_flags
from app.quality import gold, rollups, step_agreement
from app.quality import rows as agreement_rows
from app.quality.charts import line_chart
from app.quality.report import AgreementReport
from app.schemas import AgreementOut, AnnotatorRemovedOut, GoldIn, GoldOut, StepAgreementOut
from app.web.deps import MAX_ID, CurrentUser, FiguresTurn, Id, PageUser, SessionDep
from app.web.forms import GoldFromMetadataForm
from app.web.rendering import prerendered, render, render_fragment

router = APIRouter()

RubricVersionQuery = Annotated[int | None, Query(ge=1, le=MAX_ID,
                                                 description="Only rankings made under this rubric version.")]


def _readable_project(db, project_id: Id, user):
    project = projects.get_visible(db, project_id, user)  # 404 for non-members
    permissions.require(db, user, project, "agreement.see")
    return project


@router.get("/api/projects/{project_id}/agreement", tags=["agreement"], response_model=AgreementOut,
            summary="Agreement between annotators and per-annotator quality (leads, engineers, admins)",
            responses={403: {"description": "Annotators may not see the figures"},
                       404: {"description": "No such project, or not a member"},
                       422: {"description": "No such rubric version"},
                       503: {"description": "A large project's first rollup is still being computed: retry"}})
def get_agreement(request: Request, _turn: FiguresTurn, project_id: Id, db: SessionDep, user: CurrentUser,
                  rubric_version: RubricVersionQuery = None) -> AgreementOut | Response:
    project = _readable_project(db, project_id, user)  # before the cache is read: it holds every viewer's figures
    view = rollups.report_view(db, project, user, rubric_version=rubric_version)
    fresh = view.fresh
    key = ("agreement.json", *view.key) if view.key else None
    body = request.app.state.fragments.get(key) if key else None
    if body is None:
        report = view.report()
        if report is None:  # returned, not raised: the request commits the rollup job it queued
            return JSONResponse({"detail": [{"message": view.pending().describe()}]}, status_code=503,
                                headers={"Retry-After": "10"})
        # Serialized once per stored rollup; the freshness fields (the clock's) are added on each request.
        body = AgreementOut.model_validate(asdict(report)).model_dump_json(exclude=_FRESHNESS).encode()
        if key:
            request.app.state.fragments.put(key, body)
    tail = json.dumps({"computed": fresh.method, "as_of": _iso(fresh.as_of), "age_seconds": fresh.age_seconds},
                      separators=(",", ":"))
    raw = body if isinstance(body, bytes) else body.encode()  # the report's JSON object, then the freshness fields
    return Response(raw[:-1] + b"," + tail[1:].encode(), media_type="application/json")


_FRESHNESS = {"computed", "as_of", "age_seconds"}


_WHEN = TypeAdapter(datetime | None)


def _iso(at: datetime | None) -> str | None:
    # As pydantic writes a datetime in JSON (UTC as "Z"), so cached and uncached answers read the same.
    return _WHEN.dump_python(at, mode="json")


@router.get("/api/projects/{project_id}/agreement/steps", tags=["agreement"],
            summary="Agreement between annotators on step labels (process supervision), and each annotator's step "
                    "accuracy on gold tasks' known step labels",
            responses={403: {"description": "Annotators may not see the figures"}})
def get_step_agreement(project_id: Id, db: SessionDep, user: CurrentUser,
                       rubric_version: RubricVersionQuery = None) -> StepAgreementOut:
    project = _readable_project(db, project_id, user)
    return StepAgreementOut.model_validate(asdict(step_agreement.report(db, project, rubric_version)))


@router.put("/api/projects/{project_id}/prompts/{prompt_id}/gold", tags=["agreement"],
            summary="Mark a prompt as a gold task with its known correct order and step labels (leads and admins)",
            responses={422: {"description": "Bad tiers or step labels: `detail` names the field (`tiers`, "
                                            "`step_labels.<completion id>`)"}})
def put_gold(project_id: Id, prompt_id: Id, body: GoldIn, db: SessionDep, user: CurrentUser) -> GoldOut:
    project = projects.get_visible(db, project_id, user)
    prompt = gold.set_gold(db, project, prompt_id, body.tiers, user, step_labels=body.step_labels)
    return GoldOut(prompt_id=prompt.id, gold_tiers=prompt.gold_tiers, gold_step_labels=prompt.gold_step_labels)


@router.delete("/api/projects/{project_id}/annotators/{user_id}/rankings", tags=["agreement"],
               response_model=AnnotatorRemovedOut,
               summary="Remove an annotator and their work from the project: their human rankings (with their pairs "
                       "and step labels), their tasks and their membership (leads and admins); the agreement figures "
                       "drop them within seconds",
               responses={404: {"description": "No such project, or no such annotator in it"}})
def delete_annotator_rankings(project_id: Id, user_id: Id, db: SessionDep, user: CurrentUser) -> AnnotatorRemovedOut:
    project = projects.get_visible(db, project_id, user)
    removed = rankings.remove_annotator(db, project, user, user_id)
    return AnnotatorRemovedOut(user_id=user_id, rankings_removed=removed)


@router.delete("/api/projects/{project_id}/prompts/{prompt_id}/gold", tags=["agreement"], status_code=204,
               summary="Turn a gold task back into an ordinary prompt (leads and admins)")
def delete_gold(project_id: Id, prompt_id: Id, db: SessionDep, user: CurrentUser) -> Response:
    project = projects.get_visible(db, project_id, user)
    gold.clear_gold(db, project, prompt_id, user)
    return Response(status_code=204)


def _charts(report: AgreementReport) -> list:
    """Agreement and gold accuracy over time and by rubric version (shares, so both on a 0–1 axis)."""
    out = []
    if report.trend:
        lines = {"agreement": [(p.x, p.agreement) for p in report.trend if p.agreement is not None],
                 "gold accuracy": [(p.x, p.gold_accuracy) for p in report.trend if p.gold_accuracy is not None]}
        out.append(line_chart("trend", f"By {report.trend_unit}, from {report.trend[0].label} UTC", lines,
                              x_label=report.trend_unit, y_label="share of pairs", y_range=(0.0, 1.0)))
    if report.by_rubric_version:
        lines = {"agreement": [(p.x, p.agreement) for p in report.by_rubric_version if p.agreement is not None],
                 "gold accuracy": [(p.x, p.gold_accuracy) for p in report.by_rubric_version
                                   if p.gold_accuracy is not None]}
        out.append(line_chart("by_rubric_version", "By rubric version", lines, x_label="rubric version",
                              y_label="share of pairs", y_range=(0.0, 1.0)))
    return [c for c in out if c is not None]


ANNOTATOR_ROWS = 50
"""Annotator rows the page shows unless asked for all (flagged ones first): 200 rows are ~400 KB of HTML."""


@router.get("/projects/{project_id}/agreement", include_in_schema=False)
def agreement_page(request: Request, _turn: FiguresTurn, project_id: Id, db: SessionDep, user: PageUser,
                   rubric_version: Annotated[str | None, Query()] = None,
                   marked: Annotated[int | None, Query()] = None,
                   annotators: Annotated[str | None, Query()] = None) -> Response:
    project = _readable_project(db, project_id, user)  # before the cache is read: it holds every viewer's figures
    show_all = annotators == "all"
    ctx: dict = {"project": project, "marked": marked, "show_all": show_all,
                 "can_set_gold": permissions.may(db, user, project, "gold.manage"),
                 "step_report": step_agreement.report(db, project, _version(rubric_version))
                 if steps.options(project).enabled else None}
    status = 200
    try:
        view = rollups.report_view(db, project, user, rubric_version=_version(rubric_version))
    except DomainError as exc:
        ctx["error"], status = exc, exc.status_code
        view = rollups.report_view(db, project, user)
    ctx |= {"fresh": view.fresh, "versions": view.versions, "rubric_version": view.rubric_version}
    # The step labels' figures are computed on each view: a page showing them is not a function of the rollup.
    key = ("agreement.html", *view.key, show_all) if view.key and ctx["step_report"] is None else None
    body = request.app.state.fragments.get(key) if key else None
    if body is None:
        report = view.report()
        if report is None:
            ctx["fresh"] = view.pending()
            return render(request, "agreement_pending.html", ctx, status_code=status)
        body = _render_body(project, report, ctx["step_report"], show_all)
        if key:
            request.app.state.fragments.put(key, body)
    ctx["body"] = prerendered(body)
    return render(request, "agreement.html", ctx, status_code=status)


def _render_body(project: Any, report: AgreementReport, step_report: Any, show_all: bool) -> str:
    """The figures' part of the page: everything but the viewer's (freshness line, gold form, CSRF token)."""
    rows = report.annotators
    if not show_all and len(rows) > ANNOTATOR_ROWS:
        rows = sorted(rows, key=lambda a: (not a.flags, a.email))[:ANNOTATOR_ROWS]
    return render_fragment("_agreement_body.html", dict(
        project=project, report=report, charts=_charts(report), thresholds=agreement_flags.THRESHOLDS,
        step_report=step_report, annotator_rows=rows, show_all=show_all, annotator_rows_default=ANNOTATOR_ROWS,
        step_gold={s.user_id: s for s in step_report.annotators} if step_report else {}))


def _version(raw: str | None) -> int | None:
    # The selector submits "" for "all versions"; anything else that is not a number is treated the same.
    return int(raw) if raw and raw.isdigit() else None


PageQuery = Annotated[int, Query(ge=1, le=100_000)]


@router.get("/projects/{project_id}/agreement/prompts", include_in_schema=False)
def disagreement_page(request: Request, project_id: Id, db: SessionDep, user: PageUser,
                      rubric_version: Annotated[str | None, Query()] = None, page: PageQuery = 1) -> Response:
    """The prompts annotators disagree on, least agreement first, a page at a time: what the figures are made of."""
    project = _readable_project(db, project_id, user)
    version = _version(rubric_version)
    found = agreement_rows.disagreements(db, project, user, rubric_version=version, page=page)
    return render(request, "agreement_prompts.html", {"project": project, "found": found, "items": found.items,
                                                      "total": found.total, "rubric_version": version})


@router.get("/projects/{project_id}/agreement/annotators/{user_id}", include_in_schema=False)
def annotator_page(request: Request, project_id: Id, user_id: Id, db: SessionDep, user: PageUser,
                   view: Annotated[str, Query()] = "all",
                   rubric_version: Annotated[str | None, Query()] = None,
                   before: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None, page: PageQuery = 1) -> Response:
    """One annotator's rankings (or only their gold misses), a page at a time, with time, first-shown card and
    agreement."""
    project = _readable_project(db, project_id, user)
    version = _version(rubric_version)
    found = agreement_rows.annotator_rankings(db, project, user_id, view=view, rubric_version=version,
                                              before=before, page=page)
    return render(request, "agreement_annotator.html", {"project": project, "found": found, "view": view,
                                                        "annotator_id": user_id, "rubric_version": version,
                                                        "paged": before is not None or page > 1})


@router.post("/projects/{project_id}/agreement/gold-from-metadata", include_in_schema=False)
def mark_gold_from_metadata(project_id: Id, db: SessionDep, user: PageUser,
                            form: Annotated[GoldFromMetadataForm, Form()]) -> Response:
    project = projects.get_visible(db, project_id, user)
    count = gold.gold_from_metadata(db, project, limit=form.count, actor=user)
    return RedirectResponse(f"/projects/{project.id}/agreement?marked={count}", status_code=303)
