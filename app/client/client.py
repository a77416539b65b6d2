"""A small typed client for preflab's JSON API (/api/v1), for scripts, notebooks and model annotators.

    from preflab.client import Client

    client = Client("http://127.0.0.1:8000", token="…")          # or PREFLAB_URL / PREFLAB_TOKEN
    project = client.projects.create("Maths", completions_per_prompt=2, rubric="Correct answers first.")
    project.import_records(df)                                    # a DataFrame, a datasets.Dataset or dicts
    task = project.next_task()                                    # None when nothing is left for you
    task.submit([[best.id], [worst.id]])                          # idempotent: a retry reuses its submission_id
    export = project.exports.create("pairs").wait()               # the worker writes it
    pairs = export.to_datasets()                                  # or .to_pandas()
    run = export.train("reward", config={"steps": 20}).wait()     # project.training_runs.create(...) alike
    run.metrics()

It imports only the standard library and httpx (datasets and pandas when asked for them), never the server's code:
it is shipped as `preflab.client` and works against a server of any later v1 release.
"""

from __future__ import annotations

import dataclasses
import email.utils
import hashlib
import io
import json
import math
import os
import random
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar, Self, TypeVar

import httpx

from .types import (
    ImportResult,
    Job,
    Member,
    Project,
    RankingResult,
    Rubric,
    TaskCompletion,
    TaskPrompt,
    TaskRubric,
    from_json,
)

API_PREFIX = "/api/v1"

OPERATIONS: dict[str, tuple[str, str]] = {
    "list_projects": ("GET", "/projects"),
    "create_project": ("POST", "/projects"),
    "get_project": ("GET", "/projects/{project_id}"),
    "list_rubrics": ("GET", "/projects/{project_id}/rubrics"),
    "create_rubric": ("POST", "/projects/{project_id}/rubrics"),
    "get_rubric": ("GET", "/projects/{project_id}/rubrics/{version}"),
    "list_members": ("GET", "/projects/{project_id}/members"),
    "add_member": ("POST", "/projects/{project_id}/members"),
    "import_file": ("POST", "/projects/{project_id}/imports"),
    "next_task": ("GET", "/projects/{project_id}/tasks/next"),
    "submit_ranking": ("POST", "/projects/{project_id}/rankings"),
    "create_export": ("POST", "/projects/{project_id}/exports"),
    "list_exports": ("GET", "/projects/{project_id}/exports"),
    "get_export": ("GET", "/exports/{export_id}"),
    "download_export_file": ("GET", "/exports/{export_id}/files/{name}"),
    "delete_export": ("DELETE", "/exports/{export_id}"),
    "create_training_run": ("POST", "/projects/{project_id}/training-runs"),
    "list_training_runs": ("GET", "/projects/{project_id}/training-runs"),
    "get_training_run": ("GET", "/training-runs/{run_id}"),
    "get_training_metrics": ("GET", "/training-runs/{run_id}/metrics"),
    "cancel_training_run": ("POST", "/training-runs/{run_id}/cancel"),
    "get_job": ("GET", "/jobs/{job_id}"),
}
"""Every call the client makes, under /api/v1: the test checks each against the app's /openapi.json."""

RETRY_STATUSES = frozenset({429, 502, 503, 504})
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})

T = TypeVar("T")


# --- errors --------------------------------------------------------------------------------------


def _refreshed(stale: T, fresh: T) -> T:
    """`stale` with every public field taken from `fresh` (the same object read again), kept as the caller's."""
    for f in dataclasses.fields(stale):  # type: ignore[arg-type]
        if not f.name.startswith("_"):
            setattr(stale, f.name, getattr(fresh, f.name))
    return stale


@dataclasses.dataclass(frozen=True)
class _Lifecycle:
    """How an answer that a background job finishes ends: the field holding its state, the states that end it,
    the one that means success, the client method that reads one by id, and what messages call it."""

    state_field: str
    ended: tuple[str, ...]
    succeeded: str
    read: str
    noun: str


