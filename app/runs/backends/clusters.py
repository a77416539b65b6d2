"""Named clusters: where a run may be sent (`local`, and those an admin lists in PREFLAB_CLUSTERS_FILE), each with
its kind, shared path and default resources, and the backend that executes a run there.

The file is TOML, one table per cluster:

    [clusters.hpc]
    kind = "slurm"                     # slurm | ray
    shared_dir = "/shared/preflab"     # seen at this path by the app, the worker and every node
    template = "/etc/preflab/slurm-job.sh"   # optional: the job script template (see slurm.DEFAULT_TEMPLATE)
    python = "/opt/preflab/.venv/bin/python" # optional: the interpreter on the nodes (default: the worker's)
    job_prefix = "preflab"             # optional: job names are JOB_PREFIX-{job}-{attempt}
    login = "preflab@login.hpc"        # optional: run the Slurm commands on this login node over SSH
    max_running = 4                    # optional: the concurrency cap (runs at once; more wait queued)
    [clusters.hpc.resources]           # defaults a run's own resources override
    partition = "gpu"
    gpus = 1
    time_limit_min = 240
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path
from typing import Any

from app.runs.backends.base import LOCAL, Backend, Cluster, Probe, Resources

KINDS = ("local", "slurm", "ray")
LOGIN = re.compile(r"[A-Za-z0-9._-]{1,64}@[A-Za-z0-9.-]{1,253}(:[0-9]{1,5})?")
"""A Slurm login node: `user@host` or `user@host:port` (ssh's own form; no options can ride in on it)."""
LOGIN_RULE = "a Slurm cluster's login node is user@host or user@host:port"


class ClusterError(ValueError):
    """The clusters file or a cluster in it is unusable; the message names the file and the key."""


def load(path: Path | None) -> dict[str, Cluster]:
    """`local` and every cluster of the file (when one is set), by name."""
    found = {LOCAL: Cluster(LOCAL, "local")}
    if path is None:
        return found
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ClusterError(f"PREFLAB_CLUSTERS_FILE {path}: {exc}") from None
    tables = data.get("clusters", {})
    if not isinstance(tables, dict):
        raise ClusterError(f"PREFLAB_CLUSTERS_FILE {path}: `clusters` must be a table of clusters")
    for name, table in tables.items():
        found[name] = _cluster(path, name, table)
    return found


def _cluster(path: Path, name: str, table: Any) -> Cluster:
    where = f"PREFLAB_CLUSTERS_FILE {path}: clusters.{name}"
    if name == LOCAL or not isinstance(table, dict):
        raise ClusterError(f"{where}: {'local is built in' if name == LOCAL else 'must be a table'}")
    known = {"kind", "resources", "shared_dir", "template", "python", "env", "runtime_env", "job_prefix",
             "max_running", "login"}
    unknown = sorted(set(table) - known)
    if unknown:
        raise ClusterError(f"{where}.{unknown[0]} is not a cluster setting (known: {', '.join(sorted(known))})")
    kind = table.get("kind")
    if kind not in ("slurm", "ray"):
        raise ClusterError(f"{where}.kind must be slurm or ray, got {kind!r}")
    try:
        resources = Resources.from_dict(table.get("resources") or {})
    except (ValueError, TypeError) as exc:
        raise ClusterError(f"{where}.resources: {exc}") from None
    if kind == "ray" and not resources.address:
        raise ClusterError(f"{where}.resources.address: a Ray cluster needs its head's address (http://host:8265)")
    if not table.get("shared_dir"):
        raise ClusterError(f"{where}.shared_dir: the path the app and the nodes both see must be set")
    prefix = table.get("job_prefix", "preflab")
    if not isinstance(prefix, str) or not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]{0,39}", prefix):
        raise ClusterError(f"{where}.job_prefix must be a letter then up to 39 letters, digits, - or _, got {prefix!r}")
    login = table.get("login")
    if login is not None and (kind != "slurm" or not isinstance(login, str) or not LOGIN.fullmatch(login)):
        raise ClusterError(f"{where}.login: {LOGIN_RULE}, got {login!r}")
    cap = table.get("max_running")
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
        raise ClusterError(f"{where}.max_running must be a whole number of at least 1, got {cap!r}")
    return Cluster(name, kind, resources, shared_dir=Path(table["shared_dir"]),
                   template=Path(table["template"]) if table.get("template") else None,
                   python=str(table.get("python") or sys.executable),
                   env={str(k): str(v) for k, v in (table.get("env") or {}).items()},
                   runtime_env=dict(table.get("runtime_env") or {}), job_prefix=prefix, max_running=cap,
                   login=login)


def backend_for(cluster: Cluster) -> Backend:
    """A fresh backend for one run on `cluster` (the local one holds that run's process)."""
    if cluster.kind == "slurm":
        from app.runs.backends.slurm import SlurmBackend

        return SlurmBackend(cluster)
    if cluster.kind == "ray":
        from app.runs.backends.ray_jobs import RayBackend

        return RayBackend(cluster)
    from app.runs.backends.local import LocalBackend

    return LocalBackend()


def probe(cluster: Cluster, timeout: float = 120.0) -> Probe:
    """Submit a trivial job to `cluster` (Ray: `python -c 'print(1)'`; Slurm: `sbatch --wrap true`) and wait for it."""
    if cluster.kind == "slurm":
        from app.runs.backends.slurm import probe as slurm_probe

        return slurm_probe(cluster, timeout)
    if cluster.kind == "ray":
        from app.runs.backends.ray_jobs import probe as ray_probe

        return ray_probe(cluster, timeout)
    return Probe(True, 0.0, "local runs on the worker's own host: nothing to reach")
