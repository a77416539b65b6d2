"""Page forms: each HTML form's fields as they arrive, turned into the JSON API's own request model, and one way to
answer a refusal by showing the page again with the field's visible label and the values the user typed.

A form arrives as text: a blank field as "" (FastAPI then uses the field's default), a checkbox only when ticked
("on"), and the CSRF token as one more field (`app.web.deps.csrf_guard` checks it; here it is only accepted). Like the
API's models, a form refuses fields it does not know (no mass assignment).
"""

from __future__ import annotations

import math
import tomllib
from abc import abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypeVar

from fastapi import Request, UploadFile
from fastapi.responses import RedirectResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from sqlalchemy.orm import Session

from app.platform.errors import DomainError, Invalid
from app.schemas import (
    AILabelsIn,
    AIStepLabelsIn,
    ClusterIn,
    ClusterPatch,
    ConstitutionIn,
    DefaultClusterIn,
    ExportIn,
    IterateIn,
    JudgeRunIn,
    MCStepLabelsIn,
    MemberIn,
    ModelEndpointIn,
    ModelEndpointPatch,
    PrioritiesIn,
    ProjectIn,
    RankingIn,
    RevisionDecisionIn,
    RevisionJobIn,
    RubricVersionIn,
    SampleIntoProjectIn,
    SamplingJobIn,
    SelectionIn,
    StepOptionsIn,
    TrainingRunIn,
    UserIn,
    UserPatch,
    WebhookIn,
)
from app.web.rendering import render

T = TypeVar("T")

GENERATOR_BACKENDS = ("hf", "openai")


# --- errors, as a page shows them ---------------------------------------------------------------------------


@dataclass(frozen=True)
class FieldError:
    """A refusal as `_error.html` shows it: the field's visible label, the message, and the field's API name."""

    message: str
    field: str | None = None
    label: str | None = None
    status_code: int = 422

    def detail(self) -> list[dict[str, object]]:
        """The JSON API's error body (`DomainError.detail`), for HTMX requests that show it in place; with the
        field's visible `label` ("" for a hidden field) when the form knows it, so the page never shows the path."""
        item: dict[str, object] = {"message": self.message}
        if self.field:
            item["field"] = self.field
            if self.label is not None:
                item["label"] = self.label
        return [item]

    def __str__(self) -> str:
        return f"{self.label or self.field}: {self.message}" if self.field else self.message


# pydantic's wording for people: its messages speak of types ("String should have at least 1 character").
_PLAIN_MESSAGES: dict[str, Callable[[dict[str, Any]], str]] = {
    "missing": lambda ctx: "is required",
    "string_too_short": lambda ctx: "must not be blank" if ctx.get("min_length") == 1
    else f"must be at least {ctx.get('min_length')} characters",
    "string_too_long": lambda ctx: f"must be at most {ctx.get('max_length')} characters",
    "int_parsing": lambda ctx: "must be a whole number",
    "int_type": lambda ctx: "must be a whole number",
    "float_type": lambda ctx: "must be a number",
    "bool_type": lambda ctx: "must be yes or no",
    "string_type": lambda ctx: "must be text",
    "int_from_float": lambda ctx: "must be a whole number",
    "float_parsing": lambda ctx: "must be a number",
    "bool_parsing": lambda ctx: "must be yes or no",
    "greater_than_equal": lambda ctx: f"must be at least {ctx.get('ge')}",
    "less_than_equal": lambda ctx: f"must be at most {ctx.get('le')}",
    "greater_than": lambda ctx: f"must be more than {ctx.get('gt')}",
    "less_than": lambda ctx: f"must be less than {ctx.get('lt')}",
    "too_short": lambda ctx: f"needs at least {ctx.get('min_length')}",
    "extra_forbidden": lambda ctx: "is not a field of this form",
}


def validation_field(exc: ValidationError) -> tuple[str, str]:
    """(dotted field, message) of a validation error's first problem, named as the JSON API names it: the
    generator's backend is a union's tag, not a field, so `generator.hf.temperature` reads `generator.temperature`.
    Common type errors are said in plain words; others keep pydantic's message."""
    err = exc.errors()[0]
    loc = [str(p) for p in err["loc"] if str(p) not in GENERATOR_BACKENDS]
    plain = _PLAIN_MESSAGES.get(err["type"])
    return ".".join(loc), plain(err.get("ctx") or {}) if plain else err["msg"]


