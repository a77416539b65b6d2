"""The whole preflab schema in one place: typed SQLAlchemy 2 models and the constraints that keep data honest."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, ClassVar

from sqlalchemy import (
    JSON,
    Boolean,
    CheckConstraint,
    Connection,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    TypeDecorator,
    UniqueConstraint,
    event,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from training import methods

# Stable constraint names, so Alembic batch mode on SQLite can find and alter them.
NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

ROLES = ("admin", "lead", "annotator", "engineer")
MEMBER_ROLES = ("lead", "annotator", "engineer")
SPLITS = ("train", "heldout")
LABEL_SOURCES = ("human", "ai", "imported")
RANKING_SOURCES = (*LABEL_SOURCES, "mc")
"""Who made a ranking: the label sources, and "mc", Monte-Carlo step estimation (app.judge.monte_carlo), whose
rankings hold step labels only: no order of the completions, so no pairs."""
ASSIGNMENT_STATES = ("leased", "submitted", "skipped", "expired", "released")
JOB_STATES = ("queued", "running", "succeeded", "failed", "cancelled")
RUN_KINDS = methods.KINDS
"""The training methods (training/methods.py); a new one also needs a migration that widens the kind check."""
DELIVERY_STATES = ("pending", "delivered", "failed")
RUN_STATES = ("queued", "running", "succeeded", "failed", "cancelled")
STEP_VALUES = (1, 0, -1)
"""A step's label, as in PRM800K: +1 correct, 0 neutral (neither helps nor harms), −1 wrong."""


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on both backends (SQLite hands back naive ones otherwise)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("naive datetime given; use timezone-aware UTC datetimes")
        return value.astimezone(UTC) if value is not None else None

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value


# JSONB on Postgres (indexable, compact), JSON text on SQLite.
JSONType = JSON().with_variant(JSONB(), "postgresql")
# The same, storing Python None as SQL NULL (not the JSON value null): for columns where None means "not there".
NullableJSON = JSON(none_as_null=True).with_variant(JSONB(none_as_null=True), "postgresql")


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)

    if TYPE_CHECKING:
        # Every model maps a Table (none a join or a select), so Core's insert/update/delete take `__table__`.
        __table__: ClassVar[Table]


