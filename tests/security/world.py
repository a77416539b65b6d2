"""A seeded world for the security suite: two projects with different members and one of every object.

Project A: `lead` leads it, `annotator` and `engineer` are members, `victim` is an annotator in it.
Project B: `outsider` (a lead elsewhere) leads it; nobody from A is a member. Each project holds a prompt with
completions, a constitution, a ready export with a file on disk, a job and a training run, so every `{id}`
in every route has a real value in A and a real value in B.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from app.accounts import users
from app.models import (
    Assignment,
    Completion,
    ComputeCluster,
    Export,
    Job,
    ModelEndpoint,
    Project,
    Prompt,
    TrainingRun,
    Webhook,
)
from app.platform.crypto import Keyring
from app.platform.settings import Settings
from app.projects import constitutions, projects

PASSWORD = "correct horse battery staple"
IDENTITIES = ("anon", "admin", "lead", "annotator", "engineer", "outsider")


@dataclass
class ProjectObjects:
    project_id: int
    prompt_id: int
    completion_ids: list[int]
    job_id: int
    export_id: int
    run_id: int
    revision_id: int
    running_run_id: int
    assignment_id: int = 0
    """A running lease of the prompt (A: `annotator`'s, B: `outsider`'s), for the routes of one annotator's task."""
    webhook_id: int = 0

    def params(self) -> dict[str, Any]:
        return {"project_id": self.project_id, "prompt_id": self.prompt_id, "job_id": self.job_id,
                "export_id": self.export_id, "run_id": self.run_id, "revision_id": self.revision_id, "version": 1, "name": "pairs.jsonl",
                "assignment_id": self.assignment_id, "webhook_id": self.webhook_id}


@dataclass
class World:
    tokens: dict[str, str]
    emails: dict[str, str]
    user_ids: dict[str, int]
    a: ProjectObjects
    b: ProjectObjects
    lead_token_id: int
    outsider_token_id: int
    endpoint_id: int
    """A model endpoint the admin configured (global, not a project's), with an API key stored."""
    cluster_id: int = 0
    """A Ray cluster `world` the admin configured, its head on a closed port, with a token stored."""
    extra: dict[str, Any] = field(default_factory=dict)

    def headers(self, who: str) -> dict[str, str]:
        return {} if who == "anon" else {"Authorization": f"Bearer {self.tokens[who]}"}


def _objects(db: Session, project: Project, creator: Any, data_dir: Path, tag: str) -> ProjectObjects:
    prompt = Prompt(project_id=project.id, text=f"What is 2+2? ({tag})",
                    text_hash=hashlib.sha256(f"p-{tag}".encode()).hexdigest())
    db.add(prompt)
    db.flush()
    completions = [Completion(prompt_id=prompt.id, text=f"answer {i} ({tag})") for i in range(project.completions_per_prompt)]
    db.add_all(completions)
    db.flush()
    revision = Completion(prompt_id=prompt.id, text=f"revised answer ({tag})", source="revision",
                          meta={"original_id": completions[0].id, "critique": "too short", "status": "pending"})
    db.add(revision)
    constitutions.create_version(db, project, creator, principles=constitutions.DEFAULT_PRINCIPLES[:1],
                                 base_version=None, check_permission=False)
    job = Job(kind="export", project_id=project.id, state="succeeded", created_by_id=creator.id,
              result={"done": 1, "total": 1})
    db.add(job)
    db.flush()
    out = data_dir / "exports" / f"world-{tag}-{job.id}"
    out.mkdir(parents=True, exist_ok=True)
    body = b'{"chosen": "a", "rejected": "b"}\n'
    (out / "pairs.jsonl").write_bytes(body)
    digest = hashlib.sha256(body).hexdigest()
    export = Export(project_id=project.id, kind="pairs", format="jsonl", row_count=1, row_counts={"train": 1},
                    sha256=digest, files={"pairs.jsonl": digest}, path=str(out), job_id=job.id,
                    created_by_id=creator.id)
    db.add(export)
    run_job = Job(kind="train", project_id=project.id, state="succeeded", created_by_id=creator.id)
    db.add(run_job)
    db.flush()
    # A finished policy run, so "sample into project" reaches its permission check (model_dir does not exist).
    run = TrainingRun(project_id=project.id, kind="grpo", export_id=export.id, state="succeeded", job_id=run_job.id,
                      created_by_id=creator.id, config={"user": {}}, model_dir=str(data_dir / "no-such-model"))
    db.add(run)
    live_job = Job(kind="train", project_id=project.id, state="running", created_by_id=creator.id)
    db.add(live_job)
    db.flush()
    running = TrainingRun(project_id=project.id, kind="reward", export_id=export.id, state="running",
                          job_id=live_job.id, created_by_id=creator.id, config={"user": {}})
    db.add(running)
    db.flush()
    return ProjectObjects(project_id=project.id, prompt_id=prompt.id, completion_ids=[c.id for c in completions],
                          job_id=job.id, export_id=export.id, run_id=run.id,
                          revision_id=revision.id, running_run_id=running.id)