def field_error(exc: DomainError | ValidationError, label: Callable[[str], str | None]) -> FieldError:
    if isinstance(exc, ValidationError):
        field, message = validation_field(exc)
        return FieldError(message, field or None, label(field) if field else None, 422)
    return FieldError(exc.message, exc.field, label(exc.field) if exc.field else None, exc.status_code)


def lines(raw: str) -> list[str]:
    """A textarea of one item a line (criteria): blank lines and list markers dropped."""
    return [line.strip(" -\t") for line in raw.splitlines() if line.strip(" -\t")]


class PageForm(BaseModel):
    """The fields of one page's form. `LABELS` maps the API model's field names (dotted) to what the page shows
    next to the input; `SECRET` fields are never echoed back into the page. Forms with no JSON twin (logging in,
    tokens, an upload's options) are read field by field; the others are `ApiForm`s."""

    model_config = ConfigDict(extra="forbid")

    LABELS: ClassVar[Mapping[str, str]] = {}
    SECRET: ClassVar[tuple[str, ...]] = ()

    csrf_token: str = Field("", exclude=True, max_length=200)

    def label(self, field: str) -> str | None:
        """The visible label of `field` or of the nearest enclosing field that has one (`rubric.text` → Rubric).
        "" for a field the page does not show as an input (a hidden version number): the message then stands
        alone."""
        parts = field.split(".")
        while parts:
            found = self.LABELS.get(".".join(parts))
            if found is not None:
                return found
            parts.pop()
        return None

    def error(self, exc: DomainError | ValidationError) -> FieldError:
        return field_error(exc, self.label)

    def values(self) -> dict[str, Any]:
        """What the user typed, to fill the form again (secrets left out)."""
        return self.model_dump(exclude=set(self.SECRET))


class ApiForm(PageForm):
    """A page form with a JSON twin: `submit` turns it into the API's request model and runs the same service."""

    @abstractmethod
    def to_api(self) -> Any:
        """The JSON API's request model for these fields (ValidationError or Invalid when they do not make one)."""


def submit(request: Request, db: Session, form: ApiForm, action: Callable[[Any], T], *,
           redirect: str | Callable[[T], str], template: str,
           context: Callable[[FieldError], dict[str, Any]], block: str | None = None) -> Response:
    """The page's POST: validate the form into its API model and run `action` on it in a savepoint, then redirect
    (303) to `redirect`; when the model or the service refuses, show `template` again: `context(error)` with the
    error and what the user typed (`form`) (the savepoint is gone, so the page's queries still run)."""
    try:
        with db.begin_nested():
            result = action(form.to_api())
    except (DomainError, ValidationError) as exc:
        error = form.error(exc)
        ctx = context(error) | {"error": error, "form": form.values()}
        return render(request, template, ctx, status_code=error.status_code, block=block)
    return RedirectResponse(redirect if isinstance(redirect, str) else redirect(result), status_code=303)


# --- projects, members, rubrics -----------------------------------------------------------------------------


class ProjectForm(ApiForm):
    LABELS: ClassVar[Mapping[str, str]] = {
        "name": "Name", "completions_per_prompt": "Completions per prompt (K)",
        "overlap": "Overlap (rankings per prompt)", "rubric": "Rubric (Markdown)",
        "rubric.criteria": "Criteria (one per line)", "criteria": "Criteria (one per line)"}

    name: str = Field("", max_length=200)
    completions_per_prompt: int = 4
    overlap: int = 1
    rubric: str = Field("", max_length=100_000)
    criteria: str = Field("", max_length=20_000)

    def to_api(self) -> ProjectIn:
        # One validation of the whole body, so a rubric error is named `rubric.text` as the API names it.
        return ProjectIn.from_form(**{"name": self.name, "completions_per_prompt": self.completions_per_prompt,
                                         "overlap": self.overlap,
                                         "rubric": {"text": self.rubric, "criteria": lines(self.criteria)}})


class MemberForm(ApiForm):
    LABELS: ClassVar[Mapping[str, str]] = {"email": "Email", "role": "Role"}

    email: str = Field("", max_length=320)
    role: str = Field("", max_length=20)

    def to_api(self) -> MemberIn:
        return MemberIn.from_form(email=self.email, role=self.role)


class WebhookForm(ApiForm):
    LABELS: ClassVar[Mapping[str, str]] = {"url": "URL", "events": "Events",
                                           "allow_private": "Trusted private host (admins)"}

    url: str = Field("", max_length=1000)
    events: list[str] = Field(default_factory=list, max_length=10)
    allow_private: bool = False

    def to_api(self) -> WebhookIn:
        return WebhookIn(url=self.url, events=self.events, allow_private=self.allow_private)


