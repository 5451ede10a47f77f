"""Shared building blocks of the TrainJob API models.

:class:`ApiModel` (camelCase aliases, unknown fields rejected), the annotated field types
(:data:`Entrypoint`, :data:`Quantity`, :data:`ResourceMap`, :data:`FreeForm`) and
:func:`api_error`, the validation error with a hint and a sub-field path that
:func:`trainjob_operator.api.errors.field_errors` turns into a :class:`FieldError`.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, PlainValidator, WithJsonSchema
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from trainjob_operator.api.quantity import QUANTITY_PATTERN, QUANTITY_RE

__all__ = [
    "ENTRYPOINT_PATTERN",
    "IMAGE_PATTERN",
    "ApiModel",
    "Entrypoint",
    "FreeForm",
    "ImageReference",
    "Quantity",
    "ResourceMap",
    "ResourceName",
    "api_error",
    "no_default",
    "split_entrypoint",
]


_DOTTED = r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*"
ENTRYPOINT_PATTERN = rf"^{_DOTTED}:{_DOTTED}$"
"""``package.module:function`` (the attribute part may be dotted: ``pkg.mod:Class.method``)."""
_RESOURCE_NAME_PATTERN = (
    r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)

_ENTRYPOINT_RE = re.compile(ENTRYPOINT_PATTERN)
_RESOURCE_NAME_RE = re.compile(_RESOURCE_NAME_PATTERN)


def api_error(
    message: str, hint: str | None = None, field: str | None = None
) -> PydanticCustomError:
    """A validation error with a clean message, an optional hint and an optional sub-field.

    ``field`` (a camelCase name relative to the model being validated) is appended to the error
    location by :func:`~trainjob_operator.api.errors.field_errors`, so model-level checks can
    point at the offending field.
    """
    ctx: dict[str, Any] = {"message": message}
    if hint:
        ctx["hint"] = hint
    if field:
        ctx["field"] = field
    return PydanticCustomError("trainjob", "{message}", ctx)


def split_entrypoint(entrypoint: str) -> tuple[str, str]:
    """Split ``package.module:function`` into ``("package.module", "function")``.

    Raises:
        ValueError: if ``entrypoint`` does not have that form.
    """
    if not _ENTRYPOINT_RE.match(entrypoint):
        raise ValueError(f"entrypoint must look like 'package.module:function', got {entrypoint!r}")
    module, _, attr = entrypoint.partition(":")
    return module, attr


def _check_entrypoint(value: str) -> str:
    if _ENTRYPOINT_RE.match(value):
        return value
    hint = "the module must be importable in the image; the function takes (config)"
    module, sep, attr = value.partition(":")
    if sep and ("/" in module or module.endswith(".py")):
        dotted = module.removesuffix(".py").strip("./").replace("/", ".")
        hint = f"write a module path, not a file path: '{dotted}:{attr}'"
    elif not sep and "." in value:
        mod, _, func = value.rpartition(".")
        hint = f"separate the function with a colon: '{mod}:{func}'"
    raise api_error(
        f"must look like 'package.module:function', got {value!r}",
        hint=hint,
    )


Entrypoint = Annotated[
    str,
    AfterValidator(_check_entrypoint),
    WithJsonSchema({"type": "string", "pattern": ENTRYPOINT_PATTERN}),
]
"""A ``package.module:function`` reference."""

_QUANTITY_HINT = "use a Kubernetes quantity such as 2, '500m', '4Gi' or '1.5G'"


def _check_quantity(value: object) -> int | str:
    if isinstance(value, bool):
        raise api_error(f"{value!r} is not a resource quantity", hint=_QUANTITY_HINT)
    if isinstance(value, int):
        if value < 0:
            raise api_error(f"quantity must not be negative, got {value}")
        return value
    if isinstance(value, float):
        raise api_error(
            f"fractional numbers must be quoted strings, got {value!r}",
            hint=f"write '{value:g}' or use milli-units such as '{round(value * 1000)}m'",
        )
    if isinstance(value, str):
        if QUANTITY_RE.match(value):
            return value
        if value.startswith("-"):
            raise api_error(f"quantity must not be negative, got {value!r}")
        match = re.fullmatch(r"([0-9.]+)\s*([KMGTPE])i?B", value, flags=re.IGNORECASE)
        hint = _QUANTITY_HINT
        if match:
            hint = f"write '{match.group(1)}{match.group(2).upper()}i' (binary) or "
            hint += f"'{match.group(1)}{match.group(2).upper()}' (decimal)"
        raise api_error(f"{value!r} is not a Kubernetes resource quantity", hint=hint)
    raise api_error(
        f"expected a resource quantity, got {type(value).__name__}", hint=_QUANTITY_HINT
    )


Quantity = Annotated[
    int | str,
    PlainValidator(_check_quantity),
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": QUANTITY_PATTERN,
            "x-kubernetes-int-or-string": True,
        }
    ),
]
"""A Kubernetes resource quantity: a non-negative integer or a string like ``"500m"``."""


_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN = (
    r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
    r"(?:\.(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]))*(?::[0-9]+)?"
)
IMAGE_PATTERN = (
    rf"^(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9A-Fa-f]{32,})?$"
)
"""A container image reference (the grammar of ``docker pull``: ``[host[:port]/]path[:tag]
[@digest]``, lowercase path)."""
_IMAGE_RE = re.compile(IMAGE_PATTERN)


def _check_image(value: str) -> str:
    if _IMAGE_RE.match(value) and len(value) <= 4096:
        return value
    hint = (
        "use a reference such as 'registry.example.com/team/train:1.0' or 'repo/image@sha256:...'"
    )
    if value != value.strip():
        hint = "remove the spaces around the image name"
    elif any(c.isupper() for c in value.split("@")[0].split(":")[0].split("/")[-1]):
        hint = "image repository names are lowercase"
    raise api_error(f"{value!r} is not a valid container image reference", hint=hint)


ImageReference = Annotated[str, AfterValidator(_check_image)]
"""A container image reference, checked as ``docker pull`` would parse it (by the admission
webhook and ``trainjob validate``; the CRD schema says only ``type: string``)."""


def _check_resource_name(value: str) -> str:
    if _RESOURCE_NAME_RE.match(value):
        return value
    raise api_error(
        f"{value!r} is not a valid resource name",
        hint="use names such as cpu, memory, nvidia.com/gpu or google.com/tpu",
    )


ResourceName = Annotated[str, AfterValidator(_check_resource_name)]
ResourceMap = dict[ResourceName, Quantity]
"""Resource name -> quantity, e.g. ``{cpu: "4", memory: 16Gi}``."""

FreeForm = Annotated[
    dict[str, Any],
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]
"""An arbitrary mapping, kept as is (``x-kubernetes-preserve-unknown-fields``)."""


def no_default(schema: dict[str, Any]) -> None:
    """``json_schema_extra`` hook: keep a Python default out of the CRD (no server defaulting)."""
    schema.pop("default", None)


class ApiModel(BaseModel):
    """Base of all TrainJob API models: camelCase aliases, unknown fields rejected."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        serialize_by_alias=True,
        extra="forbid",
    )

    def to_dict(self) -> dict[str, Any]:
        """JSON-compatible camelCase dict without ``None`` fields (for YAML, patches, the API)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)
