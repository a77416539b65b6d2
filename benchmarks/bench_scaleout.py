"""Scale-out: annotation throughput against server processes, on one port and on two ("two hosts"), straight to
Postgres and through PgBouncer in transaction mode.

One project is seeded once (K=4, `--prompts` prompts, overlap 2, `--clients` annotators with API tokens); then each
configuration starts its servers, spreads the clients over their ports (client k on port k mod ports), runs
bench_annotation's next-task → submit loop for `--seconds` after a warm-up (ANALYZE halfway through it, as
autovacuum would: bench_annotation.analyze), stops the servers and checks the
database (no prompt over its overlap, no annotator twice on a prompt, six pairs per ranking: cumulative over every
configuration so far). A configuration is `HOSTSxWORKERS:MODE`: HOSTS `preflab serve`-like uvicorn processes on
their own ports, each with `--workers WORKERS`; MODE `direct` (prepared statements on, the default),
`unprepared` (direct, PREFLAB_DATABASE_PREPARED_STATEMENTS=false: what turning them off costs) or `pgbouncer`
(through a PgBouncer this script starts and stops, prepared statements off). Postgres connections are sampled
from pg_stat_activity during the run (the peak for the database).

    PREFLAB_BENCH_DATABASE_URL=postgresql://postgres@127.0.0.1:5432/preflab_bench \\
        .venv/bin/python benchmarks/bench_scaleout.py [--seconds 10] [--configs 1x1:direct 2x2:pgbouncer …]

Prints one JSON line per configuration (with the load average before and after it), then a summary line.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_annotation import (  # noqa: E402
    DEFAULT_URL,
    _cpu_seconds,
    analyze,
    check_database,
    load,
    reset_database,
    seed,
    start_server,
)

from app.platform.settings import Settings  # noqa: E402
from tests.support.pgbouncer import Bouncer, pgbouncer  # noqa: E402

DEFAULT_CONFIGS = ["1x1:direct", "1x1:unprepared", "1x1:pgbouncer", "1x2:direct", "1x2:pgbouncer",
                   "2x1:direct", "2x1:pgbouncer", "2x2:direct", "2x2:unprepared", "2x2:pgbouncer"]
MODES = ("direct", "unprepared", "pgbouncer")


def parse_config(config: str) -> tuple[int, int, str]:
    """'2x1:pgbouncer' → (2 hosts, 1 worker each, 'pgbouncer'), or a ValueError naming what is wrong."""
    shape, _, mode = config.partition(":")
    hosts, _, workers = shape.partition("x")
    if not (hosts.isdigit() and workers.isdigit() and int(hosts) >= 1 and int(workers) >= 1) or mode not in MODES:
        raise ValueError(f"--configs: {config!r} is not HOSTSxWORKERS:MODE (e.g. 2x1:pgbouncer; MODE one of "
                         f"{', '.join(MODES)})")
    return int(hosts), int(workers), mode


class ConnectionSampler:
    """The Postgres backends serving one database, sampled every `every_s` from pg_stat_activity: their peak
    number, and the CPU they spent (from /proc: Postgres runs on this machine; a backend first seen after the
    first sample started during the run, so all its CPU counts)."""

    def __init__(self, url: str, every_s: float = 0.25) -> None:
        self.engine = create_engine(url, pool_size=1, max_overflow=0)
        self.every_s = every_s
        self.peak = 0
        self._first: dict[int, float] = {}
        self._last: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with self.engine.connect() as conn:
            first = True
            while not self._stop.is_set():
                pids = conn.execute(text("SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                                         " AND pid <> pg_backend_pid()")).scalars().all()
                conn.rollback()
                self.peak = max(self.peak, len(pids))
                for pid in pids:
                    cpu = _cpu_seconds(pid)
                    self._first.setdefault(pid, cpu if first else 0.0)
                    self._last[pid] = max(cpu, self._last.get(pid, 0.0))
                first = False
                self._stop.wait(self.every_s)

    @property
    def cpu_s(self) -> float:
        return sum(self._last[pid] - self._first[pid] for pid in self._last)

    def __enter__(self) -> ConnectionSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.engine.dispose()


@contextmanager
def servers(url: str, hosts: int, workers: int, data_dir: str, env: dict[str, str]) -> Iterator[list[Any]]:
    """`hosts` uvicorn processes on their own ports (each `--workers workers`); yields [(process, base URL)]."""
    started: list[Any] = []
    try:
        for _ in range(hosts):
            started.append(start_server(url, workers, data_dir, env))
        yield started
    finally:
        for proc, _ in started:
            proc.terminate()
        for proc, _ in started:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def run_config(config: str, url: str, project_id: int, tokens: list[str], args: argparse.Namespace,
               data_dir: str, index: int = 0) -> dict[str, Any]:
    """One configuration; `index` (its place in --configs) keeps a repeated configuration's submission ids new."""
    hosts, workers, mode = parse_config(config)
    result: dict[str, Any] = {"bench": "scaleout", "config": config, "hosts": hosts, "workers_per_host": workers,
                              "server_processes": hosts * workers, "mode": mode, "clients": len(tokens),
                              "seconds": args.seconds, "cpus": os.cpu_count(),
                              "load_before": [round(x, 2) for x in os.getloadavg()]}
    env = {"PREFLAB_DATABASE_POOL_SIZE": str(args.pool_size)}
    with ExitStack() as stack:
        server_url = url
        bouncer: Bouncer | None = None
        if mode == "pgbouncer":
            bouncer = stack.enter_context(pgbouncer(url, pool_size=args.bouncer_pool))
            server_url = bouncer.url
            result["pgbouncer_pool_size"] = bouncer.pool_size
        if mode != "direct":
            env["PREFLAB_DATABASE_PREPARED_STATEMENTS"] = "false"
        before = check_database(url, project_id, args.overlap)["rankings"]
        started = stack.enter_context(servers(server_url, hosts, workers, data_dir, env))
        pids = [proc.pid for proc, _ in started] + ([bouncer.pid] if bouncer else [])
        cpu0 = {pid: _cpu_seconds(pid) for pid in pids}
        t0, client_cpu0 = time.perf_counter(), time.process_time()
        with ConnectionSampler(url) as sampler:
            run = asyncio.run(load([base for _, base in started], project_id, tokens, warmup=args.warmup,
                                   seconds=args.seconds, run_id=f"{index}:{config}-",
                                   settle=functools.partial(analyze, url)))
        wall = time.perf_counter() - t0
        cpu = {pid: _cpu_seconds(pid) - cpu0[pid] for pid in pids}
        made = max(check_database(url, project_id, args.overlap)["rankings"] - before, 1)
        server_cpu = sum(cpu[proc.pid] for proc, _ in started)
        run["server_cpu_ms_per_ranking"] = round(server_cpu / made * 1e3, 2)
        run["server_cpu_share"] = round(server_cpu / wall, 2)
        if bouncer:
            run["pgbouncer_cpu_ms_per_ranking"] = round(cpu[bouncer.pid] / made * 1e3, 3)
        run["postgres_cpu_ms_per_ranking"] = round(sampler.cpu_s / made * 1e3, 2)
        run["client_cpu_ms_per_ranking"] = round((time.process_time() - client_cpu0) / made * 1e3, 2)
        run["postgres_connections_peak"] = sampler.peak
    result |= run
    result["database"] = check_database(url, project_id, args.overlap)
    result["load_after"] = [round(x, 2) for x in os.getloadavg()]
    return result


