"""The storage interface, its error (:class:`StorageError`) and the URI and retry helpers
shared by every backend.

Storage sits just above the leaf :mod:`trainer_runtime.errors` and knows nothing else of the
runtime: which errors no retry can fix it learns from their type
(:class:`~trainer_runtime.errors.NotRetriableError`), not by naming fencing or checkpoints.
"""

from __future__ import annotations

import errno
import os
import random
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from trainer_runtime.errors import NotRetriableError, TrainerRuntimeError

T = TypeVar("T")


class StorageError(TrainerRuntimeError):
    """A storage operation failed after its retries.

    ``permanent``: retrying cannot help (access denied, bucket not found): the run fails at
    once instead of spending ``FailureConfig.max_failures`` on restarts.
    """

    def __init__(self, message: str, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


#: URI schemes for ``storage_path``: ``gs://`` (google-cloud-storage) and those served by
#: pyarrow's filesystems (``s3://`` ...); a local or mounted folder needs none (or ``file://``).
PYARROW_SCHEMES = ("s3", "hdfs", "viewfs", "abfs", "abfss")
SUPPORTED_SCHEMES = ("gs", *PYARROW_SCHEMES)


@dataclass(frozen=True)
class StoredFile:
    """One stored file as storage lists it: its size and a fingerprint of this very write.

    The fingerprint changes whenever the file is written again, even with the same size:
    the modification time in nanoseconds for local files, the object generation on GCS.
    """

    size: int
    fingerprint: str = ""

    def to_json(self) -> list[int | str]:
        """``[size, fingerprint]`` (compact: a checkpoint may hold thousands of files)."""
        return [self.size, self.fingerprint]

    @classmethod
    def from_json(cls, data: object) -> StoredFile:
        """Inverse of :meth:`to_json`; raises ValueError on anything else."""
        if (
            isinstance(data, list)
            and len(data) == 2
            and isinstance(data[0], int)
            and not isinstance(data[0], bool)
            and isinstance(data[1], str)
        ):
            return cls(data[0], data[1])
        raise ValueError(f"not a stored-file entry: {data!r}")


#: Check called between files of an upload; it raises to stop the upload (fencing).
UploadCheck = Callable[[], None]


@dataclass
class TransferStats:
    """What one directory transfer moved (and, for uploads, what was stored where)."""

    files: int = 0
    bytes: int = 0
    seconds: float = 0.0
    #: Uploads: every stored file, relative to the destination folder.
    stored: dict[str, StoredFile] = field(default_factory=dict)

    @property
    def throughput_mib_s(self) -> float:
        """Throughput in MiB/s (0 when nothing was timed)."""
        return self.bytes / 2**20 / self.seconds if self.seconds > 0 else 0.0


def validate_storage_uri(
    uri: str | os.PathLike[str], field: str = "storage_path", filesystem: object = None
) -> str:
    """Normalise a storage URI and reject unsupported ones with a message naming ``field``.

    Relative local paths are made absolute; ``file://`` is stripped; trailing slashes are
    removed. With ``filesystem`` (a ``pyarrow.fs.FileSystem``, Ray Train's
    ``storage_filesystem``) ``uri`` is a path on that filesystem, its scheme already
    stripped (``s3://bucket/x`` becomes ``bucket/x``), and is kept as it is.
    """
    if isinstance(uri, os.PathLike):
        uri = os.fspath(uri)
    if not isinstance(uri, str) or not uri:
        raise ValueError(f"{field} must be a non-empty string, got {uri!r}")
    if filesystem is not None:
        if "://" in uri:
            scheme, _, rest = uri.partition("://")
            raise ValueError(
                f"{field}={uri!r}: with storage_filesystem, give the path on that filesystem "
                f"without the {scheme}:// prefix (e.g. {rest!r}), as in Ray Train"
            )
        return uri.rstrip("/") or "/"
    if "://" in uri and not uri.startswith("file://"):
        scheme, _, rest = uri.partition("://")
        if scheme not in SUPPORTED_SCHEMES:
            raise ValueError(
                f"{field}={uri!r}: scheme {scheme}:// is not supported; use a local/mounted "
                f"folder path, gs://BUCKET/PREFIX, s3://BUCKET/PREFIX (or another of "
                f"{', '.join(s + '://' for s in PYARROW_SCHEMES)}), or pass "
                "RunConfig(storage_filesystem=<a pyarrow.fs.FileSystem>)"
            )
        if scheme in ("gs", "s3") and not rest.split("/", 1)[0]:
            raise ValueError(f"{field}={uri!r} has no bucket; use {scheme}://BUCKET/PREFIX")
        return uri.rstrip("/")
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


def uri_scheme(uri: str) -> str | None:
    """``s3`` for ``s3://...``; None for a path (local, or on a custom filesystem)."""
    return uri.split("://", 1)[0] if "://" in uri else None


_PERMANENT_ERRNOS = {
    errno.EACCES,
    errno.EPERM,
    errno.EROFS,
    errno.ENOENT,
    errno.ENOTDIR,
    errno.EISDIR,
}
_PERMANENT_HTTP = {401, 403, 404}


def is_permanent_error(exc: BaseException) -> bool:
    """Whether retrying (or restarting the workers) cannot fix a storage error.

    Permission denied, read-only filesystem, not found (a missing bucket or source folder),
    HTTP 401/403/404, a :class:`StorageError` marked permanent, and errors the runtime
    raises for bad input or fencing (:class:`~trainer_runtime.errors.NotRetriableError`).
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, NotRetriableError):
            return True
        if isinstance(current, StorageError) and current.permanent:
            return True
        if isinstance(current, OSError) and current.errno in _PERMANENT_ERRNOS:
            return True
        code = getattr(current, "code", None)
        if isinstance(code, int) and code in _PERMANENT_HTTP:
            return True
        current = current.__cause__
    return False


def describe_error(exc: BaseException) -> str:
    """``Type: message`` with the path(s) an OSError names, even when ``str()`` drops them."""
    text = str(exc)
    if isinstance(exc, OSError):
        paths = [p for p in (exc.filename, exc.filename2) if p is not None]
        missing = [os.fsdecode(p) for p in paths if os.fsdecode(p) not in text]
        if missing:
            text = f"{text} ({' -> '.join(missing)})"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


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

    #: The ``pyarrow.fs.FileSystem`` that checkpoints of this storage carry: a custom
    #: ``RunConfig.storage_filesystem`` (see ``pyarrow_fs``); None for URI-addressed storage.
    filesystem: Any = None

    @abstractmethod
    def upload_dir(
        self,
        local_dir: Path,
        dest_uri: str,
        *,
        files: Sequence[str] | None = None,
        check: UploadCheck | None = None,
        consume_source: bool = False,
    ) -> TransferStats:
        """Copy files under ``local_dir`` to ``dest_uri`` (same relative layout).

        ``files``: the relative paths to copy (default: every file below ``local_dir``); a
        listed file that is missing raises FileNotFoundError naming it. ``check`` is called
        before each file and may raise to stop the upload. ``TransferStats.stored`` lists
        what was stored, with fingerprints matching :meth:`list_stored`.
        ``consume_source``: the caller deletes ``local_dir`` right after a successful upload,
        so a backend may take the files over instead of copying them (local storage
        hard-links them); the source must be left intact when the upload fails.
        """

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
    def list_stored(self, uri: str, *, fingerprints: bool = True) -> dict[str, StoredFile]:
        """Every file below ``uri`` (relative path -> size and fingerprint).

        ``fingerprints=False``: the sizes are enough (fingerprints may be left empty), for
        backends where a fingerprint costs a request per file.
        """

    @abstractmethod
    def delete_dir(self, uri: str) -> None:
        """Delete ``uri`` and everything below it; a missing folder is not an error."""

    def local_path(self, uri: str) -> Path | None:
        """The local filesystem path for ``uri``, or None for remote storage."""
        return None
