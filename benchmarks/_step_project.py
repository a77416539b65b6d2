"""Step labels made the way a team makes them: a project with step labels on, a scripted annotator, a steps export.

`label_through_project` takes prompts with their completions and, in-process on a fresh SQLite database migrated to
head, goes through the app's own services in the order a team would: a lead creates a project with `step_labels`
on (one step per line) and imports the prompts with their completions (the import service splits each into steps);
an annotator takes tasks from the queue, sees each task as the ranking API shows it (`annotation.task_view`), ranks
its completions and labels every step +1 or -1 with a checker, and submits through `rankings.submit`, one
transaction per request (next task, then its ranking) as the API's routes have it; an engineer requests a `steps`
export and the worker's own code (`Worker.run_one`) writes it. The exported JSONL file is what the process reward
model trains on.

`mc_label_through_project` makes the same export from Monte-Carlo step labels instead of an annotator's: the prompts
are imported with their `reference` answers, an engineer starts a Monte-Carlo run through the service the API's
`POST /api/projects/{id}/mc-step-labels` calls (`monte_carlo.request_mc_labels`, its body checked by the route's own
`MCStepLabelsIn`) with a local policy directory, the worker runs its `mc_step_labels` job, and the engineer requests
a steps export whose `source` filter names `mc` with `every_step` on (every labelled step of every completion, the
right ones after a wrong one included, as a dense process reward needs them).

No HTTP server: the routes only parse, call these services and render.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from app.accounts import users
from app.annotation import queue, rankings, steps
from app.annotation import tasks as annotation
from app.exports import service as exports
from app.imports import service as imports
from app.judge import monte_carlo
from app.models import Export, Job, JudgeRun, Project, User
from app.platform.db import make_engine, make_session_factory
from app.platform.migrate import upgrade
from app.platform.settings import Settings
from app.projects import projects
from app.schemas import MCStepLabelsIn
from app.worker import Worker

PASSWORD = "scripted annotator password 0123456789"
# A checker: (prompt text, steps) -> one bool per step, True when the step is correct given the ones before it.
Checker = Callable[[str, list[str]], list[bool]]
# Whether a completion's final answer is right: (prompt text, completion text) -> bool.
Judge = Callable[[str, str], bool]


@dataclass
class Item:
    """A prompt to label and its K completions (distinct, at least one right and one wrong, so it ranks)."""

    prompt: str
    completions: list[str]
    split: str = "train"
    reference: str | None = None


@dataclass
class Labelled:
    """What the project made: the steps export's JSONL file and the counts along the way (`tasks`: the rankings
    that hold the labels, one per prompt; `mc_run_id` and `continuations` only for Monte-Carlo labels)."""

    path: Path
    rows: int
    tasks: int
    step_labels: int
    export_id: int
    row_counts: dict[str, int] = field(default_factory=dict)
    mc_run_id: int | None = None
    continuations: int = 0


def _import_bytes(items: Sequence[Item]) -> bytes:
    lines = []
    for item in items:
        row: dict[str, Any] = {"prompt": item.prompt, "completions": item.completions, "split": item.split}
        if item.reference is not None:
            row["reference"] = item.reference
        lines.append(json.dumps(row))
    return ("\n".join(lines) + "\n").encode("utf-8")


def scripted_ranking(task: Any, check: Checker, right: Judge) -> tuple[list[list[int]], dict[str, list[int]]]:
    """The scripted annotator's judgement of one task as the ranking API shows it: tiers (right answers first, then by
    how many steps are correct, ties kept together) and a +1/-1 label for every step of every completion."""
    prompt = task.prompt.text or ""
    keyed: dict[tuple[bool, int], list[int]] = {}
    labels: dict[str, list[int]] = {}
    for completion in task.completions:
        flags = check(prompt, list(completion.steps or []))
        labels[str(completion.id)] = [1 if ok else -1 for ok in flags]
        keyed.setdefault((right(prompt, completion.text), sum(flags)), []).append(completion.id)
    tiers = [sorted(keyed[key]) for key in sorted(keyed, reverse=True)]
    return tiers, labels


def _setup(factory: Any, items: Sequence[Item], k: int) -> tuple[int, int, int]:
    """Lead, project with step labels, members, import; returns (project id, annotator id, engineer id)."""
    with factory() as db:
        lead = users.create_user(db, "lead@bench.invalid", PASSWORD, "lead")
        project = projects.create_project(db, lead, name="method comparison steps", completions_per_prompt=k,
                                          overlap=1, criteria=["Correctness"],
                                          rubric_text="Rank right final answers first. Label each line +1 when "
                                                      "its sum is right given the lines before it, else -1.")
        steps.set_options(db, project, lead, enabled=True, separator=None)
        annotator = users.create_user(db, "annotator@bench.invalid", PASSWORD, "annotator")
        engineer = users.create_user(db, "engineer@bench.invalid", PASSWORD, "engineer")
        projects.add_member(db, project, lead, email=annotator.email, role="annotator")
        projects.add_member(db, project, lead, email=engineer.email, role="engineer")
        result = imports.import_file(db, project, "samples.jsonl", _import_bytes(items), actor=lead)
        if result.prompts != len(items) or result.completions != sum(len(i.completions) for i in items):
            raise RuntimeError(f"import wrote {result.prompts} prompts and {result.completions} completions, "
                               f"expected {len(items)} and {sum(len(i.completions) for i in items)}")
        db.commit()
        return project.id, annotator.id, engineer.id


def _annotate(factory: Any, project_id: int, annotator_id: int, check: Checker, right: Judge) -> tuple[int, int]:
    """Take and submit tasks until the queue has none left; (tasks, step labels) submitted."""
    tasks = labels = 0
    while True:
        # One transaction per request, as the API's routes have it: next task, then its ranking.
        with factory() as db:
            user = db.get(User, annotator_id)
            project = annotation.annotator_project(db, project_id, user)
            assignment = queue.next_task(db, project, user)
            if assignment is None:
                db.commit()
                return tasks, labels
            task = annotation.task_view(db, project, assignment)
            db.commit()
        tiers, step_labels = scripted_ranking(task, check, right)
        with factory() as db:
            user = db.get(User, annotator_id)
            project = annotation.annotator_project(db, project_id, user)
            body = rankings.RankingInput(tiers=tiers, rubric_version=task.rubric.version if task.rubric else 1,
                                         submission_id=f"bench-{task.assignment_id}",
                                         assignment_id=task.assignment_id, step_labels=step_labels)
            _, created = rankings.submit(db, project, user, body)
            db.commit()
        if not created:
            raise RuntimeError(f"task {task.assignment_id} was already submitted")
        tasks += 1
        labels += sum(len(v) for v in step_labels.values())


def _run_job(factory: Any, settings: Settings, what: str) -> None:
    """Run the next queued job with the worker's own code."""
    if not Worker(settings, session_factory=factory, heartbeat_s=0.5).run_one():
        raise RuntimeError(f"the worker found no {what} job")