def clean(database: dict[str, int]) -> bool:
    return all(v == 0 for k, v in database.items() if k.startswith(("over_", "prompts_", "rankings_with")))


def markdown(results: list[dict[str, Any]]) -> str:
    """The benchmarks page's table of one run: a row per configuration."""
    rows = ["| configuration | processes | rankings/s | next p50 / p95 | submit p50 / p95 | server CPU per ranking "
            "| Postgres CPU per ranking | Postgres connections (peak) | errors | load before → after |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        shape = f"{r['hosts']} port{'s' if r['hosts'] > 1 else ''} × --workers {r['workers_per_host']}"
        pgb = r.get("pgbouncer_cpu_ms_per_ranking")
        bouncer = f" (+{pgb:.1f} PgBouncer)" if pgb is not None else ""
        rows.append(f"| {shape}, {r['mode']} | {r['server_processes']} | {r['rankings_per_s']:.1f} "
                    f"| {r['next']['p50_ms']:.0f} / {r['next']['p95_ms']:.0f} ms "
                    f"| {r['submit']['p50_ms']:.0f} / {r['submit']['p95_ms']:.0f} ms "
                    f"| {r['server_cpu_ms_per_ranking']:.1f} ms{bouncer} | {r['postgres_cpu_ms_per_ranking']:.1f} ms "
                    f"| {r['postgres_connections_peak']} "
                    f"| {sum(r['errors'].values())} | {r['load_before'][0]:.1f} → {r['load_after'][0]:.1f} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per configuration")
    parser.add_argument("--warmup", type=float, default=3.0)
    # Room for every configuration: past ~90 % of prompts × overlap ranked, the queue's search for an open prompt
    # costs Postgres several times more per task, and a queue that runs dry measures nothing.
    parser.add_argument("--prompts", type=int, default=40_000)
    parser.add_argument("--overlap", type=int, default=2)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--pool-size", type=int, default=10,
                        help="PREFLAB_DATABASE_POOL_SIZE of each server process (as many again may overflow)")
    parser.add_argument("--bouncer-pool", type=int, default=8,
                        help="server connections PgBouncer keeps to Postgres (its pool_size)")
    parser.add_argument("--configs", nargs="+", default=DEFAULT_CONFIGS, help="HOSTSxWORKERS:MODE, in order")
    parser.add_argument("--markdown", action="store_true", help="also write the results as a Markdown table to stderr")
    args = parser.parse_args()
    for config in args.configs:
        try:
            parse_config(config)
        except ValueError as exc:
            parser.error(str(exc))
    url = Settings(database_url=os.environ.get("PREFLAB_BENCH_DATABASE_URL", DEFAULT_URL)).database_url
    started = time.monotonic()
    reset_database(url)
    project_id, tokens, _ = seed(url, prompts=args.prompts, chars=300, overlap=args.overlap,
                                 annotators=args.clients, name="scaleout")
    results = []
    with tempfile.TemporaryDirectory() as data_dir:
        for index, config in enumerate(args.configs):
            result = run_config(config, url, project_id, tokens, args, data_dir, index)
            results.append(result)
            print(json.dumps(result), flush=True)
    summary = {"bench": "scaleout_summary", "seconds_total": round(time.monotonic() - started, 1),
               "errors": sum(sum(r["errors"].values()) for r in results),
               "database_clean": all(clean(r["database"]) for r in results),
               "empty_queue": sum(r["empty_queue"] for r in results),
               "queue_filled": round(results[-1]["database"]["rankings"] / (args.prompts * args.overlap), 3),
               "rankings_per_s": [[r["config"], r["rankings_per_s"]] for r in results],  # in order: repeats kept
               "load_after": [round(x, 2) for x in os.getloadavg()]}
    print(json.dumps(summary))
    if args.markdown:
        print(markdown(results), file=sys.stderr)


if __name__ == "__main__":
    main()
