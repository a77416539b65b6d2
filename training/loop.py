"""The one training loop: every method (reward, sft, dpo, rft, grpo, ppo) runs on it.

A method is a `Method`: it holds its models, optimiser and data position, and supplies only what is its own —
`step()` (one global optimisation step, its rollouts included for online methods), `evaluate()`, `save_model()`
and the state it must carry across a resume. `run(method)` owns everything else, the same way for all of them:
the resume from OUT/checkpoint (written whole, through a staging directory), OUT/run.json, metrics.jsonl and the
experiment trackers, the progress bar, periodic evaluation with early stopping on the held-out loss, the final
evaluation (OUT/eval.json) and the final save (OUT/model, loadable by plain transformers).

Offline methods (reward, sft, dpo) subclass `BatchMethod`, which turns a seeded, resumable plan of global batches
into `step()`s: the method writes only `batch_loss(local, global)`.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from training.config import OfflineConfig, TrainConfig
from training.hold import hold
from training.optim import lr_lambda, make_accelerator
from training.run_info import MetricsWriter, staged_dir, write_json, write_run_config
from training.shared.files import atomic_dir, recover_dir

TRAINER_STATE = "trainer_state.json"
EXTRA_TENSORS = "extra.safetensors"


class Method:
    """A training method as the loop sees it. Subclasses build their model(s) in `__init__` and call `prepare()`;
    they implement `step()`, `evaluate()` and `save_model()`, and extend `state_dict()` / `extra_tensors()` with
    whatever else a resumed run needs (data order, KL controller, …)."""

    name = "train"

    def __init__(self, config: TrainConfig, accelerator: Any = None) -> None:
        self.config = config
        self.accelerator = accelerator or make_accelerator(config.mixed_precision, config.report_to,
                                                           project_dir=config.out or None)
        self.step_count = 0
        self.model: Any = None
        self.optimizer: Any = None
        self.scheduler: Any = None

    # -- set-up helpers -------------------------------------------------------------------------

    @property
    def total_steps(self) -> int:
        """Global steps of the whole run."""
        return self.config.steps

    def prepare(self, model: torch.nn.Module, total_steps: int | None = None) -> None:
        """AdamW over the trainable parameters (no decay on biases and norms) and the warm-up/decay schedule, both
        through the accelerator. The scheduler is stepped once per global step by `finish_step` (accelerate would
        step it once per process) and registered so a checkpoint carries it."""
        c = self.config
        trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        decay = [p for n, p in trainable if p.ndim >= 2 and "norm" not in n.lower()]
        rest = [p for n, p in trainable if not (p.ndim >= 2 and "norm" not in n.lower())]
        # the fused kernel (one pass over all parameters) where torch has one for their device: CPU and CUDA
        fused = all(p.device.type in ("cpu", "cuda") for _, p in trainable)
        optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": c.weight_decay},
                                       {"params": rest, "weight_decay": 0.0}], lr=c.lr, fused=fused)
        total = total_steps or self.total_steps
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(c.warmup(total), c.lr_schedule, total))
        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)
        self.scheduler = scheduler
        self.accelerator.register_for_checkpointing(scheduler)

    def optimizer_step(self) -> float:
        """Clip the gradients (max_grad_norm), step the optimiser and clear the gradients; the norm before clipping
        (NaN without clipping)."""
        norm = float("nan")
        if self.config.max_grad_norm > 0:
            norm = float(self.accelerator.clip_grad_norm_(self.model.parameters(), self.config.max_grad_norm))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    def finish_step(self) -> None:
        """End of a global step: the schedule moves on once, whatever the number of processes."""
        self.scheduler.step()
        self.step_count += 1

    # -- what each method supplies --------------------------------------------------------------

    def step(self) -> dict[str, Any]:
        """One global optimisation step; returns its metrics (floats). Must call `finish_step()`."""
        raise TypeError(f"{type(self).__name__} does not define step()")

    def evaluate(self, samples_path: Path | None = None) -> dict[str, Any] | None:
        """Held-out evaluation (None: nothing to evaluate on); "loss" in it drives early stopping."""
        return None

    def save_model(self, path: Path, state_dict: dict[str, Tensor]) -> None:
        """Write the trained model (save_pretrained + tokenizer) into the empty directory `path`, on the main process;
        `state_dict` is the prepared model's, gathered from every process (FSDP, DeepSpeed)."""
        raise TypeError(f"{type(self).__name__} does not define save_model()")

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state a resumed run needs beyond the model, optimiser, schedule and RNG."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()`."""

    def extra_tensors(self) -> dict[str, Tensor]:
        """Tensors a resumed run needs beyond the prepared model (e.g. a reset reference policy)."""
        return {}

    def load_extra_tensors(self, tensors: dict[str, Tensor]) -> None:
        """Restore `extra_tensors()`."""

    def eval_row(self, result: dict[str, Any]) -> dict[str, float]:
        """The scalars of an evaluation, as `eval_*` metrics for metrics.jsonl and the trackers."""
        return {f"eval_{k}": v for k, v in result.items() if isinstance(v, int | float) and not isinstance(v, bool)}

    def postfix(self, metrics: dict[str, Any]) -> dict[str, str]:
        """What the progress bar shows after each step."""
        return {"loss": f"{metrics['loss']:.4f}"} if "loss" in metrics else {}

    # -- used by the loop -----------------------------------------------------------------------

    def unwrapped(self) -> torch.nn.Module:
        return self.accelerator.unwrap_model(self.model)

    def save(self, path: str | Path) -> None:
        """The final model directory, whole or not at all (`save_model` into a temporary directory, renamed)."""
        state = self.accelerator.get_state_dict(self.model)  # every process takes part: it gathers shards
        if self.accelerator.is_main_process:
            with atomic_dir(path) as tmp:
                self.save_model(tmp, state)
        self.accelerator.wait_for_everyone()


