"""Loading TrainJob manifests: (multi-document) YAML and already-parsed objects.

- :func:`load_documents` / :func:`load_trainjobs` parse (multi-document) YAML;
- :func:`parse_trainjob` validates one already-parsed object (e.g. a kopf body) by the
  camelCase names only, as the API server does: its structural schema would silently drop a
  snake_case key, so ``trainjob validate``/``run`` reject one, naming the camelCase spelling.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml
from pydantic import ValidationError

from trainjob_operator.api.errors import FieldError, ManifestError, field_errors, yaml_type
from trainjob_operator.api.trainjob import TrainJob
from trainjob_operator.constants import API_VERSION, KIND

__all__ = [
    "MAX_MANIFEST_BYTES",
    "MAX_NESTING_DEPTH",
    "LoadedDocument",
    "load_documents",
    "load_trainjobs",
    "parse_trainjob",
]

MAX_MANIFEST_BYTES = 1_572_864
"""Largest manifest read (1.5 MiB, etcd's default request limit: the API server could not store
a larger TrainJob). A larger file is refused before it is parsed."""
MAX_NESTING_DEPTH = 100
"""Deepest nesting of mappings and lists accepted in a manifest (or an API body): a TrainJob
needs about 10 levels; deeper documents are refused before they can exhaust the stack."""


def _json_default(value: Any) -> Any:
    """How :func:`json.dumps` writes what JSON has no type for: a Mapping view (e.g. a kopf
    body) as the dict it shows, anything else (e.g. a YAML timestamp) as its string. The plain
    dicts and lists of a body are encoded by ``json``'s C encoder without a Python copy."""
    if isinstance(value, Mapping):
        return dict(value)
    return str(value)


def _too_deep(data: Mapping[str, Any]) -> str | None:
    """The path of the first value nested deeper than :data:`MAX_NESTING_DEPTH`, or None.

    Iterative, so a body of any depth (e.g. from the API server, which allows deeper JSON than
    a manifest) is checked without recursion.
    """
    stack: list[tuple[Any, str, int]] = [(data, "", 1)]
    while stack:
        value, path, depth = stack.pop()
        if depth > MAX_NESTING_DEPTH:
            return path
        if isinstance(value, Mapping):
            for key, item in value.items():
                if isinstance(item, Mapping | list | tuple):
                    stack.append((item, f"{path}.{key}" if path else str(key), depth + 1))
        elif isinstance(value, list | tuple):
            for index, item in enumerate(value):
                if isinstance(item, Mapping | list | tuple):
                    stack.append((item, f"{path}[{index}]", depth + 1))
    return None


