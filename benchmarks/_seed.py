"""The benchmarks' synthetic project: K=4 completions per prompt, three annotators' rankings, their pairs.

Written by COPY on Postgres (app.platform.bulk), in chunks of prompts; a tenth of the prompts are held out.
"""

from __future__ import annotations

import random

K = 4
ANNOTATORS = 3
PAIRS_PER_PROMPT = ANNOTATORS * K * (K - 1) // 2
CHUNK_PROMPTS = 5_000
WORDS = ("the model answer reasoning step value because therefore result check first second then total sum "
         "number compute error careful explain why which when where prompt helpful honest harmless").split()



def _sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def seed_pairs(url: str, n_pairs: int, *, name: str, vacuum: bool = False) -> tuple[int, int]:
    """(project id, pairs written): prompts, completions, rankings and pairs by COPY (Postgres), in chunks of
    prompts; `vacuum` leaves the tables as a long-running database has them (hint bits set, statistics fresh)."""
    from sqlalchemy import text

    from app.accounts import users
    from app.annotation.pairs import expand_tiers
    from app.models import Completion, Pair, Prompt, Ranking
    from app.platform.bulk import insert_rows
    from app.platform.db import make_engine, make_session_factory, session_scope
    from app.projects import projects

    factory = make_session_factory(make_engine(url))
    rng = random.Random(0)
    with session_scope(factory) as db:
        lead = users.create_user(db, "lead@bench.example", "correct horse battery staple", "lead")
        people = [users.create_user(db, f"a{i}@bench.example", "correct horse battery staple", "annotator")
                  for i in range(ANNOTATORS)]
        project = projects.create_project(db, lead, name=name, completions_per_prompt=K,
                                          overlap=ANNOTATORS, rubric_text="Prefer correct, helpful answers.",
                                          criteria=["Correctness"])
        project_id, rubric_id, annotator_ids = project.id, project.current_rubric_id, [p.id for p in people]
    n_prompts = -(-n_pairs // PAIRS_PER_PROMPT)
    written = 0
    for start in range(0, n_prompts, CHUNK_PROMPTS):
        count = min(CHUNK_PROMPTS, n_prompts - start)
        with session_scope(factory) as db:
            prompt_ids = insert_rows(db, Prompt, [
                {"project_id": project_id, "text": f"Q{start + i}: {_sentence(rng, 25)}?",
                 "text_hash": f"{start + i:064x}", "split": "heldout" if (start + i) % 10 == 0 else "train",
                 "reference": str(start + i)} for i in range(count)], ids=True)
            completion_ids = insert_rows(db, Completion, [
                {"prompt_id": pid, "text": _sentence(rng, 45), "source": "sampled"}
                for pid in prompt_ids for _ in range(K)], ids=True)
            ranking_rows, orders = [], []
            for i, pid in enumerate(prompt_ids):
                cids = completion_ids[i * K:(i + 1) * K]
                for annotator in annotator_ids:
                    order = rng.sample(cids, K)
                    orders.append((pid, order))
                    ranking_rows.append({"project_id": project_id, "prompt_id": pid, "round": 1, "source": "human",
                                         "annotator_id": annotator, "rubric_id": rubric_id,
                                         "tiers": [[c] for c in order], "display_order": order, "flags": {},
                                         "skipped": False, "seconds_spent": 20.0})
            ranking_ids = insert_rows(db, Ranking, ranking_rows, ids=True)
            pair_rows = [{"ranking_id": rid, "prompt_id": pid, "chosen_id": s.chosen, "rejected_id": s.rejected,
                          "margin": s.margin, "source": "human", "weight": 1.0, "p": 1.0}
                         for rid, (pid, order) in zip(ranking_ids, orders, strict=True)
                         for s in expand_tiers([[c] for c in order])]
            insert_rows(db, Pair, pair_rows)
            written += len(pair_rows)
    if vacuum:
        with factory.kw["bind"].connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM (FREEZE, ANALYZE)"))
    factory.kw["bind"].dispose()
    return project_id, written