def _export(factory: Any, settings: Settings, project_id: int, engineer_id: int,
            filters: dict[str, Any] | None = None, every_step: bool = False) -> Export:
    with factory() as db:
        project = db.get(Project, project_id)
        export = exports.request_export(db, project, db.get(User, engineer_id), "steps", "jsonl", filters=filters,
                                        every_step=every_step)
        db.commit()
        export_id = export.id
    _run_job(factory, settings, "export")
    with factory() as db:
        export = db.get(Export, export_id)
        state = exports.status(db, export)
        if state != "ready":
            raise RuntimeError(f"steps export {export_id} is {state}, not ready")
        db.expunge(export)
        return export


def _open(workdir: Path | None) -> tuple[Settings, Any]:
    """Settings and an engine on a fresh SQLite database migrated to head, in `workdir` (a new temporary directory
    when None)."""
    root = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="preflab-steps-"))
    root.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{root / 'preflab.db'}"
    upgrade(url)
    settings = Settings(env="dev", database_url=url, data_dir=root / "data",
                        secret_key="bench-secret-key-that-is-long-enough-0123456789abcdef")
    return settings, make_engine(url)


def _check_items(items: Sequence[Item], k: int) -> None:
    if k < 2:
        raise ValueError(f"k must be at least 2 (a task ranks K completions), got {k}")
    for n, item in enumerate(items):
        if len(item.completions) != k or len(set(item.completions)) != k:
            raise ValueError(f"items[{n}].completions: need {k} distinct completions, got {len(item.completions)}")


def _export_rows(export: Export, expected: int) -> tuple[Path, list[dict[str, Any]]]:
    """The export's file and rows; RuntimeError unless it holds one row per labelled completion."""
    path = exports.file_path(export, "steps.jsonl")
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if len(rows) != expected or export.row_count != expected:
        raise RuntimeError(f"steps export {export.id} has {len(rows)} rows (row_count {export.row_count}), expected "
                           f"one per labelled completion: {expected}")
    return path, rows


