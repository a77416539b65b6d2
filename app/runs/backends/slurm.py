"""The `slurm` backend: a job script from an admin-editable template, submitted with `sbatch`, followed with
`squeue` / `scontrol` (and `sacct` where accounting keeps finished jobs), cancelled with `scancel`.

The script's `#SBATCH` lines come from the run's resources. A run of several processes starts one `torchrun` per
node through `srun`, with the rendezvous on the allocation's first node (SLURM_JOB_NODELIST) keyed by
SLURM_JOB_ID. The run's output goes to its own directory on the shared path (`slurm-ATTEMPT.log`), which the worker
copies into the job's log from the offset it stored. The job is submitted with --no-requeue: a preempted job ends
PREEMPTED and the worker submits the next attempt itself, resuming from the trainer's last checkpoint.

The Slurm commands run on the worker's own host, or, for a cluster with a `login` node, on that node over SSH
(`ssh -o BatchMode=yes user@login -- sbatch …`) with the cluster's secret as the private key: the job script and the
run's log lie on the shared path, so only the commands travel.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import shlex
import string
import subprocess
import tempfile
import time
from pathlib import Path

from app.runs.backends.base import BackendError, Cluster, Launch, Probe, Status, Submission, check_shared, checked

DEFAULT_TEMPLATE = """#!/bin/bash
$sbatch
# A preflab run ($name). This script comes from a template an admin may edit (a cluster's `template`): load
# modules or activate an environment before the launch line. Placeholders: $$sbatch (the #SBATCH lines), $$name,
# $$workdir, $$exports (the run's environment) and $$launch (the command); $$$$ is a dollar sign.
set -eo pipefail
cd $workdir
$exports
$launch
"""

RENDEZVOUS_PORT = 29500

STATES = {
    "PENDING": "queued", "CONFIGURING": "queued", "REQUEUED": "queued", "REQUEUE_FED": "queued",
    "REQUEUE_HOLD": "queued", "RESIZING": "queued", "SUSPENDED": "queued",
    "RUNNING": "running", "COMPLETING": "running", "STAGE_OUT": "running", "SIGNALING": "running",
    "COMPLETED": "succeeded", "CANCELLED": "cancelled",
}
"""Slurm job states that are not failures, in preflab's words; every other end state is a failure (`REASONS`)."""
REASONS = {
    "TIMEOUT": "the run passed its time limit",
    "OUT_OF_MEMORY": "the run used more memory than it asked for",
    "NODE_FAIL": "a node of the run failed",
    "PREEMPTED": "the scheduler took the nodes back for another job",
    "BOOT_FAIL": "a node failed to boot",
    "DEADLINE": "the run passed its deadline",
    "FAILED": "the run exited with an error",
}


def slurm_status(state: str, exit_code: str | None = None, reason: str | None = None) -> Status:
    """A Slurm job state (`scontrol`'s JobState, `sacct`'s State) as preflab's: TIMEOUT, OUT_OF_MEMORY and NODE_FAIL
    fail the run with their reason; PREEMPTED asks for the run to be submitted again from its checkpoint."""
    name = state.split()[0].rstrip("+") if state.strip() else "UNKNOWN"  # sacct writes `CANCELLED by 0`, `OUT_OF_ME+`
    if name.startswith("OUT_OF_ME"):
        name = "OUT_OF_MEMORY"
    code = _exit_code(exit_code)
    if name in STATES:
        said = "cancelled on the cluster (scancel)" if name == "CANCELLED" else None
        return Status(STATES[name], said, exit_code=code)
    words = REASONS.get(name, "the job ended without finishing")
    detail = f" ({reason})" if reason and reason not in ("None", name) else ""
    if name == "FAILED" and code is not None:
        detail = f" (exit code {code})" + detail
    return Status("queued" if name == "PREEMPTED" else "failed", f"{name}: {words}{detail}", exit_code=code,
                  requeue=name == "PREEMPTED")


def _exit_code(value: str | None) -> int | None:
    """`2:0` (exit code 2, no signal) → 2; `0:9` (killed by signal 9) → 137, as a shell says it."""
    if not value:
        return None
    code, _, sig = value.partition(":")
    try:
        return int(code) or (128 + int(sig) if sig and int(sig) else 0)
    except ValueError:
        return None


