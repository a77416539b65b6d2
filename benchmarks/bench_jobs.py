"""Job-system overhead on Postgres: claim throughput and claim latency with 2 worker processes.

Enqueues N jobs, then two processes claim and finish them as fast as they can (the handler is not run:
this measures the queue, not the work). Prints one JSON line. Database from PREFLAB_BENCH_DATABASE_URL
(default postgresql://postgres@127.0.0.1:5432/preflab_bench_jobs; it is created and reset).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _pg import fresh_database  # noqa: E402 - after the sys.path set-up

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/preflab_bench_jobs"


def _worker(url: str, name: str, out: mp.Queue) -> None:  # type: ignore[type-arg]
    from app.jobs import queue as jobs
    from app.platform.db import make_engine, make_session_factory, session_scope

    factory = make_session_factory(make_engine(url))
    latencies: list[float] = []
    claimed = 0
    while True:
        t0 = time.perf_counter()
        with session_scope(factory) as db:
            job = jobs.claim(db, name)
            if job is None:
                break
            job_id = job.id
        latencies.append(time.perf_counter() - t0)
        with session_scope(factory) as db:
            jobs.succeed(db, job_id, name, {})
        claimed += 1
    out.put((claimed, latencies))


def measure_jobs(n_jobs: int = 2000, workers: int = 2, url: str | None = None) -> dict:
    from app.models import Job
    from app.platform.db import make_engine, make_session_factory, session_scope

    url = fresh_database(url or os.environ.get("PREFLAB_BENCH_DATABASE_URL", DEFAULT_URL))
    factory = make_session_factory(make_engine(url))
    with session_scope(factory) as db:
        db.add_all(Job(kind="sample_completions", payload={}, state="queued", result={}) for _ in range(n_jobs))
    out: mp.Queue = mp.Queue()  # type: ignore[type-arg]
    procs = [mp.Process(target=_worker, args=(url, f"bench-{i}", out)) for i in range(workers)]
    t0 = time.perf_counter()
    for p in procs:
        p.start()
    results = [out.get() for _ in procs]
    elapsed = time.perf_counter() - t0
    for p in procs:
        p.join()
    latencies = sorted(x for _, lat in results for x in lat)
    total = sum(c for c, _ in results)
    with session_scope(factory) as db:
        from sqlalchemy import func, select

        succeeded = db.scalar(select(func.count(Job.id)).where(Job.state == "succeeded"))
        double = db.scalar(select(func.count(Job.id)).where(Job.attempts != 1))
    return {
        "jobs": n_jobs, "workers": workers, "claimed": total, "succeeded": succeeded, "claimed_twice": double,
        "jobs_per_s": round(total / elapsed, 1),
        "claim_latency_ms_p50": round(1000 * statistics.median(latencies), 2),
        "claim_latency_ms_p95": round(1000 * latencies[int(0.95 * (len(latencies) - 1))], 2),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


if __name__ == "__main__":
    print(json.dumps({"bench": "jobs"} | measure_jobs()))
