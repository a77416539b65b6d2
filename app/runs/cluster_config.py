"""Clusters an admin configures in the app (the admin page and `/api/admin/clusters`), beside the read-only ones of
PREFLAB_CLUSTERS_FILE: which clusters a run may be sent to, each cluster's concurrency cap, its connection test.

A cluster's secret (a Ray token, an SSH private key) is encrypted on the way in exactly like a model endpoint's API
key (app/platform/crypto.py) and decrypted only for a worker's backend or a connection test; no page or API answer
shows it, only whether one is set.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from app.accounts import permissions
from app.models import ComputeCluster, Job, TrainingRun, User
from app.platform import audit
from app.platform.crypto import Keyring, KeyringError, KeyUnreadable
from app.platform.db import get_or_missing
from app.platform.errors import Conflict, Invalid, NotFound
from app.runs.backends import clusters
from app.runs.backends.base import LOCAL, Cluster, Probe, Resources

NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,39}")
KINDS = ("slurm", "ray")
FROM_FILE = "from PREFLAB_CLUSTERS_FILE"
RUN_RESOURCES = ("cpus", "gpus", "memory_gb", "nodes", "workers", "time_limit_min")
"""The default resources an app cluster keeps in `resources`; the address and partition have fields of their own."""


@dataclass(frozen=True)
class Listed:
    """One cluster as the admin page and API show it: an app cluster (editable, with its row) or a file one."""

    cluster: Cluster
    row: ComputeCluster | None = None

    @property
    def editable(self) -> bool:
        return self.row is not None


def file_clusters(clusters_file: Path | None) -> dict[str, Cluster]:
    """The clusters of PREFLAB_CLUSTERS_FILE (without `local`); Invalid naming `where` when the file is unusable."""
    try:
        found = clusters.load(clusters_file)
    except clusters.ClusterError as exc:
        raise Invalid(str(exc), field="where") from None
    return {name: cluster for name, cluster in found.items() if name != LOCAL}


def as_cluster(row: ComputeCluster, keyring: Keyring | None = None) -> Cluster:
    """The backend's view of an app cluster; its secret decrypted only when a keyring is given (a worker, a test)."""
    resources = Resources.from_dict(dict(row.resources or {}) | {
        key: value for key, value in (("address", row.address), ("partition", row.partition)) if value})
    secret = None
    if keyring is not None and row.secret_stored is not None:
        try:
            secret = keyring.decrypt(row.secret_stored)
        except KeyUnreadable as exc:
            raise Invalid(f"the secret of cluster {row.name} cannot be read ({exc}); an admin enters it again",
                          field="secret") from None
    return Cluster(row.name, row.kind, resources, shared_dir=Path(row.shared_dir), env=dict(row.env or {}),
                   job_prefix=row.job_prefix, max_running=row.max_running, secret=secret, source="app",
                   login=row.login)


def with_secret(db: Session, cluster: Cluster, keyring: Keyring) -> Cluster:
    """An app cluster with its secret decrypted (for a worker's backend or a connection test; no other cluster's
    secret is read, so one an admin must enter again stops only the runs sent to its own cluster)."""
    if cluster.source != "app":
        return cluster
    row = db.scalar(select(ComputeCluster).where(ComputeCluster.name == cluster.name))
    return as_cluster(row, keyring) if row is not None else cluster


def available(db: Session, clusters_file: Path | None) -> dict[str, Cluster]:
    """Every cluster a run may be sent to, by name: `local`, the file's, then the app's (a name in both is the
    file's: the app refuses to add it, and the file is what the operator last said). Secrets are not read here
    (`with_secret`)."""
    found = {LOCAL: Cluster(LOCAL, "local")} | file_clusters(clusters_file)
    for row in list_rows(db):
        found.setdefault(row.name, as_cluster(row))
    return found


def listed(db: Session, clusters_file: Path | None) -> list[Listed]:
    """The admin's list: the file's clusters (read-only) and the app's, by name."""
    try:
        from_file = file_clusters(clusters_file)
    except Invalid:
        from_file = {}  # an unreadable file still lets the admin manage the app's clusters; runs say why it fails
    items = [Listed(c) for c in from_file.values()]
    items += [Listed(as_cluster(row), row) for row in list_rows(db) if row.name not in from_file]
    return sorted(items, key=lambda item: item.cluster.name)


def list_rows(db: Session) -> list[ComputeCluster]:
    return list(db.scalars(select(ComputeCluster).order_by(ComputeCluster.name)))