def sbatch_lines(launch: Launch, log_file: Path) -> list[str]:
    """The script's `#SBATCH` lines: one task per node (torchrun starts the node's processes), the resources."""
    res = launch.resources
    lines = [f"--job-name={launch.name}", f"--output={log_file}", f"--chdir={launch.workdir}",
             f"--nodes={res.nodes}", "--ntasks-per-node=1", "--no-requeue"]
    if res.cpus:
        lines.append(f"--cpus-per-task={res.cpus * res.per_node}")
    if res.gpus:
        lines.append(f"--gpus-per-node={res.gpus}")
    if res.memory_gb:
        lines.append(f"--mem={max(1, round(res.memory_gb * 1024))}M")
    if res.time_limit_min:
        lines.append(f"--time={res.time_limit_min}")
    if res.partition:
        lines.append(f"--partition={res.partition}")
    return [f"#SBATCH {line}" for line in lines]


def launch_line(launch: Launch, python: str) -> str:
    """`python -m MODULE ARGS` for one process; for several, `srun` starts `torchrun` on every node, rendezvousing on
    the allocation's first node (so each node runs `workers / nodes` ranks of one DDP job). The export's checksums
    are checked first, on the node."""
    res = launch.resources
    module = [launch.module, *launch.args]
    before = "".join(shlex.join(command) + "\n" for command in checked(launch, python))  # set -e stops on a miss
    if res.workers == 1:
        return before + "exec " + shlex.join([python, "-m", *module])
    torchrun = [python, "-m", "torch.distributed.run", f"--nnodes={res.nodes}", f"--nproc_per_node={res.per_node}",
                "--rdzv_backend=c10d", "--rdzv_id=$SLURM_JOB_ID", "--rdzv_endpoint=$HEAD:" + str(RENDEZVOUS_PORT),
                "--module", *module]
    head = 'HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)'
    # $SLURM_JOB_ID and $HEAD stay unquoted so that the node's shell expands them; everything else is quoted.
    quoted = " ".join(arg if arg.startswith(("--rdzv_id=", "--rdzv_endpoint=")) else shlex.quote(arg)
                      for arg in torchrun)
    return f"{before}{head}\nexec srun --ntasks-per-node=1 --kill-on-bad-exit=1 {quoted}"


def job_script(launch: Launch, cluster: Cluster, log_file: Path) -> str:
    """The job script: the cluster's template (or DEFAULT_TEMPLATE) with the run's lines put in."""
    template = DEFAULT_TEMPLATE
    if cluster.template is not None:
        try:
            template = cluster.template.read_text(encoding="utf-8")
        except OSError as exc:
            raise BackendError(f"the job script template {cluster.template} of cluster {cluster.name} cannot be "
                               f"read: {exc.strerror}") from None
    env = cluster.env | launch.env
    exports = "\n".join(f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items()))
    try:
        return string.Template(template).substitute(
            sbatch="\n".join(sbatch_lines(launch, log_file)), name=launch.name,
            workdir=shlex.quote(str(launch.workdir)), exports=exports, launch=launch_line(launch, cluster.python))
    except (KeyError, ValueError) as exc:
        raise BackendError(f"the job script template {cluster.template} of cluster {cluster.name} has an unknown "
                           f"placeholder {exc}") from None


def probe(cluster: Cluster, timeout: float = 120.0) -> Probe:
    """Submit `sbatch --wrap true` and wait for it to end: the connection test of the admin page."""
    started = time.monotonic()
    partition = [f"--partition={cluster.resources.partition}"] if cluster.resources.partition else []
    try:
        backend = SlurmBackend(cluster)
        out = backend.shell.run(["sbatch", "--parsable", f"--job-name={cluster.job_prefix}-connection-test",
                                 "--output=/dev/null", *partition, "--wrap", "true"], what="sbatch")
        job_id = out.strip().split(";")[0]
        status = Status("queued")
        while time.monotonic() - started < timeout:
            found = backend._scontrol(job_id) or backend._sacct(job_id)
            status = slurm_status(*found) if found else Status("failed", f"Slurm no longer knows job {job_id}")
            if status.done:
                break
            time.sleep(0.5)
        seconds = time.monotonic() - started
        if status.state == "succeeded":
            where = f" through {cluster.login}" if cluster.login else ""
            return Probe(True, seconds, f"Slurm ran job {job_id} (sbatch --wrap true){where}")
        if not status.done:
            backend.shell.run(["scancel", job_id], what="scancel")
            return Probe(False, seconds, f"Slurm job {job_id} did not finish within {timeout:g} s "
                                         f"(still {status.state})")
        return Probe(False, seconds, f"Slurm job {job_id}: {status.reason or status.state}")
    except BackendError as exc:
        return Probe(False, time.monotonic() - started, str(exc))


