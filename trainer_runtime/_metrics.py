"""Checking what ``report()`` is given, so mistakes fail at the call with a clear message."""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from typing import Any

from trainer_runtime.errors import ReportError

_ARRAY_MODULES = ("torch", "jax", "jaxlib", "numpy", "tensorflow", "cupy")


def _array_kind(value: Any) -> str | None:
    module = type(value).__module__.split(".", 1)[0]
    if module in _ARRAY_MODULES and hasattr(value, "shape"):
        return f"{module}.{type(value).__name__}"
    return None


MAX_METRICS_DEPTH = 32
"""Deepest nesting of lists and dicts accepted in ``report()`` metrics; deeper ones are a
:class:`ReportError` at the call (they would exhaust the stack when stored)."""


def _clean(value: Any, where: str, depth: int = 1) -> Any:
    if value is None or isinstance(value, bool | int | str):
        return value
    if depth > MAX_METRICS_DEPTH and isinstance(value, list | tuple | Mapping):
        raise ReportError(
            f"report(): {where[:200]}{'...' if len(where) > 200 else ''} is nested deeper than "
            f"{MAX_METRICS_DEPTH} levels; report flat metrics (numbers, strings, or shallow "
            "lists/dicts of them)"
        )
    if isinstance(value, float):
        return value
    kind = _array_kind(value)
    if kind is not None:
        shape = tuple(getattr(value, "shape", ()))
        if shape == () and type(value).__module__.startswith("numpy"):
            return value.item()  # numpy scalar such as np.float32(0.5)
        hint = ".item()" if shape == () or math.prod(shape) == 1 else ".tolist()"
        raise ReportError(
            f"report(): {where} is a {kind} (shape {shape}); metrics must be plain Python "
            f"values. Convert it with {hint} (this also moves it off the accelerator)"
        )
    if hasattr(value, "item") and type(value).__module__.startswith("numpy"):
        return value.item()
    if isinstance(value, list | tuple):
        return [_clean(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise ReportError(f"report(): {where} has a non-string key {k!r}")
            out[k] = _clean(v, f"{where}[{k!r}]", depth + 1)
        return out
    raise ReportError(
        f"report(): {where} has type {type(value).__name__}, which is not JSON-serialisable; "
        "report numbers, strings, bools, None, or lists/dicts of them"
    )


TENSOR_METRICS_MESSAGE = (
    "Passing objects containing Torch tensors as metrics "
    "is not supported as it will throw an exception on "
    "deserialization. You can either convert the tensors "
    "to Python objects (ex: `.numpy()`, `.item()`, etc.) "
    "or save tensors as part of the checkpoint files instead."
)
"""Ray Train 2.60's error for ``report()`` metrics holding torch tensors (its sentence)."""

TENSOR_RETURN_MESSAGE = (
    "Returning objects containing Torch tensors from the "
    "training function is not supported as it will throw an "
    "exception on deserialization. You can either convert "
    "the tensors to Python objects (ex: `.numpy()`, "
    "`.item()`, etc.) or save tensors as part of the "
    "checkpoint files instead."
)
"""Ray Train 2.60's error for a train function returning torch tensors (its sentence)."""


def contains_tensor(obj: Any, depth: int = 0) -> bool:
    """Whether ``obj`` holds a ``torch.Tensor`` or ``torch.nn.Module``, looking into dicts
    (keys and values), lists and tuples: Ray's rule (``ray.air._internal.torch_utils``),
    checked only once torch is imported."""
    torch = sys.modules.get("torch")
    if torch is None or depth > MAX_METRICS_DEPTH:
        return False
    if isinstance(obj, torch.Tensor | torch.nn.Module):
        return True
    if isinstance(obj, dict):
        return any(
            contains_tensor(k, depth + 1) or contains_tensor(v, depth + 1) for k, v in obj.items()
        )
    if isinstance(obj, list | tuple):
        return any(contains_tensor(v, depth + 1) for v in obj)
    return False


def validate_metrics(metrics: Any) -> dict[str, Any]:
    """Return a plain-Python copy of ``metrics`` or raise :class:`ReportError` naming the key.

    Metrics holding torch tensors or modules are refused with Ray Train's message (its
    rule); plain Python values are kept, tuples as lists (metrics are stored as JSON).
    Metrics that pass cost no tensor check: a tensor or module anywhere in them fails the
    copy (neither is a plain value, nor a string key), and only then are they looked into
    for one, so that Ray's message is the one raised whatever else is wrong with them.
    """
    try:
        return _plain_metrics(metrics)
    except ReportError:
        if contains_tensor(metrics):
            where = ""
            if isinstance(metrics, Mapping):
                keys = [k for k, v in metrics.items() if contains_tensor(v) or contains_tensor(k)]
                where = f" (report(): metrics{[str(k) for k in keys]} hold torch tensors)"
            raise ReportError(TENSOR_METRICS_MESSAGE + where) from None
        raise


def _plain_metrics(metrics: Any) -> dict[str, Any]:
    """``metrics`` as plain Python values (:func:`_clean` of each), or :class:`ReportError`."""
    if not isinstance(metrics, Mapping):
        raise ReportError(
            f"report(metrics=...) must be a dict of str -> JSON-serialisable values, "
            f"got {type(metrics).__name__}"
        )
    out: dict[str, Any] = {}
    for key, value in metrics.items():
        if not isinstance(key, str):
            raise ReportError(f"report(): metric names must be strings, got {key!r}")
        out[key] = _clean(value, f"metrics[{key!r}]")
    return out