def get(db: Session, cluster_id: int) -> ComputeCluster:
    return get_or_missing(db, ComputeCluster, cluster_id, "no such cluster")


def find(db: Session, clusters_file: Path | None, name: str) -> Cluster:
    """A configured cluster by name (for its connection test), or NotFound."""
    found = available(db, clusters_file)
    if name not in found or name == LOCAL:
        raise NotFound(f"no cluster named {name!r}")
    return found[name]


SecretStatus = Literal["not set", "set", "unreadable"]


def secret_status(row: ComputeCluster | None, keyring: Keyring) -> SecretStatus:
    """What an admin sees of the secret: not set, set (and decryptable), or unreadable (re-enter it)."""
    if row is None or row.secret_stored is None:
        return "not set"
    return "set" if keyring.readable(row.secret_stored) else "unreadable"


@dataclass
class Fields:
    """What an admin gives for a cluster (None: unchanged on an update)."""

    name: str | None = None
    kind: str | None = None
    address: str | None = None
    partition: str | None = None
    login: str | None = None
    shared_dir: str | None = None
    resources: dict[str, Any] | None = None
    env: dict[str, str] | None = None
    job_prefix: str | None = None
    max_running: int | None = None
    no_cap: bool = False
    """Remove the concurrency cap (an update cannot say None through `max_running` alone)."""
    secret: str | None = None
    clear_secret: bool = False


def create(db: Session, actor: User, keyring: Keyring, fields: Fields, *, clusters_file: Path | None) -> ComputeCluster:
    """A new app cluster, or Invalid / Conflict naming the field."""
    permissions.require_account(actor, "clusters.manage")
    if not fields.name or not fields.kind or not fields.shared_dir:
        missing = next(f for f in ("name", "kind", "shared_dir") if not getattr(fields, f))
        raise Invalid("must be given", field=missing)
    row = ComputeCluster(name="", kind="", shared_dir="", resources={}, env={}, job_prefix="preflab",
                         created_by_id=actor.id)
    _apply(db, row, keyring, fields, clusters_file)
    db.add(row)
    db.flush()
    audit.record(db, actor, "cluster.create", object_type="cluster", object_id=row.id, name=row.name, kind=row.kind,
                 max_running=row.max_running, secret=row.secret_stored is not None)
    return row


def update(db: Session, actor: User, keyring: Keyring, row: ComputeCluster, fields: Fields, *,
           clusters_file: Path | None) -> ComputeCluster:
    """Change the given fields; a blank secret keeps the stored one (it is never shown), `clear_secret` removes it."""
    permissions.require_account(actor, "clusters.manage")
    changed = _apply(db, row, keyring, fields, clusters_file)
    audit.record(db, actor, "cluster.update", object_type="cluster", object_id=row.id, changed=changed)
    return row


def delete(db: Session, actor: User, row: ComputeCluster) -> None:
    """Remove the cluster; queued runs sent to it fail with its name when a worker reaches them, and runs going on
    it are followed no further."""
    permissions.require_account(actor, "clusters.manage")
    audit.record(db, actor, "cluster.delete", object_type="cluster", object_id=row.id, name=row.name)
    db.delete(row)
    db.flush()


def _apply(db: Session, row: ComputeCluster, keyring: Keyring, fields: Fields, clusters_file: Path | None) -> list[str]:
    """Check every given field and set it on `row`; the names of those that changed."""
    values = _checked(db, row, fields, clusters_file)
    changed = [key for key, value in values.items() if getattr(row, key) != value]
    for key, value in values.items():
        setattr(row, key, value)
    _check_kind(row)
    if fields.clear_secret:
        row.secret_stored = None
        changed.append("secret")
    elif fields.secret is not None and fields.secret.strip():
        row.secret_stored = _sealed(keyring, fields.secret.strip())
        changed.append("secret")
    return sorted(changed)


