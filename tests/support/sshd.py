"""A real OpenSSH server on 127.0.0.1 for the tests of a Slurm login node: Debian's `openssh-server`, its host key,
configuration and the one authorised client key in a scratch directory, on a free port.

The sessions it opens get `env` (SLURM_CONF, so sbatch finds the test's Slurm), since sshd passes nothing of the
client's environment on. Run as root: the test logs in as the user that runs it.
"""

from __future__ import annotations

import getpass
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

SSHD = "/usr/sbin/sshd"


def missing() -> list[str]:
    """The programs this needs that are not installed (apt-get install openssh-server)."""
    return [name for name, path in (("sshd", SSHD), ("ssh", shutil.which("ssh")), ("ssh-keygen",
                                                                                shutil.which("ssh-keygen")))
            if not path or not Path(path).exists()]


@dataclass
class Sshd:
    root: Path
    port: int
    process: subprocess.Popen[bytes]

    @property
    def login(self) -> str:
        return f"{getpass.getuser()}@127.0.0.1:{self.port}"

    @property
    def private_key(self) -> str:
        return (self.root / "client").read_text(encoding="utf-8")

    @property
    def host_key(self) -> str:
        """`ssh-ed25519 AAAA…`: the server's public host key as a known_hosts line ends with it."""
        return " ".join((self.root / "host.pub").read_text(encoding="utf-8").split()[:2])

    @property
    def known_hosts(self) -> Path:
        return self.root / "known_hosts"

    def log(self) -> str:
        path = self.root / "sshd.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.root, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start(env: dict[str, str], timeout_s: float = 30) -> Sshd:
    """sshd in the foreground, accepting the scratch client key only; RuntimeError with its log when it does not
    answer."""
    root = Path(tempfile.mkdtemp(prefix="preflab-sshd-"))
    for name in ("host", "client"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(root / name)], check=True,
                       timeout=30)
    shutil.copy(root / "client.pub", root / "authorized_keys")
    port = _free_port()
    setenv = " ".join(f"{k}={v}" for k, v in sorted(env.items()))
    (root / "sshd_config").write_text("\n".join([
        f"Port {port}", "ListenAddress 127.0.0.1", f"HostKey {root / 'host'}",
        f"AuthorizedKeysFile {root / 'authorized_keys'}", f"PidFile {root / 'sshd.pid'}", "UsePAM no",
        "PasswordAuthentication no", "KbdInteractiveAuthentication no", "PermitRootLogin prohibit-password",
        "StrictModes no", *([f"SetEnv {setenv}"] if setenv else []), ""]))
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # its privilege-separation directory
    process = subprocess.Popen([SSHD, "-D", "-f", str(root / "sshd_config"), "-E", str(root / "sshd.log")])
    server = Sshd(root, port, process)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return server
        except OSError:
            time.sleep(0.1)
    text = server.log()
    server.stop()
    raise RuntimeError(f"sshd did not answer on port {port}: {text}")
