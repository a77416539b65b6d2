"""The execution-backend interface: what a run asks for (`Resources`), what it runs (`Launch`), how it is found again
(`Submission`) and how it stands (`Status`); `Backend` is what local, Slurm and Ray each implement."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

STATES = ("queued", "running", "succeeded", "failed", "cancelled")
"""A backend's state of a submission, in preflab's words (the run's states); the last three are terminal."""
TERMINAL = ("succeeded", "failed", "cancelled")
LOCAL = "local"
"""The cluster every install has: the worker's own host."""


class BackendError(Exception):
    """The backend refused or could not be reached: the message says what and names the path or field at fault."""


@dataclass(frozen=True)
class Resources:
    """What one run asks of the machine or cluster that executes it; unset means the backend's own default."""

    cpus: int | None = None
    """CPU cores per worker process (Slurm `--cpus-per-task`, Ray `num_cpus`)."""
    gpus: int = 0
    """GPUs per node (Slurm `--gpus-per-node`); on Ray, per worker when `workers` > 1, else for the entrypoint."""
    memory_gb: float | None = None
    """Memory per node in GiB (Slurm `--mem`, Ray `memory`)."""
    nodes: int = 1
    """Nodes the run spans (Slurm `--nodes`; multi-node runs start `torchrun` on each through `srun`)."""
    workers: int = 1
    """Training processes in all (DDP ranks): `nodes` × processes per node on Slurm, Ray Train workers on Ray."""
    time_limit_min: int | None = None
    """Wall-clock limit in minutes (Slurm `--time`); the scheduler ends a run that outlives it (TIMEOUT)."""
    partition: str | None = None
    """Slurm partition (`--partition`)."""
    address: str | None = None
    """Ray: the head's dashboard address (http://host:8265) the job is submitted to."""

    def __post_init__(self) -> None:
        for name in ("gpus", "nodes", "workers", "cpus", "time_limit_min"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be a whole number, got {value!r}")
            if value < (0 if name == "gpus" else 1):
                raise ValueError(f"{name} must be at least {0 if name == 'gpus' else 1}, got {value}")
        memory = self.memory_gb
        if memory is not None and (isinstance(memory, bool) or not isinstance(memory, int | float) or memory <= 0):
            raise ValueError(f"memory_gb must be a positive number of GiB, got {self.memory_gb!r}")
        if self.workers % self.nodes:
            raise ValueError(f"workers must be a multiple of nodes (each node runs as many), got {self.workers} "
                             f"workers on {self.nodes} nodes")
        for name in ("partition", "address"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip() or "\n" in value):
                raise ValueError(f"{name} must be one line of text, got {value!r}")

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None, *, base: Resources | None = None) -> Resources:
        """`base` (a cluster's defaults) with `data`'s fields over it; ValueError names an unknown or bad field."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data or {}) - known)
        if unknown:
            raise ValueError(f"{unknown[0]} is not a resource (known: {', '.join(sorted(known))})")
        return dataclasses.replace(base or cls(), **(data or {}))

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    @property
    def per_node(self) -> int:
        """Training processes on each node."""
        return self.workers // self.nodes


@dataclass(frozen=True)
class Launch:
    """One run's command line, `python -m MODULE ARGS…`, and where it runs: the backend chooses the interpreter and
    the launcher (a plain process, `torchrun` on each node, Ray Train's workers) from its resources."""

    name: str
    """`preflab-{job}-{attempt}`: deterministic, so a worker that died after submitting finds the submission again."""
    attempt: int
    """Which submission of the run this is: 1, then one more each time a preempted run is submitted again."""
    module: str
    args: list[str]
    workdir: Path
    """The run's own directory on the shared path: its config, checkpoints, metrics, model and the backend's log."""
    log_path: Path
    """The job's log: the local backend writes the trainer's output straight into it; the others' output is copied
    there from their own log (`Backend.read_log`)."""
    resources: Resources = field(default_factory=Resources)
    reads: tuple[Path, ...] = ()
    """Files and directories the run reads (its export, base model, reward model): a cluster must see them."""
    checksums: dict[str, str] = field(default_factory=dict)
    """File → sha256 (the export's files, as its card lists them): a cluster checks them on the node before the
    command starts (`python -m training.checksums`)."""
    env: dict[str, str] = field(default_factory=dict)
    """Variables the run needs beyond the backend's own environment (offline flags, the run's marker)."""


@dataclass(frozen=True)
class Submission:
    """How a backend finds one submitted run again (after a worker restart too): stored in the run's directory."""

    backend: str
    """The backend's kind (`local`, `slurm`, `ray`)."""
    id: str
    """The backend's own id for it: a process id, a Slurm job id, a Ray submission id."""
    attempt: int
    """The launch's attempt, 1 first; a launch made again (`cluster_job.again`) is the next one, submitted under the
    name `{prefix}-{job}-{attempt}`."""
    log_offset: int = 0
    """How much of the backend's log is already copied into the job's log."""
    log_file: str | None = None
    """The backend's own log file on the shared path, when it writes one (Slurm's --output)."""

    def save(self, path: Path) -> None:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(dataclasses.asdict(self)), encoding="utf-8")
        os.replace(tmp, path)  # whole: a reader never sees half a record

    @classmethod
    def load(cls, path: Path) -> Submission | None:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return cls(str(data["backend"]), str(data["id"]), int(data["attempt"]), int(data.get("log_offset", 0)),
                       data.get("log_file"))
        except (OSError, ValueError, KeyError, TypeError):
            return None


@dataclass(frozen=True)
class Status:
    state: str
    """One of STATES."""
    reason: str | None = None
    """Why it ended, in the backend's words (`TIMEOUT: the run passed its 30 min limit`), for a failed run's page."""
    exit_code: int | None = None
    requeue: bool = False
    """The scheduler took the nodes back (preempted): submit again, resuming from the last checkpoint."""

    @property
    def done(self) -> bool:
        return self.state in TERMINAL


class Backend(Protocol):
    """Submit a command line with its resources, report its state, read new log text from an offset, cancel it."""

    kind: str
    remote: bool
    """True when the run outlives the worker that submitted it (Slurm, Ray): a worker that shuts down leaves it
    running and the next worker polls it from its stored submission; the local backend's run dies with its worker."""

    def check(self, launch: Launch) -> None:
        """Refuse, before submitting, what cannot work (a path the cluster does not see): BackendError."""
        ...

    def describe(self, launch: Launch) -> str:
        """What the job's log says was started (the command line, or where it was sent)."""
        ...

    def submit(self, launch: Launch) -> Submission: ...

    def find(self, launch: Launch) -> Submission | None:
        """The submission named `launch.name` made by an earlier worker, if the backend knows it."""
        ...

    def status(self, submission: Submission) -> Status: ...

    def read_log(self, submission: Submission, final: bool = False) -> tuple[str, int]:
        """Whole lines of log written since `submission.log_offset`, and the new offset; `final` (the run ended)
        takes a last line without its newline too."""
        ...

    def cancel(self, submission: Submission) -> None: ...

    def close(self) -> None:
        """Let go of what this worker holds for its submission (the local backend's lifeline to its trainer)."""
        ...


def checked(launch: Launch, python: str) -> list[list[str]]:
    """The commands a cluster runs before the launch: the checksum check of what the run reads, when it has any."""
    if not launch.checksums:
        return []
    pairs = [part for name, sha in sorted(launch.checksums.items()) for part in (name, sha)]
    return [[python, "-m", "training.checksums", *pairs]]


def submission_name(prefix: str, job_id: int, attempt: int) -> str:
    """`preflab-{job}-{attempt}` with the cluster's `job_prefix` (preflab unless set)."""
    return f"{prefix}-{job_id}-{attempt}"


@dataclass(frozen=True)
class Cluster:
    name: str
    kind: str
    resources: Resources = field(default_factory=Resources)
    shared_dir: Path | None = None
    """Where the run's directory, its export and its models must lie: a path the app and the nodes both see."""
    template: Path | None = None
    python: str = sys.executable
    env: dict[str, str] = field(default_factory=dict)
    """Extra variables for the run on the nodes (Ray: in the runtime_env)."""
    runtime_env: dict[str, Any] = field(default_factory=dict)
    """Ray only: more of the job's runtime_env (a conda or pip environment, py_modules)."""
    job_prefix: str = "preflab"
    """The start of every job name (`{job_prefix}-{job}-{attempt}`): two preflab installs that share a cluster each
    set their own, since their job ids overlap."""
    max_running: int | None = None
    """The concurrency cap: at most this many of preflab's runs at once on the cluster (None: no cap); the worker
    holds further runs queued rather than submitting them."""
    secret: str | None = field(default=None, repr=False)
    """Ray: a token sent to the head as `Authorization: Bearer …`; Slurm with a `login` node: the SSH private key.
    Decrypted only in the worker, never logged."""
    login: str | None = None
    """Slurm: `user@host` or `user@host:port` of a login node that runs sbatch, squeue, scontrol, sacct and scancel
    over SSH; None: they run on the worker's own host."""
    source: str = "file"
    """Where the cluster is configured: `file` (PREFLAB_CLUSTERS_FILE, read-only in the app) or `app` (the admin
    page and API)."""


@dataclass(frozen=True)
class Probe:
    """What a cluster's connection test found: whether the trivial job ran, how long it took and the backend's
    own words."""

    ok: bool
    seconds: float
    detail: str


def check_shared(cluster: Cluster, workdir: Path, reads: tuple[Path, ...]) -> None:
    """Refuse, before anything is submitted, a run whose files the cluster would not see: every path must lie under
    the cluster's shared directory, which must exist. BackendError naming the path."""
    shared = cluster.shared_dir
    if shared is None:
        return
    if not shared.is_dir():
        raise BackendError(f"the shared path {shared} of cluster {cluster.name} does not exist here: the app, the "
                         f"worker and the nodes must all see it")
    root = shared.resolve()
    for path in (workdir, *reads):
        if not path.resolve().is_relative_to(root):
            raise BackendError(f"{path} is outside the shared path {shared} of cluster {cluster.name}: its nodes "
                             f"cannot read it (put PREFLAB_DATA_DIR and the models under {shared})")
