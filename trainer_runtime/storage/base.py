"""The storage interface and URI helpers shared by every backend."""

from __future__ import annotations

import os
import random
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

SUPPORTED_SCHEMES = ("gs://", "file://", "/")


@dataclass
class TransferStats:
    """What one directory transfer moved."""

    files: int = 0
    bytes: int = 0
    seconds: float = 0.0

    @property
    def throughput_mib_s(self) -> float:
        """Throughput in MiB/s (0 when nothing was timed)."""
        return self.bytes / 2**20 / self.seconds if self.seconds > 0 else 0.0


def validate_storage_uri(uri: str, field: str = "storage_path") -> str:
    """Normalise a storage URI and reject unsupported ones with a message naming ``field``.

    Relative local paths are made absolute; ``file://`` is stripped; trailing
    slashes are removed.
    """
    if not isinstance(uri, str) or not uri:
        raise ValueError(f"{field} must be a non-empty string, got {uri!r}")
    if uri.startswith("gs://"):
        bucket = uri[len("gs://") :].split("/", 1)[0]
        if not bucket:
            raise ValueError(f"{field}={uri!r} has no bucket; use gs://BUCKET/PREFIX")
        return uri.rstrip("/")
    if "://" in uri and not uri.startswith("file://"):
        scheme = uri.split("://", 1)[0]
        raise ValueError(
            f"{field}={uri!r}: scheme {scheme}:// is not supported; use gs://BUCKET/PREFIX "
            "or a local/mounted folder path"
        )
    if uri.startswith("file://"):
        uri = uri[len("file://") :]
    path = os.path.abspath(os.path.expanduser(uri))
    return path.rstrip("/") or "/"


def join_uri(base: str, *parts: str) -> str:
    """Join URI path segments with ``/`` (works for local paths and ``gs://``)."""
    out = base.rstrip("/")
    for part in parts:
        part = part.strip("/")
        if part:
            out = f"{out}/{part}"
    return out


def uri_name(uri: str) -> str:
    """The last path segment of a URI."""
    return uri.rstrip("/").rsplit("/", 1)[-1]


def is_gcs_uri(uri: str) -> bool:
    """True for ``gs://`` URIs."""
    return uri.startswith("gs://")


def retry_call(
    fn: Callable[[], T],
    *,
    attempts: int,
    is_retriable: Callable[[BaseException], bool],
    base_delay_s: float = 0.2,
    max_delay_s: float = 10.0,
    what: str = "operation",
) -> T:
    """Call ``fn`` until it succeeds, retrying retriable errors with jittered exponential backoff.

    The last error is re-raised once ``attempts`` calls have failed or the error is
    not retriable.
    """
    delay = base_delay_s
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except Exception as exc:
            if attempt == attempts or not is_retriable(exc):
                raise
            time.sleep(min(max_delay_s, delay) * (0.5 + random.random()))
            delay *= 2
    raise AssertionError(f"unreachable: retry loop for {what} ended")  # pragma: no cover


class Storage(ABC):
    """One storage backend. Paths are full URIs as returned by :func:`join_uri`."""

    @abstractmethod
    def upload_dir(self, local_dir: Path, dest_uri: str) -> TransferStats:
        """Copy every file under ``local_dir`` to ``dest_uri`` (same relative layout)."""

    @abstractmethod
    def download_dir(self, src_uri: str, local_dir: Path) -> TransferStats:
        """Copy every file under ``src_uri`` into ``local_dir``."""

    @abstractmethod
    def write_bytes(self, uri: str, data: bytes) -> None:
        """Write one object/file atomically (readers see the old or the new content)."""

    @abstractmethod
    def read_bytes(self, uri: str) -> bytes:
        """Read one object/file; raises FileNotFoundError when it does not exist."""

    @abstractmethod
    def exists(self, uri: str) -> bool:
        """Whether the object/file exists."""

    @abstractmethod
    def list_dirs(self, uri: str) -> list[str]:
        """Names of the immediate sub-folders of ``uri`` (sorted)."""

    @abstractmethod
    def list_files(self, uri: str) -> list[str]:
        """Paths, relative to ``uri``, of every file below it (sorted)."""

    @abstractmethod
    def delete_dir(self, uri: str) -> None:
        """Delete ``uri`` and everything below it; a missing folder is not an error."""

    def local_path(self, uri: str) -> Path | None:
        """The local filesystem path for ``uri``, or None for remote storage."""
        return None