class SlurmBackend:
    kind = "slurm"
    remote = True

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.shell = Shell(cluster)

    def check(self, launch: Launch) -> None:
        check_shared(self.cluster, launch.workdir, launch.reads)

    def describe(self, launch: Launch) -> str:
        where = f" (through {self.cluster.login})" if self.cluster.login else ""
        return f"sbatch {launch.workdir / self._script_name(launch)} on cluster {self.cluster.name}{where}"

    def submit(self, launch: Launch) -> Submission:
        log_file = self._log_file(launch.workdir, launch.attempt)
        script = launch.workdir / self._script_name(launch)
        script.write_text(job_script(launch, self.cluster, log_file), encoding="utf-8")
        out = self.shell.run(["sbatch", "--parsable", str(script)], what="sbatch")
        job_id = out.strip().split(";")[0]  # `ID` or `ID;cluster`
        if not job_id.isdigit():
            raise BackendError(f"sbatch answered {out.strip()!r}, not a job id")
        return Submission(self.kind, job_id, launch.attempt, log_file=str(log_file))

    def find(self, launch: Launch) -> Submission | None:
        """The job of this name whose working directory is this run's: another preflab on the same cluster numbers
        its jobs alike, and its jobs are not this run's."""
        out = self.shell.run(["squeue", "--noheader", "--states=all", f"--name={launch.name}", "--format=%i %Z"],
                             what="squeue")
        ids = [job for job, _, workdir in (line.strip().partition(" ") for line in out.splitlines())
               if job.isdigit() and Path(workdir) == launch.workdir]
        log_file = self._log_file(launch.workdir, launch.attempt)
        return Submission(self.kind, ids[-1], launch.attempt, log_file=str(log_file)) if ids else None

    def status(self, submission: Submission) -> Status:
        found = self._scontrol(submission.id) or self._sacct(submission.id)
        if found is None:
            return Status("failed", f"Slurm no longer knows job {submission.id} (neither scontrol nor sacct lists "
                                    f"it): the run was lost")
        return slurm_status(*found)

    def _scontrol(self, job_id: str) -> tuple[str, str | None, str | None] | None:
        done = self.shell.call(["scontrol", "show", "job", "--oneliner", job_id], what="scontrol")
        if done.returncode != 0:
            return None  # "Invalid job id specified": gone from the controller's memory (MinJobAge)
        fields = dict(part.split("=", 1) for part in done.stdout.split() if "=" in part)
        return fields.get("JobState", ""), fields.get("ExitCode"), fields.get("Reason")

    def _sacct(self, job_id: str) -> tuple[str, str | None, str | None] | None:
        done = self.shell.call(["sacct", "--noheader", "--parsable2", "--jobs", job_id, "--format=State,ExitCode"],
                               what="sacct")
        lines = [line for line in done.stdout.splitlines() if line.strip()]
        if done.returncode != 0 or not lines:  # no accounting on this cluster, or it never heard of the job
            return None
        state, _, code = lines[0].partition("|")
        return state, code, None

    def read_log(self, submission: Submission, final: bool = False) -> tuple[str, int]:
        assert submission.log_file is not None  # every Slurm submission names its output file
        return read_from(Path(submission.log_file), submission.log_offset, final)

    def cancel(self, submission: Submission) -> None:
        self.shell.run(["scancel", submission.id], what="scancel")

    def close(self) -> None:
        return None

    @staticmethod
    def _script_name(launch: Launch) -> str:
        return f"slurm-{launch.attempt}.sh"

    @staticmethod
    def _log_file(workdir: Path, attempt: int) -> Path:
        return workdir / f"slurm-{attempt}.log"