def seed(db: Session, data_dir: Path) -> World:
    """Create the world and commit it."""
    roles = {"admin": "admin", "lead": "lead", "annotator": "annotator", "engineer": "engineer",
             "outsider": "lead", "victim": "annotator"}
    people = {who: users.create_user(db, f"{who}@example.org", PASSWORD, role, name=who.title())
              for who, role in roles.items()}
    project_a = projects.create_project(db, people["lead"], name="Project A", completions_per_prompt=4, overlap=1,
                                        rubric_text="Rank A.", criteria=["Correctness"])
    for who, role in (("annotator", "annotator"), ("engineer", "engineer"), ("victim", "annotator")):
        projects.add_member(db, project_a, people["lead"], email=people[who].email, role=role)
    project_b = projects.create_project(db, people["outsider"], name="Project B", completions_per_prompt=4,
                                        overlap=1, rubric_text="Rank B.", criteria=["Correctness"])
    a = _objects(db, project_a, people["lead"], data_dir, "a")
    b = _objects(db, project_b, people["outsider"], data_dir, "b")
    for objects, holder in ((a, people["annotator"]), (b, people["outsider"])):
        lease = Assignment(project_id=objects.project_id, prompt_id=objects.prompt_id, annotator_id=holder.id,
                           state="leased", leased_until=datetime.now(UTC) + timedelta(days=1))
        db.add(lease)
        db.flush()
        objects.assignment_id = lease.id
        # A row, not the service: the service resolves host names, and the suite needs no DNS.
        hook = Webhook(project_id=objects.project_id, url="https://hooks.example.org/world", events=["export.ready"],
                       secret_stored=Keyring(Settings(data_dir=data_dir)).encrypt("whsec_world"), allow_private=False)
        db.add(hook)
        db.flush()
        objects.webhook_id = hook.id
    tokens: dict[str, str] = {}
    for who in IDENTITIES[1:]:
        _, tokens[who] = users.create_token(db, people[who], "world")
    # Added as a row, not through the service: the service resolves host names, and the suite needs no DNS.
    endpoint = ModelEndpoint(name="World vLLM", base_url="http://10.9.8.7:8000/v1", model="world-model",
                             api_key_stored=Keyring(Settings(data_dir=data_dir)).encrypt("sk-world-secret-key"),
                             allow_private=True, created_by_id=people["admin"].id)
    db.add(endpoint)
    db.flush()
    cluster = ComputeCluster(name="world", kind="ray", address="http://127.0.0.1:9", shared_dir=str(data_dir),
                             resources={}, env={}, job_prefix="preflab",
                             secret_stored=Keyring(Settings(data_dir=data_dir)).encrypt("ray-world-token"))
    db.add(cluster)
    db.flush()
    lead_row, _ = users.create_token(db, people["lead"], "revocable")
    outsider_row, _ = users.create_token(db, people["outsider"], "revocable")
    db.commit()
    return World(tokens=tokens, emails={w: u.email for w, u in people.items()},
                 user_ids={w: u.id for w, u in people.items()}, a=a, b=b, lead_token_id=lead_row.id,
                 outsider_token_id=outsider_row.id, endpoint_id=endpoint.id, cluster_id=cluster.id)