def _checked(db: Session, row: ComputeCluster, fields: Fields, clusters_file: Path | None) -> dict[str, Any]:
    """The given fields' values as stored, or Invalid / Conflict naming the first bad one."""
    values: dict[str, Any] = {}
    if fields.name is not None:
        values["name"] = _name(db, row, fields.name, clusters_file)
    if fields.kind is not None:
        if fields.kind not in KINDS:
            raise Invalid(f"must be slurm or ray, got {fields.kind!r}", field="kind")
        values["kind"] = fields.kind
    for key in ("address", "partition"):
        value = getattr(fields, key)
        if value is not None:
            values[key] = _one_line(value, key) or None
    if fields.login is not None:
        values["login"] = _login(fields.login)
    if fields.shared_dir is not None:
        shared = fields.shared_dir.strip()
        if not shared.startswith("/"):
            raise Invalid("must be an absolute path that the app, the workers and every node see", field="shared_dir")
        values["shared_dir"] = shared
    if fields.resources is not None:
        values["resources"] = _resources(fields.resources)
    if fields.env is not None:
        values["env"] = _env(fields.env)
    if fields.job_prefix is not None:
        values["job_prefix"] = _prefix(fields.job_prefix)
    if fields.no_cap or fields.max_running is not None:
        values["max_running"] = None if fields.no_cap else _cap(fields.max_running)
    return values


def _login(value: str) -> str | None:
    login = value.strip()
    if login and not clusters.LOGIN.fullmatch(login):
        raise Invalid("must be user@host or user@host:port (the login node the worker reaches over SSH)",
                      field="login")
    return login or None


def _prefix(value: str) -> str:
    prefix = value.strip() or "preflab"
    if not NAME.fullmatch(prefix):
        raise Invalid("must be a letter then up to 39 letters, digits, - or _", field="job_prefix")
    return prefix


def _cap(value: int | None) -> int:
    if value is None or isinstance(value, bool) or value < 1:
        raise Invalid("must be at least 1 (leave it empty for no cap)", field="max_running")
    return value


def _name(db: Session, row: ComputeCluster, name: str, clusters_file: Path | None) -> str:
    name = name.strip()
    if name == LOCAL:
        raise Invalid("local is built in (the worker's own host)", field="name")
    if not NAME.fullmatch(name):
        raise Invalid("must be a letter then up to 39 letters, digits, - or _", field="name")
    try:
        in_file = name in file_clusters(clusters_file)
    except Invalid:
        in_file = False
    if in_file:
        raise Conflict(f"a cluster named {name!r} is configured in PREFLAB_CLUSTERS_FILE", field="name")
    clash = db.scalar(select(ComputeCluster.id).where(ComputeCluster.name == name))
    if clash is not None and clash != row.id:
        raise Conflict(f"a cluster named {name!r} already exists", field="name")
    return name


def _one_line(value: str, field: str) -> str:
    value = value.strip()
    if "\n" in value or len(value) > 1000:
        raise Invalid("must be one line of at most 1000 characters", field=field)
    return value


def _resources(given: dict[str, Any]) -> dict[str, Any]:
    for key in given:
        if key not in RUN_RESOURCES:
            raise Invalid(f"{key} is not a default resource here (known: {', '.join(RUN_RESOURCES)}; the address "
                          "and partition are fields of their own)", field=f"resources.{key}")
    try:
        Resources.from_dict({k: v for k, v in given.items() if v is not None})
    except (ValueError, TypeError) as exc:
        message = str(exc)
        bad = next((key for key in sorted(given, key=len, reverse=True) if message.startswith(key)), None)
        raise Invalid(message, field=f"resources.{bad}" if bad else "resources") from None
    return {k: v for k, v in given.items() if v is not None}


def _env(given: dict[str, Any]) -> dict[str, str]:
    for key, value in given.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(key)) or not isinstance(value, str | int | float):
            raise Invalid("must map variable names to text values", field=f"env.{key}")
    return {str(k): str(v) for k, v in given.items()}


def _check_kind(row: ComputeCluster) -> None:
    if row.kind == "ray":
        if not row.address or not re.match(r"https?://", row.address):
            raise Invalid("a Ray cluster needs its head's dashboard address (http://host:8265)", field="address")
        if row.partition:
            raise Invalid("a partition is Slurm's; a Ray cluster has none", field="partition")
        if row.login:
            raise Invalid("a login node is Slurm's; a Ray cluster is reached at its address", field="login")
    elif row.kind == "slurm" and row.address:
        raise Invalid("an address is Ray's; a Slurm cluster is reached through sbatch on the worker's host or its "
                      "login node", field="address")


def _sealed(keyring: Keyring, secret: str) -> str:
    try:
        return keyring.encrypt(secret)
    except KeyringError as exc:
        raise Invalid(str(exc), field="secret") from None


# --- the concurrency cap and the connection test -----------------------------------------------------------------


ON_CLUSTER = "on_cluster"
"""The key of a job's result that names the cluster its model work holds a slot on (a sampling job sent there)."""