class BatchMethod(Method):
    """An offline method: `batch_loss` over a seeded, resumable plan of global batches of example indices.

    Every process takes a strided share of each global batch (`global_batch[rank::world]`, a similar mix of
    lengths). `batch_loss` returns a loss whose DDP average is the global-batch mean (scale the local mean by the
    process's share), plus metrics already reduced over processes."""

    config: OfflineConfig

    def __init__(self, config: OfflineConfig, accelerator: Any = None) -> None:
        from accelerate.utils import set_seed

        super().__init__(config, accelerator)
        set_seed(config.seed)  # before the subclass builds its model: a new head's initialisation
        self.lengths: list[int] = []
        self._steps_per_epoch = 0

    def set_lengths(self, lengths: Sequence[int]) -> None:
        """The training examples' lengths (tokens): their number sets the epoch, their values the length grouping."""
        world = self.accelerator.num_processes
        if self.config.batch_size % world:
            raise ValueError(f"batch_size ({self.config.batch_size}) must be a multiple of the number of processes "
                             f"({world})")
        self.lengths = list(lengths)
        self._steps_per_epoch = len(self.plan(0))
        if not self._steps_per_epoch:
            raise ValueError(f"batch_size: {len(self.lengths)} training examples make no batch of "
                             f"{self.accelerator.num_processes} or more")

    @property
    def steps_per_epoch(self) -> int:
        return self._steps_per_epoch

    @property
    def total_steps(self) -> int:
        c = self.config
        return c.steps or max(1, math.ceil(c.epochs * self._steps_per_epoch))

    def plan(self, epoch: int) -> list[list[int]]:
        c = self.config
        return plan_batches(self.lengths, c.batch_size, c.seed, epoch, c.group_by_length, c.megabatch_factor,
                            min_batch=self.accelerator.num_processes)

    def batch_loss(self, local: list[int], global_batch: list[int]) -> tuple[Tensor, dict[str, float]]:
        raise TypeError(f"{type(self).__name__} does not define batch_loss()")

    def step(self) -> dict[str, Any]:
        epoch, position = divmod(self.step_count, self._steps_per_epoch)
        global_batch = self.plan(epoch)[position]  # the plan depends only on (seed, epoch): a resume replays it
        world, rank = self.accelerator.num_processes, self.accelerator.process_index
        loss, metrics = self.batch_loss(global_batch[rank::world], global_batch)
        self.accelerator.backward(loss)
        grad_norm = self.optimizer_step()
        self.finish_step()
        return {"epoch": self.step_count / self._steps_per_epoch, **metrics,
                "loss": self.accelerator.reduce(loss.detach(), reduction="mean").item(),
                "lr": self.scheduler.get_last_lr()[0], "grad_norm": grad_norm}

    def share(self, local: Sequence[int], global_batch: Sequence[int]) -> float:
        """This process's share of the global batch, times the number of processes: the factor that makes DDP's
        average of local means the global mean."""
        return self.accelerator.num_processes * len(local) / len(global_batch)


