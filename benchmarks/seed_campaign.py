"""A labelling campaign in a migrated, empty Postgres database, written in bulk: what the app itself would write.

    .venv/bin/python benchmarks/seed_campaign.py --rankings 1000000 \\
        --database-url postgresql://postgres@127.0.0.1:5432/preflab_campaign [--fresh]

One project (K=4, overlap 3) with `--rankings / 3` prompts, each ranked by three of `--annotators` annotators, the
way `rankings.submit` writes them: tiers (a few ties, a few skips), the display order `queue.display_order` shows,
seconds spent, the rubric version current at the time, the pairs `rankings.pair_rows` expands, and a submitted
(or skipped) assignment. Around it: three rubric versions (the rankings of each third of the campaign's three weeks
were made under the version then current), a tenth of a percent… one percent of the prompts as gold tasks with
their known order, a judge run that ranked a tenth of the prompts with soft-labelled AI pairs, and a spread of
annotators: most careful (the true order with a little noise, ~25 s), some sloppy (random orders, ~10 s), some
fast and position-biased (the first card shown on top, ~2 s), so the agreement page has every flag to raise.

Users, the project and the rubric versions go through the app's services; prompts, completions and rankings by
COPY (`app.platform.bulk`), pairs and assignments by set-based SQL from the rankings just written, in chunks of
prompts, one transaction each. Writes by COPY mark no group for the kept agreement figures, so they are computed
once at the end from every ranking (`upkeep.rebuild`, as after an upgrade): the app would have kept them up to date
as the rankings arrived. Prints one JSON line: what was written and how long it took.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

K = 4
OVERLAP = 3
CHUNK_PROMPTS = 10_000
GOLD_EVERY = 100
"""One prompt in a hundred is a gold task."""
JUDGED_EVERY = 10
"""The judge run ranked one prompt in ten."""
CAMPAIGN = timedelta(days=21)
PASSWORD = "campaign password 123"
WORDS = ("the model answer reasoning step value because therefore result check first second then total sum "
         "number compute error careful explain why which when where prompt helpful honest harmless").split()

# (kind, share of annotators, median seconds, how they order): the spread the agreement flags are written for.
PROFILES = (("careful", 0.8, 25.0), ("sloppy", 0.1, 10.0), ("fast_biased", 0.1, 2.0))
SKIP_RATE = 0.02
TIE_RATE = 0.05


def _sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def _profiles(n: int) -> list[str]:
    out: list[str] = []
    for kind, share, _ in PROFILES:
        out += [kind] * round(share * n)
    out = (out + ["careful"] * n)[:n]
    random.Random(1).shuffle(out)
    return out


def _order(rng: random.Random, kind: str, truth: list[int], shown: list[int]) -> list[list[int]]:
    """One annotator's tiers for a prompt whose best-first order is `truth`."""
    if kind == "fast_biased":
        rest = [c for c in shown[1:]]
        rng.shuffle(rest)
        return [[shown[0]]] + [[c] for c in rest]
    if kind == "sloppy":
        order = list(truth)
        rng.shuffle(order)
    else:
        order = list(truth)
        for i in range(len(order) - 1):  # a careful reader still swaps a close neighbour now and then
            if rng.random() < 0.15:
                order[i], order[i + 1] = order[i + 1], order[i]
    tiers = [[c] for c in order]
    if kind == "careful" and rng.random() < TIE_RATE:
        tiers[1:3] = [sorted(tiers[1] + tiers[2])]
    return tiers


def _seconds(rng: random.Random, kind: str) -> float:
    median = next(m for k, _, m in PROFILES if k == kind)
    return round(median * math.exp(rng.gauss(0, 0.4)), 2)