def label_through_project(items: Sequence[Item], k: int, check: Checker, right: Judge,
                          workdir: Path | None = None) -> Labelled:
    """Make the steps export of `items` (see the module's docstring) in `workdir` (database and export files; a new
    temporary directory when None). Raises when any task, row or label is missing."""
    _check_items(items, k)
    settings, engine = _open(workdir)
    try:
        factory = make_session_factory(engine)
        project_id, annotator_id, engineer_id = _setup(factory, items, k)
        tasks, labels = _annotate(factory, project_id, annotator_id, check, right)
        if tasks != len(items):
            raise RuntimeError(f"the annotator ranked {tasks} tasks, expected one per prompt ({len(items)})")
        export = _export(factory, settings, project_id, engineer_id)
    finally:
        engine.dispose()
    path, rows = _export_rows(export, sum(len(item.completions) for item in items))
    return Labelled(path=path, rows=len(rows), tasks=tasks, step_labels=labels, export_id=export.id,
                    row_counts=dict(export.row_counts or {}))


def _mc_run(factory: Any, settings: Settings, project_id: int, engineer_id: int, body: MCStepLabelsIn
            ) -> tuple[int, dict[str, Any]]:
    """Start a Monte-Carlo run as the API's route does and run its job; (run id, the job's result)."""
    with factory() as db:
        project = db.get(Project, project_id)
        run, job = monte_carlo.request_mc_labels(
            db, project, db.get(User, engineer_id), model=body.model, n=body.n, estimate=body.estimate,
            max_completions=body.max_completions, max_new_tokens=body.max_new_tokens, temperature=body.temperature,
            seed=body.seed, prompt_ids=body.prompt_ids, checker=body.checker)
        db.commit()
        run_id, job_id = run.id, job.id
    _run_job(factory, settings, "mc_step_labels")
    with factory() as db:
        job, run = db.get(Job, job_id), db.get(JudgeRun, run_id)
        if job.state != "succeeded" or run.state != "succeeded":
            raise RuntimeError(f"Monte-Carlo run {run_id} is {run.state}, its job {job.state}: {job.error}")
        return run_id, dict(job.result or {})


def mc_label_through_project(items: Sequence[Item], k: int, model_dir: Path, n: int,
                             estimate: Literal["hard", "soft"] = "hard", *,
                             seed: int = 0, max_new_tokens: int = 256, temperature: float = 1.0,
                             workdir: Path | None = None) -> Labelled:
    """Make a steps export of Monte-Carlo step labels of `items` (each with its `reference`; see the module's
    docstring): `n` continuations per step sampled by the policy in `model_dir`, labelled by the `estimate`, in
    `workdir` (as `label_through_project`). Raises when any completion, label or row is missing."""
    _check_items(items, k)
    if any(not (item.reference or "").strip() for item in items):
        raise ValueError("every item needs a reference answer: Monte-Carlo labels check continuations against it")
    completions = sum(len(item.completions) for item in items)
    body = MCStepLabelsIn(model=str(model_dir), n=n, estimate=estimate, max_completions=completions,
                          max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)
    settings, engine = _open(workdir)
    try:
        factory = make_session_factory(engine)
        project_id, _, engineer_id = _setup(factory, items, k)
        run_id, result = _mc_run(factory, settings, project_id, engineer_id, body)
        if result.get("completions_labelled") != completions:
            raise RuntimeError(f"Monte-Carlo run {run_id} labelled {result.get('completions_labelled')} "
                               f"completions, expected {completions}: {result.get('message')}")
        export = _export(factory, settings, project_id, engineer_id, filters={"source": [monte_carlo.SOURCE]},
                         every_step=True)
    finally:
        engine.dispose()
    path, rows = _export_rows(export, completions)
    labels = int(result["step_labels_written"])
    exported = sum(len(row["labels"]) for row in rows)
    if exported != labels or any(row["source"] != monte_carlo.SOURCE for row in rows):
        raise RuntimeError(f"steps export {export.id} holds {exported} step labels, the Monte-Carlo run wrote "
                           f"{labels} (every step of every completion, source mc, expected)")
    return Labelled(path=path, rows=len(rows), tasks=len(items), step_labels=labels, export_id=export.id,
                    row_counts=dict(export.row_counts or {}), mc_run_id=run_id,
                    continuations=int(result["continuations_sampled"]))
