"""Load test: 200 annotators with think time doing next-task → submit, plus an export and a training run, on Postgres.

The set-up is `bench_annotation.py`'s (a fresh database, K=4 prompts, annotators with API tokens, uvicorn as its own
process) plus a job worker for exports. Each simulated annotator opens a task, thinks for a random 2–8 s (scaled by
`--think`; 0 makes it a throughput test), submits a ranking of the completions in a random order (sometimes with a
tie, sometimes sent twice like a double click: idempotent by submission id), and goes again. A third of the way in,
a lead requests a pairs export through the API, waits for the worker to finish it, and enqueues a reward-model
training run on it (the worker runs exports only, so the training job stays queued and is cancelled at the end).
Afterwards the database is checked: no prompt ranked by more annotators than its overlap, no annotator ranking or
holding a prompt twice, six pairs per ranking.

    PREFLAB_BENCH_DATABASE_URL=postgresql://postgres@127.0.0.1:5432/preflab_load \\
        .venv/bin/python benchmarks/load_annotators.py [--annotators 200] [--seconds 120] [--think 1.0] [--workers 1]

Prints one JSON line: requests/s, rankings/s, p50/p95/p99 of next and submit, errors, the duplicate checks, the
export and training results, and the machine's load average before, during and after (the machine is shared).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _http import KeepAliveClient, ProtocolError, Response, StaleConnection  # noqa: E402 - after the sys.path set-up
from _pg import fresh_database  # noqa: E402
from bench_annotation import REPO, SECRET, _cpu_seconds, _ms, check_database, seed, start_server  # noqa: E402

from app.platform.settings import Settings  # noqa: E402

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/preflab_load"
# The annotation budget (docs/benchmarks.md): p95 of next-task and of submit within 50 ms.
P95_BUDGET_MS = 50.0
# How long past the end of the load the lead still waits for the export to be ready (a busy machine is slow).
EXPORT_GRACE_S = 60.0


@dataclass
class LoadConfig:
    annotators: int = 200
    """Simulated annotators, each with its own token and HTTP connection."""
    seconds: float = 120.0
    """Measured duration, after the warm-up."""
    warmup: float = 10.0
    """Seconds before measuring: annotators start staggered over this time, the server's pools fill."""
    think: float = 1.0
    """Scale of the think time; 1.0 is 2–8 s per ranking (read the prompt and four answers, drag, submit)."""
    think_range: tuple[float, float] = (2.0, 8.0)
    """Think time per ranking in seconds, uniform, before scaling."""
    resubmit: float = 0.02
    """Share of submits sent a second time with the same submission id (a double click or a retry)."""
    export_at: float = 1 / 3
    """When the export and training enqueue happen, as a share of the measured time."""
    seed: int = 0


@dataclass
class Stats:
    lat: dict[str, list[float]] = field(default_factory=lambda: {"next": [], "submit": []})
    errors: dict[str, int] = field(default_factory=dict)
    requests: int = 0
    """Requests answered inside the measured window (their latencies are in `lat`)."""
    sent: int = 0
    """Every request sent, warm-up included: the denominator of the error rate (errors count from the start too)."""
    rankings: int = 0
    resubmits_answered_200: int = 0
    stale_connection_retries: int = 0
    empty: int = 0

    def error(self, what: str) -> None:
        self.errors[what] = self.errors.get(what, 0) + 1