def _jobs_on_clusters(db: Session) -> list[Job]:
    """Running jobs other than training runs that hold a cluster slot (a few rows: jobs in state running)."""
    return [job for job in db.scalars(select(Job).where(Job.state == "running")) if (job.result or {}).get(ON_CLUSTER)]


def running_counts(db: Session) -> dict[str, int]:
    """preflab's runs (and sampling jobs) going on each cluster now (a few rows: runs and jobs in state running)."""
    counts: dict[str, int] = {}
    names = [((run.config or {}).get("where") or {}).get("cluster") or LOCAL
             for run in db.scalars(select(TrainingRun).where(TrainingRun.state == "running"))]
    for name in names + [str(job.result[ON_CLUSTER]) for job in _jobs_on_clusters(db)]:
        counts[name] = counts.get(name, 0) + 1
    return counts


def slot_wait(db: Session, cluster: Cluster, run_id: int | None = None, job_id: int | None = None) -> str | None:
    """None when the run (or the job, for a sampling job) may be submitted to `cluster` now; else what it waits for
    (`waiting for a slot on lab (2 of 2 running)`). On Postgres the check holds a lock on the cluster's name until the
    caller's transaction ends, in which the run is marked running (the job takes its slot, `take_slot`): two workers
    never both take the last slot."""
    if cluster.max_running is None or cluster.name == LOCAL:
        return None
    if db.get_bind().dialect.name == "postgresql":
        db.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": zlib.crc32(f"cluster:{cluster.name}".encode())})
    running = db.scalars(select(TrainingRun).where(TrainingRun.state == "running", TrainingRun.id != run_id))
    busy = sum(1 for run in running if ((run.config or {}).get("where") or {}).get("cluster") == cluster.name)
    busy += sum(1 for job in _jobs_on_clusters(db) if job.id != job_id and job.result[ON_CLUSTER] == cluster.name)
    if busy < cluster.max_running:
        return None
    return f"waiting for a slot on {cluster.name} ({busy} of {cluster.max_running} running)"


def take_slot(db: Session, cluster: Cluster, job_id: int) -> str | None:
    """A job's model work takes a slot on `cluster` (it counts against the cap until the job ends), or what it
    waits for (`slot_wait`)."""
    waiting = slot_wait(db, cluster, job_id=job_id)
    job = db.get(Job, job_id, with_for_update=db.get_bind().dialect.name == "postgresql")  # as the heartbeat does
    if waiting is None and job is not None:
        job.result = dict(job.result or {}) | {ON_CLUSTER: cluster.name}
    return waiting


def run_connection_test(db: Session, actor: User, keyring: Keyring, clusters_file: Path | None, name: str,
                        timeout: float = 120.0) -> Probe:
    """Submit a trivial job to the named cluster (with its secret) and wait for it: whether it ran, how long it took,
    the backend's own words on failure. Recorded in the audit log."""
    permissions.require_account(actor, "clusters.manage")
    cluster = with_secret(db, find(db, clusters_file, name), keyring)
    probe = clusters.probe(cluster, timeout)
    audit.record(db, actor, "cluster.test", object_type="cluster", name=name, ok=probe.ok,
                 seconds=round(probe.seconds, 2))
    return probe


def reencrypt_secrets(db: Session, keyring: Keyring, *, forget_unreadable: bool = False) -> tuple[int, list[str]]:
    """Every cluster secret encrypted again under the current key, in the caller's transaction (the key rotation's
    companion to the model endpoints' `reencrypt_all`): how many, and the clusters whose secret no key opens
    (removed with `forget_unreadable`; else Invalid naming them, so the caller rolls back and nothing changes)."""
    rows = [row for row in list_rows(db) if row.secret_stored is not None]
    unreadable: list[ComputeCluster] = []
    done = 0
    for row in rows:
        try:
            plain = keyring.decrypt(str(row.secret_stored))
        except KeyUnreadable:
            unreadable.append(row)
            continue
        row.secret_stored = keyring.encrypt(plain)
        done += 1
    names = [row.name for row in unreadable]
    if unreadable and not forget_unreadable:
        raise Invalid(f"no configured encryption key opens the secret of {len(names)} cluster(s): {', '.join(names)}; "
                      "set PREFLAB_ENCRYPTION_KEY_OLD to the key they were encrypted with, or pass "
                      "--forget-unreadable to remove them (an admin enters them again)",
                      field="PREFLAB_ENCRYPTION_KEY_OLD")
    for row in unreadable:
        row.secret_stored = None
    db.flush()
    return done, names
