"""JSON API request and response models. Requests forbid unknown fields (no mass assignment) and are strict: a JSON
body's `0` is no `false` and its `"1"` no `1`. Page forms, whose fields all arrive as text, build the same models
with `from_form`, which converts as a form must."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo
from pydantic_core import PydanticCustomError

from app.models import (
    AssignmentDraft,
    Completion,
    Constitution,
    Export,
    Job,
    ModelEndpoint,
    Project,
    Rubric,
    User,
    Webhook,
    WebhookDelivery,
)
from app.platform.formats import Aggregation, Conflicts, ExportFormat, ExportKind, ExportLayout, StepNeutral
from training.methods import KINDS as RUN_KINDS

MAX_ID = 2**31 - 1
"""The largest id the database holds (a Postgres `integer`); `app.web.deps.Id` bounds path ids the same way."""

FORM = {"form": True}
"""The validation context of a page form's values (`Strict.from_form`): text is converted, not refused."""


def _json_integer(value: Any, info: ValidationInfo) -> Any:
    """JSON numbers for an integer field: 3 and 3.0 (JSON Schema's integers both), never true or "3"."""
    if info.context == FORM:
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PydanticCustomError("int_type", "Input should be a valid integer (a JSON number)")
    return value


Int = Annotated[int, Field(strict=False), BeforeValidator(_json_integer)]
"""An integer in a strict request body: 3.0 is 3, as JSON and JSON Schema have it; 3.5, "3" and true are refused."""

Id = Annotated[Int, Field(ge=1, le=MAX_ID)]
"""An object id in a request body."""

WHITE_SPACE = r"\t\n\x0b\x0c\r\x1c-\x1f \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
"""Python's white space (`str.isspace`, `re`'s `\\s`), spelled out for patterns: `\\s` means other sets in other
regex dialects (ECMA's adds U+FEFF, Rust's and ECMA's leave out U+001C-U+001F), and a schema pattern is read by
pydantic (Rust), by JSON Schema validators (ECMA) and by generators (Python) alike."""

EMAIL_PATTERN = (rf"^[^@{WHITE_SPACE}]{{1,64}}@[^@{WHITE_SPACE}]{{1,255}}\.[^@{WHITE_SPACE}]{{1,63}}$"
                 rf"|^[^@{WHITE_SPACE}]{{1,64}}@localhost$")
"""`services.users.EMAIL_RE`, the rule accounts are created with, as the schema states it."""

Email = Annotated[str, Field(min_length=3, max_length=320, pattern=EMAIL_PATTERN)]
"""No `format: email`: format checkers disagree on what an address is (control characters, quoting, non-ASCII), so
the schema states the server's own rule, the pattern (tests/security/schema_exceptions.py)."""


def _iso_datetime(value: Any, info: ValidationInfo) -> Any:
    """JSON has no datetime: a strict body's datetime is an ISO 8601 string (never a number of seconds)."""
    if isinstance(value, str | datetime) or value is None or info.context == FORM:
        return value
    raise PydanticCustomError("datetime_type", "Input should be an ISO 8601 date-time string")


CompletionKey = Annotated[str, Field(pattern=r"^[0-9]{1,10}$")]
"""A completion id as a JSON object's key (`flags`)."""

_ONLY_COMPLETION_KEYS: dict[str, Any] = {"additionalProperties": False}

