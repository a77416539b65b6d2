"""Export throughput and memory on Postgres: seed ~1,000,000 pairs with COPY, export them as JSONL and Parquet.

Seeding: one project, K = 4 completions per prompt, 3 annotators rank every prompt (random orders, seeded), so
each prompt gives 3 × 6 pairs. Each export runs in a fresh child process through the same writer the `export`
job uses (one REPEATABLE READ snapshot, server-side cursor, batches); the child reports its wall time and peak
RSS. Prints one JSON line. Database from PREFLAB_BENCH_DATABASE_URL (default
postgresql://postgres@127.0.0.1:5432/preflab_bench_export; it is dropped and re-created).

    .venv/bin/python benchmarks/bench_export.py [--pairs 1000000] [--formats jsonl,parquet] [--repeats 2] [--reuse]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _pg import fresh_database  # noqa: E402 - after the sys.path set-up

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/preflab_bench_export"
K = 4
ANNOTATORS = 3
PAIRS_PER_PROMPT = ANNOTATORS * K * (K - 1) // 2
CHUNK_PROMPTS = 5_000
WORDS = ("the model answer reasoning step value because therefore result check first second then total sum "
         "number compute error careful explain why which when where prompt helpful honest harmless").split()


def _sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def seed(url: str, n_pairs: int) -> tuple[int, int]:
    """(project id, pairs written): prompts, completions, rankings and pairs by COPY, in chunks of prompts."""
    from sqlalchemy import text

    from app.db import make_engine, make_session_factory, session_scope
    from app.models import Completion, Pair, Prompt, Ranking
    from app.services import projects, users
    from app.services.bulk import _copy_rows
    from app.services.pairs import expand_tiers

    factory = make_session_factory(make_engine(url))
    rng = random.Random(0)
    with session_scope(factory) as db:
        lead = users.create_user(db, "lead@bench.example", "correct horse battery staple", "lead")
        people = [users.create_user(db, f"a{i}@bench.example", "correct horse battery staple", "annotator")
                  for i in range(ANNOTATORS)]
        project = projects.create_project(db, lead, name="bench export", completions_per_prompt=K,
                                          overlap=ANNOTATORS, rubric_text="Prefer correct, helpful answers.",
                                          criteria=["Correctness"])
        project_id, rubric_id, annotator_ids = project.id, project.current_rubric_id, [p.id for p in people]
    n_prompts = -(-n_pairs // PAIRS_PER_PROMPT)
    written = 0
    for start in range(0, n_prompts, CHUNK_PROMPTS):
        count = min(CHUNK_PROMPTS, n_prompts - start)
        with session_scope(factory) as db:
            prompt_ids = _copy_rows(db, Prompt, [
                {"project_id": project_id, "text": f"Q{start + i}: {_sentence(rng, 25)}?",
                 "text_hash": f"{start + i:064x}", "split": "heldout" if (start + i) % 10 == 0 else "train",
                 "reference": str(start + i)} for i in range(count)], ids=True)
            completion_ids = _copy_rows(db, Completion, [
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
            ranking_ids = _copy_rows(db, Ranking, ranking_rows, ids=True)
            pair_rows = [{"ranking_id": rid, "prompt_id": pid, "chosen_id": s.chosen, "rejected_id": s.rejected,
                          "margin": s.margin, "source": "human", "weight": 1.0, "p": 1.0}
                         for rid, (pid, order) in zip(ranking_ids, orders, strict=True)
                         for s in expand_tiers([[c] for c in order])]
            _copy_rows(db, Pair, pair_rows, ids=False)
            written += len(pair_rows)
    # Steady state, as a production database is: hint bits set and statistics fresh, so the first export does
    # not pay for the bulk load's clean-up.
    with factory.kw["bind"].connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM (FREEZE, ANALYZE)"))
    return project_id, written


def export_child(url: str, project_id: int, fmt: str, out: str) -> None:
    """Runs in its own process: one export, then one JSON line with seconds, rows and peak RSS."""
    from app.db import make_engine
    from app.services.export_writer import ExportSpec, write_export

    engine = make_engine(url)
    t0 = time.perf_counter()
    result = write_export(engine, ExportSpec(project_id, "pairs", fmt), Path(out) / fmt, secret="b" * 48)
    seconds = time.perf_counter() - t0
    size = sum(f.stat().st_size for f in (Path(out) / fmt).rglob("*") if f.is_file())
    usage = resource.getrusage(resource.RUSAGE_SELF)
    rss_mb = usage.ru_maxrss / 1024  # Linux reports KiB
    # CPU seconds of this process (the Postgres backend's share is not in it): the figure load does not move.
    print(json.dumps({"rows": result.row_count, "seconds": seconds, "peak_rss_mb": rss_mb, "bytes": size,
                      "cpu_s": usage.ru_utime + usage.ru_stime}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=1_000_000)
    parser.add_argument("--formats", default="jsonl,parquet")
    parser.add_argument("--repeats", type=int, default=2, help="exports per format; the best is reported")
    parser.add_argument("--reuse", action="store_true", help="export the already seeded database again")
    parser.add_argument("--child", nargs=4, metavar=("URL", "PROJECT", "FORMAT", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        url, project, fmt, out = args.child
        export_child(url, int(project), fmt, out)
        return
    url = os.environ.get("PREFLAB_BENCH_DATABASE_URL", DEFAULT_URL)
    t0 = time.perf_counter()
    if args.reuse:
        from sqlalchemy import create_engine, text

        from app.settings import Settings

        url = Settings(database_url=url).database_url
        with create_engine(url).connect() as conn:
            project_id, pairs = 1, int(conn.execute(text("SELECT count(*) FROM pairs")).scalar() or 0)
    else:
        url = fresh_database(url)
        project_id, pairs = seed(url, args.pairs)
    seed_s = time.perf_counter() - t0
    report: dict[str, object] = {"bench": "export", "pairs": pairs, "seed_s": round(seed_s, 1),
                                 "cpus": os.cpu_count(), "loadavg_before": [round(x, 2) for x in os.getloadavg()]}
    with tempfile.TemporaryDirectory() as out:
        for fmt in args.formats.split(","):
            runs = []
            for _ in range(args.repeats):
                child = subprocess.run([sys.executable, __file__, "--child", url, str(project_id), fmt, out],
                                       capture_output=True, text=True, check=True)
                runs.append(json.loads(child.stdout.strip().splitlines()[-1]))
                assert runs[-1]["rows"] == pairs, runs[-1]
            best = min(runs, key=lambda r: r["seconds"])
            report[fmt] = {"pairs_per_s": round(pairs / best["seconds"]), "seconds": round(best["seconds"], 2),
                           "seconds_each": [round(r["seconds"], 2) for r in runs],
                           "python_cpu_s": round(best["cpu_s"], 2),
                           "peak_rss_mb": round(max(r["peak_rss_mb"] for r in runs), 1),
                           "mb_on_disk": round(best["bytes"] / 1e6, 1),
                           "loadavg_after": [round(x, 2) for x in os.getloadavg()]}
    report["targets"] = {"jsonl_pairs_per_s": 100_000, "parquet_pairs_per_s": 200_000, "peak_rss_mb": 400}
    print(json.dumps(report))


if __name__ == "__main__":
    main()
