"""Export throughput and memory on Postgres: seed ~1,000,000 pairs with COPY, export them as JSONL and Parquet.

Seeding: one project, K = 4 completions per prompt, 3 annotators rank every prompt (random orders, seeded), so
each prompt gives 3 × 6 pairs. Each export runs in a fresh child process through the same writer the `export`
job uses (one REPEATABLE READ snapshot, server-side cursor, batches); the child reports its wall time and peak
RSS. Prints one JSON line. Database from PREFLAB_BENCH_DATABASE_URL (default
postgresql://postgres@127.0.0.1:5432/preflab_bench_export; it is dropped and re-created).

    .venv/bin/python benchmarks/bench_export.py [--pairs 1000000] [--formats jsonl,parquet] [--repeats 2] [--reuse]

Seeding 6M pairs (`--pairs 6000000`) takes about 9 minutes on 2 busy cores; `--reuse` exports it again. Exports
are written under $PREFLAB_BENCH_OUT (default: the system temp directory), which needs ~1.05 GB per 1M JSONL pairs.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _pg import fresh_database  # noqa: E402 - after the sys.path set-up
from _seed import seed_pairs  # noqa: E402

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/preflab_bench_export"
def export_child(url: str, project_id: int, fmt: str, out: str) -> None:
    """Runs in its own process: one export, then one JSON line with seconds, rows and peak RSS."""
    from app.exports.writer import ExportSpec, write_export
    from app.platform.db import make_engine

    engine = make_engine(url)
    t0 = time.perf_counter()
    result = write_export(engine, ExportSpec(project_id, "pairs", fmt), Path(out) / fmt, secret="b" * 48)
    seconds = time.perf_counter() - t0
    size = sum(f.stat().st_size for f in (Path(out) / fmt).rglob("*") if f.is_file())
    usage = resource.getrusage(resource.RUSAGE_SELF)
    rss_mb = usage.ru_maxrss / 1024  # Linux reports KiB
    status = Path("/proc/self/status").read_text() if Path("/proc/self/status").exists() else ""
    hwm = [int(line.split()[1]) / 1024 for line in status.splitlines() if line.startswith("VmHWM:")]
    # CPU seconds of this process (the Postgres backend's share is not in it): the figure load does not move.
    print(json.dumps({"rows": result.row_count, "seconds": seconds, "peak_rss_mb": rss_mb,
                      "vmhwm_mb": hwm[0] if hwm else None, "bytes": size,
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

        from app.platform.settings import Settings

        url = Settings(database_url=url).database_url
        with create_engine(url).connect() as conn:
            project_id, pairs = 1, int(conn.execute(text("SELECT count(*) FROM pairs")).scalar() or 0)
    else:
        url = fresh_database(url)
        project_id, pairs = seed_pairs(url, args.pairs, name="bench export", vacuum=True)
    seed_s = time.perf_counter() - t0
    report: dict[str, object] = {"bench": "export", "pairs": pairs, "seed_s": round(seed_s, 1),
                                 "cpus": os.cpu_count(), "loadavg_before": [round(x, 2) for x in os.getloadavg()]}
    with tempfile.TemporaryDirectory(dir=os.environ.get("PREFLAB_BENCH_OUT")) as out:
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
                           "vmhwm_mb": max((round(r["vmhwm_mb"], 1) for r in runs if r["vmhwm_mb"]), default=None),
                           "mb_on_disk": round(best["bytes"] / 1e6, 1),
                           "loadavg_after": [round(x, 2) for x in os.getloadavg()]}
    # The budget: 6M pairs at >= 150k pairs/s (JSONL and Parquet) with the exporting process's peak RSS <= 500 MB.
    report["targets"] = {"jsonl_pairs_per_s": 150_000, "parquet_pairs_per_s": 150_000, "peak_rss_mb": 500}
    print(json.dumps(report))


if __name__ == "__main__":
    main()
