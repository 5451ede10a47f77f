"""Manifest problems as camelCase field paths with messages and hints.

:func:`field_errors` turns a pydantic ``ValidationError`` into :class:`FieldError` tuples with
paths such as ``spec.scaling.tpu.topology``; :class:`ManifestError` carries them.
"""

from __future__ import annotations

import difflib
import json
import re
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, NamedTuple, Union

from pydantic import BaseModel, ValidationError

from trainjob_operator.api.tpu import ACCELERATOR_ALIASES
from trainjob_operator.api.trainjob import TrainJob
from trainjob_operator.constants import API_VERSION

__all__ = ["FieldError", "ManifestError", "field_errors", "yaml_type"]


class FieldError(NamedTuple):
    """One problem in a manifest: a camelCase field path, a message and an optional hint.

    For YAML syntax errors ``path`` is ``"line L, column C"``; for document-level problems it is
    empty.
    """

    path: str
    message: str
    hint: str | None = None

    def format(self) -> str:
        """``path: message (hint: ...)``."""
        text = f"{self.path}: {self.message}" if self.path else self.message
        return f"{text} (hint: {self.hint})" if self.hint else text


def _unwrap(tp: Any) -> Any:
    """Strip ``Annotated`` and ``Optional`` from a type annotation."""
    while True:
        origin = typing.get_origin(tp)
        if origin is Annotated:
            tp = typing.get_args(tp)[0]
        elif origin in (Union, types.UnionType):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            if len(args) != 1:
                return tp
            tp = args[0]
        else:
            return tp


def _as_model(tp: Any) -> type[BaseModel] | None:
    tp = _unwrap(tp)
    return tp if isinstance(tp, type) and issubclass(tp, BaseModel) else None


def _find_field(model: type[BaseModel], key: str) -> tuple[str, Any] | None:
    for name, info in model.model_fields.items():
        if key in (name, info.alias):
            return info.alias or name, info.annotation
    return None


_PLAIN_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


def _walk_loc(model: type[BaseModel] | None, loc: Iterable[int | str]) -> tuple[str, Any]:
    """Render a pydantic ``loc`` with camelCase names; return it and the type found there."""
    path = ""
    tp: Any = model
    for item in loc:
        if isinstance(item, int):
            path += f"[{item}]"
            args = typing.get_args(_unwrap(tp))
            tp = args[0] if args else None
            continue
        cls = _as_model(tp)
        found = _find_field(cls, item) if cls is not None else None
        if found is not None:
            name, tp = found
            path += f".{name}" if path else name
            continue
        key = item if _PLAIN_KEY_RE.match(item) else f'["{item}"]'
        path += f".{key}" if path and not key.startswith("[") else key
        args = typing.get_args(_unwrap(tp))
        origin = typing.get_origin(_unwrap(tp))
        tp = args[1] if origin is dict and len(args) == 2 else None
    return path, tp


def _field_names(model: type[BaseModel]) -> list[str]:
    return [info.alias or name for name, info in model.model_fields.items()]


def _hint_for(err: Mapping[str, Any], parent: type[BaseModel] | None, key: str) -> str | None:
    kind = err["type"]
    value = err.get("input")
    if kind == "extra_forbidden" and parent is not None:
        camel = _camel_case_of(parent, key)
        if camel is not None:
            return (
                f"did you mean {camel!r}? manifests use camelCase field names; the API server "
                "silently drops snake_case ones"
            )
        names = _field_names(parent)
        close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
        listed = "valid fields: " + ", ".join(names)
        return f"did you mean {close[0]!r}? {listed}" if close else listed
    if kind == "string_type" and isinstance(value, int | float | bool):
        return f"quote the value in YAML: '{value}'"
    if kind == "literal_error" and isinstance(value, str) and value in ACCELERATOR_ALIASES:
        return f"write {ACCELERATOR_ALIASES[value]!r}"
    if kind == "literal_error" and key == "apiVersion":
        return f"use apiVersion: {API_VERSION}"
    if kind in ("bool_parsing", "bool_type"):
        return "use true or false"
    if kind == "int_type" and isinstance(value, str) and value.strip().lstrip("+-").isdigit():
        return f"write the number without quotes: {value.strip()}"
    if kind in ("int_type", "int_from_float") and isinstance(value, float) and value.is_integer():
        return f"write a whole number without a decimal point: {int(value)}"
    if kind == "int_type" and isinstance(value, bool):
        return "use a whole number such as 2"
    return None