def setup(url: str, annotators: int, name: str) -> dict[str, Any]:
    """Lead, engineer, annotators (members), the project with three rubric versions and its constitution."""
    from argon2 import PasswordHasher

    from app.accounts import security, users
    from app.models import ProjectMember, User
    from app.platform import bulk
    from app.platform.db import make_engine, make_session_factory, session_scope
    from app.projects import constitutions, projects, rubrics

    security._hasher = PasswordHasher(time_cost=1, memory_cost=8 * 1024, parallelism=1)  # seeding, not login
    engine = make_engine(url)
    with session_scope(make_session_factory(engine)) as db:
        lead = users.create_user(db, "lead@campaign.example", PASSWORD, "lead", name="Campaign lead")
        engineer = users.create_user(db, "engineer@campaign.example", PASSWORD, "engineer", name="Engineer")
        project = projects.create_project(db, lead, name=name, completions_per_prompt=K, overlap=OVERLAP,
                                          rubric_text="Prefer correct, helpful answers.", criteria=["Correctness"])
        for v, text in ((2, "Prefer correct answers; then the clearer one."),
                        (3, "Prefer correct answers; then the clearer; penalise padding.")):
            rubrics.create_version(db, project, lead, text=text, criteria=["Correctness", "Clarity"][:v - 1],
                                   base_version=v - 1, note=f"v{v}")
        constitution = constitutions.ensure_default(db, project, lead)
        # One argon2 hash for everyone (they all log in with PASSWORD): 200 hashes would be most of a small seed.
        hashed = lead.password_hash
        ids = bulk.insert_rows(db, User, [
            {"email": f"a{i}@campaign.example", "name": f"Annotator {i}", "password_hash": hashed, "role": "annotator",
             "active": True} for i in range(annotators)], ids=True)
        bulk.insert_rows(db, ProjectMember, [{"project_id": project.id, "user_id": uid, "role": "annotator"}
                                             for uid in ids]
                         + [{"project_id": project.id, "user_id": engineer.id, "role": "engineer"}])
        versions = {r.version: r.id for r in rubrics.list_versions(db, project)}
        db.flush()
        out = {"project_id": project.id, "rubric_ids": [versions[v] for v in sorted(versions)],
               "constitution_id": constitution.id, "annotator_ids": ids, "lead_id": lead.id}
    engine.dispose()
    return out