async def _annotator(base: str, project_id: int, token: str, k: int, cfg: LoadConfig, stats: Stats,
                     t_measure: float, t_end: float) -> None:
    rng = random.Random(cfg.seed * 100_003 + k)
    lo, hi = cfg.think_range

    def think() -> float:
        return rng.uniform(lo, hi) * cfg.think

    # A lean client (benchmarks/_http.py): httpx would spend more of the shared CPU than the server it measures.
    async with KeepAliveClient(base, headers={"Authorization": f"Bearer {token}"}, timeout=30) as http:
        # Staggered start: 200 people do not press "next" in the same millisecond.
        await asyncio.sleep(rng.uniform(0, min(cfg.warmup, hi * cfg.think)))
        n = 0

        async def call(kind: str, method: str, url: str, json: Any = None) -> tuple[Response | None, bool]:
            """The response (None after a transport error) and whether it took a second try."""
            t0 = time.perf_counter()
            retried = False
            while True:
                stats.sent += 1
                try:
                    r = await http.request(method, url, json=json)
                    break
                except StaleConnection as exc:
                    # The server closed the idle keep-alive connection (`--keep-alive`, 75 s) as the request went out
                    # on it. Browsers resend on a fresh connection in that case, and both calls are safe to repeat
                    # (next returns the caller's lease, submit is idempotent by submission id), so resend once.
                    if retried:
                        stats.error(f"{kind} {type(exc).__name__}")
                        return None, retried
                    retried = True
                    stats.stale_connection_retries += 1
                except (OSError, TimeoutError, ProtocolError) as exc:
                    stats.error(f"{kind} {type(exc).__name__}")
                    return None, retried
            t1 = time.perf_counter()
            if t_measure <= t0 and t1 <= t_end:
                stats.requests += 1
                stats.lat[kind].append(t1 - t0)  # with the resend, if any: what the person waited
            return r, retried

        while time.perf_counter() < t_end:
            r, _ = await call("next", "GET", f"/api/projects/{project_id}/tasks/next")
            if r is None:
                continue
            if r.status_code == 204:
                stats.empty += 1
                await asyncio.sleep(think())
                continue
            if r.status_code != 200:
                stats.error(f"next {r.status_code}")
                continue
            task = r.json()
            ids = [c["id"] for c in task["completions"]]
            rng.shuffle(ids)
            tiers = [[i] for i in ids]
            if rng.random() < 0.1:  # a tie between the two worst
                tiers = tiers[:-2] + [tiers[-2] + tiers[-1]]
            spent = think()
            await asyncio.sleep(spent)
            if time.perf_counter() >= t_end:
                break  # the person left mid-task: the lease simply runs out
            body = {"assignment_id": task["assignment_id"], "tiers": tiers, "submission_id": f"a{k}-{n}",
                    "rubric_version": task["rubric"]["version"], "seconds_spent": round(spent, 2)}
            n += 1
            for attempt in range(2 if rng.random() < cfg.resubmit else 1):
                s, retried = await call("submit", "POST", f"/api/projects/{project_id}/rankings", json=body)
                if s is None:
                    continue
                # A first submit answers 201, or 200 when a resend found the first copy already recorded.
                expected = {201, 200} if attempt == 0 and retried else {201} if attempt == 0 else {200}
                if s.status_code not in expected:
                    stats.error(f"submit {s.status_code}" + (" (resubmit)" if attempt else ""))
                elif attempt == 0:
                    if t_measure <= time.perf_counter() <= t_end:
                        stats.rankings += 1
                else:
                    stats.resubmits_answered_200 += 1