class User(Base):
    __tablename__ = "users"
    __table_args__ = (CheckConstraint(_in("role", ROLES), name="role"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(String(320), unique=True)
    name: Mapped[str] = mapped_column(String(200), default="")
    password_hash: Mapped[str] = mapped_column(String(255))
    role: Mapped[str] = mapped_column(String(20))
    active: Mapped[bool] = mapped_column(Boolean, default=True)
    failed_logins: Mapped[int] = mapped_column(Integer, default=0)
    last_failed_login_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    password_changed_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)

    memberships: Mapped[list[ProjectMember]] = relationship(back_populates="user", cascade="all, delete-orphan")


class UserSession(Base):
    """A browser login. The cookie carries a random token; only its sha256 is stored."""

    __tablename__ = "user_sessions"

    id: Mapped[int] = mapped_column(primary_key=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    ip: Mapped[str] = mapped_column(String(64), default="")
    user_agent: Mapped[str] = mapped_column(String(300), default="")

    user: Mapped[User] = relationship()


class ApiToken(Base):
    """A personal API token for scripts (`Authorization: Bearer …`); stored as sha256, shown once."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(100), default="")
    prefix: Mapped[str] = mapped_column(String(16))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime())

    user: Mapped[User] = relationship()


class ModelEndpoint(Base):
    """An OpenAI-compatible server (vLLM, TGI, llama.cpp, a hosted API) that an admin configured.

    Leads and engineers pick one by id for generators and judges; they never type a URL. The API key
    stays here: job payloads carry only the endpoint id, and no page or API answer shows the key.
    """

    __tablename__ = "model_endpoints"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    base_url: Mapped[str] = mapped_column(String(1000))
    model: Mapped[str] = mapped_column(String(300))
    api_key_stored: Mapped[str | None] = mapped_column("api_key", Text)
    """The API key encrypted (`fernet:<token>`, app/platform/crypto.py); read it through app.judge.endpoints only.
    Text, since a token is about 1.4 times the key plus 80 characters."""
    allow_private: Mapped[bool] = mapped_column(Boolean, default=False)
    """The admin trusts this host although it resolves to a private or loopback address."""
    created_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, onupdate=utcnow)

    created_by: Mapped[User | None] = relationship()


class ComputeCluster(Base):
    """A Slurm or Ray cluster that an admin configured in the app, where runs may be sent (beside those of
    PREFLAB_CLUSTERS_FILE, which are read-only). The secret stays here, encrypted: no page or API answer shows it."""

    __tablename__ = "clusters"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(40), unique=True)
    kind: Mapped[str] = mapped_column(String(10))
    """slurm | ray."""
    address: Mapped[str | None] = mapped_column(String(1000))
    """Ray: the head's dashboard address (http://host:8265)."""
    partition: Mapped[str | None] = mapped_column(String(200))
    """Slurm: the partition runs go to unless they ask for another."""
    login: Mapped[str | None] = mapped_column(String(330))
    """Slurm: user@host[:port] of a login node the worker runs sbatch and the rest on over SSH; None: its own host."""
    shared_dir: Mapped[str] = mapped_column(String(1000))
    resources: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    """Default resources a run's own override (cpus, gpus, memory_gb, nodes, workers, time_limit_min)."""
    env: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    """More environment variables for the run on the nodes (HF_HOME, a module path)."""
    job_prefix: Mapped[str] = mapped_column(String(40), default="preflab")
    """Job names are JOB_PREFIX-{job}-{attempt}: two preflab installs that share a cluster each set their own."""
    max_running: Mapped[int | None] = mapped_column(Integer)
    """The concurrency cap: at most this many runs at once on the cluster; the worker holds further runs queued."""
    secret_stored: Mapped[str | None] = mapped_column("secret", Text)
    """A Ray token or the SSH private key for a Slurm login node, encrypted (`fernet:<token>`,
    app/platform/crypto.py); read through app.runs.cluster_config only."""
    created_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, onupdate=utcnow)

    created_by: Mapped[User | None] = relationship()


class Project(Base):
    __tablename__ = "projects"
    __table_args__ = (
        CheckConstraint("completions_per_prompt >= 2 AND completions_per_prompt <= 16", name="k_range"),
        CheckConstraint("overlap >= 1 AND overlap <= 50", name="overlap_range"),
        CheckConstraint("lease_minutes >= 1 AND lease_minutes <= 1440", name="lease_range"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    description: Mapped[str] = mapped_column(Text, default="")
    completions_per_prompt: Mapped[int] = mapped_column(Integer)
    overlap: Mapped[int] = mapped_column(Integer, default=1)
    current_round: Mapped[int] = mapped_column(Integer, default=1)
    lease_minutes: Mapped[int] = mapped_column(Integer, default=30, server_default="30")
    """How long a task stays reserved for the annotator who opened it."""
    allow_ties: Mapped[bool] = mapped_column(Boolean, default=True)
    allow_partial: Mapped[bool] = mapped_column(Boolean, default=False)
    flags: Mapped[list[str]] = mapped_column(JSONType, default=lambda: ["unsafe", "factually wrong", "off-topic"])
    skip_reasons: Mapped[list[str]] = mapped_column(
        JSONType, default=lambda: ["cannot judge", "prompt is broken", "all answers identical"]
    )
    settings: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    current_rubric_id: Mapped[int | None] = mapped_column(
        ForeignKey("rubrics.id", use_alter=True, ondelete="SET NULL")
    )
    current_constitution_id: Mapped[int | None] = mapped_column(
        ForeignKey("constitutions.id", use_alter=True, ondelete="SET NULL")
    )
    created_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)

    members: Mapped[list[ProjectMember]] = relationship(back_populates="project", cascade="all, delete-orphan")
    current_rubric: Mapped[Rubric | None] = relationship(foreign_keys=[current_rubric_id], post_update=True)
    current_constitution: Mapped[Constitution | None] = relationship(
        foreign_keys=[current_constitution_id], post_update=True
    )


class ProjectMember(Base):
    __tablename__ = "project_members"
    __table_args__ = (
        UniqueConstraint("project_id", "user_id"),
        CheckConstraint(_in("role", MEMBER_ROLES), name="role"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"), index=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    role: Mapped[str] = mapped_column(String(20))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)

    project: Mapped[Project] = relationship(back_populates="members")
    user: Mapped[User] = relationship(back_populates="memberships")


class Rubric(Base):
    """One immutable rubric version; editing creates version n+1."""

    __tablename__ = "rubrics"
    __table_args__ = (UniqueConstraint("project_id", "version"), CheckConstraint("version >= 1", name="version"))

    id: Mapped[int] = mapped_column(primary_key=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"), index=True)
    version: Mapped[int] = mapped_column(Integer)
    text: Mapped[str] = mapped_column(Text)
    criteria: Mapped[list[str]] = mapped_column(JSONType, default=list)
    note: Mapped[str] = mapped_column(String(500), default="")
    author_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)

    author: Mapped[User | None] = relationship()


class Constitution(Base):
    """One immutable constitution version: an ordered list of principles (name, rationale, priority, prompts)."""

    __tablename__ = "constitutions"
    __table_args__ = (UniqueConstraint("project_id", "version"), CheckConstraint("version >= 1", name="version"))

    id: Mapped[int] = mapped_column(primary_key=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"), index=True)
    version: Mapped[int] = mapped_column(Integer)
    principles: Mapped[list[dict[str, Any]]] = mapped_column(JSONType, default=list)
    note: Mapped[str] = mapped_column(String(500), default="")
    author_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class Prompt(Base):
    __tablename__ = "prompts"
    __table_args__ = (
        UniqueConstraint("project_id", "text_hash"),
        CheckConstraint(_in("split", SPLITS), name="split"),
        # The queue's gold lookup: without it, "any gold prompt left?" scans every prompt of the project.
        Index("ix_prompts_project_id_gold", "project_id", "id", postgresql_where=text("gold_tiers IS NOT NULL"),
              sqlite_where=text("gold_tiers IS NOT NULL")),
        # The queue's walk in priority order (selection `uncertainty` or `disagreement`).
        Index("ix_prompts_project_id_queue_rank", "project_id", "queue_rank"),
        CheckConstraint("extra_overlap >= 0 AND extra_overlap <= 50", name="extra_overlap_range"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"), index=True)
    text: Mapped[str] = mapped_column(Text)
    """The prompt as plain text; for chats, the messages rendered as `role: content` lines."""
    messages: Mapped[list[dict[str, str]] | None] = mapped_column(JSONType)
    text_hash: Mapped[str] = mapped_column(String(64))
    """sha256 of the prompt's canonical form: the same prompt twice in one project is refused."""
    split: Mapped[str] = mapped_column(String(10), default="train")
    reference: Mapped[str | None] = mapped_column(Text)
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", JSONType, default=dict)
    gold_tiers: Mapped[list[list[int]] | None] = mapped_column(JSONType)
    """A known correct order (completion ids, best tier first): a gold task mixed into the queue."""
    gold_step_labels: Mapped[dict[str, list[int]] | None] = mapped_column(NullableJSON)
    """A gold task's known step labels, {completion id: +1/0/−1 per step}, for annotators' step accuracy."""
    priority: Mapped[float | None] = mapped_column(Float)
    """How much a ranking of this prompt is expected to teach (the last priorities job; higher first)."""
    queue_rank: Mapped[int | None] = mapped_column(Integer)
    """Position in the priority order (0 first), written with `priority`; None: not scored, served after."""
    extra_overlap: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    """Rankings wanted beyond the project's overlap this round: the `disagreement` priorities job gives its most
    contested prompts more annotators (app.annotation.selection); the queue caps the prompt at overlap + this."""
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)

    completions: Mapped[list[Completion]] = relationship(
        back_populates="prompt", cascade="all, delete-orphan", order_by="Completion.id"
    )


class Completion(Base):
    __tablename__ = "completions"
    __table_args__ = (
        CheckConstraint(
            "source IN ('imported', 'sampled', 'revision') OR source LIKE 'policy:%'", name="source"
        ),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    prompt_id: Mapped[int] = mapped_column(ForeignKey("prompts.id", ondelete="CASCADE"), index=True)
    text: Mapped[str] = mapped_column(Text)
    source: Mapped[str] = mapped_column(String(80), default="imported")
    generator_name: Mapped[str | None] = mapped_column(String(200))
    generator_params: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    seed: Mapped[int | None] = mapped_column(Integer)
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", JSONType, default=dict)
    steps: Mapped[list[str] | None] = mapped_column(NullableJSON)
    """The completion split into steps (app.annotation.steps) when it entered a project that labels steps; kept as
    it was once a step is labelled, so a new separator never changes what a label refers to."""
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)

    prompt: Mapped[Prompt] = relationship(back_populates="completions")


class Assignment(Base):
    """The queue: one annotator holding one prompt for one round, until the lease runs out."""

    __tablename__ = "assignments"
    __table_args__ = (
        UniqueConstraint("prompt_id", "annotator_id", "round"),
        CheckConstraint(_in("state", ASSIGNMENT_STATES), name="state"),
        Index("ix_assignments_state_leased_until", "state", "leased_until"),
        # A prompt's load (queue overlap check) and an annotator's own tasks, each one index range.
        Index("ix_assignments_prompt_id_round_state", "prompt_id", "round", "state"),
        Index("ix_assignments_annotator_id_round_state", "annotator_id", "round", "state"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"), index=True)
    prompt_id: Mapped[int] = mapped_column(ForeignKey("prompts.id", ondelete="CASCADE"), index=True)
    annotator_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    round: Mapped[int] = mapped_column(Integer, default=1)
    state: Mapped[str] = mapped_column(String(12), default="leased")
    leased_until: Mapped[datetime] = mapped_column(UTCDateTime())
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    completed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())



class AssignmentDraft(Base):
    """The unsent ranking of one leased task, saved as it is made, so the lease resumes with it on another device.

    Only while the lease lasts: submitting the task deletes it, and a lease that ran out takes its draft with it.
    """

    __tablename__ = "assignment_drafts"

    assignment_id: Mapped[int] = mapped_column(ForeignKey("assignments.id", ondelete="CASCADE"), primary_key=True)
    tiers: Mapped[list[list[int]]] = mapped_column(JSONType, default=list)
    flags: Mapped[dict[str, list[str]]] = mapped_column(JSONType, default=dict)
    seconds_spent: Mapped[float | None] = mapped_column(Float)
    step_labels: Mapped[dict[str, list[int | None]]] = mapped_column(JSONType, default=dict, server_default="{}")
    """Completion id → a label per step so far (+1, 0, −1, or null for a step not labelled yet)."""
    # When the ranking was last changed (the client's clock, never later than the server's): the newer edit wins.
    edited_at: Mapped[datetime] = mapped_column(UTCDateTime())
    saved_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class JudgeRun(Base):
    """One pass of an automatic labeller over prompts: the AI judge under one constitution version, or Monte-Carlo
    step estimation (`params["method"]` "monte_carlo", no constitution; its rankings have source "mc")."""

    __tablename__ = "judge_runs"

    id: Mapped[int] = mapped_column(primary_key=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"), index=True)
    constitution_id: Mapped[int | None] = mapped_column(ForeignKey("constitutions.id", ondelete="SET NULL"))
    name: Mapped[str] = mapped_column(String(200), default="")
    params: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    state: Mapped[str] = mapped_column(String(12), default="queued")
    created_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class Ranking(Base):
    """One ordering of a prompt's completions into tiers (ties allowed), by a person, a judge or an import."""

    __tablename__ = "rankings"
    __table_args__ = (
        UniqueConstraint("prompt_id", "annotator_id", "round"),
        UniqueConstraint("prompt_id", "judge_run_id", "round"),
        UniqueConstraint("annotator_id", "client_submission_id"),
        CheckConstraint(_in("source", RANKING_SOURCES), name="source"),
        CheckConstraint(
            "(source = 'human' AND annotator_id IS NOT NULL AND judge_run_id IS NULL)"
            " OR (source IN ('ai', 'mc') AND judge_run_id IS NOT NULL AND annotator_id IS NULL)"
            " OR (source = 'imported' AND annotator_id IS NULL AND judge_run_id IS NULL)",
            name="labeller",
        ),
        CheckConstraint("seconds_spent IS NULL OR seconds_spent >= 0", name="seconds"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"), index=True)
    prompt_id: Mapped[int] = mapped_column(ForeignKey("prompts.id", ondelete="CASCADE"), index=True)
    round: Mapped[int] = mapped_column(Integer, default=1)
    source: Mapped[str] = mapped_column(String(10))
    annotator_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="RESTRICT"), index=True)
    judge_run_id: Mapped[int | None] = mapped_column(ForeignKey("judge_runs.id", ondelete="RESTRICT"))
    rubric_id: Mapped[int | None] = mapped_column(ForeignKey("rubrics.id", ondelete="RESTRICT"))
    constitution_id: Mapped[int | None] = mapped_column(ForeignKey("constitutions.id", ondelete="RESTRICT"))
    tiers: Mapped[list[list[int]]] = mapped_column(JSONType)
    """Completion ids, best tier first; ids in one tier are tied."""
    display_order: Mapped[list[int]] = mapped_column(JSONType, default=list)
    """Completion ids in the order the annotator saw them, for position-bias analysis."""
    flags: Mapped[dict[str, list[str]]] = mapped_column(JSONType, default=dict)
    skipped: Mapped[bool] = mapped_column(Boolean, default=False)
    skip_reason: Mapped[str | None] = mapped_column(String(200))
    seconds_spent: Mapped[float | None] = mapped_column(Float)
    client_submission_id: Mapped[str | None] = mapped_column(String(64))
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", JSONType, default=dict)
    """For AI rankings: how the ranking was made (method, scores, confidence, principles)."""
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)

    pairs: Mapped[list[Pair]] = relationship(back_populates="ranking", cascade="all, delete-orphan")


class Pair(Base):
    """chosen ≻ rejected, expanded from a ranking; `p` is the soft label p(chosen ≻ rejected)."""

    __tablename__ = "pairs"
    __table_args__ = (
        UniqueConstraint("ranking_id", "chosen_id", "rejected_id"),
        CheckConstraint("chosen_id <> rejected_id", name="distinct"),
        CheckConstraint(_in("source", LABEL_SOURCES), name="source"),
        CheckConstraint("margin >= 1", name="margin"),
        CheckConstraint("p >= 0 AND p <= 1", name="p_range"),
        CheckConstraint("weight >= 0", name="weight"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    ranking_id: Mapped[int] = mapped_column(ForeignKey("rankings.id", ondelete="CASCADE"), index=True)
    prompt_id: Mapped[int] = mapped_column(ForeignKey("prompts.id", ondelete="CASCADE"), index=True)
    chosen_id: Mapped[int] = mapped_column(ForeignKey("completions.id", ondelete="CASCADE"))
    rejected_id: Mapped[int] = mapped_column(ForeignKey("completions.id", ondelete="CASCADE"))
    margin: Mapped[int] = mapped_column(Integer, default=1)
    """How many tiers apart chosen and rejected were."""
    source: Mapped[str] = mapped_column(String(10))
    weight: Mapped[float] = mapped_column(Float, default=1.0)
    p: Mapped[float] = mapped_column(Float, default=1.0)
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", JSONType, default=dict)
    """For AI pairs: both raw order probabilities, the principles used, whether confidence was low."""
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)

    ranking: Mapped[Ranking] = relationship(back_populates="pairs")


class StepLabel(Base):
    """One step of one completion judged within a ranking: +1 correct, 0 neutral, −1 wrong (process supervision).

    A completion's labels in a ranking cover its steps from the first, and may stop at the first −1. The AI
    judge's step labels belong to its ranking (source "ai", so its judge run) and carry the soft label `p`;
    Monte-Carlo step labels (source "mc") carry the share of continuations that reached the right answer.
    """

    __tablename__ = "step_labels"
    __table_args__ = (
        UniqueConstraint("ranking_id", "completion_id", "step_index"),
        CheckConstraint("label IN (1, 0, -1)", name="label"),
        CheckConstraint("step_index >= 0", name="step_index"),
        CheckConstraint("p IS NULL OR (p >= 0 AND p <= 1)", name="p"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    ranking_id: Mapped[int] = mapped_column(ForeignKey("rankings.id", ondelete="CASCADE"))
    completion_id: Mapped[int] = mapped_column(ForeignKey("completions.id", ondelete="CASCADE"), index=True)
    step_index: Mapped[int] = mapped_column(Integer)
    label: Mapped[int] = mapped_column(Integer)
    p: Mapped[float | None] = mapped_column(Float)
    """The AI judge's p(step correct), Yes over Yes + No (its `label` is +1 when p ≥ 0.5, else −1); Monte-Carlo's
    share of right continuations (its `label` from the run's hard or soft estimate). None for people."""


class Job(Base):
    """Durable background work, claimed by workers with SELECT … FOR UPDATE SKIP LOCKED."""

    __tablename__ = "jobs"
    __table_args__ = (
        CheckConstraint(_in("state", JOB_STATES), name="state"),
        CheckConstraint("progress >= 0 AND progress <= 1", name="progress"),
        Index("ix_jobs_state_created_at", "state", "created_at"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    kind: Mapped[str] = mapped_column(String(40))
    project_id: Mapped[int | None] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"), index=True)
    payload: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    state: Mapped[str] = mapped_column(String(12), default="queued")
    progress: Mapped[float] = mapped_column(Float, default=0.0)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    max_attempts: Mapped[int] = mapped_column(Integer, default=3)
    claimed_by: Mapped[str | None] = mapped_column(String(200))
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    log_path: Mapped[str | None] = mapped_column(String(500))
    error: Mapped[str | None] = mapped_column(Text)
    result: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    created_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    run_after: Mapped[datetime | None] = mapped_column(UTCDateTime())
    """A queued job is not claimed before this moment (a retry's backoff); None: at once."""


class Export(Base):
    """An immutable dataset snapshot: filters, format, counts and the sha256 of its files."""

    __tablename__ = "exports"

    id: Mapped[int] = mapped_column(primary_key=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(String(20), default="pairs")
    format: Mapped[str] = mapped_column(String(20))
    filters: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    row_count: Mapped[int] = mapped_column(Integer, default=0)
    row_counts: Mapped[dict[str, int]] = mapped_column(JSONType, default=dict)
    sha256: Mapped[str | None] = mapped_column(String(64))
    files: Mapped[dict[str, str]] = mapped_column(JSONType, default=dict)
    path: Mapped[str | None] = mapped_column(String(500))
    snapshot: Mapped[str | None] = mapped_column(String(200))
    """The database snapshot the export read: Postgres `pg_current_snapshot()`, or SQLite's read transaction."""
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id", ondelete="SET NULL"))
    created_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    deleted_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class TrainingRun(Base):
    __tablename__ = "training_runs"
    __table_args__ = (
        CheckConstraint(_in("kind", RUN_KINDS), name="kind"),
        CheckConstraint(_in("state", RUN_STATES), name="state"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(String(10))
    config: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    export_id: Mapped[int | None] = mapped_column(ForeignKey("exports.id", ondelete="SET NULL"))
    parent_run_id: Mapped[int | None] = mapped_column(ForeignKey("training_runs.id", ondelete="SET NULL"))
    base_model: Mapped[str | None] = mapped_column(String(500))
    metrics_path: Mapped[str | None] = mapped_column(String(500))
    model_dir: Mapped[str | None] = mapped_column(String(500))
    state: Mapped[str] = mapped_column(String(12), default="queued")
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id", ondelete="SET NULL"))
    created_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class ProjectRollup(Base):
    """A project's agreement reports and counts as the rollup job last computed them (too many rows to compute on
    each view; see app.quality.rollups)."""

    __tablename__ = "project_rollups"

    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"), primary_key=True)
    reports: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    """"all" and "v1", "v2", … → that scope's AgreementReport as a dict (flags are raised when it is read)."""
    counts: Mapped[dict[str, int]] = mapped_column(JSONType, default=dict)
    """The project page's counts (app.projects.projects.ProjectCounts)."""
    rankings: Mapped[int] = mapped_column(Integer, default=0)
    """Human rankings the reports cover."""
    seconds: Mapped[float] = mapped_column(Float, default=0.0)
    """How long the computation took: the refresh interval grows with it."""
    computed_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    """When the job began reading: the reports show the rankings committed by then."""


AGREEMENT_FORMULA = 1
"""The formulas the stored agreement states were computed under (app.quality.partial). A release that changes how a
group's state or a figure is computed raises it; a project whose state says less is rebuilt from its rankings once."""


class AgreementState(Base):
    """A project's agreement figures as kept up to date from its rankings: under which formulas, and as of when (see
    app.quality.upkeep). A project without a row has never been drained: its first drain starts from empty totals."""

    __tablename__ = "agreement_states"

    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"), primary_key=True)
    formula: Mapped[int] = mapped_column(Integer, default=AGREEMENT_FORMULA)
    """AGREEMENT_FORMULA when the states were computed; below it, the states must be rebuilt before they are read."""
    as_of: Mapped[datetime | None] = mapped_column(UTCDateTime())
    """When the last drain began: every ranking whose mark it read is in the figures (None: none has run)."""
    seconds: Mapped[float] = mapped_column(Float, default=0.0)
    """How long the last drain (or rebuild) took."""
    sequence: Mapped[int] = mapped_column(Integer, default=0)
    """Raised by every drain that changed something: what a cached rendering of the figures is a function of."""
    total_prompts: Mapped[int] = mapped_column(Integer, default=0)
    gold_prompts: Mapped[int] = mapped_column(Integer, default=0)
    """The project's prompts and gold prompts, counted by the last drain."""


class AgreementMark(Base):
    """A (prompt, round) whose human rankings changed since its state was last computed: written with the change (a
    ranking submitted or removed, a gold order set), read and deleted by the next drain. One row per change, not per
    group, so a change committed while a drain runs is never deleted unread."""

    __tablename__ = "agreement_marks"
    __table_args__ = (Index("ix_agreement_marks_project_id_id", "project_id", "id"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    prompt_id: Mapped[int] = mapped_column(Integer)
    """Not a foreign key: the hot path takes no lock on the prompt for it (a deleted prompt's mark drains to
    nothing)."""
    round: Mapped[int] = mapped_column(Integer)


class AgreementGroup(Base):
    """One (prompt, round)'s contribution to a scope's agreement figures (version 0: all rubric versions), as
    app.quality.partial computes it from the group's human rankings."""

    __tablename__ = "agreement_groups"
    __table_args__ = (Index("ix_agreement_groups_project_id_version_agreement", "project_id", "version", "agreement"),)

    prompt_id: Mapped[int] = mapped_column(ForeignKey("prompts.id", ondelete="CASCADE"), primary_key=True)
    round: Mapped[int] = mapped_column(Integer, primary_key=True)
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    state: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    """Totals key ("p", "a:<user id>", "h:<hour>", "d:<day>", "w:<week>") → the integer counts it adds there. Empty in
    a rubric version's row whose state is version 0's (every ranking of the group is of that version, the usual
    case): that row's `state` and `folded` hold it, written once."""
    agreement: Mapped[float | None] = mapped_column(Float)
    """Mean pairwise agreement of the group's comparisons (None: none): the disagreements page's order."""
    shared: Mapped[bool] = mapped_column(Boolean, default=False)
    """The group has a comparison: its prompt counts as shared."""
    gold_ranked: Mapped[bool] = mapped_column(Boolean, default=False)
    """The group's prompt is gold and someone ranked it here."""
    folded: Mapped[dict[str, Any] | None] = mapped_column(NullableJSON)
    """What folding new rankings into `state` needs (app.quality.partial.GroupState.folded); None: the group's
    next change computes it from all its rankings."""


class AgreementTotal(Base):
    """The sum of every group's contribution to one scope's key: the project ("p", key 0), an annotator ("a", user id)
    or a stretch of time ("h", "d", "w": hours, days or weeks since 1970, weeks from Monday)."""

    __tablename__ = "agreement_totals"

    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"), primary_key=True)
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(1), primary_key=True)
    key: Mapped[int] = mapped_column(Integer, primary_key=True)
    rankings: Mapped[int] = mapped_column(Integer, default=0)
    state: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    seconds: Mapped[dict[str, int] | None] = mapped_column(NullableJSON)
    """The key's seconds as a histogram, tenth of a second → non-skipped rankings (None or {}: none): the median's
    source, read and written by the drains alone (a page reads `median_seconds`)."""
    median_seconds: Mapped[float | None] = mapped_column(Float)
    """The median of the key's seconds (to the tenth), read off `seconds` when a drain changed them."""


class Webhook(Base):
    """An HTTPS URL a project's lead registered to be told of events (app.webhooks.service)."""

    __tablename__ = "webhooks"

    id: Mapped[int] = mapped_column(primary_key=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"), index=True)
    url: Mapped[str] = mapped_column(String(1000))
    events: Mapped[list[str]] = mapped_column(JSONType, default=list)
    secret_stored: Mapped[str] = mapped_column("secret", Text)
    """The signing secret encrypted (`fernet:<token>`, app/platform/crypto.py); shown once, in the answer that
    created it."""
    allow_private: Mapped[bool] = mapped_column(Boolean, default=False)
    """An admin trusts this host although it resolves to a private or loopback address."""
    created_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class WebhookDelivery(Base):
    """One event sent (or being sent) to one webhook: its body, and every attempt's status code or error."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        CheckConstraint(_in("state", DELIVERY_STATES), name="state"),
        Index("ix_webhook_deliveries_webhook_id_id", "webhook_id", "id"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    webhook_id: Mapped[int] = mapped_column(ForeignKey("webhooks.id", ondelete="CASCADE"))
    uid: Mapped[str] = mapped_column(String(36), unique=True)
    """The delivery id the receiver sees (`X-Preflab-Delivery`): the same on every retry, so it can deduplicate."""
    event: Mapped[str] = mapped_column(String(40))
    payload: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    state: Mapped[str] = mapped_column(String(12), default="pending")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    status_code: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    log: Mapped[list[dict[str, Any]]] = mapped_column(JSONType, default=list)
    """One entry per attempt: attempt, at, status_code, error, seconds."""
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id", ondelete="SET NULL"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    delivered_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class AuditEvent(Base):
    __tablename__ = "audit_events"
    __table_args__ = (Index("ix_audit_events_project_id_created_at", "project_id", "created_at"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    actor_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))
    project_id: Mapped[int | None] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    action: Mapped[str] = mapped_column(String(60))
    object_type: Mapped[str] = mapped_column(String(40), default="")
    object_id: Mapped[int | None] = mapped_column(Integer)
    data: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    ip: Mapped[str] = mapped_column(String(64), default="")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


def _mark_ranking_group(_mapper: Any, connection: Connection, target: Ranking) -> None:
    """A human ranking written, changed or deleted through the ORM marks its (prompt, round) for the next agreement
    drain, as the Core write paths do (app.annotation.rankings): no way of writing one leaves the kept figures
    behind."""
    if target.source == "human":
        connection.execute(AgreementMark.__table__.insert(), {"project_id": target.project_id,
                                                              "prompt_id": target.prompt_id,
                                                              "round": target.round if target.round is not None else 1})


event.listen(Ranking, "after_insert", _mark_ranking_group)
event.listen(Ranking, "after_update", _mark_ranking_group)
event.listen(Ranking, "after_delete", _mark_ranking_group)
