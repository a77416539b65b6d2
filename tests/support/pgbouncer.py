"""PgBouncer in transaction mode in front of a Postgres, on a free port, for a test or a benchmark.

Debian's `pgbouncer` package (1.18 on Debian 12: no prepared statements in transaction mode). Config, auth file,
pid file and log live in a temporary directory; the process is stopped (SIGTERM: immediate shutdown) on exit.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.engine import make_url

PGBOUNCER_PATHS = ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer")


def pgbouncer_binary() -> str | None:
    """The pgbouncer executable (Debian installs it in /usr/sbin, off a normal user's PATH), or None."""
    found = shutil.which("pgbouncer")
    if found:
        return found
    return next((p for p in PGBOUNCER_PATHS if os.access(p, os.X_OK)), None)


def pgbouncer_version() -> tuple[int, ...]:
    """The installed PgBouncer's version, e.g. (1, 18, 0); () when there is none."""
    binary = pgbouncer_binary()
    if binary is None:
        return ()
    first = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False).stdout.split("\n")[0]
    return tuple(int(p) for p in first.rsplit(" ", 1)[-1].split(".") if p.isdigit())


def _unprivileged_user() -> str:
    """PgBouncer refuses to run as root: the user it should switch to (postgres where it exists)."""
    import pwd

    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    raise RuntimeError("pgbouncer cannot run as root and there is no postgres or nobody user to run it as")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _config(backend_host: str, backend_port: int, port: int, work: Path, pool_size: int, run_as: str | None) -> str:
    lines = [
        "[databases]",
        # Every database name the client asks for, on the one Postgres; pool_size is per (database, user).
        f"* = host={backend_host} port={backend_port} pool_size={pool_size}",
        "[pgbouncer]",
        "listen_addr = 127.0.0.1",
        f"listen_port = {port}",
        "unix_socket_dir =",
        "auth_type = trust",
        f"auth_file = {work / 'users.txt'}",
        "pool_mode = transaction",
        "max_client_conn = 2000",
        f"default_pool_size = {pool_size}",
        # psycopg sends none of these, but libpq tools and drivers often do; PgBouncer refuses unknown ones.
        "ignore_startup_parameters = extra_float_digits,options",
        f"logfile = {work / 'pgbouncer.log'}",
        f"pidfile = {work / 'pgbouncer.pid'}",
        "admin_users = postgres",
    ]
    if run_as:
        lines.append(f"user = {run_as}")  # PgBouncer refuses to run as root; it switches to this user
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Bouncer:
    url: str
    """The caller's database URL, pointing at PgBouncer."""
    pid: int
    pool_size: int
    """Server connections PgBouncer opens to Postgres for each (database, user)."""


@contextmanager
def pgbouncer(postgres_url: str, *, pool_size: int = 20, startup_s: float = 15.0) -> Iterator[Bouncer]:
    """Start PgBouncer (transaction pooling, trust auth) in front of the Postgres that `postgres_url` names, for the
    block. Raises RuntimeError when pgbouncer is not installed or does not start."""
    binary = pgbouncer_binary()
    if binary is None:
        raise RuntimeError("pgbouncer is not installed (apt-get install pgbouncer)")
    url = make_url(postgres_url)
    user = url.username or "postgres"
    port = _free_port()
    run_as = _unprivileged_user() if os.geteuid() == 0 else None
    with tempfile.TemporaryDirectory(prefix="pgbouncer-") as tmp:
        work = Path(tmp)
        (work / "users.txt").write_text(f'"{user}" ""\n')
        (work / "pgbouncer.ini").write_text(
            _config(url.host or "127.0.0.1", url.port or 5432, port, work, pool_size, run_as))
        if run_as:
            shutil.chown(work, run_as)
            for item in work.iterdir():
                shutil.chown(item, run_as)
        proc = subprocess.Popen([binary, "-q", str(work / "pgbouncer.ini")], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)
        try:
            _wait_listening(proc, port, startup_s, work)
            yield Bouncer(url.set(host="127.0.0.1", port=port).render_as_string(hide_password=False), proc.pid,
                          pool_size)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait_listening(proc: subprocess.Popen[bytes], port: int, timeout: float, work: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            log = (work / "pgbouncer.log").read_text(errors="replace") if (work / "pgbouncer.log").exists() else ""
            raise RuntimeError(f"pgbouncer exited with {proc.returncode}: {err.strip()} {log.strip()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)
    proc.kill()
    raise RuntimeError(f"pgbouncer did not listen on port {port} within {timeout:.0f} s")


def transactions_served(bouncer_url: str) -> int:
    """How many transactions PgBouncer has pooled for the database `bouncer_url` names (its admin console's
    SHOW STATS): proof that the traffic went through it."""
    import psycopg

    url = make_url(bouncer_url)
    with psycopg.connect(host=url.host, port=url.port, user=url.username or "postgres", dbname="pgbouncer",
                         autocommit=True) as conn:
        cursor = conn.execute("SHOW STATS")
        names = [d.name for d in cursor.description or []]
        for row in cursor.fetchall():
            stats = dict(zip(names, row, strict=True))
            if stats["database"] == url.database:
                return int(stats["total_xact_count"])
    return 0
