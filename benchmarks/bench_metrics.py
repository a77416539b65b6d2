"""The time one /metrics scrape takes at N pairs (default 100,000), on Postgres or SQLite.

Seeding: bench_backup's project (K = 4, 3 annotators rank every prompt, 18 pairs a prompt), written by COPY, plus
an assignment per ranking (submitted), 200 live leases on extra prompts, and 1,000 finished jobs. The scrape is a
real GET /metrics from an admin's token through the app (TestClient), after one warm-up; prints one JSON line with
the median and the worst of the timed scrapes and the collector's own time (preflab_metrics_scrape_seconds).

    .venv/bin/python benchmarks/bench_metrics.py [--pairs 100000] [--database postgres|sqlite] [--scrapes 20]

Postgres from PREFLAB_BENCH_DATABASE_URL (default postgresql://postgres@127.0.0.1:5432/preflab_bench_metrics),
dropped and re-created.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _seed import seed_pairs  # noqa: E402 - after the sys.path set-up

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/preflab_bench_metrics"


def _database(kind: str, tmp: Path) -> str:
    if kind == "sqlite":
        from app.platform.migrate import upgrade

        url = f"sqlite:///{tmp}/bench.db"
        upgrade(url)
        return url
    from _pg import fresh_database

    return fresh_database(os.environ.get("PREFLAB_BENCH_DATABASE_URL", DEFAULT_URL))


def _more_rows(url: str) -> tuple[int, str]:
    """Assignments behind the rankings, live leases, finished jobs; returns (project id, an admin's token)."""
    from sqlalchemy import text

    from app.accounts import users
    from app.models import Assignment, Job, Prompt, utcnow
    from app.platform import bulk
    from app.platform.db import make_engine, make_session_factory, session_scope

    engine = make_engine(url)
    factory = make_session_factory(engine)
    now = utcnow()
    with session_scope(factory) as db:
        db.execute(text("INSERT INTO assignments (project_id, prompt_id, annotator_id, round, state, leased_until, "
                        "created_at, completed_at) SELECT project_id, prompt_id, annotator_id, round, 'submitted', "
                        "created_at, created_at, created_at FROM rankings"))
        project_id, annotator_id = db.execute(text("SELECT project_id, annotator_id FROM rankings LIMIT 1")).one()
        prompt_ids = bulk.insert_rows(db, Prompt, [
            {"project_id": project_id, "text": f"open {i}", "text_hash": f"open-{i:058x}", "split": "train"}
            for i in range(200)], ids=True)
        bulk.insert_rows(db, Assignment, [
            {"project_id": project_id, "prompt_id": pid, "annotator_id": annotator_id, "round": 1, "state": "leased",
             "leased_until": now + timedelta(minutes=i % 30), "created_at": now} for i, pid in enumerate(prompt_ids)])
        bulk.insert_rows(db, Job, [
            {"kind": ("export", "judge", "sample_completions", "train")[i % 4], "project_id": project_id,
             "payload": {}, "state": ("succeeded", "failed")[i % 7 == 0], "progress": 1.0, "attempts": 1,
             "max_attempts": 3, "result": {}, "created_at": now - timedelta(hours=1),
             "started_at": now - timedelta(hours=1), "finished_at": now - timedelta(hours=1) + timedelta(seconds=i)}
            for i in range(1000)])
        admin = users.create_user(db, "admin@bench.example", "correct horse battery staple", "admin")
        _, token = users.create_token(db, admin)
    engine.dispose()
    return project_id, token


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=100_000)
    parser.add_argument("--database", choices=("postgres", "sqlite"), default="postgres")
    parser.add_argument("--scrapes", type=int, default=20)
    args = parser.parse_args()
    from fastapi.testclient import TestClient
    from prometheus_client.parser import text_string_to_metric_families

    from app.main import create_app
    from app.platform.settings import Settings

    with tempfile.TemporaryDirectory() as tmp:
        url = _database(args.database, Path(tmp))
        t0 = time.perf_counter()
        _, pairs = seed_pairs(url, args.pairs, name="bench metrics")
        project_id, token = _more_rows(url)
        seed_s = time.perf_counter() - t0
        app = create_app(Settings(env="dev", database_url=url, secret_key="m" * 48, data_dir=Path(tmp) / "data"))
        client = TestClient(app, headers={"Authorization": f"Bearer {token}"})
        assert client.get("/metrics").status_code == 200  # warm-up: connections, statement caches
        times, collector = [], []
        for _ in range(args.scrapes):
            started = time.perf_counter()
            r = client.get("/metrics")
            times.append(time.perf_counter() - started)
            assert r.status_code == 200, r.text
            families = {f.name: f for f in text_string_to_metric_families(r.text)}
            collector.append(families["preflab_metrics_scrape_seconds"].samples[0].value)
        depth = next(s.value for s in families["preflab_queue_depth"].samples if s.labels["project"] == str(project_id))
        app.state.engine.dispose()
    print(json.dumps({"bench": "metrics_scrape", "database": args.database, "pairs": pairs,
                      "seed_s": round(seed_s, 1), "scrapes": args.scrapes,
                      "scrape_ms_median": round(statistics.median(times) * 1000, 1),
                      "scrape_ms_max": round(max(times) * 1000, 1),
                      "collector_ms_median": round(statistics.median(collector) * 1000, 1),
                      "queue_depth": depth, "cpus": os.cpu_count(),
                      "loadavg": [round(x, 2) for x in os.getloadavg()]}))


if __name__ == "__main__":
    main()