def parse_trainjob(data: Mapping[str, Any]) -> TrainJob:
    """Validate one parsed TrainJob object (a YAML document or a Kubernetes API body).

    Unlike ``TrainJob.model_validate`` this also requires ``apiVersion`` and ``kind``, as
    ``kubectl apply`` does, accepts any ``Mapping`` (nested mappings included, e.g. a kopf
    ``Body``), and accepts only the camelCase field names: a snake_case key such as
    ``spec.scaling.num_workers`` is an unknown field whose hint names ``numWorkers`` (the API
    server would prune it and use the default).

    Raises:
        ManifestError: with one :class:`FieldError` per problem.
    """
    if not isinstance(data, Mapping):
        raise ManifestError(
            [FieldError("", f"a TrainJob must be a mapping, got {yaml_type(data)}")]
        )
    too_deep = _too_deep(data)
    if too_deep is not None:
        raise ManifestError(
            [
                FieldError(
                    too_deep,
                    f"nesting deeper than {MAX_NESTING_DEPTH} levels is not allowed",
                    "flatten the data, or keep it in a file and pass its path in spec.config",
                )
            ]
        )
    errors = [
        FieldError(key, "required field is missing", f"add {key}: {value}")
        for key, value in (("apiVersion", API_VERSION), ("kind", KIND))
        if key not in data
    ]
    try:
        # By alias only: the CRD (and so the API server) knows only the camelCase names and
        # prunes any other key, so a snake_case key must be an error here too. As JSON and
        # strictly, as the API server validates the CRD's types: "2" or true is not an integer
        # and "true" is not a boolean (pydantic's lax mode would coerce them), while enums and
        # timestamps are read from their JSON strings. Stricter in one place, by choice: 2.0
        # (which the API server stores as 2) is refused with the hint to write 2
        # (tests/k8s/test_admission.py compares the two on a real API server).
        text = json.dumps(data, default=_json_default, allow_nan=False)
        job = TrainJob.model_validate_json(text, strict=True, by_alias=True, by_name=False)
    except ValueError as exc:
        if not isinstance(exc, ValidationError):  # NaN or infinity: not JSON, as for kubectl
            raise ManifestError(
                [FieldError("", f"not representable as JSON: {exc}", "quote the value: '.nan'")]
            ) from None
        errors.extend(field_errors(exc, TrainJob))
    if errors:
        raise ManifestError(errors)
    return job


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate mapping keys (which YAML would silently merge), anchors
    and aliases (a kilobyte of aliases can expand to gigabytes: an "alias bomb"), and nesting
    deeper than :data:`MAX_NESTING_DEPTH` (the composer is recursive)."""

    _depth = 0

    @staticmethod
    def _refuse(problem: str, event: yaml.Event) -> yaml.composer.ComposerError:
        mark = event.start_mark if isinstance(event.start_mark, yaml.error.Mark) else None
        return yaml.composer.ComposerError(None, None, problem, mark)

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            raise self._refuse(f"YAML aliases are not allowed (found *{event.anchor})", event)
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            raise self._refuse(f"YAML anchors are not allowed (found &{anchor})", event)
        if isinstance(event, yaml.SequenceStartEvent | yaml.MappingStartEvent):
            if self._depth >= MAX_NESTING_DEPTH:
                raise self._refuse(
                    f"nesting deeper than {MAX_NESTING_DEPTH} levels is not allowed", event
                )
            self._depth += 1
            try:
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1
        return super().compose_node(parent, index)


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping",
                node.start_mark,
                f"found duplicate key {key!r}",
                key_node.start_mark,
            )
        seen.add(key)
    return loader.construct_mapping(node)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


@dataclass
class LoadedDocument:
    """One document of a manifest stream and its outcome.

    Attributes:
        index: position in the stream (0-based; empty documents are skipped but counted).
        trainjob: the validated model, or ``None`` when ``errors`` is non-empty.
        errors: the problems found.
        data: the raw parsed document (``None`` for a YAML syntax error).
    """

    index: int
    trainjob: TrainJob | None = None
    errors: list[FieldError] = field(default_factory=list)
    data: Any = None

    @property
    def ok(self) -> bool:
        """True when the document is a valid TrainJob."""
        return self.trainjob is not None and not self.errors

    @property
    def label(self) -> str:
        """``kind/name`` as far as known."""
        data = self.data if isinstance(self.data, Mapping) else {}
        meta = data.get("metadata")
        name = meta.get("name") if isinstance(meta, Mapping) else None
        return f"{data.get('kind') or '?'}/{name or '?'}"


def _yaml_error(exc: yaml.YAMLError) -> FieldError:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    text = (
        f"YAML syntax error: {context}: {problem}" if context else f"YAML syntax error: {problem}"
    )
    hint = None
    if "'\\t'" in str(problem) or "tab" in str(problem):
        hint = "indent with spaces; YAML does not allow tabs"
    elif "aliases are not allowed" in str(problem) or "anchors are not allowed" in str(problem):
        hint = "write the values out in full: a few aliases can expand to gigabytes"
    elif "nesting deeper" in str(problem):
        hint = "flatten the data, or keep it in a file and pass its path in spec.config"
    path = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return FieldError(path, text, hint)


class _UnreadableText(Exception):
    """The manifest's bytes are not a text we parse (too large, not UTF-8, binary)."""

    def __init__(self, error: FieldError) -> None:
        super().__init__(error.format())
        self.error = error


def _read_bytes(path: str | os.PathLike[str] | None) -> bytes | str:
    """At most :data:`MAX_MANIFEST_BYTES` + 1 bytes of a file (``None``: stdin; text when
    stdin is a text stream without bytes, e.g. replaced in tests)."""
    if path is None:
        buffer = getattr(sys.stdin, "buffer", None)
        if buffer is None:
            return str(sys.stdin.read(MAX_MANIFEST_BYTES + 1))
        return bytes(buffer.read(MAX_MANIFEST_BYTES + 1))
    with open(path, "rb") as handle:
        return handle.read(MAX_MANIFEST_BYTES + 1)