async def _export_and_train(base: str, project_id: int, lead_token: str, start_at: float,
                            deadline: float) -> dict[str, Any]:
    """A lead exports the pairs so far and enqueues a reward-model run on them, through the API, mid-load."""
    await asyncio.sleep(max(0.0, start_at - time.perf_counter()))
    out: dict[str, Any] = {}
    async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {lead_token}"},
                                 timeout=60) as http:
        t0 = time.perf_counter()
        r = await http.post(f"/api/projects/{project_id}/exports", json={"kind": "pairs", "format": "jsonl"})
        out["export_request_status"] = r.status_code
        out["export_request_ms"] = round((time.perf_counter() - t0) * 1e3, 1)
        if r.status_code != 202:
            out["export_error"] = r.text[:300]
            return out
        export_id = r.json()["export_id"]
        state: dict[str, Any] = {}
        while time.perf_counter() < deadline:
            state = (await http.get(f"/api/exports/{export_id}")).json()
            if state.get("status") in ("ready", "failed", "cancelled"):
                break
            await asyncio.sleep(0.5)
        out.update(export_status=state.get("status"), export_rows=state.get("row_count"),
                   export_ready_s=round(time.perf_counter() - t0, 2))
        if state.get("status") != "ready":
            return out
        t1 = time.perf_counter()
        r = await http.post(f"/api/projects/{project_id}/training-runs",
                            json={"kind": "reward", "export_id": export_id})
        out["training_request_status"] = r.status_code
        out["training_request_ms"] = round((time.perf_counter() - t1) * 1e3, 1)
        if r.status_code != 202:
            out["training_error"] = r.text[:300]
            return out
        out["training_run_id"] = r.json()["run_id"]
        out["training_state"] = (await http.get(f"/api/training-runs/{out['training_run_id']}")).json()["state"]
    return out


async def _cancel_run(base: str, lead_token: str, run_id: int) -> int:
    async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {lead_token}"}, timeout=30) as http:
        return (await http.post(f"/api/training-runs/{run_id}/cancel")).status_code


async def _sample_load(samples: list[float], until: float) -> None:
    while time.perf_counter() < until:
        samples.append(os.getloadavg()[0])
        await asyncio.sleep(5)


async def drive(base: str, project_id: int, tokens: list[str], lead_token: str, cfg: LoadConfig) -> dict[str, Any]:
    """Run the annotators and the lead together; return the measured figures (no database checks)."""
    stats = Stats()
    loads: list[float] = []
    t_start = time.perf_counter()
    t_measure, t_end = t_start + cfg.warmup, t_start + cfg.warmup + cfg.seconds
    lead = asyncio.create_task(_export_and_train(base, project_id, lead_token, t_measure + cfg.export_at * cfg.seconds,
                                                 deadline=t_end + EXPORT_GRACE_S))
    await asyncio.gather(_sample_load(loads, t_end),
                         *(_annotator(base, project_id, t, k, cfg, stats, t_measure, t_end)
                           for k, t in enumerate(tokens)))
    lead_result = await lead
    if "training_run_id" in lead_result:
        lead_result["training_cancel_status"] = await _cancel_run(base, lead_token, lead_result["training_run_id"])
    errors = sum(stats.errors.values())
    next_ms, submit_ms = _ms(stats.lat["next"]), _ms(stats.lat["submit"])
    return {
        "requests": stats.requests, "requests_per_s": round(stats.requests / cfg.seconds, 1),
        "rankings": stats.rankings, "rankings_per_s": round(stats.rankings / cfg.seconds, 2),
        "next": next_ms, "submit": submit_ms,
        "p95_within_budget": next_ms["p95_ms"] <= P95_BUDGET_MS and submit_ms["p95_ms"] <= P95_BUDGET_MS,
        "errors": errors, "requests_sent": stats.sent,
        "error_rate": round(errors / max(stats.sent, 1), 5), "error_kinds": stats.errors,
        "resubmits_answered_200": stats.resubmits_answered_200,
        "stale_connection_retries": stats.stale_connection_retries, "empty_queue_answers": stats.empty,
        "export_and_training": lead_result,
        "load_during": {"min": min(loads, default=None), "max": max(loads, default=None),
                        "mean": round(sum(loads) / len(loads), 2) if loads else None},
    }


def start_worker(url: str, data_dir: str, kinds: str = "export") -> subprocess.Popen[bytes]:
    """`preflab worker` for `kinds` as its own process, against the same database and data directory."""
    env = os.environ | {"PREFLAB_DATABASE_URL": url, "PREFLAB_SECRET_KEY": SECRET, "PREFLAB_ENV": "dev",
                        "PREFLAB_DATA_DIR": data_dir}
    return subprocess.Popen([sys.executable, "-c", "from app.cli import main; main()", "worker", "--kinds", kinds,
                             "--poll", "0.2"], cwd=REPO, env=env)


