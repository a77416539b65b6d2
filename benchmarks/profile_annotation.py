"""The annotation path's own cost: server CPU and SQL statements per ranking, with no network and no contention.

bench_annotation.py measures 32 clients against a real server, where the figures move with the machine's load
(other processes, the Postgres backends, the clients themselves, threads taking turns at the GIL). This drives the
app in this process through ASGI, one request at a time, next-task → submit for `--rankings` rankings on a
bench_annotation project (K=4, 300-character completions), and reports this process's CPU per ranking: all of it,
and the median and least of 50-ranking stretches (the least is the figure a busy machine disturbs least), and the
CPU of this machine's Postgres processes over the same rankings (one request at a time: no lock waits). It also
counts the SQL statements the app sends per ranking (BEGIN and COMMIT aside), in
50 rankings after the measured ones: a statement listener makes every statement go through SQLAlchemy. Run it
beside the code before a change to compare, and under py-spy for where the time goes
(`py-spy record -f raw -o out.txt -- .venv/bin/python benchmarks/profile_annotation.py`).

    PREFLAB_BENCH_DATABASE_URL=postgresql://postgres@127.0.0.1:5432/preflab_bench \\
        .venv/bin/python benchmarks/profile_annotation.py [--rankings 400] [--reseed]

The database is rebuilt and seeded on the first run (with --reseed, or when bench_annotation.py rebuilt it since),
then reused: each run adds its rankings.
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import bench_annotation  # noqa: E402
from sqlalchemy import create_engine, event, text  # noqa: E402
from sqlalchemy.exc import DBAPIError  # noqa: E402

from app.main import create_app  # noqa: E402
from app.platform.settings import Settings  # noqa: E402

CHUNK = 50


class AsgiClient:
    """Requests straight into the ASGI app, as uvicorn would send them (no sockets, no HTTP parsing)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def request(self, method: str, path: str, token: str, body: bytes = b"") -> tuple[int, bytes]:
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
                 "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
                 "headers": [(b"host", b"127.0.0.1:8000"), (b"authorization", f"Bearer {token}".encode()),
                             (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
                 "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000), "state": {}}
        chunks = [{"type": "http.request", "body": body, "more_body": False}]
        out: dict[str, Any] = {"status": 0, "body": b""}

        async def receive() -> dict[str, Any]:
            if chunks:
                return chunks.pop()
            await asyncio.Event().wait()  # the client never disconnects mid-request
            raise AssertionError("unreachable")

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                out["status"] = message["status"]
            elif message["type"] == "http.response.body":
                out["body"] += message.get("body", b"")

        await self.app(scope, receive, send)
        return out["status"], out["body"]


async def _rank_once(client: AsgiClient, project_id: int, token: str, submission_id: str) -> None:
    status, raw = await client.request("GET", f"/api/projects/{project_id}/tasks/next", token)
    if status != 200:
        raise SystemExit(f"next task answered {status}: {raw[:200]!r}")
    task = json.loads(raw)
    body = {"assignment_id": task["assignment_id"], "tiers": [[c["id"]] for c in task["completions"]],
            "rubric_version": task["rubric"]["version"], "submission_id": submission_id, "seconds_spent": 1.0}
    status, raw = await client.request("POST", f"/api/projects/{project_id}/rankings", token,
                                       json.dumps(body).encode())
    if status != 201:
        raise SystemExit(f"submit answered {status}: {raw[:200]!r}")


async def measure(app: Any, project_id: int, tokens: list[str], rankings: int) -> dict[str, Any]:
    client = AsgiClient(app)
    run = time.time_ns()
    async with app.router.lifespan_context(app):
        for i in range(CHUNK):  # warm-up: compiled statements, pool connections, prepared statements
            await _rank_once(client, project_id, tokens[i % len(tokens)], f"w{run}-{i}")
        stretches: list[float] = []
        cpu0, wall0, db0 = time.process_time(), time.perf_counter(), bench_annotation._postgres_cpu_seconds()
        for i in range(rankings):
            if i % CHUNK == 0:
                stretch = time.process_time()
            await _rank_once(client, project_id, tokens[i % len(tokens)], f"p{run}-{i}")
            if i % CHUNK == CHUNK - 1:
                stretches.append((time.process_time() - stretch) / CHUNK)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        db1 = bench_annotation._postgres_cpu_seconds()
        # Counted afterwards, apart: an engine with a statement listener runs every statement through SQLAlchemy
        # (app/platform/direct_sql.py), which would change the CPU measured above.
        statements: list[int] = []
        count = lambda *_: statements.append(1)  # noqa: E731
        event.listen(app.state.engine, "before_cursor_execute", count)
        for i in range(CHUNK):
            await _rank_once(client, project_id, tokens[i % len(tokens)], f"c{run}-{i}")
        event.remove(app.state.engine, "before_cursor_execute", count)
    return {"cpu_ms_per_ranking": round(cpu / rankings * 1e3, 2),
            "cpu_ms_per_ranking_median_stretch": round(statistics.median(stretches) * 1e3, 2),
            "cpu_ms_per_ranking_least_stretch": round(min(stretches) * 1e3, 2),
            "wall_ms_per_ranking": round(wall / rankings * 1e3, 2),
            "database_cpu_ms_per_ranking": None if db0 is None or db1 is None
            else round((db1 - db0) / rankings * 1e3, 2),
            "statements_per_ranking": round(len(statements) / CHUNK, 2)}


def _still_there(url: str, token: str) -> bool:
    """Whether the database still holds what this script seeded (bench_annotation.py rebuilds the same one)."""
    from app.accounts.security import token_hash

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return bool(conn.execute(text("SELECT count(*) FROM api_tokens WHERE token_hash = :h"),
                                     {"h": token_hash(token)}).scalar())
    except DBAPIError:  # not migrated, or gone
        return False
    finally:
        engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rankings", type=int, default=400, help="measured rankings (a multiple of 50)")
    parser.add_argument("--reseed", action="store_true", help="rebuild and seed the database first")
    args = parser.parse_args()
    if args.rankings < CHUNK or args.rankings % CHUNK:
        parser.error(f"--rankings: a multiple of {CHUNK}")
    url = Settings(database_url=os.environ.get("PREFLAB_BENCH_DATABASE_URL", bench_annotation.DEFAULT_URL)).database_url
    seed_file = Path(tempfile.gettempdir()) / "preflab_profile_annotation.json"
    seeded = json.loads(seed_file.read_text()) if seed_file.exists() and not args.reseed else None
    if seeded is None or seeded.get("url") != url or not _still_there(url, seeded["tokens"][0]):
        bench_annotation.reset_database(url)
        project_id, tokens, _ = bench_annotation.seed(url, prompts=20_000, chars=300, overlap=2, annotators=32,
                                                      name="bench")
        seeded = {"url": url, "project_id": project_id, "tokens": tokens}
        seed_file.write_text(json.dumps(seeded))
    with tempfile.TemporaryDirectory() as data_dir:
        app = create_app(Settings(database_url=url, secret_key=bench_annotation.SECRET, data_dir=data_dir))
        result = asyncio.run(measure(app, seeded["project_id"], seeded["tokens"], args.rankings))
        app.state.engine.dispose()
    print(json.dumps({"bench": "annotation_profile", "rankings": args.rankings, **result,
                      "load_avg": os.getloadavg()[0]}))


if __name__ == "__main__":
    main()
