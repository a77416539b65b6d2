"""A finished training run on record without training one: for the run page's tests, which read what a trainer
wrote (metrics.jsonl, eval.json, samples) and need only the rows that point at it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.accounts import users
from app.models import Job, TrainingRun
from app.projects import projects


def finished_run(db: Any, out: Path, *, email: str, password: str, project: str, steps: int,
                 kind: str = "grpo") -> tuple[int, int, int]:
    """A lead `email`, their project `project` and in it a succeeded `kind` run of `steps` steps whose files are in
    `out`; (project id, run id, job id), committed."""
    lead = users.create_user(db, email, password, "lead")
    made = projects.create_project(db, lead, name=project, completions_per_prompt=4, overlap=1, rubric_text="r",
                                   criteria=[])
    job = Job(kind="train", payload={}, state="succeeded", result={}, project_id=made.id)
    db.add(job)
    db.flush()
    run = TrainingRun(project_id=made.id, kind=kind, state="succeeded", job_id=job.id,
                      config={"user": {"steps": steps}}, metrics_path=str(out / "metrics.jsonl"),
                      model_dir=str(out / "model"))
    db.add(run)
    db.commit()
    return made.id, run.id, job.id
