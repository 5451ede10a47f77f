"""Pick the storage backend for a URI."""

from __future__ import annotations

import threading

from trainer_runtime.storage.base import Storage, is_gcs_uri

_lock = threading.Lock()
_backends: dict[str, Storage] = {}


def get_storage(uri: str) -> Storage:
    """The (process-wide, cached) backend for ``uri``: GCS for ``gs://``, else local."""
    kind = "gcs" if is_gcs_uri(uri) else "local"
    with _lock:
        backend = _backends.get(kind)
        if backend is None:
            if kind == "gcs":
                from trainer_runtime.storage.gcs import GCSStorage

                backend = GCSStorage()
            else:
                from trainer_runtime.storage.local import LocalStorage

                backend = LocalStorage()
            _backends[kind] = backend
        return backend


def reset_storage_cache() -> None:
    """Forget cached backends (e.g. after ``STORAGE_EMULATOR_HOST`` changed)."""
    with _lock:
        _backends.clear()
