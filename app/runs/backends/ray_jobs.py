"""The `ray` backend: Ray Jobs through `JobSubmissionClient`, over HTTP to the head's dashboard address.

Each submission's id is `preflab-{job}-{attempt}`: a worker that died between submitting and recording finds the
job under that id (Ray refuses a second job with the same id), so a run is never launched twice. The runtime_env
carries the run's environment (offline flags, the worker's PYTHONPATH) and whatever the cluster adds. A run of N
workers starts `training.ray_train`, which trains over Ray Train's `TorchTrainer` (DDP: gloo on CPU, NCCL on GPUs).
The worker asks for state and logs at each poll and holds no connection in between. The Ray client is imported
when a Ray cluster is first used: the app runs without the `cluster` extra.
"""

from __future__ import annotations

import os
import shlex
import time
from typing import Any

from app.runs.backends.base import BackendError, Cluster, Launch, Probe, Status, Submission, check_shared, checked

STATES = {"PENDING": "queued", "RUNNING": "running", "SUCCEEDED": "succeeded", "STOPPED": "cancelled",
          "FAILED": "failed"}
PASSED_ON = ("PYTHONPATH",)
"""Variables of the worker's own environment a Ray job gets too: where preflab's packages are, when not installed."""


def entrypoint(launch: Launch, python: str) -> str:
    """`python -m MODULE ARGS`, or for several workers `python -m training.ray_train --workers N … -- MODULE ARGS`,
    run in the run's directory (a Ray job otherwise starts where its head was started) once the export's checksums
    are checked there."""
    res = launch.resources
    if res.workers == 1:
        command = [python, "-m", launch.module, *launch.args]
    else:
        per_worker = ["--workers", str(res.workers), "--gpus-per-worker", str(res.gpus)]
        if res.cpus:
            per_worker += ["--cpus-per-worker", str(res.cpus)]
        command = [python, "-m", "training.ray_train", *per_worker, "--", launch.module, *launch.args]
    steps = [f"cd {shlex.quote(str(launch.workdir))}", *(shlex.join(c) for c in checked(launch, python))]
    return " && ".join([*steps, f"exec {shlex.join(command)}"])


def runtime_env(launch: Launch, cluster: Cluster) -> dict[str, Any]:
    env = {k: os.environ[k] for k in PASSED_ON if os.environ.get(k)} | cluster.env | launch.env
    extra = dict(cluster.runtime_env)
    return extra | {"env_vars": dict(extra.get("env_vars") or {}) | env}


def headers(cluster: Cluster) -> dict[str, str] | None:
    """The cluster's token as a bearer header for the head (a token-authenticated dashboard or a proxy before it)."""
    return {"Authorization": f"Bearer {cluster.secret}"} if cluster.secret else None


def probe(cluster: Cluster, timeout: float = 120.0) -> Probe:
    """Submit `python -c 'print(1)'` as a Ray job and wait for it to end: the connection test of the admin page."""
    started = time.monotonic()
    backend = RayBackend(cluster)
    try:
        client = backend.client()
        job_id = client.submit_job(entrypoint=f"{shlex.quote(cluster.python)} -c 'print(1)'",
                                   runtime_env={"env_vars": dict(cluster.env)} if cluster.env else None,
                                   metadata={"preflab": "connection test"})
        state = ""
        while time.monotonic() - started < timeout:
            state = str(getattr(client.get_job_status(job_id), "value", ""))
            if state in ("SUCCEEDED", "FAILED", "STOPPED"):
                break
            time.sleep(0.5)
        seconds = time.monotonic() - started
        if state == "SUCCEEDED":
            printed = (client.get_job_logs(job_id).strip().splitlines() or [""])[-1][:200]  # after Ray's own lines
            return Probe(True, seconds, f"Ray ran job {job_id} (python -c 'print(1)'), which printed {printed!r}")
        if state in ("FAILED", "STOPPED"):
            info = client.get_job_info(job_id)
            return Probe(False, seconds, f"Ray job {job_id} {state}: {(info.message or '').strip()[:500]}")
        client.stop_job(job_id)
        return Probe(False, seconds, f"Ray job {job_id} did not finish within {timeout:g} s "
                                     f"(last state {state or 'unknown'})")
    except BackendError as exc:
        return Probe(False, time.monotonic() - started, str(exc))
    except Exception as exc:  # the client's own words: a refused address, a rejected token
        return Probe(False, time.monotonic() - started, f"Ray: {exc}"[:1000])


