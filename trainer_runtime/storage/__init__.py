"""Checkpoint storage: a local (or mounted volume) folder, or Google Cloud Storage.

URIs are either absolute local paths (``/mnt/ckpt/run``, ``file:///mnt/ckpt``) or
``gs://bucket/prefix``. :func:`get_storage` returns the backend for a URI.
"""

from __future__ import annotations

from trainer_runtime.storage.base import Storage, TransferStats, join_uri, validate_storage_uri
from trainer_runtime.storage.factory import get_storage

__all__ = ["Storage", "TransferStats", "get_storage", "join_uri", "validate_storage_uri"]