def lead_token(url: str, name: str) -> str:
    """A token for the project's lead (seeded by `seed`), who exports and starts training."""
    from app.accounts import users
    from app.platform.db import make_engine, make_session_factory, session_scope

    engine = make_engine(url)
    with session_scope(make_session_factory(engine)) as db:
        lead = users.get_by_email(db, f"lead-{name}@example.org")
        token = users.create_token(db, lead)[1]
    engine.dispose()
    return token


def run(url: str, cfg: LoadConfig, *, prompts: int, overlap: int, workers: int) -> dict[str, Any]:
    """Fresh database, seed, server and worker up, drive the load, check the database; the result as a dict."""
    url = fresh_database(url)
    result: dict[str, Any] = {"bench": "load_annotators", "annotators": cfg.annotators, "seconds": cfg.seconds,
                              "think_s": [round(cfg.think_range[0] * cfg.think, 2),
                                          round(cfg.think_range[1] * cfg.think, 2)],
                              "k": 4, "prompts": prompts, "overlap": overlap, "uvicorn_workers": workers,
                              "cpus": os.cpu_count(), "load_before": os.getloadavg()[0],
                              "p95_budget_ms": P95_BUDGET_MS}
    project_id, tokens, _ = seed(url, prompts=prompts, chars=300, overlap=overlap, annotators=cfg.annotators,
                                 name="load")
    lead = lead_token(url, "load")
    with tempfile.TemporaryDirectory() as data_dir:
        server, base = start_server(url, workers, data_dir)
        worker = start_worker(url, data_dir)
        try:
            server_cpu0, client_cpu0 = _cpu_seconds(server.pid), time.process_time()
            result.update(asyncio.run(drive(base, project_id, tokens, lead, cfg)))
            # Load-independent figures: CPU per ranking made in the whole run (warm-up included), server and client.
            made = max(check_database(url, project_id, overlap)["rankings"], 1)
            result["server_cpu_ms_per_ranking"] = round((_cpu_seconds(server.pid) - server_cpu0) / made * 1e3, 1)
            result["client_cpu_ms_per_ranking"] = round((time.process_time() - client_cpu0) / made * 1e3, 1)
        finally:
            for proc in (worker, server):
                proc.terminate()
            for proc in (worker, server):
                proc.wait(timeout=60)
    result["load_after"] = os.getloadavg()[0]
    result["database"] = db = check_database(url, project_id, overlap)
    result["duplicate_assignments"] = (db["over_assigned_prompts"] + db["over_ranked_prompts"]
                                       + db["prompts_ranked_twice_by_one_annotator"]
                                       + db["prompts_assigned_twice_to_one_annotator"])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--annotators", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--warmup", type=float, default=10.0)
    parser.add_argument("--think", type=float, default=1.0, help="scale of the 2–8 s think time (0: none)")
    parser.add_argument("--think-range", type=float, nargs=2, default=(2.0, 8.0), metavar=("MIN", "MAX"))
    parser.add_argument("--resubmit", type=float, default=0.02)
    parser.add_argument("--workers", type=int, default=1, help="uvicorn worker processes")
    parser.add_argument("--prompts", type=int, default=10_000)
    parser.add_argument("--overlap", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    url = Settings(database_url=os.environ.get("PREFLAB_BENCH_DATABASE_URL", DEFAULT_URL)).database_url
    cfg = LoadConfig(annotators=args.annotators, seconds=args.seconds, warmup=args.warmup, think=args.think,
                     think_range=tuple(args.think_range), resubmit=args.resubmit, seed=args.seed)
    print(json.dumps(run(url, cfg, prompts=args.prompts, overlap=args.overlap, workers=args.workers)))


if __name__ == "__main__":
    main()
