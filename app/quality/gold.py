"""Gold tasks: prompts with a known correct order, against which each annotator's accuracy is measured."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from sqlalchemy import null, select, update
from sqlalchemy.orm import Session

from app.accounts import permissions
from app.annotation import steps
from app.annotation.rankings import tier_items, tier_lists
from app.models import Completion, Project, Prompt, User
from app.platform import audit
from app.platform.errors import Invalid, NotFound
from app.quality import upkeep


def _prompt(db: Session, project: Project, prompt_id: int) -> Prompt:
    prompt = db.get(Prompt, prompt_id)
    if prompt is None or prompt.project_id != project.id:
        raise NotFound("no such prompt in this project")
    return prompt


def validate_gold_tiers(tiers: Any, completion_ids: set[int]) -> list[list[int]]:
    """The tiers as lists of ints, or Invalid naming the field: this prompt's completions, no repeats, ≥ 2 tiers."""
    tiers = tier_lists(tiers)
    if len(tiers) < 2:
        raise Invalid("a gold order needs at least two tiers (best first)", field="tiers")
    return tier_items(tiers, completion_ids)


def set_gold(db: Session, project: Project, prompt_id: int, tiers: Any, actor: User,
             step_labels: Any = None) -> Prompt:
    """Mark a prompt as a gold task with a known correct order (completion ids, best tier first) and, in a
    project that labels steps, known step labels ({completion id: +1/0/−1 per step}, checked as a ranking's)."""
    permissions.require(db, actor, project, "gold.manage")
    prompt = _prompt(db, project, prompt_id)
    ids = set(db.scalars(select(Completion.id).where(Completion.prompt_id == prompt.id)))
    prompt.gold_tiers = validate_gold_tiers(tiers, ids)
    known = steps.validate(step_labels, steps.task_steps(db, project, sorted(ids)) if step_labels else {},
                           enabled=steps.options(project).enabled)
    # SQL NULL when none: the column stores None as NULL, so "no known step labels" is one value.
    prompt.gold_step_labels = {str(cid): labels for cid, labels in sorted(known.items())} or None
    db.flush()
    upkeep.mark_prompts(db, project, [prompt.id])  # every ranking of it has a new gold score
    audit.record(db, actor, "gold.set", project_id=project.id, object_type="prompt", object_id=prompt.id,
                 tiers=prompt.gold_tiers, step_labels=prompt.gold_step_labels)
    return prompt


def clear_gold(db: Session, project: Project, prompt_id: int, actor: User) -> Prompt:
    """Turn a gold task back into an ordinary prompt."""
    permissions.require(db, actor, project, "gold.manage", doing="clear gold tasks")
    prompt = _prompt(db, project, prompt_id)
    had = prompt.gold_tiers
    prompt.gold_tiers = null()  # SQL NULL, not the JSON value null, so `gold_tiers IS NULL` finds it
    prompt.gold_step_labels = None
    db.flush()
    db.refresh(prompt, ["gold_tiers", "gold_step_labels"])
    upkeep.mark_prompts(db, project, [prompt.id])
    audit.record(db, actor, "gold.clear", project_id=project.id, object_type="prompt", object_id=prompt.id,
                 previous=had)
    return prompt


def _flag(value: Any) -> bool | None:
    """True/False from metadata booleans (or 0/1 and "true"/"false" from CSV imports); None otherwise."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    return None


def gold_from_metadata(db: Session, project: Project, *, limit: int | None = None,
                       actor: User | None = None) -> int:
    """Mark prompts whose meta["is_correct"] has both true and false values as gold [correct], [incorrect].

    `is_correct` is aligned with the prompt's completions in id order (as in the GSM8K demo). Prompts that
    are already gold, whose list length does not match, or whose answers are all right or all wrong are left
    alone. At most `limit` prompts are marked, in prompt id order. Returns how many were marked.
    """
    if actor is not None:
        permissions.require(db, actor, project, "gold.manage")
    if limit is not None and limit < 1:
        raise Invalid("must be at least 1", field="limit")
    candidates = [(pid, meta) for pid, meta, tiers in db.execute(
        select(Prompt.id, Prompt.meta, Prompt.gold_tiers).where(Prompt.project_id == project.id).order_by(Prompt.id)
    ) if not tiers and isinstance(meta, dict) and isinstance(meta.get("is_correct"), list)]
    if not candidates:
        return 0
    completions: dict[int, list[int]] = defaultdict(list)
    for pid, cid in db.execute(select(Completion.prompt_id, Completion.id).join(Prompt)
                               .where(Prompt.project_id == project.id).order_by(Completion.id)):
        completions[pid].append(cid)

    marked: list[dict[str, Any]] = []
    for pid, meta in candidates:
        if limit is not None and len(marked) >= limit:
            break
        flags = [_flag(v) for v in meta["is_correct"]]
        ids = completions.get(pid, [])
        if len(flags) != len(ids) or None in flags:
            continue
        correct = [cid for cid, ok in zip(ids, flags, strict=True) if ok]
        wrong = [cid for cid, ok in zip(ids, flags, strict=True) if not ok]
        if not correct or not wrong:
            continue
        marked.append({"id": pid, "gold_tiers": [correct, wrong]})
    if marked:
        db.execute(update(Prompt), marked)  # one executemany by primary key, not a load per prompt
        changed = {row["id"] for row in marked}
        for obj in list(db.identity_map.values()):
            if isinstance(obj, Prompt) and obj.id in changed:
                db.expire(obj, ["gold_tiers"])  # the bulk update bypassed loaded objects
        upkeep.mark_prompts(db, project, changed)
    audit.record(db, actor, "gold.from_metadata", project_id=project.id, object_type="project",
                 object_id=project.id, marked=len(marked),
                 prompt_ids=[row["id"] for row in marked][:1000])
    return len(marked)
