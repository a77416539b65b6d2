"""Backup and restore time on Postgres at N pairs (default 1,000,000): `preflab backup`, then `preflab restore`
into a second, empty database and data directory, through the same functions the commands call.

Seeding: one project, K = 4, 3 annotators rank every prompt (each prompt gives 3 × 6 pairs), rows written with
the app's bulk insert (COPY), plus one 1 MB export file and a run's files in the data directory. Prints one JSON
line. Databases from PREFLAB_BENCH_DATABASE_URL (default postgresql://postgres@127.0.0.1:5432/preflab_bench_backup)
and the same name with `_restored`; both are dropped and re-created.

    .venv/bin/python benchmarks/bench_backup.py [--pairs 1000000]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _pg import fresh_database  # noqa: E402 - after the sys.path set-up

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/preflab_bench_backup"
K = 4
ANNOTATORS = 3
PAIRS_PER_PROMPT = ANNOTATORS * K * (K - 1) // 2
CHUNK_PROMPTS = 5_000
WORDS = ("the model answer reasoning step value because therefore result check first second then total sum "
         "number compute error careful explain why which when where prompt helpful honest harmless").split()


def _sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def seed(url: str, n_pairs: int) -> int:
    """Pairs written: prompts, completions, rankings and pairs by COPY (app.services.bulk), in chunks of prompts."""
    from app.db import make_engine, make_session_factory, session_scope
    from app.models import Completion, Pair, Prompt, Ranking
    from app.services import bulk, projects, users
    from app.services.pairs import expand_tiers

    engine = make_engine(url)
    factory = make_session_factory(engine)
    rng = random.Random(0)
    with session_scope(factory) as db:
        lead = users.create_user(db, "lead@bench.example", "correct horse battery staple", "lead")
        people = [users.create_user(db, f"a{i}@bench.example", "correct horse battery staple", "annotator")
                  for i in range(ANNOTATORS)]
        project = projects.create_project(db, lead, name="bench backup", completions_per_prompt=K,
                                          overlap=ANNOTATORS, rubric_text="Prefer correct, helpful answers.",
                                          criteria=["Correctness"])
        project_id, rubric_id, annotator_ids = project.id, project.current_rubric_id, [p.id for p in people]
    n_prompts = -(-n_pairs // PAIRS_PER_PROMPT)
    written = 0
    for start in range(0, n_prompts, CHUNK_PROMPTS):
        count = min(CHUNK_PROMPTS, n_prompts - start)
        with session_scope(factory) as db:
            prompt_ids = bulk.insert_rows(db, Prompt, [
                {"project_id": project_id, "text": f"Q{start + i}: {_sentence(rng, 25)}?",
                 "text_hash": f"{start + i:064x}", "split": "train", "reference": str(start + i)}
                for i in range(count)], ids=True)
            completion_ids = bulk.insert_rows(db, Completion, [
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
            ranking_ids = bulk.insert_rows(db, Ranking, ranking_rows, ids=True)
            pair_rows = [{"ranking_id": rid, "prompt_id": pid, "chosen_id": s.chosen, "rejected_id": s.rejected,
                          "margin": s.margin, "source": "human", "weight": 1.0, "p": 1.0}
                         for rid, (pid, order) in zip(ranking_ids, orders, strict=True)
                         for s in expand_tiers([[c] for c in order])]
            bulk.insert_rows(db, Pair, pair_rows)
            written += len(pair_rows)
    engine.dispose()
    return written


def _data_dir(path: Path) -> None:
    """An export's and a run's files, as the data directory holds them (sizes in the range real ones have)."""
    (path / "exports" / "1").mkdir(parents=True)
    (path / "exports" / "1" / "pairs.jsonl").write_bytes(os.urandom(1 << 20))
    (path / "runs" / "1" / "model").mkdir(parents=True)
    (path / "runs" / "1" / "model" / "model.safetensors").write_bytes(os.urandom(8 << 20))
    (path / "jobs").mkdir()
    (path / "jobs" / "1.log").write_text("step 1\n" * 1000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=1_000_000)
    args = parser.parse_args()
    from app.backup import backup, restore
    from app.settings import Settings

    url = os.environ.get("PREFLAB_BENCH_DATABASE_URL", DEFAULT_URL)
    t0 = time.perf_counter()
    src_url = fresh_database(url)
    pairs = seed(src_url, args.pairs)
    seed_s = time.perf_counter() - t0
    dst_url = fresh_database(f"{url}_restored")
    report: dict[str, object] = {"bench": "backup", "pairs": pairs, "seed_s": round(seed_s, 1),
                                 "cpus": os.cpu_count(), "loadavg_before": [round(x, 2) for x in os.getloadavg()]}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        _data_dir(root / "src-data")
        src = Settings(env="dev", database_url=src_url, secret_key="b" * 48, data_dir=root / "src-data")
        dst = Settings(env="dev", database_url=dst_url, secret_key="b" * 48, data_dir=root / "dst-data")
        t0 = time.perf_counter()
        manifest = backup(src, root / "backup")
        report["backup_s"] = round(time.perf_counter() - t0, 2)
        report["backup_mb"] = round(sum(f.stat().st_size for f in (root / "backup").rglob("*") if f.is_file()) / 1e6,
                                    1)
        t0 = time.perf_counter()
        restored = restore(dst, root / "backup")  # into the migrated, empty database: its tables are replaced
        report["restore_s"] = round(time.perf_counter() - t0, 2)
        assert restored.counts["pairs"] == pairs == manifest["counts"]["pairs"]
    report["rows"] = sum(n for t, n in manifest["counts"].items() if t != "alembic_version")
    report["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(report))


if __name__ == "__main__":
    main()
