"""A reward model against the humans: its accuracy on the project's held-out human pairs, and on pairs labelled
after its training export (drift as the policy changes), so a lead sees when it must be retrained."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, aliased

from app.models import Completion, Pair, Prompt, Ranking

MAX_PAIRS = 2000
"""Pairs scored per set, newest first: enough for a stable accuracy, bounded in time."""


def human_pairs(db: Session, project_id: int, *, split: str | None = None, after: datetime | None = None,
                limit: int = MAX_PAIRS) -> list[tuple[Any, str, str]]:
    """(prompt, chosen text, rejected text) of human pairs, newest first."""
    chosen, rejected = aliased(Completion), aliased(Completion)
    query = (select(Prompt.messages, Prompt.text, chosen.text, rejected.text)
             .select_from(Pair).join(Ranking, Pair.ranking_id == Ranking.id).join(Prompt, Pair.prompt_id == Prompt.id)
             .join(chosen, Pair.chosen_id == chosen.id).join(rejected, Pair.rejected_id == rejected.id)
             .where(Prompt.project_id == project_id, Ranking.source == "human")
             .order_by(Pair.id.desc()).limit(limit))
    if split:
        query = query.where(Prompt.split == split)
    if after is not None:
        query = query.where(Ranking.created_at > after)
    return [(messages or text, c, r) for messages, text, c, r in db.execute(query)]


def accuracy(model_dir: str, pairs: list[tuple[Any, str, str]]) -> float | None:
    """Share of pairs the reward model scores chosen above rejected (None without pairs)."""
    if not pairs:
        return None
    from training.reward_model import RewardModel  # lazy: torch loads only in the worker that scores

    model = RewardModel.load(model_dir)
    prompts = [p for p, _, _ in pairs]
    chosen = model.score(prompts, [c for _, c, _ in pairs])
    rejected = model.score(prompts, [r for _, _, r in pairs])
    return round(float((chosen > rejected).float().mean()), 4)


def check(db: Session, project_id: int, model_dir: str, export_created_at: datetime | None) -> dict[str, Any]:
    heldout = human_pairs(db, project_id, split="heldout")
    newer = human_pairs(db, project_id, after=export_created_at) if export_created_at else []
    return {"heldout_human_pairs": len(heldout), "heldout_accuracy": accuracy(model_dir, heldout),
            "pairs_after_export": len(newer), "accuracy_after_export": accuracy(model_dir, newer)}