def read_from(path: Path, offset: int, final: bool) -> tuple[str, int]:
    """Whole lines of `path` after byte `offset` (and a last line without its newline when `final`)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            data = fh.read(4 * 1024 * 1024)  # a slow poll catches up over several reads rather than one huge one
    except OSError:
        return "", offset
    if not final:
        data = data[: data.rfind(b"\n") + 1]
    return data.decode("utf-8", errors="replace"), offset + len(data)


KNOWN_HOSTS_ENV = "PREFLAB_SSH_KNOWN_HOSTS"
"""A known_hosts file of preflab's own for the login nodes' host keys (default: the worker user's)."""
SSH_EXIT = 255
"""ssh's own exit status when it could not reach or log in to the login node (the command's status otherwise)."""


class Shell:
    """Runs the Slurm commands: on the worker's host, or on the cluster's login node over SSH.

    Over SSH: BatchMode (never a password prompt), the cluster's secret as the identity when it holds a private key
    (else the worker user's own keys and ssh config), and a host key accepted on first contact and checked on every
    later one (`StrictHostKeyChecking=accept-new`; the worker user's known_hosts, or PREFLAB_SSH_KNOWN_HOSTS): put
    the node's key there beforehand (`ssh-keyscan`) for no first-contact trust at all.
    """

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    def call(self, cmd: list[str], *, what: str) -> subprocess.CompletedProcess[str]:
        """The command's completed process (its own non-zero status is the caller's to read); BackendError when
        the command or the login node cannot be reached at all."""
        argv = self._argv(cmd)
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        except FileNotFoundError:
            if self.cluster.login:
                raise BackendError("ssh is not installed on the worker's host (cluster "
                                   f"{self.cluster.name} reaches Slurm through {self.cluster.login})") from None
            raise BackendError(f"{what} is not installed on the worker's host (a Slurm login node can run it; or "
                               f"set the cluster's login node)") from None
        except subprocess.TimeoutExpired:
            where = f"on {self.cluster.login} " if self.cluster.login else ""
            raise BackendError(f"{what} did not answer {where}within 60 s (is slurmctld up?)") from None
        if self.cluster.login and done.returncode == SSH_EXIT:
            said = (done.stderr or "").strip().splitlines()
            raise BackendError(f"ssh to the login node {self.cluster.login} of cluster {self.cluster.name} failed: "
                               f"{(said[-1] if said else 'no answer')[:300]}")
        return done

    def run(self, cmd: list[str], *, what: str) -> str:
        """The command's output; BackendError with its own words when it fails."""
        done = self.call(cmd, what=what)
        if done.returncode != 0:
            raise BackendError(f"{what} failed: {(done.stderr or done.stdout).strip()[:500]}")
        return done.stdout

    def _argv(self, cmd: list[str]) -> list[str]:
        login = self.cluster.login
        if not login:
            return cmd
        target, _, port = login.partition(":")
        ssh = ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=accept-new", "-o", "ConnectTimeout=20"]
        known_hosts = os.environ.get(KNOWN_HOSTS_ENV)
        if known_hosts:
            ssh += ["-o", f"UserKnownHostsFile={known_hosts}"]
        if port:
            ssh += ["-p", port]
        if self.cluster.secret and "PRIVATE KEY" in self.cluster.secret:
            ssh += ["-o", "IdentitiesOnly=yes", "-i", str(_key_file(self.cluster.secret))]
        # The remote side hands the command to a shell: every word is quoted so a path or a name stays one argument.
        return [*ssh, "--", target, shlex.join(cmd)]


_KEY_FILES: dict[str, Path] = {}


def _key_file(secret: str) -> Path:
    """The private key in a file only this user may read (ssh's `-i` wants a file), written once per worker process
    and key, removed when the process exits."""
    digest = hashlib.sha256(secret.encode()).hexdigest()[:16]
    path = _KEY_FILES.get(digest)
    if path is None or not path.exists():
        fd, name = tempfile.mkstemp(prefix="preflab-ssh-", suffix=".key")  # mode 0600
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(secret.strip() + "\n")  # OpenSSH refuses a key file without its final newline
        path = _KEY_FILES[digest] = Path(name)
        atexit.register(path.unlink, missing_ok=True)
    return path
