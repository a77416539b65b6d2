"""`python -m training.ray_train --workers N -- MODULE ARGS…`: one training command over N Ray Train workers.

Ray Train's `TorchTrainer` starts the workers, sets up their process group (gloo on CPU, NCCL on GPUs) and hands each
its rank; every worker then runs `python -m MODULE ARGS` in its own process, whose Accelerator joins that group
(DDP), exactly as under `torchrun` or `accelerate launch`. This is the entrypoint preflab submits as a Ray job for a
run of several workers; on a Ray cluster it can be run by hand the same way.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
from pathlib import Path
from typing import Any


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m training.ray_train", description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, required=True, help="Ray Train workers (DDP ranks)")
    parser.add_argument("--gpus-per-worker", type=int, default=0)
    parser.add_argument("--cpus-per-worker", type=float, default=1.0)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- MODULE ARGS… (e.g. -- training reward "
                                                                   "--config run.toml)")
    ns = parser.parse_args(argv)
    ns.command = ns.command[1:] if ns.command[:1] == ["--"] else ns.command
    if ns.workers < 1:
        parser.error("--workers must be at least 1")
    if not ns.command:
        parser.error("give the command after --: MODULE ARGS…")
    return ns


def worker_loop(config: dict[str, Any]) -> None:
    """One Ray Train worker: its rank in the environment accelerate reads, then the command in this process."""
    from ray import train

    ctx = train.get_context()
    os.environ.update(RANK=str(ctx.get_world_rank()), WORLD_SIZE=str(ctx.get_world_size()),
                      LOCAL_RANK=str(ctx.get_local_rank()), LOCAL_WORLD_SIZE=str(ctx.get_local_world_size()),
                      NODE_RANK=str(ctx.get_node_rank()))
    os.chdir(config["cwd"])
    module, *args = config["command"]
    sys.argv = [module, *args]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:  # the command's own exit: a non-zero one fails the worker, and so the job
        if exc.code not in (None, 0):
            raise RuntimeError(f"{module} exited with {exc.code}") from None


def main(argv: list[str] | None = None) -> int:
    ns = parse(list(sys.argv[1:] if argv is None else argv))
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    ray.init()  # inside a Ray job: the job's own cluster
    cwd = Path.cwd()
    use_gpu = ns.gpus_per_worker > 0
    per_worker = {"CPU": ns.cpus_per_worker} | ({"GPU": ns.gpus_per_worker} if use_gpu else {})
    trainer = TorchTrainer(
        worker_loop, train_loop_config={"cwd": str(cwd), "command": ns.command},
        torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo"),
        scaling_config=ScalingConfig(num_workers=ns.workers, use_gpu=use_gpu, resources_per_worker=per_worker),
        # Ray Train's own records (not the run's: the command writes those) stay beside the run.
        run_config=RunConfig(name="ray_train", storage_path=str(cwd / "ray_results")))
    trainer.fit()
    return 0


if __name__ == "__main__":
    sys.exit(main())
