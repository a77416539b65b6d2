"""Model endpoints: the OpenAI-compatible servers admins configure, and turning a lead's pick into a generator.

A generator spec stored in a job says `{"backend": "openai", "endpoint_id": 3, "model": ...}`; the base URL and
API key are looked up (and the URL checked again) only when a worker builds the generator, so a key never lands
in a job payload, a judge run's parameters or a log line. Keys are stored encrypted (app/platform/crypto.py): they are
encrypted here on the way in and decrypted only for a worker's generator.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from sqlalchemy import select, text
from sqlalchemy import update as sql_update
from sqlalchemy.orm import Session

from app.accounts import permissions
from app.jobs.context import JobContext, JobError
from app.models import ModelEndpoint, User
from app.platform import audit, outbound
from app.platform.crypto import Keyring, KeyringError, KeyUnreadable, encrypted_under_current, is_encrypted
from app.platform.db import get_or_missing
from app.platform.errors import Conflict, DomainError, Invalid
from training.generation import GenerationError, make_generator
from training.weights import UnsafeWeights, require_safetensors

NAME_MAX = 100


def local_model_dir(path: str, *, field: str, note: str = "") -> str:
    """A local model directory checked before any job starts: it holds config.json and safetensors weights (pickled
    weights are never loaded). Invalid naming `field` otherwise; `note` says where the path came from."""
    if not (Path(path) / "config.json").is_file():
        raise Invalid(f"model directory {path}{note} not found (no config.json there)", field=field)
    try:
        require_safetensors(path)
    except UnsafeWeights as exc:
        raise Invalid(str(exc).removeprefix("model: "), field=field) from None
    return path


def list_endpoints(db: Session) -> list[ModelEndpoint]:
    return list(db.scalars(select(ModelEndpoint).order_by(ModelEndpoint.name)))


def get(db: Session, endpoint_id: int) -> ModelEndpoint:
    return get_or_missing(db, ModelEndpoint, endpoint_id, "no such model endpoint")


def _clean_name(db: Session, name: str, current: ModelEndpoint | None = None) -> str:
    name = name.strip()
    if not name:
        raise Invalid("must not be empty", field="name")
    if len(name) > NAME_MAX:
        raise Invalid(f"must be at most {NAME_MAX} characters", field="name")
    clash = db.scalar(select(ModelEndpoint.id).where(ModelEndpoint.name == name))
    if clash is not None and (current is None or clash != current.id):
        raise Conflict(f"a model endpoint named {name!r} already exists", field="name")
    return name


def _clean_model(model: str) -> str:
    model = model.strip()
    if not model:
        raise Invalid("must name the model the server serves", field="model")
    return model


def _sealed(keyring: Keyring, api_key: str) -> str:
    try:
        return keyring.encrypt(api_key)
    except KeyringError as exc:
        raise Invalid(str(exc), field="api_key") from None


def create(db: Session, actor: User, keyring: Keyring, *, name: str, base_url: str, model: str,
           api_key: str | None = None, allow_private: bool = False) -> ModelEndpoint:
    """A new endpoint, or Invalid / Conflict naming the field. The URL is checked (and resolved) now; the key
    is stored encrypted under `keyring`'s current key."""
    permissions.require_account(actor, "endpoints.manage")
    key = (api_key or "").strip()
    endpoint = ModelEndpoint(name=_clean_name(db, name), model=_clean_model(model),
                             base_url=outbound.check_base_url(base_url, allow_private=allow_private),
                             api_key_stored=_sealed(keyring, key) if key else None,
                             allow_private=bool(allow_private), created_by_id=actor.id)
    db.add(endpoint)
    db.flush()
    audit.record(db, actor, "model_endpoint.create", object_type="model_endpoint", object_id=endpoint.id,
                 name=endpoint.name, base_url=endpoint.base_url, allow_private=endpoint.allow_private)
    return endpoint