class _Finishes:
    """What a background job on the server finishes (an export, a training run): read again, or wait for its end."""

    LIFECYCLE: ClassVar[_Lifecycle]
    id: int
    job_id: int | None
    _client: Client

    def refresh(self) -> Self:
        """Read it again from the server, in place."""
        return _refreshed(self, getattr(self._client, self.LIFECYCLE.read)(self.id))

    def _wait_to_end(self, timeout: float) -> Self:
        """Refresh in place until it ends; JobFailed, with its job's reason, unless it succeeded."""
        what = f"{self.LIFECYCLE.noun} {self.id}"
        self._client._wait(self.refresh, lambda _: self._state() in self.LIFECYCLE.ended, timeout, what)
        if self._state() != self.LIFECYCLE.succeeded:
            error = self._client.job(self.job_id).error if self.job_id else None
            raise JobFailed(what, self._state(), error)
        return self

    def _state(self) -> str:
        return str(getattr(self, self.LIFECYCLE.state_field))

@dataclasses.dataclass(frozen=True)
class ErrorDetail:
    """One entry of the server's error body `{"detail": [{"field", "message", "line"?}]}`."""

    message: str
    field: str | None = None
    line: int | None = None

    def __str__(self) -> str:
        where = ".".join(p for p in (f"line {self.line}" if self.line else None, self.field) if p)
        return f"{where}: {self.message}" if where else self.message


class PreflabError(Exception):
    """Base of every error this client raises."""


class ApiError(PreflabError):
    """The server answered with an error status; `details` are its field-by-field reasons."""

    def __init__(self, status_code: int, method: str, url: str, details: list[ErrorDetail],
                 request_id: str | None = None) -> None:
        self.status_code, self.method, self.url = status_code, method, url
        self.details, self.request_id = details, request_id
        reasons = "; ".join(str(d) for d in details) or "no detail"
        suffix = f" (request id {request_id})" if request_id else ""
        super().__init__(f"{status_code} {method} {url}: {reasons}{suffix}")

    @property
    def fields(self) -> list[str]:
        """The fields the server named, e.g. ["overlap"] or ["file"]."""
        return [d.field for d in self.details if d.field]


class AuthenticationError(ApiError):
    """401: no token, or one the server does not know."""


class PermissionDenied(ApiError):
    """403: the caller's role in the project does not allow this."""


class NotFound(ApiError):
    """404: no such object, or one the caller may not see."""


class Conflict(ApiError):
    """409: e.g. a rubric edit on a stale base version."""


class ValidationFailed(ApiError):
    """422: bad input; `details` name the field (and the line, for a file) and nothing was written."""


class RateLimited(ApiError):
    """429 after every retry."""


class ServerError(ApiError):
    """5xx after every retry."""


class JobFailed(PreflabError):
    """An export or training run ended failed or cancelled; `error` is the job's reason."""

    def __init__(self, what: str, state: str, error: str | None) -> None:
        self.state, self.error = state, error
        super().__init__(f"{what} {state}" + (f": {error}" if error else ""))


class IntegrityError(PreflabError):
    """A downloaded file's sha256 is not the one the server listed."""


_BY_STATUS: dict[int, type[ApiError]] = {401: AuthenticationError, 403: PermissionDenied, 404: NotFound,
                                         409: Conflict, 422: ValidationFailed, 429: RateLimited}


def _error_from(response: httpx.Response) -> ApiError:
    try:
        body = response.json()
    except ValueError:
        body = None
    raw = body.get("detail") if isinstance(body, dict) else None
    if isinstance(raw, str):
        raw = [{"message": raw}]
    details = [ErrorDetail(message=str(d.get("message", d)), field=d.get("field"), line=d.get("line"))
               for d in raw or [] if isinstance(d, dict)]
    if not details and response.text and body is None:
        details = [ErrorDetail(message=response.text[:300])]
    request_id = response.headers.get("X-Request-ID") or (body.get("request_id") if isinstance(body, dict) else None)
    cls = _BY_STATUS.get(response.status_code, ServerError if response.status_code >= 500 else ApiError)
    return cls(response.status_code, response.request.method, str(response.request.url), details, request_id)


# --- retries -------------------------------------------------------------------------------------


@dataclasses.dataclass
class Retry:
    """How idempotent calls are retried: on connection errors and 429/502/503/504, `attempts` times at most."""

    attempts: int = 5
    """Tries in all, the first included."""
    backoff: float = 0.5
    """The first wait in seconds; it doubles each try, with up to 25% jitter."""
    max_wait: float = 30.0
    """No wait is longer than this, whatever Retry-After says."""

    def wait(self, attempt: int, response: httpx.Response | None) -> float:
        """Seconds before try `attempt + 1`: the server's Retry-After when it gave one, else the backoff."""
        after = _retry_after(response.headers.get("Retry-After")) if response is not None else None
        if after is None:
            after = self.backoff * 2 ** (attempt - 1) * (1 + random.random() / 4)  # nosec B311 - jitter, not a secret
        return min(max(after, 0.0), self.max_wait)


