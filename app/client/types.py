"""The answers of the preflab API as dataclasses, one per response schema of `/openapi.json`.

Each class names the schema it mirrors in `SCHEMA`; tests/app/test_client.py checks every field against the app's
own OpenAPI document, so a field renamed on the server fails there. Within /api/v1 the server only adds fields:
unknown fields in an answer are ignored, so an older client keeps working against a newer server.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from datetime import datetime
from typing import Any, ClassVar, TypeVar, Union

T = TypeVar("T")


def _convert(hint: Any, value: Any) -> Any:
    """`value` from JSON as the annotation `hint` has it: datetimes parsed, nested answers built."""
    if value is None:
        return None
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        for arg in typing.get_args(hint):
            if arg is not type(None):
                return _convert(arg, value)
    if origin is list:
        (item,) = typing.get_args(hint)
        return [_convert(item, v) for v in value]
    if hint is datetime:
        return datetime.fromisoformat(value)
    if dataclasses.is_dataclass(hint):
        return from_json(hint, value)  # type: ignore[arg-type]
    return value


def from_json(cls: type[T], data: dict[str, Any]) -> T:
    """An answer class built from a JSON object; fields the class does not know are left out (additive API)."""
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls) if f.init and not f.name.startswith("_")}  # type: ignore[arg-type]
    return cls(**{name: _convert(hints[name], data[name]) for name in known if name in data})


def api_fields(cls: type) -> dict[str, Any]:
    """The fields of an answer class that come from the API, by their name in the API, with their annotations."""
    hints = typing.get_type_hints(cls)
    return {f.metadata.get("api", f.name): hints[f.name] for f in dataclasses.fields(cls) if not f.name.startswith("_")}


@dataclasses.dataclass
class Project:
    SCHEMA: ClassVar[str] = "ProjectOut"
    id: int
    name: str
    description: str
    completions_per_prompt: int
    overlap: int
    rubric_version: int | None
    created_at: datetime
    step_labels: bool = False
    step_separator: str | None = None


@dataclasses.dataclass
class Rubric:
    SCHEMA: ClassVar[str] = "RubricOut"
    version: int
    text: str
    criteria: list[str]
    note: str
    author: str | None
    created_at: datetime
    current: bool


@dataclasses.dataclass
class Member:
    SCHEMA: ClassVar[str] = "MemberOut"
    user_id: int
    email: str
    name: str
    role: str


@dataclasses.dataclass
class ImportResult:
    SCHEMA: ClassVar[str] = "ImportOut"
    prompts: int
    completions: int
    pairs: int
    skipped_duplicates: list[int] = dataclasses.field(default_factory=list)
    rankings: int = 0
    annotators: int = 0
    preset: str = "preflab"
    extra_columns: list[str] = dataclasses.field(default_factory=list)
    step_labels: int = 0
    note: str | None = None


@dataclasses.dataclass
class TaskPrompt:
    SCHEMA: ClassVar[str] = "PromptView"
    id: int
    text: str | None = None
    messages: list[dict[str, str]] | None = None


@dataclasses.dataclass
class TaskCompletion:
    SCHEMA: ClassVar[str] = "CompletionView"
    id: int
    text: str
    messages: list[dict[str, str]] | None = None
    steps: list[str] | None = None


@dataclasses.dataclass
class TaskRubric:
    SCHEMA: ClassVar[str] = "RubricView"
    version: int
    text: str
    criteria: list[str]


@dataclasses.dataclass
class RankingResult:
    SCHEMA: ClassVar[str] = "RankingOut"
    ranking_id: int
    pairs_created: int
    created: bool
    """False when this submission_id was already recorded: the answer is the first submit's."""


@dataclasses.dataclass
class Job:
    SCHEMA: ClassVar[str] = "JobOut"
    id: int
    kind: str
    state: str
    attempts: int
    project_id: int | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    progress: dict[str, int] = dataclasses.field(default_factory=dict)
    message: str | None = None
    error: str | None = None
    result: dict[str, Any] | None = None