def update(db: Session, actor: User, keyring: Keyring, endpoint: ModelEndpoint, *, name: str | None = None,
           base_url: str | None = None, model: str | None = None, api_key: str | None = None,
           clear_api_key: bool = False, allow_private: bool | None = None) -> ModelEndpoint:
    """Change the given fields. `api_key=None` keeps the stored key (it is never shown, so forms send it blank);
    `clear_api_key` removes it."""
    permissions.require_account(actor, "endpoints.manage")
    changed: list[str] = []
    if name is not None and name.strip() != endpoint.name:
        endpoint.name = _clean_name(db, name, endpoint)
        changed.append("name")
    if model is not None and model.strip() != endpoint.model:
        endpoint.model = _clean_model(model)
        changed.append("model")
    if allow_private is not None and bool(allow_private) != endpoint.allow_private:
        endpoint.allow_private = bool(allow_private)
        changed.append("allow_private")
    if base_url is not None or "allow_private" in changed:
        # Re-checked when trust is withdrawn too: a private URL cannot stay once its endpoint is no longer trusted.
        endpoint.base_url = outbound.check_base_url(base_url if base_url is not None else endpoint.base_url,
                                                    allow_private=endpoint.allow_private)
        changed.append("base_url")
    if clear_api_key:
        endpoint.api_key_stored = None
        changed.append("api_key")
    elif api_key is not None and api_key.strip():
        endpoint.api_key_stored = _sealed(keyring, api_key.strip())
        changed.append("api_key")
    audit.record(db, actor, "model_endpoint.update", object_type="model_endpoint", object_id=endpoint.id,
                 changed=sorted(set(changed)))
    return endpoint


KeyStatus = Literal["none", "stored", "unreadable"]


def key_status(endpoint: ModelEndpoint, keyring: Keyring) -> KeyStatus:
    """What an admin sees about the stored key: none, stored (and decryptable), or unreadable (no configured
    encryption key opens it: the jobs using this endpoint fail until an admin enters the key again)."""
    if endpoint.api_key_stored is None:
        return "none"
    return "stored" if keyring.readable(endpoint.api_key_stored) else "unreadable"


def delete(db: Session, actor: User, endpoint: ModelEndpoint) -> None:
    """Remove the endpoint; queued jobs that picked it fail with a clear reason when a worker reaches them."""
    permissions.require_account(actor, "endpoints.manage")
    audit.record(db, actor, "model_endpoint.delete", object_type="model_endpoint", object_id=endpoint.id,
                 name=endpoint.name)
    db.delete(endpoint)
    db.flush()


# --- generator specs ----------------------------------------------------------------------------------


def choose(db: Session, actor: User, generator: dict[str, Any], *, field: str = "generator") -> dict[str, Any]:
    """The spec a job stores for the caller's generator choice, or Invalid naming `<field>.<key>`.

    `hf` specs pass through. An `openai` spec names an endpoint by `endpoint_id` (its model defaults to the
    endpoint's); the stored spec keeps the id, never a URL or key. A free-form `base_url` is for admins only
    (for a quick test of a public server) and may not carry an API key: keys live on endpoints.
    """
    spec = {k: v for k, v in generator.items() if v is not None}
    if spec.get("backend") != "openai":
        return spec
    endpoint_id = spec.get("endpoint_id")
    if endpoint_id is not None:
        if spec.get("base_url"):
            raise Invalid("give endpoint_id or base_url, not both", field=f"{field}.base_url")
        if spec.get("api_key"):
            raise Invalid("the endpoint's own API key is used; do not send one", field=f"{field}.api_key")
        endpoint = db.get(ModelEndpoint, int(endpoint_id))
        if endpoint is None:
            raise Invalid("no such model endpoint; ask an admin for the list", field=f"{field}.endpoint_id")
        spec["endpoint_id"] = endpoint.id
        spec["model"] = spec.get("model") or endpoint.model
        return spec
    if not spec.get("base_url"):
        raise Invalid("pick a model endpoint (endpoint_id)", field=f"{field}.endpoint_id")
    if not permissions.may_account(actor, "endpoints.manage"):
        raise Invalid("server URLs are configured by admins; pick a model endpoint (endpoint_id) instead",
                      field=f"{field}.base_url")
    if spec.get("api_key"):
        raise Invalid("API keys are stored on model endpoints, never in job parameters; create an endpoint",
                      field=f"{field}.api_key")
    if not spec.get("model"):
        raise Invalid("must name the model the server serves", field=f"{field}.model")
    spec["base_url"] = outbound.check_base_url(spec["base_url"], field=f"{field}.base_url")
    return spec