def plan_batches(lengths: Sequence[int], batch_size: int, seed: int, epoch: int, group_by_length: bool,
                 megabatch_factor: int, min_batch: int = 1) -> list[list[int]]:
    """One epoch of global batches of example indices: a seeded shuffle, then (optionally) length-sorted mega-batches.

    The plan depends only on (seed, epoch), so a resumed run replays the same batches.
    """
    gen = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    perm = torch.randperm(len(lengths), generator=gen).tolist()
    if not group_by_length:
        batches = [perm[i:i + batch_size] for i in range(0, len(perm), batch_size)]
    else:
        mega = batch_size * megabatch_factor
        batches = []
        for start in range(0, len(perm), mega):
            chunk = sorted(perm[start:start + mega], key=lambda i: -lengths[i])
            batches += [chunk[i:i + batch_size] for i in range(0, len(chunk), batch_size)]
        order = torch.randperm(len(batches), generator=gen).tolist()
        batches = [batches[i] for i in order]
    # every process needs at least one example of each batch
    return [b for b in batches if len(b) >= min_batch]


# ----------------------------------------------------------------------------------------------
# the loop


@dataclass
class RunResult:
    """What `run` returns: the final evaluation and how the run went."""

    eval: dict[str, Any]
    steps: int
    seconds: float
    cpu_seconds: float
    stopped_early: bool = False
    best_step: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    main_process: bool = True


@dataclass
class _Stopping:
    """Early stopping on the held-out loss (offline methods), carried across a resume."""

    patience: int
    min_delta: float
    best_loss: float = math.inf
    bad_evals: int = 0
    best_step: int = 0
    best_state: dict[str, Tensor] | None = None

    def observe(self, method: Method, step: int, result: dict[str, Any]) -> bool:
        """Record an evaluation; True when the patience ran out."""
        if not self.patience or "loss" not in result:
            return False
        if result["loss"] < self.best_loss - self.min_delta:
            self.best_loss, self.bad_evals, self.best_step = result["loss"], 0, step
            self.best_state = {k: v.detach().cpu().clone() for k, v in method.unwrapped().state_dict().items()}
            return False
        self.bad_evals += 1
        return self.bad_evals >= self.patience

    def state(self) -> dict[str, Any]:
        return {"best_loss": self.best_loss, "bad_evals": self.bad_evals, "best_step": self.best_step}


def run(method: Method, data: dict[str, str | Path | None] | None = None) -> RunResult:
    """Train `method` to its last step (or early stop) and save it: OUT/model, eval.json, metrics.jsonl, run.json."""
    c = method.config
    acc = method.accelerator
    out = Path(c.out)
    stopping = _Stopping(getattr(c, "early_stopping_patience", 0), getattr(c, "early_stopping_min_delta", 0.0))
    resumed = _resume(method, out / "checkpoint", stopping)
    total = method.total_steps
    main = acc.is_main_process
    if main:
        out.mkdir(parents=True, exist_ok=True)
        write_run_config(out, c, data=data, extra={"method": method.name, "processes": acc.num_processes,
                                                   "total_steps": total, "resumed_from_step": method.step_count})
    log = _Log(method, out, total, resumed)
    history: list[dict[str, Any]] = []
    stopped = False
    started, cpu_started = time.perf_counter(), time.process_time()
    try:
        while method.step_count < total and not stopped:
            metrics = method.step()
            step = method.step_count
            if c.eval_every and step % c.eval_every == 0 and step < total:
                result = method.evaluate()
                if result is not None:
                    metrics.update(method.eval_row(result))
                    stopped = stopping.observe(method, step, result)
            log.step(step, metrics, last=step >= total or stopped)
            history.append({"step": step, **metrics})
            if c.save_every and (step % c.save_every == 0 or stopped):
                save_checkpoint(method, out / "checkpoint", stopping)
            hold(f"train.step.{step}")  # crash tests stop the trainer here, with the step logged and checkpointed
        seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
        evaluation = _final_evaluation(method, stopping, out)
        method.save(out / "model")
        log.final(method.step_count, evaluation)
        final = {**evaluation, "steps": method.step_count, "stopped_early": stopped,
                 "best_step": stopping.best_step or method.step_count}
    finally:
        log.close()
    if main:
        write_json(out / "eval.json", final)
    acc.wait_for_everyone()
    return RunResult(eval=final, steps=method.step_count, seconds=seconds, cpu_seconds=cpu_seconds,
                     stopped_early=stopped, best_step=stopping.best_step or method.step_count, history=history,
                     main_process=main)


