"""A real single-node Slurm on this machine for the cluster tests: munged, slurmctld and slurmd from Debian's
`munge` and `slurm-wlm`, with their key, configuration, state and logs in one scratch directory.

Run as root (the daemons' own user). Nothing here touches /etc: the key and socket are the scratch directory's,
the clients find the configuration through SLURM_CONF, and the ports are free ones, so a host's own Slurm (or a
second test run) is left alone. `start` returns once the node is idle; `stop` ends the daemons it started.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

NEEDED = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel")


def missing() -> list[str]:
    """The programs this needs that are not installed (apt-get install slurm-wlm munge)."""
    return [name for name in NEEDED if shutil.which(name) is None and not Path(f"/usr/sbin/{name}").exists()]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _program(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


@dataclass
class Slurm:
    root: Path
    conf: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def stop(self) -> None:
        for proc in reversed(self.processes):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in reversed(self.processes):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.processes.clear()
        shutil.rmtree(self.root, ignore_errors=True)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(self.root.glob("*.log")))


def _node_line() -> str:
    """This host as slurmd sees it (`slurmd -C`): a node configured with more than it has would be drained."""
    done = subprocess.run([_program("slurmd"), "-C"], capture_output=True, text=True, timeout=60, check=True)
    line = done.stdout.splitlines()[0]
    fields = dict(part.split("=", 1) for part in line.split())
    return (f"NodeName={fields['NodeName']} NodeAddr=127.0.0.1 CPUs={fields['CPUs']} "
            f"Boards={fields['Boards']} SocketsPerBoard={fields['SocketsPerBoard']} "
            f"CoresPerSocket={fields['CoresPerSocket']} ThreadsPerCore={fields['ThreadsPerCore']} "
            f"RealMemory={int(fields['RealMemory']) // 2} State=UNKNOWN")


def start(timeout_s: float = 120) -> Slurm:
    """munged, slurmctld and slurmd in a scratch directory, up and with the node idle; RuntimeError with their logs
    otherwise."""
    root = Path(tempfile.mkdtemp(prefix="preflab-slurm-"))
    os.chmod(root, 0o755)
    key = root / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    munge_socket = root / "munge.socket"
    node = _node_line()
    hostname = node.split()[0].split("=", 1)[1]
    conf = root / "slurm.conf"
    conf.write_text("\n".join([
        "ClusterName=preflab-test", f"SlurmctldHost={hostname}(127.0.0.1)",
        "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={munge_socket}",
        "SlurmUser=root", "SlurmdUser=root", f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}",
        f"StateSaveLocation={root / 'state'}", f"SlurmdSpoolDir={root / 'spool'}",
        f"SlurmctldPidFile={root / 'slurmctld.pid'}", f"SlurmdPidFile={root / 'slurmd.pid'}",
        f"SlurmctldLogFile={root / 'slurmctld.log'}", f"SlurmdLogFile={root / 'slurmd.log'}",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "MpiDefault=none",
        "SchedulerType=sched/builtin", "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
        "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
        "ReturnToService=2", "MinJobAge=3600", "KillWait=5", "SchedulerParameters=sched_interval=1",
        # `low` runs are preempted (cancelled, state PREEMPTED) by `high` ones: how a test preempts a run.
        "PreemptType=preempt/partition_prio", "PreemptMode=CANCEL",
        node, "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
        "PartitionName=low Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=1",
        "PartitionName=high Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=2", ""]))
    for sub in ("state", "spool"):
        (root / sub).mkdir()
    slurm = Slurm(root, conf)
    env = os.environ | slurm.env
    try:
        slurm.processes.append(subprocess.Popen(
            [_program("munged"), "--foreground", "--force", f"--key-file={key}", f"--socket={munge_socket}",
             f"--pid-file={root / 'munged.pid'}", f"--log-file={root / 'munged.log'}",
             f"--seed-file={root / 'munged.seed'}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        _wait(lambda: munge_socket.exists(), "munged's socket", timeout_s, slurm)
        slurm.processes.append(subprocess.Popen([_program("slurmctld"), "-D", "-c", "-f", str(conf)], env=env,
                                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        slurm.processes.append(subprocess.Popen([_program("slurmd"), "-D", "-f", str(conf)], env=env,
                                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        _wait(lambda: _node_state(env) == "idle", "the node to be idle", timeout_s, slurm)
    except BaseException:
        slurm.stop()
        raise
    return slurm


def _node_state(env: dict[str, str]) -> str:
    done = subprocess.run(["sinfo", "--noheader", "--format=%T"], capture_output=True, text=True, env=env,
                          timeout=30)
    return done.stdout.strip().rstrip("*") if done.returncode == 0 else ""


def _wait(condition, what: str, timeout_s: float, slurm: Slurm) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in slurm.processes):
            break
        if condition():
            return
        time.sleep(0.2)
    raise RuntimeError(f"Slurm did not come up (waiting for {what}):\n{slurm.logs()}")
