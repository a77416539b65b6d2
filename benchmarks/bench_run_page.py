"""The training run page with many metric rows: HTML size and render time, full page and the 2 s HTMX poll.

A GRPO run with N metrics.jsonl rows (loss, reward_mean, kl, entropy, clipfrac, lr: six charts), a finished
evaluation (Pass@K / Maj@K curves, 64 held-out samples a side) and a 200-line log, on SQLite in a temporary
directory. Prints one JSON line: bytes of the page and of the poll's fragment, and render time p50/p95 over the
repeats (in-process, through the whole app: routing, session, queries, template).

    python benchmarks/bench_run_page.py [--rows 1000] [--repeats 30]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PASSWORD = "correct horse battery staple"


def _write_run(out: Path, rows: int) -> None:
    out.mkdir(parents=True)
    with (out / "metrics.jsonl").open("w") as fh:
        for step in range(1, rows + 1):
            fh.write(json.dumps({"step": step, "loss": 1 / step, "reward_mean": step / rows, "kl": 0.001 * step,
                                 "entropy": 2 - step / rows, "clipfrac": 0.1, "lr": 1e-6}) + "\n")
    k = {str(j): j / 8 for j in range(1, 9)}
    (out / "eval.json").write_text(json.dumps({"reward_mean": {"policy": 0.6, "reference": 0.2}, "kl": 0.4,
                                               "win_rate": 0.7, "curves": {"pass_at": {"policy": k, "reference": k},
                                                                           "maj_at": {"policy": k}}}))
    with (out / "samples.jsonl").open("w") as fh:
        for i in range(64):
            for model in ("policy", "reference"):
                fh.write(json.dumps({"prompt": f"q{i}", "model": model, "answer": "a", "reward": i / 64}) + "\n")
    (out / "progress.json").write_text(json.dumps({"step": rows, "total": rows, "eta_s": None, "line": "",
                                                   "at": "2026-01-01T00:00:00+00:00"}))


def measure(rows: int = 1000, repeats: int = 30) -> dict:
    from fastapi.testclient import TestClient

    from app.accounts import users
    from app.main import create_app
    from app.models import Job, TrainingRun
    from app.platform.migrate import upgrade
    from app.platform.settings import Settings
    from app.projects import projects

    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/bench.db"
        upgrade(url)
        app = create_app(Settings(env="dev", database_url=url, data_dir=Path(tmp), secret_key="s" * 48))
        out = Path(tmp) / "runs" / "1"
        _write_run(out, rows)
        with app.state.session_factory() as db:
            lead = users.create_user(db, "lead@example.org", PASSWORD, "lead")
            project = projects.create_project(db, lead, name="Bench", completions_per_prompt=2, overlap=1,
                                              rubric_text="r", criteria=[])
            job = Job(kind="train", payload={}, state="running", result={})
            db.add(job)
            db.flush()
            run = TrainingRun(project_id=project.id, kind="grpo", state="running", config={}, job_id=job.id,
                              metrics_path=str(out / "metrics.jsonl"), model_dir=str(out / "model"))
            db.add(run)
            db.commit()
            run_id, job_id = run.id, job.id
        (Path(tmp) / "jobs").mkdir()
        (Path(tmp) / "jobs" / f"{job_id}.log").write_text("".join(f"progress: step {i}/{rows}\n" for i in range(200)))
        client = TestClient(app, base_url="http://testserver", follow_redirects=False)
        csrf = re.search(r'name="csrf_token" value="([0-9a-f]{64})"', client.get("/login").text).group(1)  # type: ignore[union-attr]
        assert client.post("/login", data={"email": "lead@example.org", "password": PASSWORD,
                                           "csrf_token": csrf}).status_code == 303
        figures = {}
        for name, headers in (("page", {}), ("poll", {"HX-Request": "true", "HX-Target": "live"})):
            times, size = [], 0
            for _ in range(repeats):
                t0 = time.perf_counter()
                response = client.get(f"/training-runs/{run_id}", headers=headers)
                times.append((time.perf_counter() - t0) * 1000)
                assert response.status_code == 200
                size = len(response.content)
            times.sort()
            figures[name] = {"bytes": size, "p50_ms": round(statistics.median(times), 1),
                             "p95_ms": round(times[int(0.95 * (len(times) - 1))], 1)}
            figures[name]["points_drawn"] = response.text.count("<circle")
        app.state.engine.dispose()
    return {"bench": "run_page", "metric_rows": rows, **figures}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    print(json.dumps(measure(args.rows, args.repeats)))