class RubricForm(ApiForm):
    LABELS: ClassVar[Mapping[str, str]] = {"text": "Rubric (Markdown)", "criteria": "Criteria (one per line)",
                                           "note": "What changed (for the history)", "base_version": ""}

    text: str = Field("", max_length=100_000)
    criteria: str = Field("", max_length=20_000)
    base_version: int = 0
    note: str = Field("", max_length=500)

    def to_api(self) -> RubricVersionIn:
        return RubricVersionIn.from_form(text=self.text, criteria=lines(self.criteria), base_version=self.base_version,
                               note=self.note)


class ImportForm(PageForm):
    file: UploadFile
    on_duplicate: str = "error"
    preset: str = ""
    """Empty: detect the layout from the first row."""
    strict: str = ""
    """"on": refuse unknown columns instead of keeping them in each row's metadata."""

    @property
    def preset_name(self) -> str | None:
        return self.preset or None

    @property
    def strict_mode(self) -> bool:
        return self.strict == "on"

    @property
    def policy(self) -> Literal["error", "skip"]:
        return "skip" if self.on_duplicate == "skip" else "error"


# --- accounts -------------------------------------------------------------------------------------------------


class LoginForm(PageForm):
    SECRET = ("password",)

    email: str = Field("", max_length=320)
    password: str = Field("", max_length=1024)
    next: str = ""


class PasswordForm(PageForm):
    LABELS: ClassVar[Mapping[str, str]] = {"current_password": "Current password", "password": "New password",
                                           "new_password": "New password"}
    SECRET = ("current_password", "new_password")

    current_password: str = Field(max_length=1024)
    new_password: str = Field(max_length=1024)


class TokenForm(PageForm):
    name: str = Field("", max_length=100)


class UserForm(ApiForm):
    LABELS: ClassVar[Mapping[str, str]] = {"email": "Email", "name": "Name", "role": "Role",
                                           "password": "Initial password"}
    SECRET = ("password",)

    email: str = Field(max_length=320)
    password: str = Field(max_length=1024)
    role: str = Field(max_length=20)
    name: str = Field("", max_length=200)

    def to_api(self) -> UserIn:
        return UserIn.from_form(email=self.email, password=self.password, role=self.role, name=self.name)


class UserUpdateForm(ApiForm):
    LABELS: ClassVar[Mapping[str, str]] = {"role": "Role", "active": "active"}

    role: str = Field(max_length=20)
    active: bool = False

    def to_api(self) -> UserPatch:
        return UserPatch.from_form(role=self.role, active=self.active)

    def values(self) -> dict[str, Any]:
        return {}  # a row's edit: the page's one form to fill again is "Add a user", which this is not


_ENDPOINT_LABELS = {"name": "Name", "base_url": "Base URL", "model": "Default model", "api_key": "API key",
                    "allow_private": "trusted private host", "clear_api_key": "remove the stored key"}


class EndpointForm(ApiForm):
    LABELS: ClassVar[Mapping[str, str]] = _ENDPOINT_LABELS
    SECRET = ("api_key",)

    name: str = Field(max_length=100)
    base_url: str = Field(max_length=1000)
    model: str = Field(max_length=300)
    api_key: str = Field("", max_length=500)
    allow_private: bool = False

    def to_api(self) -> ModelEndpointIn:
        return ModelEndpointIn.from_form(name=self.name, base_url=self.base_url, model=self.model,
                               api_key=self.api_key or None, allow_private=self.allow_private)


class EndpointUpdateForm(EndpointForm):
    clear_api_key: bool = False

    def to_api(self) -> ModelEndpointPatch:  # type: ignore[override]
        return ModelEndpointPatch.from_form(name=self.name, base_url=self.base_url, model=self.model,
                                  api_key=self.api_key or None, clear_api_key=self.clear_api_key,
                                  allow_private=self.allow_private)

    def values(self) -> dict[str, Any]:
        return {}  # a row's edit: the page's one form to fill again is "Add a model endpoint", which this is not


# --- generators: sampling, the judge, revisions -------------------------------------------------------------------


_CLUSTER_LABELS = {"name": "Name", "kind": "Kind", "address": "Ray head address", "partition": "Slurm partition",
                   "login": "Slurm login node", "shared_dir": "Shared path", "resources": "Default resources",
                   "job_prefix": "Job prefix", "max_running": "Runs at once (cap)", "secret": "Secret",
                   "clear_secret": "remove the stored secret"}