def _camel_case_of(model: type[BaseModel], key: str) -> str | None:
    """The camelCase name of the field whose Python (snake_case) name is ``key``, if any."""
    info = model.model_fields.get(key)
    if info is not None and info.alias and info.alias != key:
        return info.alias
    return None


def _message_for(err: Mapping[str, Any], key: str) -> str:
    kind = err["type"]
    if kind == "extra_forbidden":
        return f"unknown field {key!r}"
    if kind == "missing":
        return "required field is missing"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return f"expected a mapping, got {yaml_type(err.get('input'))}"
    if kind == "list_type":
        return f"expected a list, got {yaml_type(err.get('input'))}"
    if kind == "int_type":
        return f"expected an integer, got {yaml_type(err.get('input'))} ({_shown(err)})"
    if kind == "bool_type":
        return f"expected a boolean, got {yaml_type(err.get('input'))} ({_shown(err)})"
    msg = str(err["msg"])
    for prefix in ("Value error, ", "Assertion failed, "):
        msg = msg.removeprefix(prefix)
    return msg


def _shown(err: Mapping[str, Any]) -> str:
    """The offending value as JSON (``true``, ``"2"``, ``2.0``), shortened."""
    try:
        text = json.dumps(err.get("input"))
    except (TypeError, ValueError):
        text = repr(err.get("input"))
    return text if len(text) <= 40 else text[:37] + "..."


def yaml_type(value: object) -> str:
    """How a manifest reader names ``value``'s type in an error ("a string", "a mapping"...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, Mapping):
        return "a mapping"
    return type(value).__name__


def field_errors(
    exc: ValidationError, model: type[BaseModel] | None = None, prefix: str = ""
) -> list[FieldError]:
    """Turn a pydantic ``ValidationError`` into :class:`FieldError` tuples.

    Paths use the camelCase (YAML) names, e.g. ``spec.scaling.tpu.topology`` or
    ``spec.env[0].name``; model-level checks point at the field they are about.

    Args:
        exc: the error raised by ``model.model_validate``.
        model: the model that was validated (default :class:`TrainJob`); needed to map Python
            names to camelCase and to list the valid fields of unknown-field errors.
        prefix: prepended to every path (e.g. ``"spec"`` when validating a spec alone).
    """
    root = model or TrainJob
    out: list[FieldError] = []
    for err in exc.errors():
        loc = list(err["loc"])
        ctx = err.get("ctx") or {}
        _, parent_tp = _walk_loc(root, loc[:-1])
        key = str(loc[-1]) if loc else ""
        if err["type"] == "extra_forbidden" and loc:
            # Name the unknown key as written (``num_workers``), not the field it resembles.
            path, _ = _walk_loc(root, loc[:-1])
            shown = key if _PLAIN_KEY_RE.match(key) else f'["{key}"]'
            path += f".{shown}" if path and not shown.startswith("[") else shown
        else:
            path, _ = _walk_loc(root, loc)
        sub = ctx.get("field") if err["type"] == "trainjob" else None
        if sub:
            sep = "" if str(sub).startswith("[") or not path else "."
            path = f"{path}{sep}{sub}"
        if prefix:
            path = f"{prefix}.{path}" if path else prefix
        message = _message_for(err, key)
        hint = ctx.get("hint") if err["type"] == "trainjob" else None
        hint = hint or _hint_for(err, _as_model(parent_tp), key)
        out.append(FieldError(path, message, hint))
    return out


class ManifestError(ValueError):
    """A manifest could not be loaded; ``errors`` holds one :class:`FieldError` per problem."""

    def __init__(self, errors: list[FieldError], source: str = "") -> None:
        self.errors = errors
        self.source = source
        lines = [e.format() for e in errors]
        head = f"{source}: " if source else ""
        super().__init__(head + "; ".join(lines))
