"""What each execution backend adds to a tiny reward run: submit → first metric → saved model, one JSON line each.

    .venv/bin/python benchmarks/bench_cluster.py [--backends local,slurm,ray] [--steps 4]

The same run (a 1-layer BERT reward model, 16 pairs, `steps` steps) is submitted through each backend as the train
job does, and polled as it polls (every 0.2 s here, so the poll interval adds at most that much): `first_metric_s` is
the time from submit until metrics.jsonl holds its first row, `model_s` until the model directory is complete, and
`overhead_s` the backend's `model_s` less the local one's. Slurm and Ray are the real engines the tests use, started
here on this machine (tests/support/slurm.py needs root and Debian's slurm-wlm and munge; Ray needs the `cluster`
extra); a backend that cannot start prints `{"backend": ..., "skipped": reason}`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from app.runs.backends import clusters  # noqa: E402
from app.runs.backends.base import Cluster, Launch, Resources  # noqa: E402
from app.runs.train_job import write_toml  # noqa: E402
from tests.app.test_training_runs import WORDS, _tiny_reward_base  # noqa: E402

POLL_S = 0.2


def _pairs(path: Path, n: int = 16) -> Path:
    rows = [{"prompt": f"what is {WORDS[i % 4]}", "chosen": "good right answer", "rejected": "bad wrong",
             "split": "train"} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _complete(model: Path) -> bool:
    return (model / "config.json").is_file() and any(model.glob("*.safetensors"))


def run_once(cluster: Cluster, root: Path, base: Path, pairs: Path, steps: int) -> dict[str, Any]:
    out = root / f"run-{cluster.kind}"
    out.mkdir()
    write_toml(out / "run.toml", {"model": str(base), "train": str(pairs), "out": str(out), "steps": steps,
                                  "batch_size": 4, "lr": 1e-3, "log_every": 1, "eval_every": 1000000})
    backend = clusters.backend_for(cluster)
    launch = Launch(name=f"preflab-bench-{int(time.time())}-1", attempt=1, module="training",
                    args=["reward", "--config", str(out / "run.toml"), "--quiet"], workdir=out,
                    log_path=out / "job.log", resources=cluster.resources, reads=(base, pairs),
                    env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TQDM_DISABLE": "1"})
    backend.check(launch)
    start = time.monotonic()
    submission = backend.submit(launch)
    first = None
    try:
        while True:
            status = backend.status(submission)
            if first is None and (out / "metrics.jsonl").exists() and (out / "metrics.jsonl").stat().st_size:
                first = time.monotonic() - start
            if status.done:
                break
            time.sleep(POLL_S)
    finally:
        backend.close()
    done = time.monotonic() - start
    if status.state != "succeeded" or not _complete(out / "model"):
        raise RuntimeError(f"{cluster.kind}: the run ended {status.state}: {status.reason}")
    return {"backend": cluster.kind, "steps": steps, "first_metric_s": round(first or done, 2),
            "model_s": round(done, 2)}


def _engine(kind: str, shared: Path) -> tuple[Cluster, Any]:
    if kind == "local":
        return Cluster("local", "local"), None
    if kind == "slurm":
        from tests.support import slurm

        if os.geteuid() != 0 or slurm.missing():
            raise RuntimeError("needs root and slurm-wlm, munge")
        started = slurm.start()
        os.environ.update(started.env)
        return Cluster("bench", "slurm", Resources(cpus=1), shared_dir=shared), started
    from tests.support import ray_head

    head = ray_head.start()
    return Cluster("bench", "ray", Resources(cpus=1, address=head.address), shared_dir=shared), head


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="local,slurm,ray")
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp:
        root = Path(tmp)
        base = _tiny_reward_base(root / "base")
        pairs = _pairs(root / "pairs.jsonl")
        local_s = None
        for kind in args.backends.split(","):
            try:
                cluster, engine = _engine(kind, root)
            except (RuntimeError, OSError) as exc:
                print(json.dumps({"backend": kind, "skipped": str(exc).splitlines()[0]}), flush=True)
                continue
            try:
                result = run_once(cluster, root, base, pairs, args.steps)
            finally:
                if engine is not None:
                    engine.stop()
            if kind == "local":
                local_s = result["model_s"]
            elif local_s is not None:
                result["overhead_s"] = round(result["model_s"] - local_s, 2)
            print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
