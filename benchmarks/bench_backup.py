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
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _pg import fresh_database  # noqa: E402 - after the sys.path set-up
from _seed import seed_pairs  # noqa: E402

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/preflab_bench_backup"
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
    from app.platform.backup import backup, restore
    from app.platform.settings import Settings

    url = os.environ.get("PREFLAB_BENCH_DATABASE_URL", DEFAULT_URL)
    t0 = time.perf_counter()
    src_url = fresh_database(url)
    _, pairs = seed_pairs(src_url, args.pairs, name="bench backup")
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
