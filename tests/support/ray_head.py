"""A real local Ray head for the cluster tests: `ray start --head --block` on 127.0.0.1 with free ports, in its own
process group, so that `stop` ends exactly what it started (no `ray stop`, which ends every Ray on the host)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path


def _free_ports(n: int) -> list[int]:
    """`n` distinct free ports: each socket stays bound until all are chosen, so the kernel never hands one out
    twice (picked one at a time, two of Ray's components once got the same port and the head refused to start)."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


@dataclass
class RayHead:
    address: str
    """The dashboard's address, which the Jobs API is reached at."""
    proc: subprocess.Popen[bytes]
    temp_dir: Path
    output: Path

    def stop(self) -> None:
        for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 30)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        _kill_group_leftovers(self.proc.pid)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def _kill_group_leftovers(pgid: int) -> None:
    """Ray's daemons (raylet, GCS, dashboard, workers) started in the head's process group."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def ray_command() -> list[str] | None:
    """The `ray` command of this interpreter's environment, or None without ray[default]."""
    script = Path(sys.executable).with_name("ray")
    if script.exists():
        return [str(script)]
    found = shutil.which("ray")
    return [found] if found else None


def start(num_cpus: int = 2, timeout_s: float = 180) -> RayHead:
    command = ray_command()
    if command is None:
        raise RuntimeError("the `ray` command is not installed (pip install 'preflab[cluster]')")
    temp_dir = Path(tempfile.mkdtemp(prefix="pfray-", dir="/tmp"))  # short: Ray's socket paths must stay short
    output = temp_dir / "head.log"
    port, dashboard, client, agent, metrics, runtime_env, node_manager, object_manager = _free_ports(8)
    args = [*command, "start", "--head", "--block", f"--num-cpus={num_cpus}", "--num-gpus=0",
            "--disable-usage-stats", "--node-ip-address=127.0.0.1", f"--port={port}",
            "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}", "--include-dashboard=true",
            f"--temp-dir={temp_dir}", "--object-store-memory=200000000",
            f"--ray-client-server-port={client}", f"--dashboard-agent-listen-port={agent}",
            f"--metrics-export-port={metrics}", f"--runtime-env-agent-port={runtime_env}",
            f"--node-manager-port={node_manager}", f"--object-manager-port={object_manager}"]
    with open(output, "ab") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env=os.environ | {"RAY_USAGE_STATS_ENABLED": "0"})
    head = RayHead(f"http://127.0.0.1:{dashboard}", proc, temp_dir, output)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"{head.address}/api/version", timeout=5) as answer:  # noqa: S310 (local)
                if answer.status == 200:
                    return head
        except OSError:
            pass
        time.sleep(0.5)
    log = output.read_text(errors="replace")[-3000:] if output.exists() else ""
    head.stop()
    raise RuntimeError(f"the Ray head did not come up at {head.address}:\n{log}")
