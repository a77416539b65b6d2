"""Annotation throughput: 32 API clients doing next-task → submit against the real app on Postgres.

For each server shape (one uvicorn process, then `--workers 2`), the database is rebuilt and seeded (K=4, 20k prompts
of ~300-character completions, 32 annotators with API tokens), the server is started on a free port as its own
process beside one `preflab worker` (which keeps the agreement figures up to date as rankings arrive; leave it out
with `--no-job-worker`), and every client loops next-task → submit for a fixed time after a warm-up. Afterwards the
database is checked: no prompt over its overlap, six pairs per K=4 ranking. Then the ranking page's server time is
measured in-process (an ASGI wrapper times each request, no network) for K=4 completions of 2,000 characters.

    PREFLAB_BENCH_DATABASE_URL=postgresql://postgres@127.0.0.1:5432/preflab_bench \\
        .venv/bin/python benchmarks/bench_annotation.py [--seconds 20] [--workers 1 2]

Prints one JSON line with every figure and the machine's load average.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import create_engine, text

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from _http import KeepAliveClient  # noqa: E402

from app.platform.settings import Settings  # noqa: E402

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/preflab_bench"
SECRET = "bench-secret-key-that-is-long-enough-0123456789abcdef"
WORDS = ("the answer follows because each step keeps the invariant and the total is checked twice "
         "so we conclude with confidence that").split()


def _text(rng: random.Random, chars: int) -> str:
    out: list[str] = []
    n = 0
    while n < chars:
        word = rng.choice(WORDS)
        out.append(word)
        n += len(word) + 1
    return " ".join(out)[:chars]


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _ms(values: list[float]) -> dict[str, float]:
    return {"n": len(values), "p50_ms": round(_percentile(values, 0.50) * 1e3, 2),
            "p95_ms": round(_percentile(values, 0.95) * 1e3, 2), "p99_ms": round(_percentile(values, 0.99) * 1e3, 2)}


def reset_database(url: str) -> None:
    from app.platform.db import make_engine
    from app.platform.migrate import upgrade

    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(text("DROP SCHEMA public CASCADE"))
        conn.execute(text("CREATE SCHEMA public"))
    engine.dispose()
    upgrade(url)


def seed(url: str, *, prompts: int, chars: int, overlap: int, annotators: int, name: str,
         seed_: int = 0, selection: str = "random", extra_share: float = 0.0) -> tuple[int, list[str], list[int]]:
    """A project with `prompts` ready prompts (K=4), `annotators` members; returns (project id, tokens, user ids).
    With a `selection` other than random, every prompt gets a random priority (as a priorities job would write);
    with `disagreement`, the top `extra_share` of them also get 2 extra overlap (as contested prompts would)."""
    from argon2 import PasswordHasher

    from app.accounts import security, users
    from app.platform import bulk
    from app.platform.db import make_engine, make_session_factory, session_scope
    from app.projects import projects

    security._hasher = PasswordHasher(time_cost=1, memory_cost=8 * 1024, parallelism=1)  # seeding, not login
    rng = random.Random(seed_)
    engine = make_engine(url)
    with session_scope(make_session_factory(engine)) as db:
        lead = users.create_user(db, f"lead-{name}@example.org", "bench password 123", "lead")
        project = projects.create_project(db, lead, name=name, completions_per_prompt=4, overlap=overlap,
                                          rubric_text="Rank correct, clear answers first.", criteria=["Correctness"])
        tokens, ids = [], []
        for i in range(annotators):
            person = users.create_user(db, f"a{i}-{name}@example.org", "bench password 123", "annotator")
            projects.add_member(db, project, lead, email=person.email, role="annotator")
            tokens.append(users.create_token(db, person)[1])
            ids.append(person.id)
        from app.models import Completion, Prompt

        prompt_ids = bulk.insert_rows(db, Prompt, [
            {"project_id": project.id, "text": f"Question {i}: {_text(rng, 200)}", "text_hash": f"{name}-{i}",
             "split": "train", "meta": {}} for i in range(prompts)], ids=True)
        bulk.insert_rows(db, Completion, [
            {"prompt_id": pid, "text": _text(rng, chars), "source": "imported", "generator_params": {},
             "meta": {}} for pid in prompt_ids for _ in range(4)])
        project_id = project.id
        if selection != "random":
            from app.annotation import selection as queue_selection

            queue_selection.set_selection(db, project, lead, selection)
            scores = {pid: rng.random() for pid in prompt_ids}
            top = sorted(scores, key=scores.__getitem__, reverse=True)[:int(len(scores) * extra_share)]
            extras = {pid: 2 for pid in top} if selection == "disagreement" else {}
            queue_selection.store_priorities(db, project, scores, selection=selection, extras=extras)
    with engine.begin() as conn:
        conn.execute(text("ANALYZE"))
    engine.dispose()
    return project_id, tokens, ids


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpu_seconds(pid: int) -> float:
    """user + system CPU of a process and its children (uvicorn's workers), from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for p in [pid, *_children(pid)]:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except OSError:
            continue
    return total


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _sockets(port: int, state: str) -> set[str]:
    """Inodes of the TCP sockets on local port `port` in `state` (/proc/net/tcp's hex code: 01 established,
    0A listening)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == state:
                inodes.add(fields[9])
    return inodes


def connections_per_process(pid: int, port: int) -> list[int]:
    """Established connections to `port` that each of the server's processes holds (uvicorn's workers: which one
    a keep-alive connection lands on is the kernel's choice at connect, and it stays there), most first."""
    inodes = _sockets(port, "01")  # ESTABLISHED
    counts = []
    for p in _children(pid) or [pid]:
        try:
            fds = [os.readlink(f) for f in Path(f"/proc/{p}/fd").iterdir()]
        except OSError:
            continue
        counts.append(sum(1 for fd in fds if fd.startswith("socket:[") and fd[8:-1] in inodes))
    return sorted(counts, reverse=True)


def _postgres_cpu_seconds() -> float | None:
    """user + system CPU of this machine's Postgres processes, the postmaster's exited backends included (their CPU
    moves into its children's figure when they are reaped); None when no Postgres runs here."""
    tick, total, found = os.sysconf("SC_CLK_TCK"), 0.0, False
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            comm, fields = stat.read_text().split(" (", 1)[1].rsplit(")", 1)
        except OSError:
            continue
        if comm == "postgres":
            found = True
            values = fields.split()
            total += sum(int(v) for v in values[11:15]) / tick
    return total if found else None


def start_server(url: str, workers: int, data_dir: str,
                 env: dict[str, str] | None = None) -> tuple[subprocess.Popen[bytes], str]:
    """`preflab serve` on a free port (`--workers N`) with `env` added to its environment, without access lines;
    (process, base URL)."""
    port = _free_port()
    env = os.environ | {"PREFLAB_DATABASE_URL": url, "PREFLAB_SECRET_KEY": SECRET, "PREFLAB_ENV": "dev",
                        "PREFLAB_DATA_DIR": data_dir} | (env or {})
    cmd = [sys.executable, "-m", "app.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--workers", str(workers), "--no-access-log"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            # Every worker listens on a socket of its own once its start-up is done (app.web.serving): clients that
            # connected before the last one listened would all stay with the others.
            if (httpx.get(f"{base}/healthz", timeout=1).status_code == 200
                    and (workers == 1 or len(_sockets(port, "0A")) >= workers)):
                return proc, base
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("server did not start")


def start_job_worker(url: str, data_dir: str) -> subprocess.Popen[bytes]:
    """`preflab worker` against the database, as a deployment runs one beside the server."""
    env = os.environ | {"PREFLAB_DATABASE_URL": url, "PREFLAB_SECRET_KEY": SECRET, "PREFLAB_ENV": "dev",
                        "PREFLAB_DATA_DIR": data_dir}
    return subprocess.Popen([sys.executable, "-m", "app.cli", "worker"], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def load(base: str | list[str], project_id: int, tokens: list[str], *, warmup: float,
               seconds: float, run_id: str = "", probe: Callable[[], Any] | None = None,
               settle: Callable[[], Any] | None = None, raw: dict[str, list[float]] | None = None) -> dict[str, Any]:
    """Each token is one client looping next-task → submit; only requests after the warm-up are measured. Given
    several base URLs (servers on several ports), client k talks to base k mod their number. `run_id` keeps
    submission ids apart when several runs share one project (a repeated id is an idempotent resend). `probe` is
    called once halfway through the measured time (in a thread); its result is the run's "probe". `settle` is called
    once halfway through the warm-up (in a thread): `analyze`. The measured latencies of next and submit are also
    appended to `raw`'s lists, for figures over several runs."""
    bases = [base] if isinstance(base, str) else base
    lat: dict[str, list[float]] = {"next": [], "submit": []}
    errors: dict[str, int] = {}
    counts = {"rankings": 0, "empty": 0}
    per_client = [0] * len(tokens)
    t_start = time.perf_counter()
    t_measure, t_end = t_start + warmup, t_start + warmup + seconds

    async def client(token: str, k: int) -> None:
        # The lean client of benchmarks/_http.py: httpx would take ~7 ms of the shared CPU per ranking.
        auth = {"Authorization": f"Bearer {token}"}
        async with KeepAliveClient(bases[k % len(bases)], headers=auth, timeout=30) as http:
            n = 0
            while (now := time.perf_counter()) < t_end:
                measured = now >= t_measure
                t0 = time.perf_counter()
                r = await http.request("GET", f"/api/projects/{project_id}/tasks/next")
                t1 = time.perf_counter()
                if r.status_code == 204:
                    counts["empty"] += 1
                    await asyncio.sleep(0.05)
                    continue
                if r.status_code != 200:
                    errors[f"next {r.status_code}"] = errors.get(f"next {r.status_code}", 0) + 1
                    continue
                task = r.json()
                body = {"assignment_id": task["assignment_id"], "tiers": [[c["id"]] for c in task["completions"]],
                        "rubric_version": task["rubric"]["version"], "submission_id": f"{run_id}c{k}-{n}",
                        "seconds_spent": 1.0}
                n += 1
                t2 = time.perf_counter()
                s = await http.request("POST", f"/api/projects/{project_id}/rankings", json=body)
                t3 = time.perf_counter()
                if s.status_code != 201:
                    errors[f"submit {s.status_code}"] = errors.get(f"submit {s.status_code}", 0) + 1
                    continue
                if measured and t3 <= t_end:
                    lat["next"].append(t1 - t0)
                    lat["submit"].append(t3 - t2)
                    counts["rankings"] += 1
                    per_client[k] += 1

    async def probed() -> Any:
        await asyncio.sleep(max(0.0, t_measure + seconds / 2 - time.perf_counter()))
        return await asyncio.to_thread(probe) if probe is not None else None

    async def settled() -> None:
        if settle is not None:
            await asyncio.sleep(max(0.0, t_start + warmup / 2 - time.perf_counter()))
            await asyncio.to_thread(settle)

    *_, probed_value, _ = await asyncio.gather(*(client(t, k) for k, t in enumerate(tokens)), probed(), settled())
    if raw is not None:
        raw["next"].extend(lat["next"])
        raw["submit"].extend(lat["submit"])
    spread = sorted(per_client)
    return {**({"probe": probed_value} if probe is not None else {}),
            "rankings_per_client": {"min": spread[0], "median": spread[len(spread) // 2], "max": spread[-1]},
            "rankings": counts["rankings"], "rankings_per_s": round(counts["rankings"] / seconds, 1),
            "next": _ms(lat["next"]), "submit": _ms(lat["submit"]),
            "all_requests": _ms(lat["next"] + lat["submit"]), "errors": errors, "empty_queue": counts["empty"]}


def analyze(url: str) -> None:
    """ANALYZE the tables a run writes, halfway through its warm-up, as autovacuum does once a table has grown (after
    50 rows and then 10 %). Without it, every database connection keeps the plan its foreign-key checks made while
    `rankings` was empty, a sequential scan of the whole table for each pair inserted (six per ranking), and this
    machine's Postgres runs with autovacuum off."""
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text("ANALYZE rankings, pairs, assignments"))
    engine.dispose()


def check_database(url: str, project_id: int, overlap: int) -> dict[str, int]:
    """What the queue promises, counted afterwards: no prompt over its overlap (plus its extra overlap), no annotator
    on a prompt twice, every ranking stored as the pairs its tiers expand to (six for K=4 without ties)."""
    from app.annotation.pairs import expand_tiers

    engine = create_engine(url)
    with engine.connect() as conn:
        def count(sql: str) -> int:
            return int(conn.execute(text(sql), {"p": project_id, "o": overlap}).scalar_one())

        result = {
            "over_assigned_prompts": count(
                "SELECT count(*) FROM (SELECT a.prompt_id FROM assignments a JOIN prompts p ON p.id = a.prompt_id"
                " WHERE a.project_id = :p"
                " AND (a.state = 'submitted' OR (a.state = 'leased' AND a.leased_until > now()))"
                " GROUP BY a.prompt_id, a.round, p.extra_overlap HAVING count(*) > :o + p.extra_overlap) x"),
            "over_ranked_prompts": count(
                "SELECT count(*) FROM (SELECT r.prompt_id FROM rankings r JOIN prompts p ON p.id = r.prompt_id"
                " WHERE r.project_id = :p AND r.annotator_id IS NOT NULL AND NOT r.skipped"
                " GROUP BY r.prompt_id, r.round, p.extra_overlap HAVING count(*) > :o + p.extra_overlap) x"),
            "prompts_with_extra_overlap": count("SELECT count(*) FROM prompts WHERE project_id = :p"
                                                " AND extra_overlap > 0"),
            "rankings_beyond_the_overlap": count(
                "SELECT coalesce(sum(n - :o), 0) FROM (SELECT count(*) AS n FROM rankings WHERE project_id = :p"
                " AND annotator_id IS NOT NULL AND NOT skipped GROUP BY prompt_id, round HAVING count(*) > :o) x"),
            "prompts_ranked_twice_by_one_annotator": count(
                "SELECT count(*) FROM (SELECT 1 FROM rankings WHERE project_id = :p AND annotator_id IS NOT NULL"
                " GROUP BY annotator_id, prompt_id, round HAVING count(*) > 1) x"),
            "prompts_assigned_twice_to_one_annotator": count(
                "SELECT count(*) FROM (SELECT 1 FROM assignments WHERE project_id = :p"
                " GROUP BY annotator_id, prompt_id, round HAVING count(*) > 1) x"),
            "rankings": count("SELECT count(*) FROM rankings WHERE project_id = :p"),
            "pairs": count("SELECT count(*) FROM pairs JOIN rankings r ON r.id = pairs.ranking_id"
                           " WHERE r.project_id = :p"),
            "rankings_with_wrong_pair_count": sum(
                stored != len(expand_tiers(tiers)) for tiers, stored in conn.execute(text(
                    "SELECT r.tiers, (SELECT count(*) FROM pairs WHERE ranking_id = r.id) FROM rankings r"
                    " WHERE r.project_id = :p AND NOT r.skipped"), {"p": project_id})),
            "submitted_assignments": count("SELECT count(*) FROM assignments WHERE project_id = :p"
                                           " AND state = 'submitted'"),
        }
    engine.dispose()
    return result


def render_times(url: str, renders: int, prompts: int, data_dir: str) -> dict[str, Any]:
    """Server time of GET /projects/{id}/annotate, in-process: an ASGI wrapper times the app, no network."""
    from fastapi.testclient import TestClient

    from app.accounts import users
    from app.main import create_app
    from app.models import User
    from app.platform.db import make_engine, make_session_factory, session_scope

    project_id, _, (user_id,) = seed(url, prompts=prompts, chars=2000, overlap=1, annotators=1, name="render")
    engine = make_engine(url)
    with session_scope(make_session_factory(engine)) as db:
        cookie = users.start_session(db, db.get(User, user_id), hours=1)
    engine.dispose()
    app = create_app(Settings(env="dev", database_url=url, secret_key=SECRET, data_dir=Path(data_dir)))
    times: list[float] = []

    async def timed(scope, receive, send):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        await app(scope, receive, send)
        times.append(time.perf_counter() - t0)

    with TestClient(timed, base_url="http://testserver", cookies={"preflab_session": cookie}) as client:  # type: ignore[arg-type]
        for i in range(renders + 20):
            r = client.get(f"/projects/{project_id}/annotate")
            assert r.status_code == 200 and "2000" not in r.headers.get("x-error", ""), r.status_code
            if i == 19:
                times.clear()  # warm-up: template compilation, pool connections
    app.state.engine.dispose()
    return {"page": "GET /projects/{id}/annotate", "k": 4, "completion_chars": 2000, "project_prompts": prompts,
            "renders": len(times), "p50_ms": round(_percentile(times, 0.5) * 1e3, 2),
            "p95_ms": round(_percentile(times, 0.95) * 1e3, 2), "mean_ms": round(statistics.mean(times) * 1e3, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--prompts", type=int, default=20_000)
    parser.add_argument("--overlap", type=int, default=2)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--job-worker", action=argparse.BooleanOptionalAction, default=True,
                        help="run one `preflab worker` beside the server, as a deployment does: it keeps the "
                             "agreement figures up to date as the rankings arrive, on the same cores")
    parser.add_argument("--renders", type=int, default=200)
    parser.add_argument("--render-prompts", type=int, default=2_000)
    parser.add_argument("--selection", default="random", choices=("random", "uncertainty", "disagreement"),
                        help="the project's queue order; not random: every prompt gets a random priority")
    parser.add_argument("--extra-share", type=float, default=0.1,
                        help="with --selection disagreement: the share of prompts (the top priorities) given 2 "
                             "extra overlap, as contested prompts get it, so the queue runs at the raised cap")
    args = parser.parse_args()
    url = Settings(database_url=os.environ.get("PREFLAB_BENCH_DATABASE_URL", DEFAULT_URL)).database_url
    result: dict[str, Any] = {"bench": "annotation", "clients": args.clients, "k": 4, "prompts": args.prompts,
                              "overlap": args.overlap, "seconds": args.seconds, "cpus": os.cpu_count(),
                              "selection": args.selection, "extra_share": args.extra_share,
                              "load_before": os.getloadavg()[0], "runs": {}}
    with tempfile.TemporaryDirectory() as data_dir:
        for workers in args.workers:
            reset_database(url)
            project_id, tokens, _ = seed(url, prompts=args.prompts, chars=300, overlap=args.overlap,
                                         annotators=args.clients, name="bench", selection=args.selection,
                                         extra_share=args.extra_share)
            proc, base = start_server(url, workers, data_dir)
            jobs = start_job_worker(url, data_dir) if args.job_worker else None
            try:
                jobs_cpu0 = _cpu_seconds(jobs.pid) if jobs else 0.0
                cpu0, t0, db_cpu0 = _cpu_seconds(proc.pid), time.perf_counter(), _postgres_cpu_seconds()
                client_cpu0 = time.process_time()
                port = int(base.rsplit(":", 1)[1])
                run = asyncio.run(load(base, project_id, tokens, warmup=args.warmup, seconds=args.seconds,
                                       probe=functools.partial(connections_per_process, proc.pid, port),
                                       settle=functools.partial(analyze, url)))
                run["connections_per_process"] = run.pop("probe")
                server_cpu, db_cpu = _cpu_seconds(proc.pid) - cpu0, _postgres_cpu_seconds()
                wall = time.perf_counter() - t0
                # Load-independent figures: CPU the app server and the client spent per ranking (whole run,
                # warm-up included, so divided by every ranking made in it).
                made = check_database(url, project_id, args.overlap)["rankings"]
                run["server_cpu_ms_per_ranking"] = round(server_cpu / max(made, 1) * 1e3, 2)
                run["client_cpu_ms_per_ranking"] = round((time.process_time() - client_cpu0) / max(made, 1) * 1e3, 2)
                run["server_cpu_share"] = round(server_cpu / wall, 2)
                if db_cpu is not None and db_cpu0 is not None:  # a local Postgres: its share of the cores
                    run["database_cpu_ms_per_ranking"] = round((db_cpu - db_cpu0) / max(made, 1) * 1e3, 2)
                if jobs is not None:  # the worker's upkeep of the agreement figures (its Postgres part is above)
                    run["job_worker_cpu_ms_per_ranking"] = round((_cpu_seconds(jobs.pid) - jobs_cpu0)
                                                                 / max(made, 1) * 1e3, 2)
            finally:
                for running in (proc, jobs):
                    if running is not None:
                        running.terminate()
                        running.wait(timeout=30)
            run["load_1min_after"] = os.getloadavg()[0]
            run["database"] = check_database(url, project_id, args.overlap)
            result["runs"][f"workers_{workers}"] = run
        if args.renders:
            reset_database(url)
            result["render"] = render_times(url, args.renders, args.render_prompts, data_dir)
    result["load_after"] = os.getloadavg()[0]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