def _retry_after(value: str | None) -> float | None:
    """Retry-After as seconds: a number of seconds or an HTTP date (RFC 9110)."""
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return (when - datetime.now(UTC)).total_seconds()


# --- serialising records -------------------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    """A row's value as plain JSON: numpy scalars and arrays as Python values, NaN (pandas' missing) as null."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if hasattr(value, "tolist") and not isinstance(value, str | bytes):  # numpy arrays and scalars
        return _jsonable(value.tolist())
    if isinstance(value, datetime):
        return value.isoformat()
    if hasattr(value, "isoformat"):  # pandas Timestamp, date
        return value.isoformat()
    return value


def _rows_of(records: Any) -> Iterable[Mapping[str, Any]]:
    """Rows from a pandas DataFrame, a `datasets.Dataset` or an iterable of dicts, without importing either."""
    kind = type(records).__module__.split(".")[0]
    if kind == "pandas" and hasattr(records, "to_dict"):
        return records.to_dict(orient="records")
    if kind == "datasets":
        if hasattr(records, "keys") and not hasattr(records, "features"):
            raise TypeError(f"a DatasetDict holds several splits ({', '.join(records.keys())}): import one, "
                            "e.g. records['train']")
        return iter(records)
    if isinstance(records, Mapping):
        raise TypeError("records must be rows (an iterable of dicts, a DataFrame or a Dataset), not one dict")
    return records


def to_jsonl(records: Any) -> bytes:
    """Records as JSON Lines, the bytes of an import file."""
    lines = []
    for i, row in enumerate(_rows_of(records), start=1):
        if not isinstance(row, Mapping):
            raise TypeError(f"record {i} is a {type(row).__name__}, not a dict")
        lines.append(json.dumps(_jsonable(row), ensure_ascii=False, allow_nan=False))
    if not lines:
        raise ValueError("no records to import")
    return ("\n".join(lines) + "\n").encode("utf-8")


# --- the client ----------------------------------------------------------------------------------