class RayBackend:
    kind = "ray"
    remote = True

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._client: Any = None

    def client(self) -> Any:
        if self._client is None:
            try:
                from ray.job_submission import JobSubmissionClient
            except ImportError:
                raise BackendError("the Ray client is not installed on the worker's host (pip install "
                                   "'preflab[cluster]')") from None
            try:
                self._client = JobSubmissionClient(self.cluster.resources.address, headers=headers(self.cluster))
            except Exception as exc:  # a refused or unresolvable address: the client says which
                raise BackendError(f"cannot reach the Ray head at {self.cluster.resources.address} "
                                   f"(cluster {self.cluster.name}): {exc}") from None
        return self._client

    def check(self, launch: Launch) -> None:
        check_shared(self.cluster, launch.workdir, launch.reads)

    def describe(self, launch: Launch) -> str:
        return (f"Ray job {launch.name} on cluster {self.cluster.name} ({self.cluster.resources.address}): "
                f"{entrypoint(launch, self.cluster.python)}")

    def submit(self, launch: Launch) -> Submission:
        res = launch.resources
        single = res.workers == 1
        try:
            self.client().submit_job(
                entrypoint=entrypoint(launch, self.cluster.python), submission_id=launch.name,
                runtime_env=runtime_env(launch, self.cluster),
                # One process: the entrypoint holds the run's resources. Several: the entrypoint only drives Ray
                # Train's workers, which ask for theirs.
                entrypoint_num_cpus=(res.cpus or 1) if single else 0, entrypoint_num_gpus=res.gpus if single else 0,
                entrypoint_memory=int(res.memory_gb * 1024**3) if res.memory_gb and single else None,
                metadata={"preflab_workdir": str(launch.workdir)})
        except BackendError:
            raise
        except Exception as exc:
            found = self.find(launch)
            if found is not None:  # submitted already, by an attempt that died before it could say so
                return found
            raise BackendError(f"Ray refused job {launch.name}: {exc}") from None
        return Submission(self.kind, launch.name, launch.attempt)

    def find(self, launch: Launch) -> Submission | None:
        try:
            info = self.client().get_job_info(launch.name)
        except BackendError:
            raise
        except Exception:  # "does not exist"
            return None
        workdir = (info.metadata or {}).get("preflab_workdir")
        if workdir != str(launch.workdir):
            raise BackendError(f"Ray already holds a job {launch.name} of another preflab (it writes to {workdir}); "
                               f"two preflab installs on one Ray cluster need their own heads or namespaces")
        return Submission(self.kind, launch.name, launch.attempt)

    def status(self, submission: Submission) -> Status:
        try:
            info = self.client().get_job_info(submission.id)
        except BackendError:
            raise
        except Exception as exc:
            return Status("failed", f"Ray no longer knows job {submission.id}: {exc}")
        state = STATES.get(str(getattr(info.status, "value", info.status)), "failed")
        if state == "failed":
            return Status(state, f"Ray: {(info.message or 'the job failed').strip()[:500]}",
                          exit_code=getattr(info, "driver_exit_code", None))
        return Status(state, "stopped on the cluster (ray job stop)" if state == "cancelled" else None)

    def read_log(self, submission: Submission, final: bool = False) -> tuple[str, int]:
        try:
            text = self.client().get_job_logs(submission.id)
        except BackendError:
            raise
        except Exception:  # not started yet, or gone: nothing new to copy
            return "", submission.log_offset
        new = text[submission.log_offset:]
        if not final:
            new = new[: new.rfind("\n") + 1]
        return new, submission.log_offset + len(new)

    def cancel(self, submission: Submission) -> None:
        try:
            self.client().stop_job(submission.id)
        except BackendError:
            raise
        except Exception as exc:
            raise BackendError(f"Ray could not stop job {submission.id}: {exc}") from None

    def close(self) -> None:
        self._client = None