def _final_evaluation(method: Method, stopping: _Stopping, out: Path) -> dict[str, Any]:
    """The last evaluation; with early stopping, of the best held-out model when the last one is no better."""
    samples = out / "samples.jsonl" if method.accelerator.is_main_process else None
    final = method.evaluate(samples_path=samples)
    if (final is not None and stopping.best_state is not None
            and final.get("loss", math.inf) >= stopping.best_loss - stopping.min_delta):
        method.unwrapped().load_state_dict(stopping.best_state)
        final = method.evaluate(samples_path=samples)
    return dict(final or {})


def save_checkpoint(method: Method, path: Path, stopping: _Stopping | None = None) -> None:
    """Model, optimiser, schedule and RNG (accelerate's save_state), the data position and the method's own state,
    written whole into a staging directory by every process and renamed over `path` once all are done."""
    acc = method.accelerator
    with staged_dir(path, acc) as stage:
        acc.save_state(str(stage))
        if acc.is_main_process:
            tensors = dict(method.extra_tensors())
            if stopping is not None and stopping.best_state is not None:
                tensors |= {f"best.{k}": v for k, v in stopping.best_state.items()}
            if tensors:
                from safetensors.torch import save_file

                save_file({k: v.contiguous() for k, v in tensors.items()}, str(stage / EXTRA_TENSORS))
            write_json(stage / TRAINER_STATE, {"step": method.step_count, "method": method.state_dict(),
                                               "stopping": stopping.state() if stopping is not None else {}})


def _resume(method: Method, path: Path, stopping: _Stopping) -> bool:
    """Load OUT/checkpoint when the config asks to resume and one exists; whether it did."""
    acc = method.accelerator
    if not method.config.resume:
        return False
    if acc.is_main_process:
        recover_dir(path)  # a kill between the two renames of a checkpoint save
    acc.wait_for_everyone()
    if not (path / TRAINER_STATE).exists():
        return False
    acc.load_state(str(path))
    state = json.loads((path / TRAINER_STATE).read_text(encoding="utf-8"))
    method.step_count = int(state["step"])
    method.load_state_dict(state.get("method") or {})
    for key, value in (state.get("stopping") or {}).items():
        setattr(stopping, key, value)
    if (path / EXTRA_TENSORS).exists():
        from safetensors.torch import load_file

        tensors = load_file(str(path / EXTRA_TENSORS))
        best = {k.removeprefix("best."): v for k, v in tensors.items() if k.startswith("best.")}
        stopping.best_state = best or None
        method.load_extra_tensors({k: v for k, v in tensors.items() if not k.startswith("best.")})
    return True


class _Log:
    """metrics.jsonl, the experiment trackers and the progress bar, on the main process."""

    def __init__(self, method: Method, out: Path, total: int, resumed: bool) -> None:
        from tqdm.auto import tqdm

        c = method.config
        self.method = method
        self.main = method.accelerator.is_main_process
        self.interval = c.log_interval(total)
        self.total = total
        self.writer = MetricsWriter(out / "metrics.jsonl", append=resumed,
                                    resume_step=method.step_count) if self.main else None
        self.trackers = bool(c.report_to)
        if self.trackers:
            from training.trackers import start_trackers

            start_trackers(method.accelerator, c, out, resumed)
        self.bar = tqdm(total=total, initial=method.step_count, desc=method.name, unit="step",
                        disable=not (c.progress and self.main))
        self.pending: tuple[int, dict[str, Any]] | None = None

    def step(self, step: int, metrics: dict[str, Any], last: bool) -> None:
        self.bar.update(1)
        self.bar.set_postfix(self.method.postfix(metrics), refresh=False)
        if "warning" in metrics:
            self.bar.write(f"step {step}: {metrics['warning']}")
        if last:  # written with the final evaluation: one row per step, so rows count steps
            self.pending = (step, metrics)
        elif step % self.interval == 0 or any(k.startswith("eval_") for k in metrics):
            self._write(step, metrics)

    def final(self, step: int, result: dict[str, Any]) -> None:
        last_step, metrics = self.pending or (step, {})
        self.pending = None
        row = {**metrics, **(self.method.eval_row(result) if result else {})}
        if row:
            self._write(last_step, row)

    def _write(self, step: int, row: dict[str, Any]) -> None:
        if self.writer is not None:
            self.writer.log(step, **row)
        if self.trackers:
            self.method.accelerator.log(_scalars(row), step=step)

    def close(self) -> None:
        if self.pending is not None:  # the run broke off before its final evaluation: keep the last step's row
            self._write(*self.pending)
        self.bar.close()
        if self.writer is not None:
            self.writer.close()
        if self.trackers:
            self.method.accelerator.end_training()


def _scalars(metrics: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items()
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)}