class Client:
    """preflab's JSON API. `base_url` is the server (…/api/v1 is added); `token` a personal API token
    (`preflab token create EMAIL`). Both default to $PREFLAB_URL and $PREFLAB_TOKEN."""

    def __init__(self, base_url: str | None = None, token: str | None = None, *, timeout: float = 60.0,
                 retry: Retry | None = None, transport: httpx.BaseTransport | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        base = (base_url or os.environ.get("PREFLAB_URL") or "http://127.0.0.1:8000").rstrip("/")
        base = base.removesuffix(API_PREFIX).removesuffix("/api")
        token = token or os.environ.get("PREFLAB_TOKEN")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.retry = retry or Retry()
        self._sleep = sleep
        self._http = httpx.Client(base_url=base + API_PREFIX, headers=headers, timeout=timeout,
                                  transport=transport)
        self.projects = Projects(self)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- one call -------------------------------------------------------------------------------

    def request(self, operation: str, *, params: Mapping[str, Any] | None = None, json: Any = None,
                files: Any = None, idempotent: bool | None = None, **path: Any) -> httpx.Response:
        """Call one of OPERATIONS; raise an ApiError subclass for an error status. Idempotent calls (GET, PUT,
        DELETE, and rankings, which carry a submission_id) are retried on connection errors and 429/502/503/504,
        waiting as the server's Retry-After says or with exponential backoff."""
        method, template = OPERATIONS[operation]
        url = template.format(**{k: urllib.parse.quote(str(v), safe="/") for k, v in path.items()})
        retrying = method in IDEMPOTENT_METHODS if idempotent is None else idempotent
        attempts = self.retry.attempts if retrying else 1
        for attempt in range(1, attempts + 1):
            try:
                response = self._http.request(method, url, params=params, json=json, files=files)
            except httpx.TransportError:
                if attempt == attempts:
                    raise
                self._sleep(self.retry.wait(attempt, None))
                continue
            if response.status_code in RETRY_STATUSES and attempt < attempts:
                self._sleep(self.retry.wait(attempt, response))
                continue
            if response.status_code >= 400:
                raise _error_from(response)
            return response
        raise AssertionError("unreachable")  # the loop returns or raises on its last attempt

    def _json(self, operation: str, **kw: Any) -> Any:
        return self.request(operation, **kw).json()

    # -- handles --------------------------------------------------------------------------------

    def project(self, project_id: int) -> ProjectRef:
        """A project by id, without a request: `client.project(3).import_records(rows)`."""
        return ProjectRef(self, project_id)

    def export(self, export_id: int) -> Export:
        return _export(self, self._json("get_export", export_id=export_id))

    def training_run(self, run_id: int, *, last: int = 50) -> TrainingRun:
        return _run(self, self._json("get_training_run", run_id=run_id, params={"last": last}))

    def job(self, job_id: int) -> Job:
        return from_json(Job, self._json("get_job", job_id=job_id))

    def _wait(self, refresh: Callable[[], Any], done: Callable[[Any], bool], timeout: float, what: str) -> Any:
        """Poll `refresh` until `done` holds, every 0.2 s at first and at most every 2 s, for `timeout` seconds."""
        deadline, every = time.monotonic() + timeout, 0.2
        while True:
            current = refresh()
            if done(current):
                return current
            if time.monotonic() + every > deadline:
                raise TimeoutError(f"{what} was not finished after {timeout:g} s")
            self._sleep(every)
            every = min(every * 1.5, 2.0)


class Projects:
    """`client.projects`: list and create."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def list(self) -> list[Project]:
        return [_project(self._client, p) for p in self._client._json("list_projects")]

    def get(self, project_id: int) -> Project:
        return _project(self._client, self._client._json("get_project", project_id=project_id))

    def create(self, name: str, *, completions_per_prompt: int, rubric: str, criteria: Iterable[str] = (),
               overlap: int = 1, description: str = "") -> Project:
        """A project with its first rubric version (`rubric` is its Markdown text)."""
        body = {"name": name, "completions_per_prompt": completions_per_prompt, "overlap": overlap,
                "description": description, "rubric": {"text": rubric, "criteria": list(criteria)}}
        return _project(self._client, self._client._json("create_project", json=body))


class _ProjectOps:
    """What one can do with a project; `ProjectRef` (an id) and `Project` (its fields) both have it."""

    id: int
    _client: Client

    @property
    def rubrics(self) -> Rubrics:
        return Rubrics(self._client, self.id)

    @property
    def exports(self) -> Exports:
        return Exports(self._client, self.id)

    @property
    def training_runs(self) -> TrainingRuns:
        return TrainingRuns(self._client, self.id)

    def get(self) -> Project:
        return self._client.projects.get(self.id)

    def members(self) -> list[Member]:
        return [from_json(Member, m) for m in self._client._json("list_members", project_id=self.id)]

    def add_member(self, email: str, role: str) -> Member:
        """Add an existing account as "lead", "annotator" or "engineer"."""
        return from_json(Member, self._client._json("add_member", project_id=self.id,
                                                    json={"email": email, "role": role}))

    def import_records(self, records: Any, *, preset: str | None = None, on_duplicate: str = "error",
                       strict: bool = False) -> ImportResult:
        """Import rows (dicts, a pandas DataFrame or a `datasets.Dataset`), sent as one JSONL file: prompts with
        completions, or pairs, in any layout of the import presets. All or nothing; a bad row raises
        ValidationFailed naming its line and field."""
        return self._import("records.jsonl", to_jsonl(records), preset, on_duplicate, strict)

    def import_file(self, path: str | os.PathLike[str], *, preset: str | None = None, on_duplicate: str = "error",
                    strict: bool = False) -> ImportResult:
        """Import a JSONL, CSV or Parquet file (or a Label Studio JSON export)."""
        path = Path(path)
        return self._import(path.name, path.read_bytes(), preset, on_duplicate, strict)

    def _import(self, name: str, data: bytes, preset: str | None, on_duplicate: str, strict: bool) -> ImportResult:
        params: dict[str, Any] = {"on_duplicate": on_duplicate, "strict": "true" if strict else "false"}
        if preset:
            params["preset"] = preset
        answer = self._client._json("import_file", project_id=self.id, params=params,
                                    files={"file": (name, data, "application/octet-stream")})
        return from_json(ImportResult, answer)

    def next_task(self) -> Task | None:
        """Lease the next prompt to rank, or None when nothing is left for this caller."""
        response = self._client.request("next_task", project_id=self.id)
        if response.status_code == 204:
            return None
        return _task(self._client, self.id, response.json())

    def tasks(self) -> Iterator[Task]:
        """Task after task until none is left (submit each before asking for the next)."""
        while (task := self.next_task()) is not None:
            yield task

    def submit_ranking(self, *, tiers: list[list[int]], rubric_version: int, assignment_id: int | None = None,
                       prompt_id: int | None = None, submission_id: str | None = None, **extra: Any) -> RankingResult:
        """Submit a ranking: completion ids, best tier first (ties share a tier). `extra`: flags, skipped,
        skip_reason, seconds_spent, step_labels. Retried safely: the same submission_id is stored once."""
        body = {"tiers": tiers, "rubric_version": rubric_version,
                "submission_id": submission_id or uuid.uuid4().hex, **extra}
        body |= {k: v for k, v in (("assignment_id", assignment_id), ("prompt_id", prompt_id)) if v is not None}
        answer = self._client._json("submit_ranking", project_id=self.id, json=body, idempotent=True)
        return from_json(RankingResult, answer)


class ProjectRef(_ProjectOps):
    """A project known by its id only (`client.project(id)`); `.get()` fetches its fields."""

    def __init__(self, client: Client, project_id: int) -> None:
        self._client, self.id = client, project_id

    def __repr__(self) -> str:
        return f"ProjectRef(id={self.id})"


def _project(client: Client, data: dict[str, Any]) -> Project:
    project = from_json(ProjectWithOps, data)
    project._client = client
    return project


@dataclasses.dataclass
class ProjectWithOps(Project, _ProjectOps):
    """A project's fields (`types.Project`) and what one can do with it."""

    _client: Client = dataclasses.field(default=None, repr=False, compare=False)  # type: ignore[assignment]


class Rubrics:
    """`project.rubrics`: versions of the project's rubric."""

    def __init__(self, client: Client, project_id: int) -> None:
        self._client, self.project_id = client, project_id

    def list(self) -> list[Rubric]:
        """Every version, newest first."""
        return [from_json(Rubric, r) for r in self._client._json("list_rubrics", project_id=self.project_id)]

    def get(self, version: int) -> Rubric:
        return from_json(Rubric, self._client._json("get_rubric", project_id=self.project_id, version=version))

    def current(self) -> Rubric:
        return next(r for r in self.list() if r.current)

    def create(self, text: str, *, criteria: Iterable[str] = (), base_version: int | None = None,
               note: str = "") -> Rubric:
        """A new version. `base_version` is the one edited (default: the current one); a stale base is a Conflict."""
        if base_version is None:
            base_version = self.current().version
        body = {"text": text, "criteria": list(criteria), "base_version": base_version, "note": note}
        return from_json(Rubric, self._client._json("create_rubric", project_id=self.project_id, json=body))


# --- tasks ---------------------------------------------------------------------------------------


@dataclasses.dataclass
class Task:
    """A leased task: the prompt, its completions in this annotator's display order, and the rubric."""

    SCHEMA: ClassVar[str] = "TaskOut"
    assignment_id: int
    prompt: TaskPrompt
    completions: list[TaskCompletion]
    rubric: TaskRubric | None
    lease_expires_at: datetime
    flags: list[str]
    skip_reasons: list[str]
    allow_ties: bool
    allow_partial: bool
    step_labels: bool = False
    _client: Client = dataclasses.field(default=None, repr=False, compare=False)  # type: ignore[assignment]
    _project_id: int = dataclasses.field(default=0, repr=False, compare=False)

    def submit(self, tiers: list[list[int]], *, submission_id: str | None = None, **extra: Any) -> RankingResult:
        """Rank this task: completion ids, best tier first. The submission id defaults to one derived from the
        assignment, so submitting the same task again (a retry after a lost answer) is stored once."""
        return ProjectRef(self._client, self._project_id).submit_ranking(
            tiers=tiers, rubric_version=self.rubric.version if self.rubric else 1, assignment_id=self.assignment_id,
            submission_id=submission_id or f"client-{self.assignment_id}", **extra)

    def rank_by(self, score: Callable[[TaskCompletion], float], **extra: Any) -> RankingResult:
        """Rank by a scoring function (a model annotator): higher first, equal scores tied when ties are allowed."""
        scored = sorted(((score(c), c.id) for c in self.completions), key=lambda s: -s[0])
        tiers: list[list[int]] = []
        last: float | None = None
        for value, cid in scored:
            if tiers and self.allow_ties and value == last:
                tiers[-1].append(cid)
            else:
                tiers.append([cid])
            last = value
        return self.submit(tiers, **extra)


def _task(client: Client, project_id: int, data: dict[str, Any]) -> Task:
    task = from_json(Task, data)
    task._client, task._project_id = client, project_id
    return task


# --- exports -------------------------------------------------------------------------------------


class Exports:
    """`project.exports`: request, list."""

    def __init__(self, client: Client, project_id: int) -> None:
        self._client, self.project_id = client, project_id

    def create(self, kind: str = "pairs", *, format: str = "jsonl", filters: Mapping[str, Any] | None = None,
               **options: Any) -> Export:
        """Request an export (a background job a worker runs): kind pairs, rankings, prompts, sft or steps;
        format jsonl, parquet or hf. `options`: aggregation, conflicts, layout, neutral, every_step. `.wait()` for
        it."""
        body = {"kind": kind, "format": format, "filters": dict(filters or {}), **options}
        accepted = self._client._json("create_export", project_id=self.project_id, json=body)
        return self._client.export(accepted["export_id"])

    def list(self) -> list[Export]:
        return [_export(self._client, e) for e in self._client._json("list_exports", project_id=self.project_id)]


EXPORT_DONE = ("ready", "failed", "cancelled", "deleted")


@dataclasses.dataclass
class Export(_Finishes):
    """An export: its status, counts and file hashes; once ready, its rows as a Dataset or a DataFrame."""

    SCHEMA: ClassVar[str] = "ExportOut"
    LIFECYCLE: ClassVar[_Lifecycle] = _Lifecycle("status", EXPORT_DONE, "ready", read="export", noun="export")
    id: int
    project_id: int
    kind: str
    format: str
    filters: dict[str, Any]
    status: str
    row_count: int
    row_counts: dict[str, int]
    empty: bool
    sha256: str | None
    files: dict[str, str]
    snapshot: str | None
    job_id: int | None
    created_by_id: int | None
    created_at: datetime
    deleted_at: datetime | None
    _client: Client = dataclasses.field(default=None, repr=False, compare=False)  # type: ignore[assignment]

    def wait(self, timeout: float = 600.0) -> Export:
        """Wait until the worker has written it; JobFailed if it failed or was cancelled."""
        return self._wait_to_end(timeout)

    @property
    def data_files(self) -> list[str]:
        """The files holding rows (the dataset card, README.md, left out)."""
        return sorted(n for n in self.files if n != "README.md")

    def download(self, name: str) -> bytes:
        """One file's bytes, checked against the sha256 the server lists."""
        data = self._client.request("download_export_file", export_id=self.id, name=name).content
        expected = self.files.get(name)
        if expected and hashlib.sha256(data).hexdigest() != expected:
            raise IntegrityError(f"export {self.id}: {name} does not match its sha256 {expected}")
        return data

    def download_to(self, directory: str | os.PathLike[str]) -> Path:
        """Every file of the export, the dataset card included, into `directory` (made if missing)."""
        root = Path(directory)
        for name in self.files:
            target = root / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(self.download(name))
        return root

    def to_records(self) -> list[dict[str, Any]]:
        """The rows as dicts (jsonl exports; parquet and hf through `to_datasets().to_list()`)."""
        if self.format != "jsonl":
            return self.to_datasets().to_list()
        rows: list[dict[str, Any]] = []
        for name in self.data_files:
            rows += [json.loads(line) for line in self.download(name).decode("utf-8").splitlines() if line.strip()]
        return rows

    def to_datasets(self) -> Any:
        """The rows as a `datasets.Dataset` (the export's `split` column says train or test)."""
        import datasets

        self._require_ready()
        if self.format == "hf":
            import tempfile

            with tempfile.TemporaryDirectory() as tmp:
                # A save_to_disk directory (`pairs/`, beside the dataset card): the one holding state.json.
                state = next(self.download_to(tmp).rglob("state.json"))
                return datasets.load_from_disk(str(state.parent), keep_in_memory=True)
        if self.format == "parquet":
            return datasets.Dataset(self._parquet_table())
        return datasets.Dataset.from_list(self.to_records())

    def to_pandas(self) -> Any:
        """The rows as a pandas DataFrame."""
        import pandas

        self._require_ready()
        if self.format == "parquet":
            return self._parquet_table().to_pandas()
        if self.format == "hf":
            return self.to_datasets().to_pandas()
        return pandas.DataFrame.from_records(self.to_records())

    def _parquet_table(self) -> Any:
        import pyarrow as pa
        import pyarrow.parquet as pq

        return pa.concat_tables([pq.read_table(io.BytesIO(self.download(n))) for n in self.data_files])

    def _require_ready(self) -> None:
        if self.status != "ready":
            raise PreflabError(f"export {self.id} is {self.status}, not ready: call .wait() first")

    def train(self, kind: str = "reward", **options: Any) -> TrainingRun:
        """Start a training run on this export (see TrainingRuns.create)."""
        return TrainingRuns(self._client, self.project_id).create(kind, export=self, **options)


def _export(client: Client, data: dict[str, Any]) -> Export:
    export = from_json(Export, data)
    export._client = client
    return export


# --- training runs -------------------------------------------------------------------------------


class TrainingRuns:
    """`project.training_runs`: start and list."""

    def __init__(self, client: Client, project_id: int) -> None:
        self._client, self.project_id = client, project_id

    def create(self, kind: str, *, export: Export | int, base_model: str | None = None,
               reward_run_id: int | None = None, config: Mapping[str, Any] | None = None) -> TrainingRun:
        """Train on an export (a background job): kind sft, reward, prm, dpo, rft, grpo or ppo. `config` takes the
        trainer's fields (`python -m training KIND --help`); a bad one is a ValidationFailed naming it."""
        body: dict[str, Any] = {"kind": kind, "export_id": export.id if isinstance(export, Export) else export,
                                "config": dict(config or {})}
        body |= {k: v for k, v in (("base_model", base_model), ("reward_run_id", reward_run_id)) if v is not None}
        accepted = self._client._json("create_training_run", project_id=self.project_id, json=body)
        return self._client.training_run(accepted["run_id"])

    def list(self) -> list[TrainingRun]:
        return [_run(self._client, r) for r in self._client._json("list_training_runs", project_id=self.project_id)]


RUN_DONE = ("succeeded", "failed", "cancelled")


@dataclasses.dataclass
class TrainingRun(_Finishes):
    """A training run: state, recent metrics, eval, lineage; `.wait()` until it ends, `.metrics()` for every row."""

    SCHEMA: ClassVar[str] = "TrainingRunOut"
    LIFECYCLE: ClassVar[_Lifecycle] = _Lifecycle("state", RUN_DONE, "succeeded", read="training_run",
                                                  noun="training run")
    id: int
    kind: str
    state: str
    export_id: int | None
    parent_run_id: int | None
    base_model: str | None
    job_id: int | None
    created_at: datetime
    metrics_tail: list[dict[str, Any]] = dataclasses.field(default_factory=list, metadata={"api": "metrics"})
    config: dict[str, Any] = dataclasses.field(default_factory=dict)
    lineage: dict[str, Any] = dataclasses.field(default_factory=dict)
    eval: dict[str, Any] | None = None
    human_check: dict[str, Any] | None = None
    model_dir: str | None = None
    step_stats: dict[str, Any] | None = None
    """A process-reward run's step reward and advantage per step index (null for other runs)."""
    _client: Client = dataclasses.field(default=None, repr=False, compare=False)  # type: ignore[assignment]

    def wait(self, timeout: float = 3600.0) -> TrainingRun:
        """Wait until the run ends; JobFailed (with the job's reason) unless it succeeded."""
        return self._wait_to_end(timeout)

    def metrics(self) -> list[dict[str, Any]]:
        """Every metrics row the trainer logged (step, loss, accuracy, …), oldest first."""
        return self._client._json("get_training_metrics", run_id=self.id)

    def cancel(self) -> TrainingRun:
        fresh = _run(self._client, self._client._json("cancel_training_run", run_id=self.id))
        self.state = fresh.state
        return self


def _run(client: Client, data: dict[str, Any]) -> TrainingRun:
    # The answer's `metrics` (its last rows) would shadow the method of the same name: it is `metrics_tail` here.
    data = {**data, "metrics_tail": data.get("metrics", [])}
    run = from_json(TrainingRun, data)
    run._client = client
    return run


ANSWER_TYPES: tuple[type, ...] = (Project, Rubric, Member, ImportResult, TaskPrompt, TaskCompletion, TaskRubric,
                                  RankingResult, Job, Task, Export, TrainingRun)
"""Every answer class, each with the OpenAPI schema it mirrors in SCHEMA (checked by tests/app/test_client.py)."""
