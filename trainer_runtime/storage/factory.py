"""Pick the storage backend for a URI (and, optionally, a custom pyarrow filesystem)."""

from __future__ import annotations

import threading
from typing import Any

from trainer_runtime.storage.base import PYARROW_SCHEMES, Storage, is_gcs_uri, uri_scheme
from trainer_runtime.storage.gcs import GCSStorage
from trainer_runtime.storage.local import LocalStorage
from trainer_runtime.storage.pyarrow_fs import PyArrowStorage, filesystem_from_uri

_lock = threading.Lock()
_backends: dict[str, Storage] = {}
#: Backends of custom filesystems, matched by identity (pyarrow filesystems do not hash).
_custom: list[tuple[Any, Storage]] = []


def get_storage(uri: str, filesystem: Any = None) -> Storage:
    """The (process-wide, cached) backend for ``uri``.

    ``filesystem`` (a ``pyarrow.fs.FileSystem``, Ray Train's ``storage_filesystem``): that
    filesystem, ``uri`` being a path on it. Otherwise by scheme: GCS (google-cloud-storage)
    for ``gs://``, pyarrow for ``s3://`` and pyarrow's other schemes (one filesystem per
    bucket, from ``pyarrow.fs.FileSystem.from_uri``), the local filesystem for paths.
    """
    if filesystem is not None:
        with _lock:
            for fs, known in _custom:
                if fs is filesystem:
                    return known

            custom = PyArrowStorage(filesystem)
            _custom.append((filesystem, custom))
            return custom
    scheme = uri_scheme(uri)
    if is_gcs_uri(uri):
        kind = "gcs"
    elif scheme is not None:
        kind = f"{scheme}://{uri[len(scheme) + 3 :].split('/', 1)[0]}"
    else:
        kind = "local"
    with _lock:
        cached = _backends.get(kind)
        if cached is not None:
            return cached
        backend: Storage
        if kind == "gcs":
            backend = GCSStorage()
        elif scheme is not None:
            fs, _ = filesystem_from_uri(kind)
            backend = PyArrowStorage(fs, scheme=scheme)
        else:
            backend = LocalStorage()
        _backends[kind] = backend
        return backend


def client_modules(uri: str | None, filesystem: Any = None) -> tuple[str, ...]:
    """The client library the backend of ``uri`` imports on first use (none for a local
    folder or a given filesystem, already imported). A worker imports it in the background
    from its start, so its first download (a restore's ``as_directory()``) or upload does not
    wait for the import (google-cloud-storage: about a second on an idle core)."""
    if uri is None or filesystem is not None:
        return ()
    if is_gcs_uri(uri):
        return ("google.cloud.storage",)
    if uri_scheme(uri) not in (None, "file"):
        return ("pyarrow.fs",)
    return ()


def split_query_uri(uri: Any, filesystem: Any = None) -> tuple[Any, Any]:
    """``(path, filesystem)`` for a storage URI carrying pyarrow's query parameters
    (``s3://bucket/prefix?region=...&endpoint_override=...``, as
    ``pyarrow.fs.FileSystem.from_uri`` takes them: MinIO, R2 and other S3-compatible
    stores need them): the filesystem they configure and the path on it (``bucket/prefix``),
    as Ray Train's storage does. Anything else, or with ``filesystem`` given, is returned
    unchanged."""
    if filesystem is not None or not isinstance(uri, str) or "?" not in uri:
        return uri, filesystem
    scheme = uri_scheme(uri)
    if scheme not in PYARROW_SCHEMES:
        return uri, filesystem
    fs, path = filesystem_from_uri(uri)
    return path, fs


def pyarrow_filesystem(uri: str, filesystem: Any = None) -> Any:
    """The ``pyarrow.fs.FileSystem`` for ``uri`` (what Ray Train's ``Result.filesystem`` and
    ``Checkpoint.filesystem`` are): ``filesystem`` when given, the S3 (...) filesystem of a
    pyarrow-served URI, else pyarrow's own for ``gs://`` or a local path."""
    if filesystem is not None:
        return filesystem
    backend = get_storage(uri) if uri_scheme(uri) not in (None, "gs") else None
    fs = getattr(backend, "fs", None)
    if fs is not None:
        return fs
    import pyarrow.fs as pafs

    if uri_scheme(uri) is None:
        return pafs.LocalFileSystem()
    return pafs.FileSystem.from_uri(uri)[0]


def reset_storage_cache() -> None:
    """Forget cached backends (e.g. after ``STORAGE_EMULATOR_HOST`` changed)."""
    with _lock:
        _backends.clear()
        _custom.clear()