def runtime_generator(db: Session, spec: dict[str, Any], *, field: str = "generator",
                      keyring: Keyring | None = None) -> tuple[Any, dict[str, Any]]:
    """(generator, resolved spec) for a job: the spec `training.generation.make_generator` takes, with the endpoint's
    URL and key filled in and the URL checked again now (DNS may have changed since the job was queued; the resolved
    spec is never stored anywhere), and an openai client that checks every address it connects to by the endpoint's
    trust, so a DNS answer that changes after the URL check is refused too. The endpoint's key is decrypted with
    `keyring`; without one (an up-front check, which never connects) the generator has no key.
    Raises Invalid (also for a key no configured encryption key opens), or the generator's SpecError
    (a ValueError) naming the bad key."""
    resolved, allow_private = _resolve(db, spec, field, keyring)
    guard = outbound.address_guard(allow_private) if resolved.get("backend") == "openai" else None
    return make_generator(resolved, address_check=guard), resolved


def job_generator(ctx: JobContext, stored: dict[str, Any], what: str = "generator") -> tuple[Any, dict[str, Any]]:
    """(generator, spec) built now, for a running job: a model endpoint's URL and key are read (and the URL checked
    again) when the job runs, so neither ever sits in the job's payload; its client checks every address it connects
    to as well. A key no configured encryption key opens fails this job (JobError naming the endpoint), nothing
    else."""
    with ctx.session_factory() as db:
        try:
            return runtime_generator(db, dict(stored), field=what, keyring=Keyring(ctx.settings))
        except DomainError as exc:
            raise JobError(f"{what}: {exc.message}") from None


def _resolve(db: Session, spec: dict[str, Any], field: str, keyring: Keyring | None) -> tuple[dict[str, Any], bool]:
    spec = dict(spec)
    if spec.get("backend") != "openai":
        return spec, False
    endpoint_id = spec.pop("endpoint_id", None)
    if endpoint_id is None:  # an admin's free-form public URL (or a job queued before endpoints existed)
        spec["base_url"] = outbound.check_base_url(str(spec.get("base_url") or ""), field=f"{field}.base_url")
        return spec, False
    endpoint = db.get(ModelEndpoint, int(endpoint_id))
    if endpoint is None:
        raise Invalid(f"model endpoint {endpoint_id} no longer exists", field=f"{field}.endpoint_id")
    spec["base_url"] = outbound.check_base_url(endpoint.base_url, field=f"{field}.endpoint_id",
                                               allow_private=endpoint.allow_private)
    spec["model"] = spec.get("model") or endpoint.model
    if endpoint.api_key_stored is not None and keyring is not None:
        try:
            spec["api_key"] = keyring.decrypt(endpoint.api_key_stored)
        except KeyUnreadable:
            raise Invalid(f"the API key of model endpoint {endpoint.name!r} cannot be decrypted with the configured "
                          "PREFLAB_ENCRYPTION_KEY (or PREFLAB_ENCRYPTION_KEY_OLD); an admin must enter the key "
                          "again on the model endpoints page", field=f"{field}.endpoint_id") from None
    return spec, endpoint.allow_private


def prepare(db: Session, actor: User, generator: dict[str, Any], *, field: str = "generator") -> dict[str, Any]:
    """`choose`, then the cheap up-front check of the generator a worker will build from it (a model directory
    exists; a URL is well formed). The spec to store, or Invalid naming the field."""
    spec = choose(db, actor, generator, field=field)
    try:
        runtime_generator(db, spec, field=field)[0].check()
    except (GenerationError, ValueError) as exc:
        raise Invalid(str(exc), field=f"{field}.model" if spec.get("backend") == "hf" else field) from None
    return spec


def check_server_url(db: Session, actor: User, url: str, *, field: str) -> str:
    """A URL a trainer will call (GRPO's `server_base_url`): the base URL of a configured endpoint (checked with
    that endpoint's trust), or, for admins only, a public URL. Invalid naming `field` otherwise."""
    wanted = url.strip().rstrip("/")
    for endpoint in list_endpoints(db):
        if endpoint.base_url.rstrip("/") == wanted:
            return outbound.check_base_url(endpoint.base_url, field=field, allow_private=endpoint.allow_private)
    if not permissions.may_account(actor, "endpoints.manage"):
        raise Invalid("must be the base URL of a model endpoint an admin configured", field=field)
    return outbound.check_base_url(wanted, field=field)