Timestamp = Annotated[datetime, Field(strict=False), BeforeValidator(_iso_datetime)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    @classmethod
    def from_form(cls, **fields: Any) -> Any:
        """The model from a page form's values, converted as a form's text must be ("4" → 4, "on" → true); the
        JSON API validates its bodies strictly."""
        return cls.model_validate(fields, strict=False, context=FORM)


class RubricIn(Strict):
    text: str = Field(min_length=1, max_length=100_000, description="The rubric in Markdown.")
    criteria: list[str] = Field(default_factory=list, max_length=30, description="Short named criteria.")


class ProjectIn(Strict):
    name: str = Field(min_length=1, max_length=200)
    completions_per_prompt: Int = Field(ge=2, le=16, description="K: completions ranked per prompt.")
    overlap: Int = Field(default=1, ge=1, le=50, description="Independent rankings wanted per prompt.")
    description: str = Field(default="", max_length=5000)
    rubric: RubricIn


class ProjectOut(BaseModel):
    id: int
    name: str
    description: str
    completions_per_prompt: int = Field(description="K: completions ranked per prompt.")
    overlap: int = Field(description="Independent rankings wanted per prompt.")
    rubric_version: int | None = Field(description="The current rubric's version; null while there is none.")
    step_labels: bool = Field(False, description="Annotators label each step of each completion (+1, 0, -1).")
    step_separator: str | None = Field(None, description="The regular expression that ends a step; null: one step "
                                                         "per non-empty line.")
    created_at: datetime

    @classmethod
    def from_model(cls, project: Project, rubric_version: int | None) -> ProjectOut:
        settings = project.settings or {}
        return cls(id=project.id, name=project.name, description=project.description,
                   completions_per_prompt=project.completions_per_prompt, overlap=project.overlap,
                   rubric_version=rubric_version, step_labels=bool(settings.get("step_labels", False)),
                   step_separator=settings.get("step_separator") or None, created_at=project.created_at)


class StepOptionsIn(Strict):
    enabled: bool = Field(description="Annotators label each step of each completion while ranking.")
    separator: str | None = Field(
        default=None, max_length=200,
        description="A regular expression that ends a step (null or empty: one step per non-empty line). Changing "
                    "it re-splits only completions that have no step label yet.")


class StepOptionsOut(BaseModel):
    enabled: bool
    separator: str | None


class RubricVersionIn(Strict):
    text: str = Field(min_length=1, max_length=100_000)
    criteria: list[str] = Field(default_factory=list, max_length=30)
    base_version: Int = Field(ge=1, le=MAX_ID, description="The version you edited; 409 if it is no longer current.")
    note: str = Field(default="", max_length=500, description="What changed, for the history page.")


class RubricOut(BaseModel):
    version: int = Field(description="1 for the project's first rubric, one more for each edit.")
    text: str
    criteria: list[str] = Field(description="The named criteria annotators judge by, in order.")
    note: str = Field(description="What the edit changed, as its author wrote it (empty when none was given).")
    author: str | None = Field(description="The author's email; null when no author account is recorded (or it "
                                           "was deleted).")
    created_at: datetime
    current: bool = Field(description="Whether annotators rank under this version now.")

    @classmethod
    def from_model(cls, rubric: Rubric, current_id: int | None) -> RubricOut:
        return cls(version=rubric.version, text=rubric.text, criteria=rubric.criteria, note=rubric.note,
                   author=rubric.author.email if rubric.author else None, created_at=rubric.created_at,
                   current=rubric.id == current_id)


class MemberIn(Strict):
    email: Email = Field(description="The address of an existing account.")
    role: Literal["lead", "annotator", "engineer"]


class MemberOut(BaseModel):
    user_id: int
    email: str
    name: str
    role: str


class ImportOut(BaseModel):
    prompts: int
    completions: int
    pairs: int
    skipped_duplicates: list[int] = Field(default_factory=list, description="Lines skipped as duplicates.")
    rankings: int = Field(0, description="Rankings by annotators of another tool (label-studio, argilla presets).")
    annotators: int = Field(0, description="Pseudonymous users standing for those annotators.")
    step_labels: int = Field(0, description="Step labels imported, one per labelled step (trl-stepwise, prm800k "
                             "presets; their rankings carry the labels and make no pairs).")
    preset: str = Field("preflab", description="The layout the file was read in: the one asked for, or the one "
                        "detected from its first row.")
    extra_columns: list[str] = Field(default_factory=list,
                                     description="Columns preflab does not know, kept in each row's metadata.")
    note: str | None = Field(None, description='e.g. "kept 3 extra columns: prompt_id, source, model".')


class UserIn(Strict):
    email: Email
    password: str = Field(min_length=10, max_length=1024)
    role: Literal["admin", "lead", "annotator", "engineer"]
    name: str = Field(default="", max_length=200)


class UserPatch(Strict):
    name: str | None = Field(default=None, max_length=200)
    role: Literal["admin", "lead", "annotator", "engineer"] | None = None
    active: bool | None = None


class UserOut(BaseModel):
    id: int
    email: str
    name: str
    role: str
    active: bool
    created_at: datetime

    @classmethod
    def from_model(cls, user: User) -> UserOut:
        return cls(id=user.id, email=user.email, name=user.name, role=user.role, active=user.active,
                   created_at=user.created_at)


class ModelEndpointIn(Strict):
    name: str = Field(min_length=1, max_length=100, description="What leads see in the picker.")
    base_url: str = Field(min_length=8, max_length=1000, description="The API root, e.g. http://vllm:8000/v1.")
    model: str = Field(min_length=1, max_length=300, description="The default served model name.")
    api_key: str | None = Field(default=None, max_length=500, description="Sent as a Bearer token; never shown again.")
    allow_private: bool = Field(default=False, description="Trust this host although it is a private or loopback "
                                                           "address (metadata and link-local stay refused).")


class ModelEndpointPatch(Strict):
    name: str | None = Field(default=None, min_length=1, max_length=100)
    base_url: str | None = Field(default=None, min_length=8, max_length=1000)
    model: str | None = Field(default=None, min_length=1, max_length=300)
    api_key: str | None = Field(default=None, max_length=500, description="A new key (omit to keep the stored one).")
    clear_api_key: bool = False
    allow_private: bool | None = None


class ModelEndpointOut(BaseModel):
    """What everyone may see: enough to pick an endpoint. Admins get `ModelEndpointAdminOut`."""

    id: int
    name: str
    model: str


class ModelEndpointAdminOut(ModelEndpointOut):
    base_url: str
    has_api_key: bool = Field(description="Whether a key is stored; the key itself is never returned.")
    api_key_status: Literal["none", "stored", "unreadable"] = Field(
        description='"unreadable": no configured encryption key decrypts the stored key; jobs using this endpoint '
                    "fail until an admin enters the key again.")
    allow_private: bool
    created_by: str | None
    created_at: datetime

    @classmethod
    def from_model(cls, endpoint: ModelEndpoint, key_status: Literal["none", "stored", "unreadable"]
                   ) -> ModelEndpointAdminOut:
        return cls(id=endpoint.id, name=endpoint.name, model=endpoint.model, base_url=endpoint.base_url,
                   has_api_key=endpoint.api_key_stored is not None, api_key_status=key_status,
                   allow_private=endpoint.allow_private,
                   created_by=endpoint.created_by.email if endpoint.created_by else None,
                   created_at=endpoint.created_at)


CLUSTER_NAME = r"^[A-Za-z][A-Za-z0-9_-]{0,39}$"
"""A cluster's name, as runs give it in `where`."""
JOB_PREFIX = r"^([A-Za-z][A-Za-z0-9_-]{0,39})?$"
"""A cluster's job-name prefix; empty: preflab."""
CLUSTER_LOGIN = r"^[A-Za-z0-9._-]{1,64}@[A-Za-z0-9.-]{1,253}(:[0-9]{1,5})?$"
"""A Slurm login node, user@host[:port] (app.runs.backends.clusters.LOGIN)."""
CLUSTER_LOGIN_OR_EMPTY = r"^([A-Za-z0-9._-]{1,64}@[A-Za-z0-9.-]{1,253}(:[0-9]{1,5})?)?$"


class ClusterIn(Strict):
    name: str = Field(min_length=1, max_length=40, pattern=CLUSTER_NAME,
                      description="What runs name in `where`: a letter, then letters, digits, - or _.")
    kind: Literal["slurm", "ray"]
    address: str | None = Field(default=None, max_length=1000,
                                description="Ray: the head's dashboard address (http://host:8265).")
    partition: str | None = Field(default=None, max_length=200, description="Slurm: the default partition.")
    login: str | None = Field(default=None, max_length=330, pattern=CLUSTER_LOGIN,
                              description="Slurm: user@host or user@host:port of a login node that runs sbatch and "
                                          "the rest over SSH (the secret is its private key); none: the worker's "
                                          "own host.")
    shared_dir: str = Field(min_length=1, max_length=1000, pattern=r"^\s*/",
                            description="The path the app, the workers and every node see (PREFLAB_DATA_DIR and "
                                        "the models lie under it).")
    resources: dict[str, Any] = Field(default_factory=dict,
                                      description="Default resources a run's own override: cpus, gpus, memory_gb, "
                                                  "nodes, workers, time_limit_min.")
    env: dict[str, str] = Field(default_factory=dict, description="More environment variables for runs there.")
    job_prefix: str = Field(default="preflab", max_length=40, pattern=JOB_PREFIX,
                            description="Job names are JOB_PREFIX-<job>-<attempt>; two installs sharing a cluster "
                                        "each set their own.")
    max_running: int | None = Field(default=None, ge=1, le=10_000,
                                    description="The concurrency cap: at most this many runs at once on the cluster; "
                                                "further runs wait queued (none: no cap).")
    secret: str | None = Field(default=None, max_length=20_000,
                               description="A Ray token (sent as a Bearer header to the head) or the login node's SSH "
                                           "private key; stored encrypted and never shown again.")


class ClusterPatch(Strict):
    name: str | None = Field(default=None, min_length=1, max_length=40, pattern=CLUSTER_NAME)
    kind: Literal["slurm", "ray"] | None = None
    address: str | None = Field(default=None, max_length=1000, description='"" removes it.')
    partition: str | None = Field(default=None, max_length=200, description='"" removes it.')
    login: str | None = Field(default=None, max_length=330, pattern=CLUSTER_LOGIN_OR_EMPTY,
                              description='"" removes it.')
    shared_dir: str | None = Field(default=None, min_length=1, max_length=1000, pattern=r"^\s*/")
    resources: dict[str, Any] | None = Field(default=None, description="Replaces the default resources whole.")
    env: dict[str, str] | None = Field(default=None, description="Replaces the variables whole.")
    job_prefix: str | None = Field(default=None, max_length=40, pattern=JOB_PREFIX)
    max_running: int | None = Field(default=None, ge=1, le=10_000)
    no_cap: bool = Field(default=False, description="Remove the concurrency cap.")
    secret: str | None = Field(default=None, max_length=20_000, description="A new secret (omit to keep the stored "
                                                                            "one).")
    clear_secret: bool = False


class ClusterOut(BaseModel):
    """A cluster as admins see it: never its secret, only whether one is set."""

    id: int | None = Field(description="None for a cluster of PREFLAB_CLUSTERS_FILE (not editable here).")
    name: str
    kind: str
    source: Literal["app", "file"] = Field(description='"file": from PREFLAB_CLUSTERS_FILE, read-only in the app.')
    address: str | None
    partition: str | None
    login: str | None = Field(description="Slurm: the login node its commands run on over SSH.")
    shared_dir: str | None
    resources: dict[str, Any]
    env_names: list[str] = Field(description="The names of the extra variables (their values are not shown).")
    job_prefix: str
    max_running: int | None
    running: int = Field(description="preflab's runs going on the cluster now.")
    secret: Literal["not set", "set", "unreadable"] = Field(
        description='"unreadable": no configured encryption key decrypts the stored secret; enter it again.')


class ClusterTestOut(BaseModel):
    ok: bool
    seconds: float = Field(description="From submitting the trivial job to its end.")
    detail: str = Field(description="What the backend said: the job it ran, or its own words on failure.")


class DefaultClusterIn(Strict):
    default_cluster: str | None = Field(default=None, max_length=40,
                                        description="The cluster the project's runs go to when they name none "
                                                    "(null or local: the worker's host).")


class DefaultClusterOut(BaseModel):
    default_cluster: str = Field(description="`local` when none is set.")


class WebhookIn(Strict):
    url: str = Field(min_length=8, max_length=1000, description="The https:// URL each event is POSTed to.")
    events: list[str] = Field(min_length=1, max_length=10, description="Events to send: export.ready, "
                              "training_run.finished, training_run.failed, judge_run.finished, overlap.reached, "
                              "annotator.flagged.")
    allow_private: bool = Field(default=False, description="Admins only: allow a private or loopback host (and "
                                                           "plain http to it); metadata and link-local stay refused.")


class WebhookOut(BaseModel):
    id: int
    project_id: int
    url: str
    events: list[str]
    allow_private: bool
    created_at: datetime

    @classmethod
    def from_model(cls, hook: Webhook) -> WebhookOut:
        return cls(id=hook.id, project_id=hook.project_id, url=hook.url, events=list(hook.events),
                   allow_private=hook.allow_private, created_at=hook.created_at)


class WebhookCreated(WebhookOut):
    secret: str = Field(description="The signing secret. Shown only in this answer: store it now.")


class WebhookAttempt(BaseModel):
    attempt: int
    at: str
    status_code: int | None
    error: str | None
    seconds: float


class WebhookDeliveryOut(BaseModel):
    id: int
    delivery_id: str = Field(description="The X-Preflab-Delivery header's value, the same on every retry.")
    event: str
    state: Literal["pending", "delivered", "failed"]
    attempts: int
    status_code: int | None
    error: str | None
    log: list[WebhookAttempt]
    created_at: datetime
    delivered_at: datetime | None

    @classmethod
    def from_model(cls, d: WebhookDelivery) -> WebhookDeliveryOut:
        return cls(id=d.id, delivery_id=d.uid, event=d.event, state=d.state, attempts=d.attempts,
                   status_code=d.status_code, error=d.error, log=[WebhookAttempt(**a) for a in d.log],
                   created_at=d.created_at, delivered_at=d.delivered_at)


class Health(BaseModel):
    """`GET /healthz`: the process and the database, as it always answered."""

    status: Literal["ok", "degraded"]
    database: Literal["ok", "down"]


class Live(BaseModel):
    """`GET /healthz/live`: the process serves requests."""

    status: Literal["ok"]


class ReadinessCheck(BaseModel):
    status: Literal["ok", "fail", "unknown"] = Field(description="`unknown`: not checked, an earlier check failed")
    detail: str = Field(description="What was found, in words")


class ReadinessChecks(BaseModel):
    database: ReadinessCheck
    migrations: ReadinessCheck
    worker: ReadinessCheck


class Readiness(BaseModel):
    """`GET /healthz/ready`: each check, and the names of those that failed (a 503 when any did)."""

    status: Literal["ok", "fail"]
    failing: list[Literal["database", "migrations", "worker"]]
    checks: ReadinessChecks


class PromptView(BaseModel):
    id: int
    text: str | None = None
    messages: list[dict[str, str]] | None = None


class CompletionView(BaseModel):
    id: int
    text: str
    messages: list[dict[str, str]] | None = Field(
        None, description="The response as chat turns, when it is more than one assistant turn (text renders them).")
    steps: list[str] | None = Field(None, description="The completion's steps, when the project labels steps.")


class RubricView(BaseModel):
    version: int
    text: str
    criteria: list[str]


class TaskOut(BaseModel):
    assignment_id: int
    prompt: PromptView
    completions: list[CompletionView] = Field(description="In the display order chosen for this annotator.")
    rubric: RubricView | None
    lease_expires_at: datetime
    flags: list[str] = Field(description="Flags this project allows per completion.")
    skip_reasons: list[str]
    allow_ties: bool
    allow_partial: bool
    step_labels: bool = Field(False, description="Label each completion's steps: +1 correct, 0 neutral, -1 wrong.")


StepValue = Annotated[Int, Field(ge=-1, le=1)]
"""+1 correct, 0 neutral, -1 wrong (a JSON number: true is not a label)."""
StepLabelList = Annotated[list[StepValue], Field(max_length=100)]
DraftStepLabelList = Annotated[list[StepValue | None], Field(max_length=100)]


class RankingIn(Strict):
    assignment_id: Id | None = Field(default=None, description="The task from /tasks/next (or give prompt_id).")
    prompt_id: Id | None = None
    tiers: list[Annotated[list[Id], Field(min_length=1, max_length=16)]] = Field(
        default_factory=list, max_length=16, description="Completion ids, best tier first; ties share a tier.")
    rubric_version: Int = Field(ge=1, le=MAX_ID,
                                description="The rubric version shown while ranking; 422 if no longer current.")
    submission_id: str = Field(min_length=1, max_length=64, description="Client id: a retry with it is idempotent.")
    flags: dict[CompletionKey, Annotated[list[Annotated[str, Field(max_length=200)]], Field(max_length=32)]] = Field(
        default_factory=dict, max_length=16, description="Completion id → flags.",
        json_schema_extra=_ONLY_COMPLETION_KEYS)
    skipped: bool = False
    skip_reason: str | None = Field(default=None, max_length=200)
    seconds_spent: float | None = Field(default=None, ge=0)
    step_labels: dict[CompletionKey, StepLabelList] = Field(
        default_factory=dict, max_length=16,
        description="Completion id → a label per step (1 correct, 0 neutral, -1 wrong), for projects that label "
                    "steps. A list covers every step, or stops at the first -1; a completion left out is unlabelled.",
        json_schema_extra=_ONLY_COMPLETION_KEYS)


class RankingOut(BaseModel):
    ranking_id: int
    pairs_created: int
    created: bool



DRAFT_MAX_BYTES = 16 * 1024
"""The largest draft body accepted (a K=16 task with every flag ticked is well under it; so are step labels for
16 completions of 100 steps each, about 8 KiB)."""


class DraftIn(Strict):
    tiers: list[Annotated[list[Id], Field(min_length=1, max_length=16)]] = Field(
        default_factory=list, max_length=16,
        description="The completions placed so far, best tier first; ties share a tier. Unplaced ones are left out.")
    flags: dict[CompletionKey, Annotated[list[Annotated[str, Field(max_length=200)]], Field(max_length=32)]] = Field(
        default_factory=dict, max_length=16, description="Completion id → the flags ticked so far.",
        json_schema_extra=_ONLY_COMPLETION_KEYS)
    seconds_spent: float | None = Field(default=None, ge=0, le=24 * 3600,
                                        description="Time on the task so far: a resumed page counts on from it.")
    step_labels: dict[CompletionKey, DraftStepLabelList] = Field(
        default_factory=dict, max_length=16,
        description="Completion id → the step labels so far (1, 0, -1, or null for a step not labelled yet).",
        json_schema_extra=_ONLY_COMPLETION_KEYS)
    edited_at: Timestamp | None = Field(
        default=None, description="When the ranking was last changed, on the client's clock (default: now; never "
                                  "later than the server's). A draft older than the stored one is refused with 409, "
                                  "so a late retry never overwrites a newer draft from another device.")


class DraftOut(BaseModel):
    assignment_id: int
    tiers: list[list[int]]
    flags: dict[str, list[str]]
    seconds_spent: float | None
    step_labels: dict[str, list[int | None]] = Field(default_factory=dict)
    edited_at: datetime
    saved_at: datetime

    @classmethod
    def from_model(cls, draft: AssignmentDraft) -> DraftOut:
        return cls(assignment_id=draft.assignment_id, tiers=draft.tiers, flags=draft.flags,
                   seconds_spent=draft.seconds_spent, step_labels=draft.step_labels or {},
                   edited_at=draft.edited_at, saved_at=draft.saved_at)

class HFGeneratorIn(Strict):
    backend: Literal["hf"]
    model: str = Field(min_length=1, max_length=1000, description="Path of a local model directory (no hub).")
    temperature: float = Field(default=1.0, ge=0, le=5)
    top_p: float = Field(default=1.0, gt=0, le=1)
    max_new_tokens: Int = Field(default=256, ge=1, le=32_768)
    stop: list[str] = Field(default_factory=list, max_length=16)
    batch_size: Int = Field(default=8, ge=1, le=512)


class OpenAIGeneratorIn(Strict):
    backend: Literal["openai"]
    endpoint_id: Id | None = Field(default=None, description="A model endpoint an admin configured "
                                    "(GET /api/model-endpoints); its URL and API key stay on the server.")
    base_url: str | None = Field(default=None, min_length=8, max_length=1000,
                                 description="Admins only: a public server's URL, e.g. https://api.example.org/v1. "
                                             "Everyone else picks an endpoint_id.")
    model: str | None = Field(default=None, min_length=1, max_length=300,
                              description="The served model's name (default: the endpoint's model).")
    api_key: str | None = Field(default=None, max_length=500,
                                description="Refused: API keys are stored on model endpoints, never in a job.")
    api: Literal["chat", "completions"] = "chat"
    temperature: float = Field(default=1.0, ge=0, le=5)
    top_p: float = Field(default=1.0, gt=0, le=1)
    max_new_tokens: Int = Field(default=256, ge=1, le=32_768)
    stop: list[str] = Field(default_factory=list, max_length=16)
    timeout_s: float = Field(default=60, gt=0, le=3600)
    max_retries: Int = Field(default=4, ge=0, le=20)
    concurrency: Int = Field(default=8, ge=1, le=256)
    max_n: Int = Field(default=16, ge=1, le=128)


class SamplingJobIn(Strict):
    generator: HFGeneratorIn | OpenAIGeneratorIn = Field(discriminator="backend")
    k: Int | None = Field(default=None, ge=1, le=16,
                          description="Completions wanted per prompt (default: the project's K).")
    prompt_ids: list[Id] | None = Field(default=None, max_length=100_000, description="Only these prompts.")
    seed: Int | None = Field(default=None, ge=0, le=2**31 - 1)
    resample_duplicates: Int = Field(default=0, ge=0, le=5, description=(
        "Tries to replace empty, blank and near-duplicate answers; what is still empty or identical is dropped."))


class JobAccepted(BaseModel):
    job_id: int


class JobProgress(BaseModel):
    done: int
    total: int


class JobOut(BaseModel):
    id: int
    kind: str
    state: Literal["queued", "running", "succeeded", "failed", "cancelled"]
    progress: JobProgress
    message: str | None = None
    error: str | None = None
    attempts: int
    project_id: int | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    result: dict | None = Field(default=None, description="The job's summary once it succeeded.")

    @classmethod
    def from_model(cls, job: Job) -> JobOut:
        result = dict(job.result or {})
        return cls(id=job.id, kind=job.kind, state=job.state,
                   progress=JobProgress(done=int(result.get("done", 0)), total=int(result.get("total", 0))),
                   message=result.get("message"), error=job.error, attempts=job.attempts, project_id=job.project_id,
                   created_at=job.created_at, started_at=job.started_at, finished_at=job.finished_at,
                   result={k: v for k, v in result.items() if k not in ("done", "total", "message")}
                   if job.state == "succeeded" else None)


NOT_BLANK = f"[^{WHITE_SPACE}]"
"""Text the server strips must hold a character Python's `str.strip` keeps."""


class PrincipleIn(Strict):
    name: str = Field(min_length=1, max_length=200, pattern=NOT_BLANK)
    rationale: str = Field(default="", max_length=4000)
    priority: Int = Field(default=1, ge=0, le=1000, description="Lower comes first.")
    comparison: str = Field(min_length=1, max_length=4000, pattern=NOT_BLANK,
                            description="e.g. 'Which response is less harmful?'")
    critique: str = Field(default="", max_length=4000, description="The critique request (supervised CAI stage).")
    revision: str = Field(default="", max_length=4000, description="The revision request (supervised CAI stage).")


class ConstitutionIn(Strict):
    principles: list[PrincipleIn] = Field(min_length=1, max_length=50)
    base_version: Int | None = Field(default=None, ge=1, le=MAX_ID,
                                     description="The version you edited (omit for the first).")
    note: str = Field(default="", max_length=500)


class ConstitutionOut(BaseModel):
    version: int
    principles: list[dict]
    note: str
    created_at: datetime
    current: bool

    @classmethod
    def from_model(cls, constitution: Constitution, current_id: int | None) -> ConstitutionOut:
        return cls(version=constitution.version, principles=constitution.principles, note=constitution.note,
                   created_at=constitution.created_at, current=constitution.id == current_id)


class JudgeRunIn(Strict):
    constitution_version: Int | None = Field(default=None, ge=1, le=MAX_ID, description="Default: the current version "
                                             "(the default constitution is created if the project has none).")
    generator: HFGeneratorIn | OpenAIGeneratorIn = Field(discriminator="backend")
    mode: Literal["logprob", "cot"] = "logprob"
    principles: Literal["sample", "all"] = "sample"
    prompt_ids: list[Id] | None = Field(default=None, max_length=100_000)
    scope: Literal["all", "human_ranked"] = Field(default="all", description=(
        "Which prompts (of `prompt_ids`, when given): `all` with two or more completions, or `human_ranked`, those "
        "an annotator has ranked when the run starts: the quickest way to measure the judge's agreement with humans "
        "(422 naming `scope` when there are none)."))
    seed: Int = Field(default=0, ge=0, le=2**31 - 1)
    low_confidence: float = Field(default=0.6, ge=0.5, le=1.0,
                                  description="Pairs whose max(p, 1−p) is below this are marked low-confidence.")
    route_low_confidence: bool = Field(default=False, description="Send low-confidence prompts back to humans.")
    label_steps: bool = Field(default=False, description=(
        "Also label every step of every judged completion (projects with step labels on; 422 otherwise): the judge "
        "is asked \"Is step N correct given the problem and the steps before it?\" and p(Yes), Yes over Yes + No "
        "from the answer tokens' log-probs, is stored as the run's soft step label (hard label +1 when p ≥ 0.5, "
        "else -1). Read from log-probs whatever `mode` says; no principle applies."))


class JudgeRunAccepted(BaseModel):
    judge_run_id: int
    job_id: int


class MCStepLabelsIn(Strict):
    model: str | None = Field(default=None, max_length=1000, description=(
        "The policy that writes the continuations: a local model directory (a causal LM, no hub). Default: the "
        "default policy (PREFLAB_DEFAULT_POLICY_MODEL, SmolLM2-135M-Instruct once `preflab models prepare` ran)."))
    n: Int = Field(default=8, ge=1, le=64, description=(
        "N: continuations sampled from each step's prefix (Math-Shepherd used 8). The run samples N × (steps − 1) "
        "per completion; one over 500000 in all is refused, naming this field."))
    estimate: Literal["hard", "soft"] = Field(default="hard", description=(
        "Which estimate labels a step: hard, +1 when any of the N continuations reaches the right answer; soft, "
        "+1 when at least half do. Either way the share of right continuations is stored as the soft label p."))
    max_completions: Int = Field(default=100, ge=1, le=10_000, description=(
        "Most completions to label: the ones a task shows (the prompt's K newest), prompt by prompt in id order."))
    max_new_tokens: Int = Field(default=256, ge=1, le=4096, description="Most tokens per continuation.")
    temperature: float = Field(default=1.0, gt=0, le=5, description="Sampling temperature of the continuations.")
    seed: Int = Field(default=0, ge=0, le=2**31 - 1, description="Base seed: a run with the same seed and policy "
                                                                 "samples the same continuations.")
    checker: Literal["gsm8k_exact_match"] = Field(default="gsm8k_exact_match", description=(
        "How a continuation is checked against the prompt's reference answer: gsm8k_exact_match compares final "
        "numbers (`#### x`, `A: x`, `\\boxed{x}`, else the last number). Prompts without a reference are passed "
        "over; a project with none is refused."))
    prompt_ids: list[Id] | None = Field(default=None, max_length=100_000, description="Only these prompts.")


class MCStepLabelsAccepted(BaseModel):
    run_id: int = Field(description="The Monte-Carlo run (listed with the judge runs); its rankings have source mc.")
    job_id: int
    planned_completions: int = Field(description="Completions the run will label.")
    planned_continuations: int = Field(description="Continuations it will sample: N × (steps − 1) per completion.")


class CalibrationBinOut(BaseModel):
    p_low: float
    p_high: float
    n: int
    human_rate: float | None
    mean_p: float | None = Field(None, description="The judge's mean p(chosen ≻ rejected) over the bin's pairs.")


class JudgeAgreementOut(BaseModel):
    n_prompts: int
    n_pairs: int
    pair_agreement: float | None
    kendall_tau: float | None
    calibration: list[CalibrationBinOut]
    position_flip_rate: float | None
    per_principle: dict[str, dict]
    gold_prompts: int
    gold_accuracy: float | None
    ai_labels_enabled: bool
    gate_missing: list[str] = Field(
        default_factory=list, description="What the evidence for allowing AI labels for training still lacks "
                                          "(prompts judged beside humans, agreement); empty when the lead may allow "
                                          "them.")
    computed: str = Field("live", description="live: computed on this request | rollup: by the rollup job at "
                          "`as_of` (projects over a few thousand rankings, over all the judge's rankings).")
    as_of: datetime | None = Field(None, description="When the rankings behind these figures were read.")
    age_seconds: float | None = Field(None, description="How old the figures are, in seconds.")


class SelectionIn(Strict):
    selection: Literal["random", "uncertainty", "disagreement"] = Field(
        description="The queue's order: `random` (by import order, the default), `uncertainty` (prompts the reward "
                    "model is least sure about first) or `disagreement` (prompts whose human rankings disagree most "
                    "first). The two last serve by the priorities their last priorities job stored. Measured (the "
                    "Benchmarks page): `uncertainty` reached random order's final accuracy on HH-RLHF harmless with "
                    "2.13× fewer labels (95 % interval 1.12–3.78, 20 seeds, an ensemble over a frozen encoder); "
                    "`disagreement`'s extra rankings were worth 5.96× as many given at random (4.64–7.82) in a "
                    "simulation on GSM8K. Random stays the default.")
    disagreement_extra: Int | None = Field(
        None, ge=0, le=10,
        description="`disagreement`: rankings added beyond the overlap to each contested prompt (one that reached "
                    "the overlap with a disagreement share above `disagreement_threshold`), bounded by the "
                    "project's annotators; 0 gives none. Omitted: unchanged (default 2). A change ends the extra "
                    "overlap given so far until the next priorities job.")
    disagreement_threshold: float | None = Field(
        None, ge=0, lt=0.5,
        description="`disagreement`: a prompt is contested when more than this share of its human pair votes went "
                    "against each pair's majority (0 to below 0.5). Omitted: unchanged (default 0.2).")


class PrioritiesIn(Strict):
    training_run_id: Id | None = Field(
        None, description="`uncertainty`: the reward-model run that scores the prompts (default: the project's "
                                "newest finished one).")


class SelectionOut(BaseModel):
    selection: str
    computed_at: str | None = Field(description="When the stored priorities were computed (ISO 8601, UTC).")
    computed_for: str | None = Field(description="The selection the stored priorities were computed for.")
    training_run_id: int | None = Field(description="The reward-model run behind them (`uncertainty`).")
    prompts: int = Field(description="Prompts that have a priority.")
    measure: str | None = Field(description="`spread` (across an ensemble's heads), `margin` (a single-head "
                                            "model: p nearest 0.5 first) or `disagreement`.")
    disagreement_extra: int = Field(description="Rankings `disagreement` adds beyond the overlap to a contested "
                                                "prompt.")
    disagreement_threshold: float = Field(description="The disagreement share above which a prompt is contested.")
    extra_overlap_prompts: int = Field(
        description="Prompts that want rankings beyond the overlap now: given by the last `disagreement` "
                    "priorities job this round (0 under another selection, or after a change of the two settings).")


class AILabelsIn(Strict):
    enabled: bool = Field(description="May AI labels be used for training (exports include them)?")


class AIStepLabelsIn(Strict):
    enabled: bool = Field(description="May the judge's step labels be used for training (steps exports include "
                                      "them)? Allowing needs 20 prompts step-labelled by both the judge and humans "
                                      "and step agreement of 60 % or more.")


class JudgeStepAgreementOut(BaseModel):
    n_prompts: int = Field(description="Prompts with steps labelled by both the judge and humans.")
    n_completions: int = Field(description="Completions with steps labelled by both.")
    n_steps: int = Field(description="Steps compared: labelled by both, the human majority +1 or -1.")
    neutral_steps: int = Field(description="Steps labelled by both whose human majority is neutral (0): left out "
                                           "of every figure, since the judge answers only Yes or No.")
    step_agreement: float | None = Field(description="Share of compared steps where the judge's hard label "
                                                     "(p ≥ 0.5 → +1, else -1) is the human majority (ties to the "
                                                     "worse label).")
    brier: float | None = Field(description="Mean (p − y)² over compared steps, y = 1 for a step humans call "
                                            "correct: 0 is perfect, 0.25 a constant p = 0.5.")
    wrong_step_recall: float | None = Field(description="Share of the steps humans call wrong the judge calls "
                                                        "wrong too.")
    mean_p: float | None = Field(description="The judge's mean p(correct) over compared steps.")
    human_correct_rate: float | None = Field(description="Share of compared steps humans call correct.")
    ai_step_labels_enabled: bool
    gate_missing: list[str] = Field(default_factory=list, description="What the evidence for allowing AI step "
                                                                      "labels still lacks; empty when the lead may "
                                                                      "allow them.")


class TrainingRunIn(Strict):
    kind: Literal[RUN_KINDS]  # type: ignore[valid-type]  # the training methods, in the registry's order
    export_id: Id = Field(description="An SFT export for sft, a pairs export for reward and dpo, a steps "
                                      "export for prm, a prompts export for rft, grpo and ppo.")
    base_model: str | None = Field(default=None, max_length=1000,
                                   description="Local model directory: a causal LM for sft, dpo, rft, grpo and ppo "
                                               "(reward and prm runs default to the shipped MiniLM).")
    reward_run_id: Id | None = Field(default=None,
                                     description="The reward-model run an rft, grpo or ppo run optimises; for grpo "
                                                 "also a prm run, whose step scores become the process reward.")
    config: dict = Field(default_factory=dict, description="Trainer config fields (see `python -m training KIND "
                                                           "--help`); validated before any job exists.")
    where: str | None = Field(default=None, max_length=100,
                              description="The cluster the run executes on: `local` (the worker's host, the default) "
                                          "or a Slurm or Ray cluster an admin configured (admin page, "
                                          "PREFLAB_CLUSTERS_FILE). Default: the project's default cluster, else "
                                          "local.")
    resources: dict | None = Field(default=None,
                                   description="What the run asks of its cluster, over the cluster's defaults: cpus, "
                                               "gpus, memory_gb, nodes, workers (DDP processes in all), "
                                               "time_limit_min, partition (Slurm). A Ray head's address is the "
                                               "cluster's own.")


class TrainingRunAccepted(BaseModel):
    run_id: int
    job_id: int


class StepStatOut(BaseModel):
    index: int = Field(description="j, the step's place in the rollout (0 = the first step).")
    reward: float | None = Field(description="Mean step reward over the rollouts that reach step j, averaged over the "
                                             "last `window` updates (process scores alone).")
    advantage: float | None = Field(description="Mean advantage of step j, over the same rollouts and updates.")
    reward_first: float | None = Field(description="The step reward over the first `window` updates (null for a run "
                                                   "of one update).")
    advantage_first: float | None = Field(description="The advantage over the first `window` updates.")
    rollouts: float | None = Field(description="Rollouts that reach step j per update, over the last `window` "
                                               "updates (null when the trainer did not log `step_reached/j`).")


class StepStatsOut(BaseModel):
    updates: int = Field(description="Updates that logged step figures.")
    window: int = Field(description="Updates averaged: at most 20, at most half the run's.")
    early: bool = Field(description="Whether the first-window figures are given (more than one update).")
    steps: list[StepStatOut]
    outcome_zero_std_frac: float | None = Field(
        description="Share of groups whose outcome reward did not vary (no outcome signal), over the last `window` "
                    "updates.")
    outcome_zero_std_frac_first: float | None = Field(description="The same share over the first `window` updates.")


class TrainingRunOut(BaseModel):
    id: int
    kind: str = Field(description="The training method, as requested (TrainingRunIn.kind).")
    state: str = Field(description="queued | running | succeeded | failed | cancelled")
    export_id: int | None = Field(description="The export it trains on; null once that export's record is purged.")
    parent_run_id: int | None = Field(description="The reward-model run it optimises, or a reward run is "
                                                  "retrained from; null when none.")
    base_model: str | None = Field(description="The model directory it starts from; null: a reward model on the "
                                               "default base.")
    job_id: int | None
    created_at: datetime
    metrics: list[dict]
    eval: dict | None = None
    human_check: dict | None = Field(default=None, description="Reward runs: accuracy on held-out human pairs and "
                                                               "on pairs labelled after the export (drift).")
    step_stats: StepStatsOut | None = Field(
        default=None, description="A run whose reward scores steps (GRPO with a process reward model): its figures "
                                  "per step index, from metrics.jsonl. Null for other runs and in a project's list.")
    model_dir: str | None = None
    config: dict
    lineage: dict


class SampleIntoProjectIn(Strict):
    k: Int | None = Field(default=None, ge=1, le=16, description="Completions per prompt (default: the project's K).")
    new_round: bool = Field(default=True, description="Start a new annotation round on these completions.")
    seed: Int | None = Field(default=None, ge=0, le=2**31 - 1)
    max_new_tokens: Int | None = Field(default=None, ge=1, le=32_768, description="Default: the run's own.")
    temperature: float | None = Field(default=None, ge=0, le=5, description="Default: the run's own.")
    max_prompts: Int | None = Field(default=None, ge=1, le=MAX_ID, description=(
        "Answer at most this many of the prompts still short of k, oldest first (default: every one). The run page "
        "fills in what fits a quarter of an hour on the worker's measured speed."))


class RevisionJobIn(Strict):
    generator: HFGeneratorIn | OpenAIGeneratorIn = Field(discriminator="backend")
    constitution_version: Int | None = Field(default=None, ge=1, le=MAX_ID)
    prompt_ids: list[Id] | None = Field(default=None, max_length=100_000)
    limit: Int = Field(default=20, ge=1, le=10_000, description="Most completions to critique and revise.")
    seed: Int = Field(default=0, ge=0, le=2**31 - 1)


class RevisionOut(BaseModel):
    id: int
    prompt_id: int
    original_id: int | None
    original: str | None
    critique: str
    revision: str
    principle: str | None
    constitution_version: int | None
    status: str

    @classmethod
    def from_model(cls, revision: Completion, original: Completion | None) -> RevisionOut:
        meta = revision.meta or {}
        return cls(id=revision.id, prompt_id=revision.prompt_id, original_id=meta.get("original_id"),
                   original=original.text if original else None, critique=meta.get("critique", ""),
                   revision=revision.text, principle=meta.get("principle"),
                   constitution_version=meta.get("constitution_version"), status=meta.get("status", "pending"))


class RevisionDecisionIn(Strict):
    accept: bool


class IterateIn(Strict):
    replay_share: float = Field(default=0.1, ge=0, le=1, description="Share of earlier pairs mixed into the new "
                                                                     "reward-model export (replay).")
    k: Int | None = Field(default=None, ge=1, le=16, description="Completions per prompt for the next round.")
    max_prompts: Int | None = Field(default=None, ge=1, le=MAX_ID, description=(
        "The next round's sampling answers at most this many prompts, oldest first (default: every one)."))
    where: str | None = Field(default=None, max_length=40, description=(
        "The cluster the round's reward-model and policy runs go to (`local`: the worker's host), with its default "
        "resources; none: each goes where the run it continues went."))


class ExportIn(Strict):
    kind: ExportKind = "pairs"
    format: ExportFormat
    filters: dict[str, Any] = Field(default_factory=dict)
    aggregation: Aggregation = "raw"
    conflicts: Conflicts = Field(
        "keep", description="Aggregated pairs whose votes disagree: kept with weight = agreement, or dropped")
    layout: ExportLayout | None = Field(
        None, description="standard: prompt and responses as text; conversational: as message lists (TRL's "
        "conversational layout). Not given: conversational when the project holds chat prompts, else standard.")
    neutral: StepNeutral = Field(
        "positive", description="steps exports: neutral (0) steps become True (positive), False (negative), or end "
                                "the row before them (truncate)")
    every_step: bool = Field(
        False, description="steps exports: write every labelled step of each completion, the steps after its first "
                           "wrong one included (for training a process reward model as a dense reward); false: a row "
                           "ends at its first wrong step")


class ExportAccepted(BaseModel):
    export_id: int
    job_id: int


class ExportOut(BaseModel):
    id: int
    project_id: int
    kind: str = Field(description="What each row holds, as requested (ExportIn.kind).")
    format: str
    filters: dict[str, Any] = Field(description="The filters the rows were selected by, as requested.")
    status: str
    """queued | running | ready | failed | cancelled | deleted"""
    row_count: int
    row_counts: dict[str, int] = Field(description="Rows per labeller (`source.<name>`) and per split "
                                                   "(`split.<name>`); empty until the export is written.")
    empty: bool = Field(description="Ready with no row: the filters matched nothing.")
    sha256: str | None = Field(description="One hash over every file's sha256 (`files`); null until written.")
    files: dict[str, str] = Field(description="File name → sha256, every file of the export, its card included.")
    snapshot: str | None = Field(description="The database snapshot the export read (Postgres: pg_current_snapshot())")
    job_id: int | None
    created_by_id: int | None
    created_at: datetime
    deleted_at: datetime | None

    @classmethod
    def from_model(cls, export: Export, state: str) -> ExportOut:
        """`state` is `services.exports.status`: the job's state folded into the export's own."""
        return cls(id=export.id, project_id=export.project_id, kind=export.kind, format=export.format,
                   filters=dict(export.filters or {}), status=state, row_count=export.row_count,
                   row_counts=dict(export.row_counts or {}), empty=state == "ready" and export.row_count == 0,
                   sha256=export.sha256, files=dict(export.files or {}), snapshot=export.snapshot,
                   job_id=export.job_id,
                   created_by_id=export.created_by_id, created_at=export.created_at, deleted_at=export.deleted_at)


class FlagOut(BaseModel):
    kind: str = Field(description="too_fast | position_bias | low_gold | negative_alpha")
    title: str
    why: str = Field(description="Why it is a problem, in words, with the figures behind it.")
    action: str = Field(description="What a lead should do about it.")


class TrendPointOut(BaseModel):
    label: str = Field(description="The bucket's start (UTC) or the rubric version (\"v2\").")
    x: float
    rankings: int
    agreement: float | None
    gold_accuracy: float | None
    median_seconds: float | None


class AnnotatorOut(BaseModel):
    user_id: int
    email: str
    name: str
    rankings: int = Field(description="Human rankings submitted, skips included.")
    skipped: int
    skip_share: float | None = Field(description="skipped / rankings.")
    median_seconds: float | None = Field(description="Median seconds per ranking that was not a skip.")
    agreement: float | None = Field(
        description="Mean pairwise agreement with other annotators' rankings of the same prompts: the share of "
                    "item pairs ranked by both that both order the same way (a tie is a relation of its own).")
    comparisons: int = Field(description="Ranking pairs behind `agreement`.")
    kendall_tau: float | None = Field(description="Mean Kendall τ_b over the same comparisons, where defined.")
    tie_share: float | None = Field(description="Share of non-skipped rankings with a tier of two or more items.")
    position_rate: float | None = Field(description="Share of rankings whose first-shown item is in the top tier.")
    position_expected: float | None = Field(
        description="The rate without position bias: mean |top tier| / items shown, i.e. 1/K without ties.")
    gold_seen: int = Field(description="Non-skipped rankings of gold prompts.")
    gold_pairs: int = Field(description="Gold pairs (from the gold tiers) whose two completions were shown.")
    gold_agreed: int = Field(description="Gold pairs ordered the same way (a tie or an unranked item is a miss).")
    gold_accuracy: float | None = Field(description="gold_agreed / gold_pairs.")
    position_rankings: int = Field(0, description="Rankings behind `position_rate` (with a display order).")
    flags: list[FlagOut] = Field(default_factory=list, description="What a lead should look at for this annotator.")


class AgreementOut(BaseModel):
    project_id: int
    rubric_version: int | None = Field(description="The rubric version filtered to; null for all versions.")
    rubric_versions: list[int]
    overlap: int = Field(description="Rankings wanted per prompt.")
    total_prompts: int
    prompts_at_overlap: int = Field(
        description="Prompts with at least `overlap` non-skipped human rankings in the current round.")
    human_rankings: int
    skipped: int
    shared_prompts: int = Field(description="Prompts ranked by two or more annotators.")
    comparisons: int = Field(description="Pairs of rankings of one prompt by two different annotators.")
    mean_agreement: float | None
    mean_kendall_tau: float | None
    krippendorff_alpha: float | None = Field(
        description="Ordinal α over mid-ranks; units are the ranked completions, coders the annotators.")
    gold_prompts: int = Field(description="Prompts marked as gold tasks, ranked by anyone or not.")
    annotators: list[AnnotatorOut]
    gold_prompts_ranked: int = Field(0, description="Gold prompts at least one annotator has ranked.")
    median_seconds: float | None = Field(None, description="The project's median seconds per non-skipped ranking.")
    flags: list[FlagOut] = Field(default_factory=list, description="What a lead should look at for the project.")
    trend_unit: str = Field("day", description="hour | day | week: the width of each point of `trend`.")
    trend: list[TrendPointOut] = Field(default_factory=list)
    by_rubric_version: list[TrendPointOut] = Field(default_factory=list)
    computed: str = Field("kept", description="kept: the figures kept up to date as rankings arrive, as of `as_of` "
                          "(earlier releases said live or rollup: from every ranking on the request, or by the "
                          "rollup job).")
    as_of: datetime | None = Field(None, description="When the changes behind these figures were last folded in.")
    age_seconds: float | None = Field(None, description="How old the figures are, in seconds.")


class GoldStepScoreOut(BaseModel):
    user_id: int
    email: str
    gold_completions: int = Field(description="Gold completions with known step labels the annotator labelled.")
    gold_steps: int = Field(description="Steps labelled both by the annotator and in the gold (steps after either's "
                                        "first -1 are not compared).")
    gold_steps_agreed: int = Field(description="Of those, steps given the gold's label.")
    gold_step_accuracy: float | None = Field(description="gold_steps_agreed / gold_steps.")
    gold_first_error_agreed: int = Field(
        description="Gold completions where the annotator's first -1 is on the gold's first -1 step (or neither "
                    "has one).")
    gold_first_error_accuracy: float | None = Field(description="gold_first_error_agreed / gold_completions.")


class LabellerAgreementOut(BaseModel):
    first: Literal["human", "ai", "mc"] = Field(description="A labeller: human (the annotators' majority per step), "
                                                           "ai (the AI judge) or mc (Monte-Carlo estimation).")
    second: Literal["human", "ai", "mc"]
    completions: int = Field(description="Completions with a step labelled by both.")
    steps: int = Field(description="Steps compared: labelled by both, neither's majority neutral (0). Each "
                                   "labeller's label of a step is the majority of its rankings' (ties to the worse).")
    agreement: float | None = Field(description="Share of compared steps given the same label.")
    first_wrong_caught: float | None = Field(description="Of the compared steps `first` calls wrong, the share "
                                                         "`second` calls wrong too.")


class StepAgreementOut(BaseModel):
    labelled_completions: int = Field(description="Completions with at least one human step label.")
    shared_completions: int = Field(description="Completions step-labelled by two or more annotators.")
    compared_steps: int = Field(description="Steps labelled by two or more annotators.")
    step_agreement: float | None = Field(description="Mean share of annotator pairs giving a step the same label.")
    krippendorff_alpha: float | None = Field(description="Ordinal α over steps (-1 < 0 < +1); annotators are coders.")
    first_error_agreement: float | None = Field(
        description="Share of annotator pairs putting a completion's first wrong step on the same step (or none).")
    gold_completions: int = Field(0, description="Completions of gold tasks with known step labels.")
    annotators: list[GoldStepScoreOut] = Field(
        default_factory=list, description="Each annotator's step accuracy on gold tasks' known step labels (those "
                                          "who step-labelled any gold completion).")
    labellers: list[LabellerAgreementOut] = Field(
        default_factory=list, description="Humans (their majority per step), the AI judge and Monte-Carlo step "
                                          "labels compared two by two on the steps both labelled; a pair with no "
                                          "step in common is left out.")


class GoldIn(Strict):
    tiers: list[Annotated[list[Id], Field(min_length=1, max_length=16)]] = Field(
        min_length=2, max_length=16,
        description="The known correct order: completion ids, best tier first; ties share a tier. At least two "
                    "tiers: a gold order with everything tied teaches nothing.")
    step_labels: dict[CompletionKey, StepLabelList] = Field(
        default_factory=dict, max_length=16,
        description="Projects that label steps: completion id → the known label of each of its steps (1 correct, "
                    "0 neutral, -1 wrong), checked as a ranking's are (every step, or up to the first -1; a "
                    "completion left out has none). Setting the gold again replaces them; {} clears them.",
        json_schema_extra=_ONLY_COMPLETION_KEYS)


class AnnotatorRemovedOut(BaseModel):
    user_id: int
    rankings_removed: int = Field(description="Their human rankings removed from the project, with their pairs.")


class GoldOut(BaseModel):
    prompt_id: int
    gold_tiers: list[list[int]] | None
    gold_step_labels: dict[str, list[int]] | None = Field(
        None, description="The known step labels, completion id → labels; null when none.")
