"""Typed settings read from `PREFLAB_*` environment variables, validated once at start-up."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from cryptography.fernet import Fernet
from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

# Values that mean "nobody chose a secret": refused in production.
PLACEHOLDER_SECRETS = {"", "changeme", "change-me", "secret", "dev", "development", "placeholder", "xxx"}
DEFAULT_DATABASE_URL = "sqlite:///./data/preflab.db"


class SettingsError(ValueError):
    """Raised with a human-readable message when the configuration cannot start the app."""


REQUEST_THREADS = 8
"""The default of `request_threads`: for one server process, or shared by the processes of `serve --workers N`."""


def check_key(value: str) -> bytes:
    """The key as Fernet takes it, or ValueError saying what a valid key is."""
    raw = value.strip().encode()
    try:
        Fernet(raw)
    except (ValueError, TypeError):
        raise ValueError("must be a Fernet key: 32 url-safe base64-encoded bytes (make one with `python -c "
                         "'from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())'`)") from None
    return raw


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PREFLAB_", extra="ignore")

    env: Literal["dev", "demo", "production"] = "dev"
    """dev: local work; demo: the bundled demo; production: secure cookies, a real secret required."""
    database_url: str = DEFAULT_DATABASE_URL
    """SQLAlchemy URL. `postgresql://` is mapped to the psycopg 3 driver."""
    database_pool_size: int = Field(default=20, ge=1, le=500)
    """Postgres connections each server process keeps open (as many again may open briefly under a burst).
    Kept connections keep their prepared statements; a pool smaller than the concurrent requests makes each
    burst open and close connections, which costs more than the requests themselves."""
    request_threads: int = Field(default=REQUEST_THREADS, ge=1, le=200)
    """Threads that run the synchronous routes (almost all of them) in each server process; anyio's default is 40.
    Python runs one thread at a time, and 40 threads taking turns cost more CPU than they overlap database waits:
    at 1M rankings on 2 cores, 32 annotators without think time got 74 rankings/s (p95 365 ms) with 40 threads and
    98/s (p95 264 ms) with 8. Requests beyond it wait in the event loop, in order. Each busy thread holds one
    database connection, so keep `database_pool_size` at least this. Unset, the `serve --workers N` processes
    share the default's 8 (`threads_per_process`)."""
    keepalive_requests: int = Field(default=1000, ge=0)
    """A keep-alive connection serves about this many requests, then the server closes it (at random, one response
    in N; 0: never) and the client reconnects, as nginx's `keepalive_requests` (default 1000). With `--workers`,
    a connection stays with the process it reached: clients that all reconnected while one process was up (a
    restart) would stay there for as long as they keep sending. Reconnecting spreads them over the processes."""
    database_prepared_statements: bool = True
    """Let psycopg prepare a statement on a connection once it ran five times there (Postgres parses and plans it
    once). Set false behind PgBouncer in transaction mode (before 1.21, and without `max_prepared_statements`):
    there a connection's next transaction may run on another server connection, which lacks the statement
    ("prepared statement … does not exist") or holds another client's of the same name ("… already exists")."""
    secret_key: str | None = None
    """Signs cookies and CSRF tokens. Required in production; generated into DATA_DIR otherwise."""
    encryption_key: SecretStr | None = None
    """Encrypts model-endpoint API keys at rest (a Fernet key). Needed in production to store a key;
    generated into DATA_DIR/encryption_key otherwise."""
    encryption_key_old: SecretStr | None = None
    """Earlier encryption keys, comma-separated: they decrypt, never encrypt. Set during a rotation
    (`preflab rotate-encryption-key`), unset after it."""
    data_dir: Path = Path("./data")
    """Where exports, job logs, model outputs and the generated dev secret live."""
    hub_endpoint: str = "https://huggingface.co"
    """The Hugging Face Hub-compatible server `preflab export push` pushes to (HF_ENDPOINT overrides it)."""
    max_upload_mb: int = Field(default=50, ge=1, le=10_000)
    """Largest import file accepted, in MiB."""
    max_import_rows: int = Field(default=200_000, ge=1)
    """Most rows one import file may hold."""
    session_hours: int = Field(default=12, ge=1, le=24 * 30)
    """Browser sessions expire after this many hours."""
    trust_proxy_headers: bool = False
    """Read the client address from X-Forwarded-For (only behind a proxy you control). Also turns off the
    connection balance of `serve --workers` (app.web.balance), which counts connections by client address."""
    public_origin: str | None = None
    """The site's external origin (e.g. https://preflab.example.org) when behind a TLS-terminating proxy."""
    secure_cookies: bool | None = None
    """Mark cookies Secure; defaults to true in production only (PREFLAB_ENV=production)."""
    default_policy_model: Path | None = None
    """Model directory (a causal LM) that sft, dpo, rft, grpo and ppo runs start from when the run names none, and
    Monte-Carlo step labels sample with when they name no policy, and that the sampling, judge and revision forms
    fill in as their local model. Unset, it is SmolLM2-135M-Instruct once `preflab models prepare` (or
    `preflab demo`) has prepared it under DATA_DIR/models; before that, such a run must name its base model."""
    clusters_file: Path | None = None
    """A TOML file naming the Slurm and Ray clusters runs may be sent to, each with its shared path and default
    resources (docs: Running on a cluster); read-only beside the clusters admins add in the app (Admin › Clusters).
    Unset, and with none added there, every run executes on the worker's own host (`local`)."""
    log_format: Literal["text", "json"] = "text"
    """Log lines as plain text, or one JSON object per line (time, level, logger, message, request_id, job_id)."""
    metrics_allowed_networks: str = "127.0.0.1/32,::1/128"
    """Comma-separated CIDRs whose clients may read /metrics without logging in (admins may from anywhere)."""
    outbound_hosts: Literal["rules", "none"] = "rules"
    """Which hosts jobs may call (OpenAI-compatible model servers): `rules` applies the outbound rules (no metadata,
    link-local or reserved addresses; private ones only for trusted endpoints); `none` refuses every host before
    resolving its name (an air-gapped install, or fuzzing the API without DNS traffic)."""
    worker_heartbeat_max_age_s: int = Field(default=60, ge=0)
    """Readiness fails when no worker sent a heartbeat within this many seconds; 0 leaves workers out of it."""
    webhook_timeout_s: float = Field(default=10.0, gt=0, le=120)
    """How long one webhook delivery attempt waits for the receiver's answer."""
    webhook_retry_base_s: float = Field(default=30.0, gt=0, le=3600)
    """Backoff before a failed webhook delivery's first retry; it doubles with each attempt (30 s, 1 min, 2 min, …)."""
    agreement_drain_every_s: float = Field(default=2.0, ge=0, le=60)
    """How often each worker folds new rankings (and other changes) into the kept agreement figures: they are that
    fresh whether or not anyone looks, and a view only reads them, saying how old they are. Where no worker has folded
    for three times this long, a view folds in what waits itself (when few changes wait). 0: every view folds in what
    waits (the worker then sweeps every 0.5 s)."""
    job_retry_base_s: float = Field(default=10.0, ge=0, le=3600)
    """Backoff before a crashed job's next attempt (a lost connection, a server that did not answer); it doubles with
    each attempt (10 s, 20 s, …, at most an hour). A failure no attempt can change (bad input, a prompt longer than
    the model's context) is never retried: the job fails at once with its reason."""

    @field_validator("data_dir")
    @classmethod
    def _absolute_data_dir(cls, value: Path) -> Path:
        # Absolute once, here: the paths stored in the database and handed to trainer processes (which run in
        # other working directories) must not depend on where the server was started.
        return value.expanduser().absolute()

    @field_validator("database_url")
    @classmethod
    def _normalise_url(cls, value: str) -> str:
        value = value.strip()
        if value.startswith("postgres://"):
            value = "postgresql://" + value[len("postgres://"):]
        if value.startswith("postgresql://"):
            value = "postgresql+psycopg://" + value[len("postgresql://"):]
        if not (value.startswith("sqlite") or value.startswith("postgresql+psycopg")):
            raise ValueError("PREFLAB_DATABASE_URL must be a sqlite:/// or postgresql:// URL")
        return value

    @field_validator("encryption_key", "encryption_key_old")
    @classmethod
    def _fernet_keys(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or not value.get_secret_value().strip():
            return None
        for part in value.get_secret_value().split(","):
            if part.strip():
                check_key(part)
        return value

    @field_validator("metrics_allowed_networks")
    @classmethod
    def _check_networks(cls, value: str) -> str:
        import ipaddress

        for item in (v.strip() for v in value.split(",")):
            if item:
                try:
                    ipaddress.ip_network(item, strict=False)
                except ValueError:
                    raise ValueError(f"{item!r} is not a network in CIDR notation (e.g. 10.0.0.0/8)") from None
        return value

    @property
    def metrics_networks(self) -> list[Any]:
        import ipaddress

        return [ipaddress.ip_network(v.strip(), strict=False) for v in self.metrics_allowed_networks.split(",")
                if v.strip()]

    @model_validator(mode="after")
    def _default_policy_prepared(self) -> Settings:
        # training/base_model.py prepares it there; read at start-up, like every setting.
        prepared = self.data_dir / "models" / "smollm2-135m-instruct"
        if self.default_policy_model is None and (prepared / "manifest.json").is_file():
            self.default_policy_model = prepared
        return self

    @model_validator(mode="after")
    def _require_secret_in_production(self) -> Settings:
        if self.env == "production":
            if self.secret_key is None or self.secret_key.strip().lower() in PLACEHOLDER_SECRETS:
                raise ValueError(
                    "PREFLAB_SECRET_KEY must be set to a long random value in production "
                    "(e.g. `python -c 'import secrets; print(secrets.token_urlsafe(48))'`)"
                )
            if len(self.secret_key) < 32:
                raise ValueError("PREFLAB_SECRET_KEY must be at least 32 characters in production")
        return self

    def threads_per_process(self, processes: int) -> int:
        """`request_threads` of each of `processes` server processes on one host: as set, or the default shared by
        them (at least 2 each). The threads overlap database waits, and the processes share the cores and the
        database: on 2 cores, `--workers 2` made 13 % more rankings/s with 4 threads each than with 8, at a fifth
        less p95 and a tenth less CPU per ranking (docs/benchmarks.md, bench_annotation.py)."""
        if "request_threads" in self.model_fields_set:
            return self.request_threads
        return max(2, -(-REQUEST_THREADS // processes))

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")

    @property
    def cookies_secure(self) -> bool:
        return self.secure_cookies if self.secure_cookies is not None else self.env == "production"

    def resolved_secret(self) -> str:
        """The secret key; outside production a random one is generated once into DATA_DIR (mode 0600)."""
        if self.secret_key and self.secret_key.strip().lower() not in PLACEHOLDER_SECRETS:
            return self.secret_key
        if self.env == "production":
            raise SettingsError("PREFLAB_SECRET_KEY is required in production")
        import os
        import secrets

        path = self.data_dir / "secret_key"
        if path.exists():
            return path.read_text().strip()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_urlsafe(48))
        return path.read_text().strip()


def load_settings() -> Settings:
    """Settings from the environment, or a SettingsError whose message names the bad variable."""
    from pydantic import ValidationError

    try:
        return Settings()
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            field = ".".join(str(p) for p in err["loc"]) or "settings"
            name = f"PREFLAB_{field.upper()}" if field != "settings" else "settings"
            problems.append(f"{name}: {err['msg'].removeprefix('Value error, ')}")
        raise SettingsError("invalid configuration:\n  " + "\n  ".join(problems)) from None


@lru_cache
def get_settings() -> Settings:
    return load_settings()
