"""Where a pairs export's time goes, stage by stage, on an already seeded Postgres (bench_export.py's database).

Runs `write_export` once in this process with the write-behind thread replaced by a synchronous sink, so that the
stages run one after another and their times add up to the wall time; each stage's wall time is timed around the
writer's own functions (nothing else changes). Also reports this process's CPU time and that of the Postgres
backends the export used (read from /proc before they are closed), since on two cores the two compete.

    PYTHONPATH=. .venv/bin/python benchmarks/profile_export.py [--format jsonl] [--project 1] [--database-url URL]

Prints one JSON line: {"stages": {name: seconds}, "wall_s", "python_cpu_s", "postgres_cpu_s", "loadavg"}.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/preflab_bench_export"
STAGES: Counter[str] = Counter()


def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            STAGES[name] += time.perf_counter() - t0
    return wrapper


def timed_iter(name: str, fn: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
    """Times each `next()` of the generator `fn` returns (its own work plus whatever it pulls from below)."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Iterator[Any]:
        it = fn(*args, **kwargs)
        while True:
            t0 = time.perf_counter()
            try:
                item = next(it)
            except StopIteration:
                STAGES[name] += time.perf_counter() - t0
                return
            STAGES[name] += time.perf_counter() - t0
            yield item
    return wrapper


def backend_cpu_s(pids: list[int]) -> float:
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return total


def instrument() -> None:
    """Wrap the writer's stages in timers; the sink runs synchronously so that the stage times add up."""
    from app.exports import card as export_card
    from app.exports import queries as export_queries
    from app.exports import sinks as export_sinks
    from app.exports import writer as export_writer
    from app.exports.sinks import JsonlSink, ParquetSink

    class Synchronous:
        def __init__(self, sink: Any, depth: int = 2) -> None:
            self.sink = sink

        @property
        def hashed(self) -> dict[str, str]:
            return self.sink.hashed

        def write(self, batch: Any) -> None:
            self.sink.write(batch)

        def close(self) -> None:
            self.sink.close()

    export_writer.WriteBehind = Synchronous  # type: ignore[misc,assignment]
    export_queries.Snapshot.copy_records = timed_iter(  # type: ignore[method-assign]
        "sql: COPY of the packed pair scan (Postgres scan, joins, packing; wire)", export_queries.Snapshot.copy_records)
    export_queries.PackedScan.decode = timed("decode: packed records → Arrow (numpy)",  # type: ignore[method-assign]
                                             export_queries.PackedScan.decode)
    export_writer._Run.lookup = timed("sql: text lookups by id (prompts, completions)",  # type: ignore[method-assign]
                                      export_writer._Run.lookup)
    export_writer._Run.count = timed("sql: count of the filtered pairs", export_writer._Run.count)  # type: ignore[method-assign]
    export_writer.render_card = timed("card: dataset card (rest)", export_card.render_card)
    export_writer._AgreementBeside.result = timed(  # type: ignore[method-assign]
        "card: waiting for its agreement GROUP BY (runs beside the stream on Postgres)",
        export_writer._AgreementBeside.result)
    export_writer.annotator_pseudonym = timed("rows: annotator pseudonyms (HMAC)", export_writer.annotator_pseudonym)
    for name in ("write", "close"):
        for cls in (JsonlSink, ParquetSink):
            setattr(cls, name, timed(f"sink: {cls.__name__}.{name}", getattr(cls, name)))
    if hasattr(JsonlSink, "fragments"):
        JsonlSink.fragments = timed("  of which: JSON fragments per column", JsonlSink.fragments)  # type: ignore[method-assign]
    hashlib_sha = export_sinks.hashlib.sha256

    class TimedDigest:
        def __init__(self, *args: Any) -> None:
            self.digest = hashlib_sha(*args)

        def update(self, data: Any) -> None:
            t0 = time.perf_counter()
            self.digest.update(data)
            STAGES["  of which: sha256"] += time.perf_counter() - t0

        def hexdigest(self) -> str:
            return self.digest.hexdigest()

    export_sinks.hashlib = type("H", (), {"sha256": TimedDigest})  # type: ignore[assignment]
    export_writer.replace_dir = timed("io: fsync + rename", export_writer.replace_dir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--format", default="jsonl", choices=("jsonl", "parquet"))
    parser.add_argument("--project", type=int, default=1)
    parser.add_argument("--database-url", default=os.environ.get("PREFLAB_BENCH_DATABASE_URL", DEFAULT_URL))
    args = parser.parse_args()
    from sqlalchemy import text

    from app.exports.writer import ExportSpec, write_export
    from app.platform.db import make_engine
    from app.platform.settings import Settings

    instrument()
    url = Settings(database_url=args.database_url).database_url
    engine = make_engine(url)
    load_before = os.getloadavg()
    pids: set[int] = set()
    from sqlalchemy import event

    @event.listens_for(engine, "connect")
    def _remember(dbapi_conn: Any, _record: Any) -> None:
        pids.add(dbapi_conn.info.backend_pid)

    usage0 = resource.getrusage(resource.RUSAGE_SELF)
    cpu_at_close: dict[int, float] = {}

    @event.listens_for(engine, "close")
    def _closing(dbapi_conn: Any, _record: Any) -> None:
        pid = dbapi_conn.info.backend_pid
        cpu_at_close[pid] = backend_cpu_s([pid])

    with tempfile.TemporaryDirectory(dir=os.environ.get("PREFLAB_BENCH_OUT")) as out:
        t0 = time.perf_counter()
        result = write_export(engine, ExportSpec(args.project, "pairs", args.format), Path(out) / "x",
                              secret="b" * 48)
        wall = time.perf_counter() - t0
        postgres_cpu = backend_cpu_s(sorted(pids - cpu_at_close.keys())) + sum(cpu_at_close.values())
    usage = resource.getrusage(resource.RUSAGE_SELF)
    with engine.connect() as conn:
        conn.execute(text("SELECT 1"))
    stages = {k: round(v, 2) for k, v in STAGES.most_common()}
    accounted = sum(v for k, v in STAGES.items() if not k.startswith("  "))
    stages["other (batch assembly, Arrow glue, pseudonym lookup)"] = round(wall - accounted, 2)
    print(json.dumps({"format": args.format, "rows": result.row_count, "wall_s": round(wall, 2),
                      "pairs_per_s": round(result.row_count / wall),
                      "python_cpu_s": round(usage.ru_utime + usage.ru_stime - usage0.ru_utime - usage0.ru_stime, 2),
                      "postgres_cpu_s": round(postgres_cpu, 2), "stages": stages,
                      "loadavg_before": [round(x, 2) for x in load_before],
                      "loadavg_after": [round(x, 2) for x in os.getloadavg()]}, ensure_ascii=False))


if __name__ == "__main__":
    main()
