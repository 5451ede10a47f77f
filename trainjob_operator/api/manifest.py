"""Loading TrainJob manifests: (multi-document) YAML and already-parsed objects.

- :func:`load_documents` / :func:`load_trainjobs` parse (multi-document) YAML;
- :func:`parse_trainjob` validates one already-parsed object (e.g. a kopf body) by the
  camelCase names only, as the API server does: its structural schema would silently drop a
  snake_case key, so ``trainjob validate``/``run`` reject one, naming the camelCase spelling.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from trainjob_operator.api.errors import FieldError, ManifestError, field_errors, yaml_type
from trainjob_operator.api.trainjob import TrainJob
from trainjob_operator.constants import API_VERSION, KIND

__all__ = ["LoadedDocument", "load_documents", "load_trainjobs", "parse_trainjob"]


def _plain(value: Any) -> Any:
    """Deep-copy Mapping/list views (e.g. kopf bodies) into plain dicts and lists."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


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
    errors = [
        FieldError(key, "required field is missing", f"add {key}: {value}")
        for key, value in (("apiVersion", API_VERSION), ("kind", KIND))
        if key not in data
    ]
    try:
        # By alias only: the CRD (and so the API server) knows only the camelCase names and
        # prunes any other key, so a snake_case key must be an error here too.
        job = TrainJob.model_validate(_plain(data), by_alias=True, by_name=False)
    except ValidationError as exc:
        errors.extend(field_errors(exc, TrainJob))
    if errors:
        raise ManifestError(errors)
    return job


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate mapping keys (which YAML would silently merge)."""


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
    path = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return FieldError(path, text, hint)


def _read_source(source: str | os.PathLike[str]) -> tuple[str, str]:
    """Return ``(text, name)``; ``source`` is a path, ``"-"`` (stdin) or YAML text."""
    if isinstance(source, os.PathLike):
        return Path(source).read_text(encoding="utf-8"), os.fspath(source)
    if source == "-":
        return sys.stdin.read(), "<stdin>"
    if _looks_like_path(source):
        return Path(source).read_text(encoding="utf-8"), source
    return source, "<string>"


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

    Raises:
        OSError: when the file cannot be read.
    """
    text, _ = _read_source(source)
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
