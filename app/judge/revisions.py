"""The supervised CAI stage in the app: ask for critiques and revisions, store what the revise job writes, and the
lead's accept / reject."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.accounts import permissions
from app.jobs import queue as jobs
from app.judge import endpoints
from app.models import Completion, Job, Project, Prompt, User
from app.platform import audit
from app.platform.errors import Conflict, Invalid, NotFound
from app.projects import constitutions, projects


def request_revisions(db: Session, project: Project, actor: User, *, generator: dict[str, Any],
                      constitution_version: int | None, prompt_ids: list[int] | None, limit: int,
                      seed: int = 0) -> Job:
    permissions.require(db, actor, project, "revisions.start")
    constitution = (constitutions.get_version(db, project, constitution_version, field="constitution_version")
                    if constitution_version else constitutions.ensure_default(db, project, actor))
    if not any(p.get("critique") and p.get("revision") for p in constitution.principles):
        raise Invalid("no principle has both a critique and a revision request", field="constitution_version")
    # An openai generator names an admin's model endpoint; the job keeps the id, never a URL or key.
    generator = endpoints.prepare(db, actor, generator)
    payload: dict[str, Any] = {"generator": generator, "constitution_id": constitution.id, "prompt_ids": prompt_ids,
                               "limit": limit, "seed": seed}
    cluster = projects.default_cluster(project)
    if cluster is not None and generator.get("backend") == "hf":
        # A local model's critiques and revisions are heavy: they go where the project's runs go.
        payload["where"] = {"cluster": cluster}
    return jobs.enqueue(db, "revise", payload, project=project, actor=actor)


def unrevised(db: Session, project_id: int, prompt_ids: list[int] | None, limit: int
              ) -> list[tuple[int, int, Any, str]]:
    """[(completion id, prompt id, prompt text or messages, completion text)]: the project's non-revision completions
    without a revision yet, oldest first, at most `limit`."""
    revised = {int((m or {}).get("original_id", 0)) for m in db.scalars(
        select(Completion.meta).join(Prompt).where(Prompt.project_id == project_id, Completion.source == "revision"))}
    query = (select(Completion.id, Prompt.id, Prompt.messages, Prompt.text, Completion.text).join(Prompt)
             .where(Prompt.project_id == project_id, Completion.source != "revision")
             .order_by(Completion.id))
    if prompt_ids:
        query = query.where(Prompt.id.in_(prompt_ids))
    out = []
    for cid, pid, messages, prompt_text, text in db.execute(query):
        if cid in revised:
            continue
        out.append((cid, pid, messages or prompt_text, text))
        if len(out) >= limit:
            break
    return out


def add_revision(db: Session, *, original_id: int, prompt_id: int, text: str, steps: list[str] | None,
                 critique: str, principle: str, constitution_version: int, generator_name: str,
                 generator_params: dict[str, Any], seed: int | None, job_id: int) -> bool:
    """Store `text` as a revision of completion `original_id`, pending the lead's review, unless that completion has
    one already (a resumed job never revises the same completion twice); whether it was stored."""
    already = db.scalar(select(Completion.id).where(Completion.prompt_id == prompt_id,
                                                    Completion.source == "revision",
                                                    Completion.meta["original_id"].as_integer() == original_id))
    if already is not None:
        return False
    db.add(Completion(prompt_id=prompt_id, text=text, source="revision", generator_name=generator_name,
                      generator_params=generator_params, seed=seed, steps=steps,
                      meta={"original_id": original_id, "principle": principle,
                            "constitution_version": constitution_version, "critique": critique,
                            "status": "pending", "job_id": job_id}))
    return True


def list_revisions(db: Session, project: Project, status: str | None = None
                   ) -> list[tuple[Completion, Completion | None]]:
    """(revision, original) pairs, newest first; the original None when it was deleted."""
    rows = list(db.scalars(select(Completion).join(Prompt).where(Prompt.project_id == project.id,
                                                                 Completion.source == "revision")
                           .order_by(Completion.id.desc())))
    if status:
        rows = [r for r in rows if (r.meta or {}).get("status") == status]
    originals = {c.id: c for c in db.scalars(select(Completion).where(
        Completion.id.in_([int((r.meta or {}).get("original_id", 0)) for r in rows])))} if rows else {}
    return [(r, originals.get(int((r.meta or {}).get("original_id", 0)))) for r in rows]


def decide(db: Session, project: Project, actor: User, revision_id: int, accept: bool) -> Completion:
    permissions.require(db, actor, project, "labels.decide", doing="accept or reject revisions")
    revision = db.get(Completion, revision_id)
    if revision is None or revision.source != "revision" or revision.prompt.project_id != project.id:
        raise NotFound("no such revision")
    if (revision.meta or {}).get("status") not in ("pending", None):
        raise Conflict(f"already {(revision.meta or {}).get('status')}", field="status")
    revision.meta = dict(revision.meta or {}) | {"status": "accepted" if accept else "rejected",
                                                 "decided_by": actor.id}
    audit.record(db, actor, "revision.accept" if accept else "revision.reject", project_id=project.id,
                 object_type="completion", object_id=revision.id)
    return revision


def original_of(db: Session, revision: Completion) -> Completion | None:
    """The completion a revision rewrote (None when it is gone)."""
    return db.get(Completion, int((revision.meta or {}).get("original_id", 0)))
