"""Checkpoint storage: a local (or mounted volume) folder, Google Cloud Storage, S3, or any
``pyarrow.fs.FileSystem``.

URIs are absolute local paths (``/mnt/ckpt/run``, ``file:///mnt/ckpt``), ``gs://bucket/prefix``,
``s3://bucket/prefix`` (and pyarrow's other schemes), or paths on a custom filesystem
(``RunConfig(storage_filesystem=...)``). :func:`get_storage` returns the backend.
"""

from __future__ import annotations

from trainer_runtime.storage.base import (
    Storage,
    StorageError,
    TransferStats,
    join_uri,
    validate_storage_uri,
)
from trainer_runtime.storage.factory import get_storage, pyarrow_filesystem, split_query_uri

__all__ = [
    "Storage",
    "StorageError",
    "TransferStats",
    "get_storage",
    "join_uri",
    "pyarrow_filesystem",
    "split_query_uri",
    "validate_storage_uri",
]