def _chunk(db: Any, seeded: dict[str, Any], start: int, count: int, rng: random.Random, t0: datetime,
           n_prompts: int, judge_run_id: int) -> tuple[int, int]:
    """One chunk of prompts with everything hanging off them; (human rankings, AI rankings) written."""
    from sqlalchemy import text

    from app.annotation.queue import display_order
    from app.models import Completion, Prompt, Ranking
    from app.platform import bulk

    project_id, rubric_ids = seeded["project_id"], seeded["rubric_ids"]
    people, kinds = seeded["annotator_ids"], seeded["kinds"]
    prompt_ids = bulk.insert_rows(db, Prompt, [
        {"project_id": project_id, "text": f"Q{start + i}: {_sentence(rng, 25)}?", "text_hash": f"{start + i:064x}",
         "split": "heldout" if (start + i) % 10 == 0 else "train", "reference": str(start + i), "meta": {}}
        for i in range(count)], ids=True)
    completion_ids = bulk.insert_rows(db, Completion, [
        {"prompt_id": pid, "text": _sentence(rng, 45), "source": "sampled", "generator_params": {}, "meta": {}}
        for pid in prompt_ids for _ in range(K)], ids=True)
    humans, ais, gold = [], [], []
    for i, pid in enumerate(prompt_ids):
        index = start + i
        cids = completion_ids[i * K:(i + 1) * K]
        truth = random.Random(index).sample(cids, K)
        if index % GOLD_EVERY == 0:
            gold.append((pid, json.dumps([[c] for c in truth])))
        at = t0 + CAMPAIGN * (index / n_prompts)
        version = rubric_ids[min(2, 3 * index // n_prompts)]
        for j in range(OVERLAP):
            who = (index + j * (len(people) // OVERLAP)) % len(people)  # three different annotators per prompt
            shown = display_order(cids, people[who], pid, 1)
            skipped = rng.random() < SKIP_RATE
            tiers = [] if skipped else _order(rng, kinds[who], truth, shown)
            when = at + timedelta(seconds=rng.uniform(0, 3600))
            humans.append({"project_id": project_id, "prompt_id": pid, "round": 1, "source": "human",
                           "annotator_id": people[who], "rubric_id": version, "tiers": tiers, "display_order": shown,
                           "flags": {}, "skipped": skipped, "skip_reason": "cannot judge" if skipped else None,
                           "seconds_spent": _seconds(rng, kinds[who]), "client_submission_id": f"seed-{pid}-{j}",
                           "meta": {}, "created_at": when})
        if index % JUDGED_EVERY == 0:
            ais.append({"project_id": project_id, "prompt_id": pid, "round": 1, "source": "ai",
                        "judge_run_id": judge_run_id, "constitution_id": seeded["constitution_id"],
                        "tiers": [[c] for c in truth], "display_order": cids, "flags": {}, "skipped": False,
                        "meta": {"method": "bradley_terry", "confidence": 0.9}, "created_at": at})
    ids = bulk.insert_rows(db, Ranking, humans + ais, ids=True)
    lo, hi = ids[0], ids[-1]
    if gold:
        db.execute(text("UPDATE prompts SET gold_tiers = CAST(g.t AS jsonb) FROM unnest(CAST(:ids AS int[]), "
                        "CAST(:tiers AS text[])) AS g(id, t) WHERE prompts.id = g.id"),
                   {"ids": [g[0] for g in gold], "tiers": [g[1] for g in gold]})
    # The pairs rankings.pair_rows expands (tier by tier; ties none), the judge's with a soft label.
    db.execute(text("""
        INSERT INTO pairs (ranking_id, prompt_id, chosen_id, rejected_id, margin, source, weight, p, metadata,
                           created_at)
        SELECT r.id, r.prompt_id, CAST(c.v AS int), CAST(d.v AS int), CAST(t2.j - t1.i AS int), r.source, 1.0,
               CASE WHEN r.source = 'ai' THEN 0.55 + 0.45 * abs(sin(r.id * 7 + t1.i)) ELSE 1.0 END,
               CASE WHEN r.source = 'ai' THEN CAST('{"low_confidence": false}' AS jsonb)
                    ELSE CAST('{}' AS jsonb) END,
               r.created_at
        FROM rankings r
        CROSS JOIN LATERAL jsonb_array_elements(r.tiers) WITH ORDINALITY AS t1(tier, i)
        CROSS JOIN LATERAL jsonb_array_elements_text(t1.tier) AS c(v)
        CROSS JOIN LATERAL jsonb_array_elements(r.tiers) WITH ORDINALITY AS t2(tier, j)
        CROSS JOIN LATERAL jsonb_array_elements_text(t2.tier) AS d(v)
        WHERE r.id BETWEEN :lo AND :hi AND t2.j > t1.i"""), {"lo": lo, "hi": hi})
    # The task each human ranking completed: leased when it was opened, completed when it was submitted.
    db.execute(text("""
        INSERT INTO assignments (project_id, prompt_id, annotator_id, round, state, leased_until, created_at,
                                 completed_at)
        SELECT project_id, prompt_id, annotator_id, round, CASE WHEN skipped THEN 'skipped' ELSE 'submitted' END,
               created_at + interval '30 minutes', created_at - seconds_spent * interval '1 second', created_at
        FROM rankings WHERE id BETWEEN :lo AND :hi AND source = 'human'"""), {"lo": lo, "hi": hi})
    return len(humans), len(ais)


def _open_prompts(db: Any, project_id: int, start: int, count: int, rng: random.Random) -> None:
    """Prompts nobody has ranked yet (K completions each): the queue annotators draw from during a bench."""
    from app.models import Completion, Prompt
    from app.platform import bulk

    prompt_ids = bulk.insert_rows(db, Prompt, [
        {"project_id": project_id, "text": f"Q{start + i}: {_sentence(rng, 25)}?", "text_hash": f"{start + i:064x}",
         "split": "train", "reference": str(start + i), "meta": {}} for i in range(count)], ids=True)
    bulk.insert_rows(db, Completion, [
        {"prompt_id": pid, "text": _sentence(rng, 45), "source": "sampled", "generator_params": {}, "meta": {}}
        for pid in prompt_ids for _ in range(K)])


def seed_campaign(url: str, rankings: int, *, annotators: int = 200, name: str = "Campaign",
                  open_prompts: int = 0, progress: bool = False) -> dict[str, Any]:
    from sqlalchemy import text

    from app.models import JudgeRun
    from app.platform.db import make_engine, make_session_factory, session_scope

    started = time.perf_counter()
    seeded = setup(url, annotators, name)
    seeded["kinds"] = _profiles(annotators)
    n_prompts = -(-rankings // OVERLAP)
    engine = make_engine(url)
    factory = make_session_factory(engine)
    with session_scope(factory) as db:
        run = JudgeRun(project_id=seeded["project_id"], constitution_id=seeded["constitution_id"],
                       name="Seeded judge run", params={"ranking": "bradley_terry"}, state="succeeded",
                       created_by_id=seeded["lead_id"])
        db.add(run)
        db.flush()
        judge_run_id = run.id
    rng = random.Random(0)
    t0 = datetime.now(UTC) - CAMPAIGN - timedelta(hours=2)
    human = ai = 0
    for start in range(0, n_prompts, CHUNK_PROMPTS):
        count = min(CHUNK_PROMPTS, n_prompts - start)
        with session_scope(factory) as db:
            h, a = _chunk(db, seeded, start, count, rng, t0, n_prompts, judge_run_id)
        human, ai = human + h, ai + a
        if progress:
            print(f"{start + count}/{n_prompts} prompts, {time.perf_counter() - started:.0f} s", file=sys.stderr)
    if open_prompts:
        with session_scope(factory) as db:
            _open_prompts(db, seeded["project_id"], n_prompts, open_prompts, rng)
    written = time.perf_counter() - started
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM (ANALYZE)"))
        pairs = int(conn.execute(text("SELECT count(*) FROM pairs")).scalar() or 0)
    kept = _keep_agreement(factory, seeded["project_id"])
    engine.dispose()
    total = time.perf_counter() - started
    return {"seed": "campaign", "project_id": seeded["project_id"], "prompts": n_prompts, "human_rankings": human,
            "ai_rankings": ai, "pairs": pairs, "annotators": annotators, "open_prompts": open_prompts,
            "annotator_kinds": {k: seeded["kinds"].count(k) for k, _, _ in PROFILES},
            "gold_prompts": -(-n_prompts // GOLD_EVERY), "rubric_versions": len(seeded["rubric_ids"]),
            "write_s": round(written, 1), "agreement_rebuild_s": round(kept, 1), "total_s": round(total, 1),
            "rankings_per_s": round(human / written) if written else None}


def _keep_agreement(factory: Any, project_id: int) -> float:
    """The kept agreement figures computed from every ranking, in one transaction: its seconds."""
    from app.models import Project
    from app.platform.db import session_scope
    from app.quality import upkeep

    t0 = time.perf_counter()
    with session_scope(factory) as db:
        project = db.get(Project, project_id)
        assert project is not None
        upkeep.rebuild(db, project)
    return time.perf_counter() - t0


def _is_empty(url: str) -> bool:
    from sqlalchemy import text

    from app.platform.db import make_engine

    engine = make_engine(url)
    with engine.connect() as conn:
        n = conn.execute(text("SELECT (SELECT count(*) FROM projects) + (SELECT count(*) FROM users)")).scalar()
    engine.dispose()
    return not n


def main(argv: list[str] | None = None) -> None:
    from app.platform.settings import Settings

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rankings", type=int, required=True, help="human rankings to write (3 per prompt)")
    parser.add_argument("--database-url", required=True, help="a migrated, empty Postgres database")
    parser.add_argument("--annotators", type=int, default=200)
    parser.add_argument("--open-prompts", type=int, default=0, help="prompts left unranked, for annotators to draw")
    parser.add_argument("--fresh", action="store_true", help="drop and recreate the database, then migrate it")
    parser.add_argument("--progress", action="store_true", help="a line on stderr per chunk of prompts")
    args = parser.parse_args(argv)
    if args.annotators < OVERLAP:
        parser.error(f"--annotators must be at least {OVERLAP}")
    url = Settings(database_url=args.database_url).database_url
    if not url.startswith("postgresql"):
        parser.error("--database-url must be a Postgres database (the seed writes with COPY)")
    if args.fresh:
        from _pg import fresh_database

        url = fresh_database(url)
    elif not _is_empty(url):
        parser.error("the database is not empty (users or projects exist); pass --fresh to recreate it")
    print(json.dumps(seed_campaign(url, args.rankings, annotators=args.annotators, open_prompts=args.open_prompts,
                                   progress=args.progress)))


if __name__ == "__main__":
    main()