def recheck_server_url(db: Session, url: str, *, field: str) -> str:
    """`check_server_url` again when the run starts (DNS and trust may have changed since it was accepted): the
    URL of a configured endpoint is checked with that endpoint's trust now; any other URL (an admin's public
    one, or an endpoint's that was deleted since) must be public now. Invalid naming `field` otherwise."""
    wanted = url.strip().rstrip("/")
    for endpoint in list_endpoints(db):
        if endpoint.base_url.rstrip("/") == wanted:
            return outbound.check_base_url(endpoint.base_url, field=field, allow_private=endpoint.allow_private)
    return outbound.check_base_url(wanted, field=field)


# --- keys at rest: the start-up pass and rotation -------------------------------------------------------------


def seal_plain_keys(db: Session, keyring: Keyring) -> int:
    """Encrypt every API key still stored in plain text (from before encryption at rest); how many. Each row is
    updated only if it still holds the value read, so two processes starting at once, or an admin saving a new
    key meanwhile, never lose a write. 0, with nothing changed, when there is no key to encrypt with."""
    rows = db.execute(select(ModelEndpoint.id, ModelEndpoint.api_key_stored).where(
        ModelEndpoint.api_key_stored.is_not(None))).all()
    plain = [(endpoint_id, value) for endpoint_id, value in rows if value is not None and not is_encrypted(value)]
    if not plain or keyring.keys().encrypt is None:
        return 0
    for endpoint_id, value in plain:
        unchanged = (ModelEndpoint.id == endpoint_id) & (ModelEndpoint.api_key_stored == value)
        db.execute(sql_update(ModelEndpoint).where(unchanged).values(api_key_stored=keyring.encrypt(value)))
    return len(plain)


def plain_key_count(db: Session) -> int:
    values = db.scalars(select(ModelEndpoint.api_key_stored).where(ModelEndpoint.api_key_stored.is_not(None)))
    return sum(1 for value in values if value is not None and not is_encrypted(value))


@dataclass
class Rotation:
    reencrypted: int = 0
    """Keys now under the current key (all of the readable ones)."""
    from_old_key: int = 0
    """Of those, how many only an old key (or the file key being replaced) opened."""
    from_plain: int = 0
    """Of those, how many were stored in plain text."""
    unreadable: list[str] | None = None
    """Names of the endpoints whose key no configured key opens."""
    forgotten: int = 0
    """Unreadable keys removed (with `forget_unreadable`); an admin enters them again."""


def reencrypt_all(db: Session, keyring: Keyring, *, forget_unreadable: bool = False) -> Rotation:
    """Every stored key decrypted with any configured key and encrypted again under the current one, in the
    caller's one transaction. Writers are locked out meanwhile (Postgres: a table lock; SQLite's one writer
    already holds the database). An unreadable key raises Invalid listing the endpoints, so the caller rolls
    back and nothing changes, unless `forget_unreadable` removes those keys."""
    if db.get_bind().dialect.name == "postgresql":
        db.execute(text("LOCK TABLE model_endpoints IN SHARE ROW EXCLUSIVE MODE"))
    report = Rotation(unreadable=[])
    endpoints = list(db.scalars(select(ModelEndpoint).where(ModelEndpoint.api_key_stored.is_not(None))
                                .order_by(ModelEndpoint.id)))
    unreadable: list[ModelEndpoint] = []
    for endpoint in endpoints:
        stored = endpoint.api_key_stored
        assert stored is not None
        try:
            plain = keyring.decrypt(stored)
        except KeyUnreadable:
            unreadable.append(endpoint)
            continue
        if not is_encrypted(stored):
            report.from_plain += 1
        elif not encrypted_under_current(keyring, stored):
            report.from_old_key += 1
        endpoint.api_key_stored = keyring.encrypt(plain)
        report.reencrypted += 1
    report.unreadable = [e.name for e in unreadable]
    if unreadable and not forget_unreadable:
        raise Invalid(f"no configured encryption key opens the API key of {len(unreadable)} model endpoint(s): "
                      f"{', '.join(report.unreadable)}; set PREFLAB_ENCRYPTION_KEY_OLD to the key they were "
                      "encrypted with, or pass --forget-unreadable to remove them (an admin enters them again)",
                      field="PREFLAB_ENCRYPTION_KEY_OLD")
    for endpoint in unreadable:
        endpoint.api_key_stored = None
        report.forgotten += 1
    audit.record(db, None, "model_endpoint.keys_reencrypted", object_type="model_endpoint",
                 reencrypted=report.reencrypted, from_old_key=report.from_old_key, from_plain=report.from_plain,
                 forgotten=report.unreadable if forget_unreadable else [])
    db.flush()
    return report