def key_values(raw: str, field: str) -> dict[str, Any]:
    """`gpus=1, cpus=8` (commas or lines) as a dict, numbers as numbers; Invalid naming `field` for a bad item."""
    found: dict[str, Any] = {}
    for item in (part.strip() for part in raw.replace("\n", ",").split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise Invalid(f"{item!r} is not KEY=VALUE", field=field)
        text = value.strip()
        found[key.strip()] = int(text) if text.isdigit() else _number(text)
    return found


def _number(text: str) -> Any:
    try:
        return float(text)
    except ValueError:
        return text


class ClusterForm(ApiForm):
    LABELS: ClassVar[Mapping[str, str]] = _CLUSTER_LABELS
    SECRET = ("secret",)

    name: str = Field("", max_length=40)
    kind: str = Field("slurm", max_length=10)
    address: str = Field("", max_length=1000)
    partition: str = Field("", max_length=200)
    login: str = Field("", max_length=330)
    shared_dir: str = Field("", max_length=1000)
    resources: str = Field("", max_length=2000)
    job_prefix: str = Field("preflab", max_length=40)
    max_running: str = Field("", max_length=10)
    secret: str = Field("", max_length=20_000)

    def to_api(self) -> ClusterIn:
        return ClusterIn.from_form(name=self.name, kind=self.kind, address=self.address or None,
                                   partition=self.partition or None, login=self.login.strip() or None,
                                   shared_dir=self.shared_dir,
                                   resources=key_values(self.resources, "resources"), job_prefix=self.job_prefix,
                                   max_running=self.max_running.strip() or None, secret=self.secret or None)


class ClusterUpdateForm(ClusterForm):
    clear_secret: bool = False

    def to_api(self) -> ClusterPatch:  # type: ignore[override]
        cap = self.max_running.strip()
        return ClusterPatch.from_form(name=self.name, kind=self.kind, address=self.address, partition=self.partition,
                                      login=self.login.strip(), shared_dir=self.shared_dir,
                                      resources=key_values(self.resources, "resources"),
                                      job_prefix=self.job_prefix, max_running=cap or None, no_cap=not cap,
                                      secret=self.secret or None, clear_secret=self.clear_secret)

    def values(self) -> dict[str, Any]:
        return {}  # a row's edit: the page's one form to fill again is "Add a cluster", which this is not


class DefaultClusterForm(ApiForm):
    LABELS: ClassVar[Mapping[str, str]] = {"default_cluster": "Default cluster"}

    default_cluster: str = Field("local", max_length=40)

    def to_api(self) -> DefaultClusterIn:
        return DefaultClusterIn.from_form(default_cluster=self.default_cluster or None)

    def values(self) -> dict[str, Any]:
        return {}  # the page's form to fill again is the run's, which this is not


class GeneratorForm(PageForm):
    """The model picker the sampling and judge pages share: a local directory, or an admin's model endpoint."""

    SECRET = ("api_key",)

    backend: str = "hf"
    model: str = Field("", max_length=1000)
    endpoint_id: str = Field("", max_length=20)
    base_url: str = Field("", max_length=1000)
    api_key: str = Field("", max_length=500)

    def generator(self, **params: object) -> dict[str, object]:
        """The generator as the API receives it. Blank fields are left out, so a page that posts a base URL or a
        key gets the same refusal from the service as the API would."""
        backend = self.backend
        if backend == "hf" and not self.model.strip() and self.endpoint_id.strip():
            # The label promises "blank: the endpoint's default": a chosen endpoint with no model name is that,
            # even when the local-directory choice was left as it was.
            backend = "openai"
        raw: dict[str, object] = {"backend": backend, "model": self.model, **params}
        if backend == "hf" and not self.model.strip():
            raise Invalid("give the path of a local model directory, or choose a model endpoint (a blank model "
                          "name then means the endpoint's default model)", field="generator.model")
        if backend == "openai":
            raw |= {"endpoint_id": self.endpoint_id.strip() or None, "base_url": self.base_url.strip() or None,
                    "api_key": self.api_key or None, "model": self.model.strip() or None}
        return raw

    def label(self, field: str) -> str | None:
        return super().label(field) or GENERATOR_LABELS.get(field.removeprefix("generator."))


GENERATOR_LABELS = {"model": "Model", "endpoint_id": "Model endpoint", "base_url": "Server URL",
                    "api_key": "API key", "temperature": "Temperature", "top_p": "Top-p",
                    "max_new_tokens": "Max new tokens", "backend": "Backend"}


class SamplingForm(GeneratorForm, ApiForm):
    LABELS: ClassVar[Mapping[str, str]] = {"seed": "Seed", "resample_duplicates": "Resample near-duplicates (tries)",
                                           "prompt_ids": "Prompts", "k": "Completions per prompt"}

    temperature: str = "1.0"
    top_p: str = "1.0"
    max_new_tokens: str = "256"
    seed: str = ""
    resample_duplicates: str = "0"

    def to_api(self) -> SamplingJobIn:
        try:
            seed = int(self.seed) if self.seed.strip() else None
            tries = int(self.resample_duplicates or 0)
        except ValueError:
            raise Invalid("must be a whole number", field="seed") from None
        generator = self.generator(temperature=self.temperature, top_p=self.top_p,
                                   max_new_tokens=self.max_new_tokens)
        # The page's tries field is a hint, not a request to refuse: it is kept within the API's range.
        return SamplingJobIn.from_form(generator=generator, seed=seed, resample_duplicates=max(0, min(tries, 5)))


class JudgeForm(GeneratorForm, ApiForm):
    LABELS: ClassVar[Mapping[str, str]] = {"mode": "Mode", "principles": "Principles", "seed": "Seed",
                                           "constitution_version": "Constitution", "scope": "Prompts",
                                           "route_low_confidence": "Send unsure prompts to humans first",
                                           "label_steps": "Label steps too"}

    mode: str = "logprob"
    principles: str = "sample"
    scope: str = "all"
    seed: int = Field(0, ge=0)
    route_low_confidence: bool = False
    label_steps: bool = False

    def to_api(self) -> JudgeRunIn:
        return JudgeRunIn.from_form(generator=self.generator(), mode=self.mode, principles=self.principles,
                                    scope=self.scope, seed=self.seed, route_low_confidence=self.route_low_confidence,
                                    label_steps=self.label_steps)


class MCStepLabelsForm(ApiForm):
    LABELS: ClassVar[Mapping[str, str]] = {"model": "Policy model directory", "n": "Continuations per step (N)",
                                           "estimate": "Estimate", "max_completions": "Most completions",
                                           "max_new_tokens": "Max new tokens", "temperature": "Temperature",
                                           "seed": "Seed", "checker": "Checker", "prompt_ids": "Prompts"}

    model: str = Field("", max_length=1000)
    n: str = Field("8", max_length=20)
    estimate: str = Field("hard", max_length=20)
    max_completions: str = Field("100", max_length=20)
    max_new_tokens: str = Field("256", max_length=20)
    temperature: str = Field("1.0", max_length=20)
    seed: str = Field("0", max_length=20)

    def to_api(self) -> MCStepLabelsIn:
        return MCStepLabelsIn.from_form(model=self.model.strip() or None, n=self.n, estimate=self.estimate,
                                        max_completions=self.max_completions, max_new_tokens=self.max_new_tokens,
                                        temperature=self.temperature, seed=self.seed)


class RevisionsForm(ApiForm):
    LABELS: ClassVar[Mapping[str, str]] = {"generator": "Model directory", "generator.model": "Model directory",
                                           "limit": "Completions",
                                           "constitution_version": "Constitution"}

    model: str = Field("", max_length=1000)
    limit: int = Field(20, ge=1, le=10_000)

    def to_api(self) -> RevisionJobIn:
        return RevisionJobIn.from_form(generator={"backend": "hf", "model": self.model}, limit=self.limit)


class GoldFromMetadataForm(PageForm):
    limit: str = Field("", max_length=10)

    @property
    def count(self) -> int | None:
        """At most this many prompts; blank (or not a number) means no limit."""
        return int(self.limit) if self.limit.strip().isdigit() else None


class AILabelsForm(ApiForm):
    LABELS: ClassVar[Mapping[str, str]] = {"enabled": "Allow AI labels for training"}

    enabled: str = ""

    def to_api(self) -> AILabelsIn:
        return AILabelsIn.from_form(enabled=self.enabled == "yes")


class AIStepLabelsForm(ApiForm):
    LABELS: ClassVar[Mapping[str, str]] = {"enabled": "Allow AI step labels for training"}

    enabled: str = ""

    def to_api(self) -> AIStepLabelsIn:
        return AIStepLabelsIn.from_form(enabled=self.enabled == "yes")


class SelectionForm(ApiForm):
    LABELS: ClassVar[Mapping[str, str]] = {"selection": "Queue order",
                                           "disagreement_extra": "Extra rankings for contested prompts",
                                           "disagreement_threshold": "Contested above disagreement share"}

    selection: str = Field("", max_length=20)
    disagreement_extra: str = Field("", max_length=12)
    disagreement_threshold: str = Field("", max_length=20)

    def to_api(self) -> SelectionIn:
        # Blank: unchanged (a form without the two fields keeps them).
        return SelectionIn.from_form(selection=self.selection,
                                     disagreement_extra=self.disagreement_extra.strip() or None,
                                     disagreement_threshold=self.disagreement_threshold.strip() or None)


class PrioritiesForm(ApiForm):
    LABELS: ClassVar[Mapping[str, str]] = {"training_run_id": "Reward-model run"}

    training_run_id: str = Field("", max_length=12)

    def to_api(self) -> PrioritiesIn:
        run = self.training_run_id.strip()
        return PrioritiesIn(training_run_id=int(run) if run.isdigit() else None)


class StepOptionsForm(ApiForm):
    # The service names `step_separator`; the page's field is `separator`.
    LABELS: ClassVar[Mapping[str, str]] = {"enabled": "Label steps", "separator": "Step separator",
                                           "step_separator": "Step separator"}

    enabled: str = ""
    separator: str = Field("", max_length=200)

    def to_api(self) -> StepOptionsIn:
        return StepOptionsIn(enabled=self.enabled == "yes", separator=self.separator or None)


class DecisionForm(ApiForm):
    accept: str = ""

    def to_api(self) -> RevisionDecisionIn:
        return RevisionDecisionIn.from_form(accept=self.accept == "yes")


class FieldsetForm(PageForm):
    """A form with one group of fields per item (`p-0-name`, `rank_12`): fields whose names start with one of
    `PREFIXES` are gathered into `items` by name, in the order they came; any other unknown field is refused."""

    PREFIXES: ClassVar[tuple[str, ...]] = ()

    items: dict[str, str | list[str]] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _gather(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            data = dict(data)
            data["items"] = {k: data.pop(k) for k in list(data) if k.startswith(cls.PREFIXES)}
        return data

    def item(self, name: str) -> list[str]:
        """Every value sent under `name` (a ticked checkbox group sends several)."""
        value = self.items.get(name)
        if value is None:
            return []
        return list(value) if isinstance(value, list) else [value]


# --- constitutions --------------------------------------------------------------------------------------------

PRINCIPLE_FIELDS = ("name", "rationale", "priority", "comparison", "critique", "revision")
PRINCIPLE_LABELS = {"name": "Name", "rationale": "Rationale", "priority": "Priority",
                    "comparison": "Comparison question", "critique": "Critique request",
                    "revision": "Revision request"}


class ConstitutionForm(FieldsetForm, ApiForm):
    """The editor's fieldsets `p-<i>-<field>`, one per principle; `principles()` reads them back in order."""

    PREFIXES = ("p-",)
    LABELS: ClassVar[Mapping[str, str]] = {"base_version": "", "note": "What changed (for the history)",
                                           "principles": "Principles"}

    base_version: int = 0
    note: str = Field("", max_length=500)

    def principles(self) -> list[dict[str, Any]]:
        """The principles as typed; one whose name and comparison are both blank is left out, and a blank
        priority is its place in the list."""
        indices = sorted({int(k.split("-")[1]) for k in self.items if k.split("-")[1].isdigit()})
        out: list[dict[str, Any]] = []
        for i in indices:
            item = {f: (self.item(f"p-{i}-{f}") or [""])[0].strip() for f in PRINCIPLE_FIELDS}
            if item["name"] or item["comparison"]:
                item["priority"] = item["priority"] or str(len(out) + 1)
                out.append(item)
        return out

    def to_api(self) -> ConstitutionIn:
        return ConstitutionIn.from_form(principles=self.principles(), base_version=self.base_version or None,
                              note=self.note)

    def label(self, field: str) -> str | None:
        parts = field.split(".")
        if len(parts) == 3 and parts[0] == "principles" and parts[1].isdigit():
            return f"Principle {int(parts[1]) + 1}: {PRINCIPLE_LABELS.get(parts[2], parts[2])}"
        return super().label(field)

    def values(self) -> dict[str, Any]:
        return {"base_version": self.base_version, "note": self.note, "principles": self.principles()}


# --- the ranking page -----------------------------------------------------------------------------------------


class RankingForm(FieldsetForm):
    """`rank_<id>` (1..K, equal numbers tie, blank = unranked) and `flag_<id>` (ticked flags), one of each per
    completion shown; `step_<id>_<n>` (1, 0 or -1) per step when the project labels steps."""

    PREFIXES = ("rank_", "flag_", "step_")
    # The task's hidden fields ("": the message stands alone) and what the page calls the others.
    LABELS: ClassVar[Mapping[str, str]] = {
        "assignment_id": "", "prompt_id": "", "rubric_version": "", "submission_id": "", "seconds_spent": "",
        "tiers": "Ranking", "flags": "Flags", "skip_reason": "Skip because", "step_labels": "Step labels"}

    def label(self, field: str) -> str | None:
        if field.startswith("rank_"):
            return "Rank"
        if field.startswith("flag_"):
            return "Flags"
        if field.startswith("step_"):
            return "Step labels"
        return super().label(field)

    assignment_id: str = ""
    action: str = ""
    rubric_version: str = ""
    submission_id: str = ""
    skip_reason: str = ""
    seconds_spent: str = ""

    def assignment(self) -> int:
        try:
            return int(self.assignment_id)
        except ValueError:
            raise Invalid("missing task", field="assignment_id") from None

    def ranks(self, completion_ids: list[int]) -> dict[int, str]:
        return {cid: (self.item(f"rank_{cid}") or [""])[0] for cid in completion_ids}

    def flags(self, completion_ids: list[int]) -> dict[str, list[str]]:
        return {str(cid): names for cid in completion_ids if (names := self.item(f"flag_{cid}"))}

    def tiers(self, completion_ids: list[int]) -> list[list[int]]:
        by_rank: dict[int, list[int]] = {}
        for cid, raw in self.ranks(completion_ids).items():
            raw = raw.strip()
            if not raw:
                continue
            if not raw.isdigit() or not 1 <= int(raw) <= len(completion_ids):
                raise Invalid(f"rank must be a number from 1 to {len(completion_ids)}", field=f"rank_{cid}")
            by_rank.setdefault(int(raw), []).append(cid)
        return [by_rank[r] for r in sorted(by_rank)]

    def step_labels(self, completion_ids: list[int]) -> dict[str, list[int]]:
        """Each completion's step labels from step 1 on, ending at the first -1 (later ones are not sent); a step
        left blank before a labelled one is refused naming it."""
        out: dict[str, list[int]] = {}
        for cid in completion_ids:
            marked: dict[int, int] = {}
            for name in self.items:
                head, _, index = name.rpartition("_")
                if head == f"step_{cid}" and index.isdigit():
                    raw = (self.item(name) or [""])[0].strip()
                    if raw not in ("1", "0", "-1"):
                        raise Invalid("a step label is 1, 0 or -1", field=name)
                    marked[int(index)] = int(raw)
            labels: list[int] = []
            for i in range(max(marked, default=-1) + 1):
                if i not in marked:
                    raise Invalid(f"step {i + 1} has no label: label every step up to the first wrong one",
                                  field=f"step_{cid}_{i}")
                labels.append(marked[i])
                if marked[i] == -1:
                    break
            if labels:
                out[str(cid)] = labels
        return out

    def seconds(self) -> float | None:
        """The page's own timer; blank, unreadable or negative leaves the server's clock to decide."""
        try:
            seconds = float(self.seconds_spent)
        except ValueError:
            return None
        return seconds if math.isfinite(seconds) and seconds >= 0 else None

    def ranking(self, assignment_id: int, completion_ids: list[int]) -> RankingIn:
        skipped = self.action == "skip"
        return RankingIn.from_form(
            assignment_id=assignment_id, tiers=[] if skipped else self.tiers(completion_ids),
            rubric_version=int(self.rubric_version) if self.rubric_version.isdigit() else 0,
            submission_id=self.submission_id[:64], flags=self.flags(completion_ids), skipped=skipped,
            skip_reason=self.skip_reason or "" if skipped else None, seconds_spent=self.seconds(),
            step_labels={} if skipped else self.step_labels(completion_ids))


# --- exports and training -------------------------------------------------------------------------------------


class ExportForm(ApiForm):
    LABELS: ClassVar[Mapping[str, str]] = {
        "kind": "Kind", "format": "Format", "aggregation": "Aggregation (pairs)",
        "conflicts": "Conflicts (aggregated)", "neutral": "Neutral steps (steps)",
        "every_step": "Every labelled step (steps)", "filters.source": "Sources",
        "filters.split": "Split",
        "filters.rubric_versions": "Rubric versions", "filters.min_agreement": "Minimum agreement (pairs)",
        "filters.flagged": "Flagged items", "filters": "Filters", "layout": "Layout"}

    kind: str = "pairs"
    format: str = "jsonl"
    aggregation: str = "raw"
    conflicts: str = "keep"
    layout: str = ""
    """Empty: the project's own (conversational when it holds chat prompts)."""
    neutral: str = "positive"
    every_step: bool = False
    source: list[str] = Field(default_factory=list)
    split: str = ""
    rubric_versions: str = Field("", max_length=200)
    min_agreement: str = Field("", max_length=20)
    flagged: str = "include"

    def filters(self) -> dict[str, Any]:
        """Only the filters the chosen kind understands (the page shows them all)."""
        filters: dict[str, Any] = {"split": self.split}
        if self.kind != "prompts":
            filters |= {"source": self.source, "rubric_versions": self.rubric_versions, "flagged": self.flagged}
        if self.kind == "pairs":
            filters["min_agreement"] = self.min_agreement
        return filters

    def to_api(self) -> ExportIn:
        return ExportIn.from_form(kind=self.kind, format=self.format, filters=self.filters(),
                        aggregation=self.aggregation if self.kind == "pairs" else "raw",
                        conflicts=self.conflicts, layout=self.layout or None,
                        neutral=self.neutral if self.kind == "steps" else "positive",
                        every_step=self.every_step and self.kind == "steps")


class TrainingForm(ApiForm):
    LABELS: ClassVar[Mapping[str, str]] = {"kind": "Kind", "export_id": "Export", "reward_run_id": "Reward model run",
                                           "base_model": "Base model directory", "config": "Config (TOML)",
                                           "where": "Where", "resources": "Resources (TOML)"}

    kind: str = "reward"
    export_id: str = ""
    base_model: str = Field("", max_length=1000)
    reward_run_id: str = ""
    config: str = Field("", max_length=20_000)
    where: str = Field("local", max_length=100)
    resources: str = Field("", max_length=2_000)
    action: str = Field("", max_length=20)
    """"estimate": the button that prices the form without starting a run (pages without scripts)."""

    def label(self, field: str) -> str | None:
        # A key of the TOML the user typed: name it, since the label alone does not say which line is wrong.
        for box in ("config", "resources"):
            if field.startswith(f"{box}."):
                return f"{self.LABELS[box]}, {field.removeprefix(box + '.')}"
        return super().label(field)

    def to_api(self) -> TrainingRunIn:
        try:
            config = tomllib.loads(self.config) if self.config.strip() else {}
        except tomllib.TOMLDecodeError as exc:
            raise Invalid(f"not valid TOML: {exc}", field="config") from None
        try:
            resources = tomllib.loads(self.resources) if self.resources.strip() else None
        except tomllib.TOMLDecodeError as exc:
            raise Invalid(f"not valid TOML: {exc}", field="resources") from None
        if not self.export_id.isdigit():
            raise Invalid("choose an export", field="export_id")
        return TrainingRunIn.from_form(kind=self.kind, export_id=int(self.export_id),
                                       base_model=self.base_model or None,
                                       reward_run_id=int(self.reward_run_id) if self.reward_run_id.isdigit() else None,
                                       config=config, where=self.where or None, resources=resources)


class IterateForm(ApiForm):
    LABELS: ClassVar[Mapping[str, str]] = {"replay_share": "Replay share of earlier pairs",
                                           "max_prompts": "Prompts to answer", "where": "Where"}

    replay_share: float = Field(0.1, ge=0, le=1)
    max_prompts: str = Field("", max_length=12)
    """Blank: every prompt."""
    where: str = Field("", max_length=40)
    """Blank: where the runs it continues went."""

    def to_api(self) -> IterateIn:
        return IterateIn.from_form(replay_share=self.replay_share, max_prompts=self.max_prompts.strip() or None,
                                   where=self.where.strip() or None)


class SampleIntoProjectForm(ApiForm):
    LABELS: ClassVar[Mapping[str, str]] = {"max_prompts": "Prompts to answer"}

    max_prompts: str = Field("", max_length=12)
    """Blank: every prompt."""

    def to_api(self) -> SampleIntoProjectIn:
        return SampleIntoProjectIn.from_form(max_prompts=self.max_prompts.strip() or None)
