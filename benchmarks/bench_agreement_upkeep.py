"""The CPU the kept agreement figures cost per human ranking, as rankings arrive, with and without folding.

Rankings arrive in batches of `--batch` (written as `rankings.write_rankings` writes them, marking their groups), one
ranking for each of `--batch` prompts in turn, so every group grows a ranking at a time up to its size; after each
batch a drain folds them in, one `upkeep.drain` transaction at a time as the drain job runs them. Measured over the
drains only: the CPU of this process (time.process_time) and of its Postgres backend (utime + stime from
/proc/<backend pid>/stat, when the server runs on this host; null otherwise), per ranking. Two ways of draining:

- `fold`: a group that only gained rankings has them folded into its kept state, each compared with the ones there
  (partial.extend): O(n) per new ranking;
- `full`: every marked group computed from all its rankings (partial.extend switched off): what a drain did before
  folding, O(n²) pairs per group per drain.

Two shapes of `--rankings` rankings: `campaign` (3 rankings per prompt, K = 4, as seed_campaign writes them) and `wide`
(`--wide` rankings per prompt: a gold-set study where every annotator ranks every prompt). Each run starts from a
fresh migrated database; the figures are checked against a rebuild from every ranking at the end.

    PREFLAB_BENCH_DATABASE_URL=postgresql://postgres@127.0.0.1:5432/preflab_upkeep \\
        .venv/bin/python benchmarks/bench_agreement_upkeep.py [--rankings 10000] [--batch 50] [--wide 100]

Prints one JSON line per (shape, way).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/preflab_upkeep"
K = 4


def _backend_cpu_s(pid: int) -> float | None:
    """A Postgres backend's CPU seconds so far (None: not a process of this host)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _arrivals(prompts: list[tuple[int, list[int]]], per_prompt: int, people: list[int], rubric_id: int,
              seed: int) -> list[dict[str, Any]]:
    """Every ranking in arrival order: one per prompt in turn, each prompt's j-th by a different annotator."""
    rng = random.Random(seed)
    t0 = datetime(2026, 3, 2, 8, tzinfo=UTC)
    out: list[dict[str, Any]] = []
    for j in range(per_prompt):
        for i, (pid, cids) in enumerate(prompts):
            truth = random.Random(pid).sample(cids, K)
            order = truth if rng.random() < 0.7 else rng.sample(cids, K)
            tiers = [[order[0]], order[1:3], [order[3]]] if rng.random() < 0.15 else [[c] for c in order]
            skipped = rng.random() < 0.03
            out.append({"project_id": None, "prompt_id": pid, "round": 1, "source": "human",
                        "annotator_id": people[(i + j) % len(people)], "rubric_id": rubric_id,
                        "tiers": [] if skipped else tiers, "display_order": rng.sample(cids, K), "flags": {},
                        "skipped": skipped, "skip_reason": "cannot judge" if skipped else None,
                        "seconds_spent": round(rng.uniform(2, 60), 1), "client_submission_id": f"u-{pid}-{j}",
                        "meta": {}, "created_at": t0 + timedelta(minutes=len(out))})
    return out


