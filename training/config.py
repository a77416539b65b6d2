"""Loading dataclass configs from TOML files and `--set key=value` overrides, with errors that name the field."""

from __future__ import annotations

import dataclasses
import json
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def field_docs(cls: type) -> dict[str, str]:
    """The docstring written under each dataclass field (the house style), for `--help` texts."""
    import ast
    import inspect

    try:
        tree = ast.parse(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    docs: dict[str, str] = {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    for node, nxt in zip(body, body[1:], strict=False):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def _coerce(name: str, raw: Any, annotation: Any) -> Any:
    """Turn a TOML value or a `--set` string into the field's declared type, or raise naming the field."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        if raw is None or (isinstance(raw, str) and raw.lower() in {"none", "null"}):
            if type(None) in args:
                return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(name, raw, arg)
            except ValueError as exc:
                errors.append(str(exc))
        raise ValueError(errors[0] if errors else f"{name}: cannot parse {raw!r}")
    if annotation is bool:
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.lower() in {"true", "1", "yes", "on"}:
            return True
        if isinstance(raw, str) and raw.lower() in {"false", "0", "no", "off"}:
            return False
        raise ValueError(f"{name}: expected true or false, got {raw!r}")
    if annotation in (int, float):
        try:
            if annotation is int and isinstance(raw, float) and not raw.is_integer():
                raise ValueError
            return annotation(raw) if not isinstance(raw, str) else annotation(raw.strip())
        except (TypeError, ValueError):
            raise ValueError(f"{name}: expected {annotation.__name__}, got {raw!r}") from None
    if annotation is str:
        if not isinstance(raw, str | int | float):
            raise ValueError(f"{name}: expected a string, got {raw!r}")
        return str(raw)
    if origin in (list, tuple):
        if isinstance(raw, str):
            try:
                raw = json.loads(raw)
            except json.JSONDecodeError:
                raw = [part.strip() for part in raw.split(",") if part.strip()]
        if not isinstance(raw, list | tuple):
            raise ValueError(f"{name}: expected a list, got {raw!r}")
        inner = args[0] if args else Any
        items = [_coerce(name, item, inner) if inner is not Any else item for item in raw]
        return items if origin is list else tuple(items)
    if origin is dict:
        if isinstance(raw, str):
            try:
                raw = json.loads(raw)
            except json.JSONDecodeError:
                raise ValueError(f"{name}: expected a JSON object, got {raw!r}") from None
        if not isinstance(raw, dict):
            raise ValueError(f"{name}: expected a table, got {raw!r}")
        return dict(raw)
    if typing.get_origin(annotation) is typing.Literal:
        if raw not in args:
            raise ValueError(f"{name}: expected one of {', '.join(map(repr, args))}, got {raw!r}")
        return raw
    return raw


def parse_sets(pairs: list[str]) -> dict[str, str]:
    """`["lr=1e-5", "beta=0"]` → `{"lr": "1e-5", "beta": "0"}`; a malformed item raises naming it."""
    out: dict[str, str] = {}
    for item in pairs:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set expects key=value, got {item!r}")
        out[key.strip()] = value
    return out


def build_config(cls: type[T], *sources: dict[str, Any]) -> T:
    """Merge sources left to right into `cls`, coercing types; unknown keys raise with the known ones listed."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    values: dict[str, Any] = {}
    for source in sources:
        for key, raw in source.items():
            if raw is None and key not in values:
                continue
            if key not in fields:
                raise ValueError(f"unknown config field {key!r}; known fields: {', '.join(sorted(fields))}")
            values[key] = _coerce(key, raw, hints[key]) if raw is not None else None
    return cls(**values)


def load_config(cls: type[T], path: str | Path | None = None, sets: list[str] | None = None,
                **overrides: Any) -> T:
    """A config from an optional TOML file, then command-line flags (`overrides`), then `--set` items."""
    file_values: dict[str, Any] = {}
    if path is not None:
        try:
            file_values = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"{path}: invalid TOML: {exc}") from None
    return build_config(cls, file_values, {k: v for k, v in overrides.items() if v is not None},
                        parse_sets(sets or []))


def config_to_dict(config: Any) -> dict[str, Any]:
    return dataclasses.asdict(config)