def _decode(data: bytes | str) -> str:
    """The manifest's text; raises :class:`_UnreadableText` for what YAML should not see."""
    size = len(data.encode("utf-8", "surrogatepass")) if isinstance(data, str) else len(data)
    if size > MAX_MANIFEST_BYTES:
        raise _UnreadableText(
            FieldError(
                "",
                f"the manifest is larger than {MAX_MANIFEST_BYTES} bytes (1.5 MiB, the most the "
                "API server stores in one object)",
                "keep large data out of the manifest: put it in storage and pass its path in "
                "spec.config",
            )
        )
    if isinstance(data, str):
        return data
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _UnreadableText(
            FieldError(
                "",
                f"the manifest is not UTF-8 text: byte 0x{data[exc.start]:02x} at offset "
                f"{exc.start}",
                "a TrainJob manifest is a YAML or JSON text file; save it as UTF-8",
            )
        ) from None
    if "\x00" in text:
        raise _UnreadableText(
            FieldError(
                "",
                f"the manifest is binary: a NUL byte at offset {text.index(chr(0))}",
                "a TrainJob manifest is a YAML or JSON text file",
            )
        )
    return text.removeprefix("\ufeff")


def _read_source(source: str | os.PathLike[str]) -> tuple[str, str]:
    """Return ``(text, name)``; ``source`` is a path, ``"-"`` (stdin) or YAML text.

    Raises:
        _UnreadableText: for a manifest that is too large, not UTF-8 or binary.
        OSError: when the file cannot be read.
    """
    if isinstance(source, os.PathLike):
        return _decode(_read_bytes(source)), os.fspath(source)
    if source == "-":
        return _decode(_read_bytes(None)), "<stdin>"
    if _looks_like_path(source):
        return _decode(_read_bytes(source)), source
    return _decode(source), "<string>"


def _looks_like_path(source: str) -> bool:
    """A one-line string naming an existing file or ending in .yaml/.yml/.json is a path."""
    if "\n" in source:
        return False
    return os.path.isfile(source) or source.strip().endswith((".yaml", ".yml", ".json"))


def _source_name(source: str | os.PathLike[str]) -> str:
    if isinstance(source, os.PathLike):
        return os.fspath(source)
    if source == "-":
        return "<stdin>"
    return source if _looks_like_path(source) else ""


def load_documents(source: str | os.PathLike[str]) -> list[LoadedDocument]:
    """Parse a (multi-document) YAML manifest and validate every TrainJob in it.

    Args:
        source: a path (a ``Path``, or a one-line string naming an existing file or ending in
            ``.yaml``/``.yml``/``.json``), ``"-"`` for stdin, or YAML text.

    Returns:
        One :class:`LoadedDocument` per non-empty document, in order. A YAML syntax error ends
        the stream with a document holding a single error whose path is ``line L, column C``.

        A manifest larger than :data:`MAX_MANIFEST_BYTES`, not UTF-8 or binary is one
        document holding that error; so is YAML with anchors or aliases, or nested deeper than
        :data:`MAX_NESTING_DEPTH` (a ``line L, column C`` error).

    Raises:
        OSError: when the file cannot be read.
    """
    try:
        text, _ = _read_source(source)
    except _UnreadableText as exc:
        return [LoadedDocument(index=0, errors=[exc.error])]
    results: list[LoadedDocument] = []
    index = 0
    stream = yaml.load_all(text, Loader=_StrictLoader)  # a SafeLoader subclass
    while True:
        try:
            data = next(stream)
        except StopIteration:
            break
        except yaml.YAMLError as exc:
            results.append(LoadedDocument(index=index, errors=[_yaml_error(exc)]))
            break
        current = index
        index += 1
        if data is None:
            continue
        doc = LoadedDocument(index=current, data=data)
        if not isinstance(data, dict):
            doc.errors.append(
                FieldError("", f"a TrainJob document must be a mapping, got {yaml_type(data)}")
            )
        else:
            try:
                doc.trainjob = parse_trainjob(data)
            except ManifestError as exc:
                doc.errors.extend(exc.errors)
        results.append(doc)
    return results


def load_trainjobs(source: str | os.PathLike[str]) -> list[TrainJob]:
    """Load every TrainJob of a (multi-document) YAML manifest.

    Args:
        source: a path (a ``Path``, or a one-line string naming an existing file or ending in
            ``.yaml``/``.yml``/``.json``), ``"-"`` for stdin, or YAML text.

    Raises:
        ManifestError: when any document is invalid (all problems of all documents, paths
            prefixed with ``#N`` for the N-th document of a multi-document stream) or when the
            stream holds no document.
        OSError: when the file cannot be read.
    """
    name = _source_name(source)
    docs = load_documents(source)
    if not docs:
        raise ManifestError([FieldError("", "no TrainJob document found")], name)
    errors: list[FieldError] = []
    multi = len(docs) > 1
    for doc in docs:
        for err in doc.errors:
            if multi and not err.path.startswith("line "):
                err = FieldError(f"#{doc.index + 1} {err.path}".rstrip(), err.message, err.hint)
            errors.append(err)
    if errors:
        raise ManifestError(errors, name)
    return [doc.trainjob for doc in docs if doc.trainjob is not None]