def run(url: str, shape: str, way: str, rankings: int, batch: int, wide: int) -> dict[str, Any]:
    from _pg import fresh_database
    from seed_campaign import _open_prompts, setup
    from sqlalchemy import select, text

    from app.annotation.rankings import NewRanking, write_rankings
    from app.models import Completion, Project, Prompt
    from app.platform.db import make_engine, make_session_factory, session_scope
    from app.quality import partial, upkeep

    per_prompt = 3 if shape == "campaign" else wide
    url = fresh_database(url)
    seeded = setup(url, max(per_prompt, 200), f"Upkeep {shape}")
    engine = make_engine(url)
    factory = make_session_factory(engine)
    project_id = seeded["project_id"]
    with session_scope(factory) as db:
        _open_prompts(db, project_id, 0, -(-rankings // per_prompt), random.Random(1))
        by_prompt: dict[int, list[int]] = {}
        for pid, cid in db.execute(select(Completion.prompt_id, Completion.id)
                                   .join(Prompt, Prompt.id == Completion.prompt_id)
                                   .where(Prompt.project_id == project_id).order_by(Completion.id)):
            by_prompt.setdefault(pid, []).append(cid)
    arrivals = _arrivals(sorted(by_prompt.items()), per_prompt, seeded["annotator_ids"], seeded["rubric_ids"][0],
                         seed=7)[:rankings]
    for row in arrivals:
        row["project_id"] = project_id
    extend = partial.extend
    if way == "full":
        partial.extend = lambda *_a, **_k: None  # every group computed anew
    app_s = backend_s = 0.0
    backend_known = True
    drains = groups = extended = 0
    try:
        for start in range(0, len(arrivals), batch):
            with session_scope(factory) as db:
                write_rankings(db, [NewRanking(row) for row in arrivals[start:start + batch]])
            while True:
                with session_scope(factory) as db:
                    pid = int(db.scalar(text("SELECT pg_backend_pid()")) or 0)
                    b0, a0 = _backend_cpu_s(pid), time.process_time()
                    project = db.get(Project, project_id)
                    assert project is not None
                    drained = upkeep.drain(db, project)
                    db.flush()
                a1, b1 = time.process_time(), _backend_cpu_s(pid)  # after the commit
                app_s += a1 - a0
                if b0 is None or b1 is None:
                    backend_known = False
                else:
                    backend_s += b1 - b0
                assert drained is not None
                drains, groups, extended = drains + 1, groups + drained.groups, extended + drained.extended
                if drained.marks < upkeep.DRAIN_BATCH:
                    break
    finally:
        partial.extend = extend
    check = _check(factory, project_id)
    engine.dispose()
    n = len(arrivals)
    return {"bench": "agreement_upkeep", "shape": shape, "way": way, "rankings": n, "rankings_per_prompt": per_prompt,
            "batch": batch, "drains": drains, "groups_updated": groups, "groups_folded": extended,
            "app_cpu_ms_per_ranking": round(1e3 * app_s / n, 3),
            "postgres_cpu_ms_per_ranking": round(1e3 * backend_s / n, 3) if backend_known else None,
            "app_cpu_s": round(app_s, 2), "postgres_cpu_s": round(backend_s, 2) if backend_known else None,
            "kept_equal_rebuilt": check, "load_avg": os.getloadavg()}


def _check(factory: Any, project_id: int) -> bool:
    """The kept totals equal the ones a rebuild from every ranking leaves (the rebuild rolled back)."""
    from sqlalchemy import select

    from app.models import AgreementTotal, Project
    from app.quality import upkeep

    def totals(db: Any) -> dict[Any, Any]:
        return {(r.version, r.kind, r.key): (r.rankings, r.state, r.median_seconds) for r in db.execute(
            select(AgreementTotal).where(AgreementTotal.project_id == project_id)).scalars()}

    db = factory()
    try:
        kept = totals(db)
        project = db.get(Project, project_id)
        assert project is not None
        upkeep.rebuild(db, project)
        return kept == totals(db)
    finally:
        db.rollback()
        db.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rankings", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=50, help="rankings written between two drains")
    parser.add_argument("--wide", type=int, default=100, help="rankings per prompt in the wide shape")
    parser.add_argument("--shapes", default="campaign,wide")
    parser.add_argument("--ways", default="full,fold")
    args = parser.parse_args()
    for name, value in (("--rankings", args.rankings), ("--batch", args.batch), ("--wide", args.wide)):
        if value < 1:
            parser.error(f"{name}: must be at least 1, not {value}")
    url = os.environ.get("PREFLAB_BENCH_DATABASE_URL", DEFAULT_URL)
    for shape in args.shapes.split(","):
        if shape not in ("campaign", "wide"):
            parser.error(f"--shapes: no shape {shape!r} (campaign, wide)")
        for way in args.ways.split(","):
            if way not in ("full", "fold"):
                parser.error(f"--ways: no way {way!r} (full, fold)")
            print(json.dumps(run(url, shape, way, args.rankings, args.batch, args.wide)), flush=True)


if __name__ == "__main__":
    main()
