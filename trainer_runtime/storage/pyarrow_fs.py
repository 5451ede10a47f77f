"""Storage on any ``pyarrow.fs.FileSystem``: ``s3://`` and the other schemes pyarrow resolves,
and ``RunConfig(storage_filesystem=...)`` (Ray Train's custom filesystem).

Paths are either URIs (``s3://bucket/prefix/...``: the filesystem comes from
``pyarrow.fs.FileSystem.from_uri``, which reads the usual AWS settings such as
``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID`` and ``AWS_DEFAULT_REGION``) or, with a custom
filesystem, paths on that filesystem with the scheme already stripped (``bucket/prefix/...``),
as in Ray Train.

* files of a folder upload and download in parallel (a thread pool), streamed in 8 MiB pieces;
* fingerprints (see :class:`~trainer_runtime.storage.base.StoredFile`): the object's ETag on
  S3 (it changes whenever the content does; read with a HEAD request, since listings through
  pyarrow carry sizes only), the modification time in nanoseconds elsewhere;
* transient S3 errors (``SLOW_DOWN``, ``INTERNAL_FAILURE``, ``SERVICE_UNAVAILABLE``,
  ``NETWORK_CONNECTION``, ``UNKNOWN``: the tokens Ray Train retries) are retried with
  jittered exponential backoff (``TRAINJOB_S3_ATTEMPTS``, default 6); access denied and a
  missing bucket are permanent.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from trainer_runtime._layout import STORE_TEMP_SUFFIX
from trainer_runtime.storage.base import (
    Storage,
    StorageError,
    StoredFile,
    TransferStats,
    UploadCheck,
    describe_error,
    is_permanent_error,
    retry_call,
    uri_scheme,
)

_CHUNK = 8 * 2**20
#: Error texts of pyarrow's S3 client worth retrying (Ray Train's ``AWS_RETRYABLE_TOKENS``).
TRANSIENT_TOKENS = (
    "AWS Error SLOW_DOWN",
    "AWS Error INTERNAL_FAILURE",
    "AWS Error SERVICE_UNAVAILABLE",
    "AWS Error NETWORK_CONNECTION",
    "AWS Error UNKNOWN",
    "Connection refused",
    "Couldn't connect to server",
)
#: ... and those retrying cannot fix.
PERMANENT_TOKENS = (
    "AWS Error ACCESS_DENIED",
    "Access Denied",
    "AccessDenied",
    "NoSuchBucket",
    "NO_SUCH_BUCKET",
    "The specified bucket does not exist",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "Forbidden",
)


def is_transient_pyarrow_error(exc: BaseException) -> bool:
    """Whether a pyarrow filesystem error is worth retrying."""
    if isinstance(exc, FileNotFoundError):
        return False
    text = str(exc)
    if any(token in text for token in PERMANENT_TOKENS):
        return False
    return any(token in text for token in TRANSIENT_TOKENS) or isinstance(
        exc, ConnectionError | TimeoutError
    )


def _is_permanent_pyarrow_error(exc: BaseException) -> bool:
    return any(token in str(exc) for token in PERMANENT_TOKENS) or is_permanent_error(exc)


def filesystem_from_uri(uri: str) -> tuple[Any, str]:
    """``pyarrow.fs.FileSystem.from_uri`` with a clear error when pyarrow is missing."""
    try:
        import pyarrow.fs as pafs
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise StorageError(
            f"{uri_scheme(uri)}:// storage needs pyarrow: pip install 'trainjob-operator[runtime]'",
            permanent=True,
        ) from exc
    try:
        fs, path = pafs.FileSystem.from_uri(uri)
    except Exception as exc:
        raise StorageError(
            f"cannot open storage {uri}: {describe_error(exc)}", permanent=True
        ) from exc
    return fs, path


class PyArrowStorage(Storage):
    """A ``pyarrow.fs.FileSystem``; paths are its paths, or URIs of ``scheme``.

    Args:
        filesystem: the filesystem.
        scheme: for URI-addressed storage (``s3``): URIs ``s3://...`` map to paths by
            stripping ``s3://``; None when paths are the filesystem's own (a custom
            ``storage_filesystem``), which is then also :attr:`filesystem`.
    """

    def __init__(
        self,
        filesystem: Any,
        *,
        scheme: str | None = None,
        max_workers: int = 8,
        attempts: int | None = None,
    ) -> None:
        self.fs = filesystem
        self.scheme = scheme
        #: The custom filesystem checkpoints of this storage carry (None for URIs).
        self.filesystem = filesystem if scheme is None else None
        self.max_workers = max_workers
        self.attempts = attempts or int(os.environ.get("TRAINJOB_S3_ATTEMPTS", "6"))
        self._is_s3 = getattr(filesystem, "type_name", "") == "s3"
        self._object_store = getattr(filesystem, "type_name", "") in ("s3", "gcs")
        self._lock = threading.Lock()

    # -- paths ----------------------------------------------------------------------------
    def _path(self, uri: str) -> str:
        prefix = f"{self.scheme}://" if self.scheme else None
        if prefix and uri.startswith(prefix):
            return uri[len(prefix) :].rstrip("/")
        return uri.rstrip("/") or "/"

    def _retry(self, fn: Callable[[], Any], what: str) -> Any:
        try:
            return retry_call(
                fn, attempts=self.attempts, is_retriable=is_transient_pyarrow_error, what=what
            )
        except FileNotFoundError:
            raise
        except Exception as exc:
            if _is_permanent_pyarrow_error(exc):
                raise StorageError(
                    f"{what} failed (not retried: {describe_error(exc)})", permanent=True
                ) from exc
            if is_transient_pyarrow_error(exc):
                raise StorageError(
                    f"{what} failed after {self.attempts} attempts: {describe_error(exc)}"
                ) from exc
            raise StorageError(f"{what} failed: {describe_error(exc)}") from exc

    def _info(self, path: str) -> Any:
        return self.fs.get_file_info(path)

    def _fingerprint(self, path: str, info: Any | None = None) -> StoredFile:
        """Size and fingerprint of one stored file (a HEAD request on S3 for its ETag)."""
        if self._is_s3:
            with self.fs.open_input_file(path) as fh:
                meta = fh.metadata()
                size = fh.size()
            etag = meta.get(b"ETag") or meta.get("ETag") or b""
            if isinstance(etag, bytes):
                etag = etag.decode(errors="replace")
            return StoredFile(int(size), str(etag).strip('"'))
        info = info if info is not None else self._info(path)
        mtime = info.mtime_ns
        return StoredFile(int(info.size or 0), "" if mtime is None else str(mtime))

    def _ensure_parent(self, path: str) -> None:
        if self._object_store:
            return  # object stores have no folders to create
        parent = path.rsplit("/", 1)[0] if "/" in path else ""
        if parent:
            self.fs.create_dir(parent, recursive=True)

    # -- transfers ------------------------------------------------------------------------
    def _upload_file(self, local: Path, path: str, check: UploadCheck | None) -> StoredFile:
        if check is not None:
            check()

        def upload() -> StoredFile:
            self._ensure_parent(path)
            if self._object_store:  # an object appears whole once its upload completes
                with open(local, "rb") as src, self.fs.open_output_stream(path) as dst:
                    shutil.copyfileobj(src, dst, _CHUNK)
                return self._fingerprint(path)
            # A file system: write a temporary file and move it into place, so ranks storing
            # the same name each replace a whole file (nobody lists a half-written one).
            parent, _, name = path.rpartition("/")
            tmp = f"{parent}/.{name}.{uuid.uuid4().hex}{STORE_TEMP_SUFFIX}"
            try:
                with open(local, "rb") as src, self.fs.open_output_stream(tmp) as dst:
                    shutil.copyfileobj(src, dst, _CHUNK)
                self.fs.move(tmp, path)
            except BaseException:
                with contextlib.suppress(Exception):  # best effort
                    self.fs.delete_file(tmp)
                raise
            return self._fingerprint(path)

        stored: StoredFile = self._retry(upload, f"upload {local} -> {path}")
        return stored

    def upload_dir(
        self,
        local_dir: Path,
        dest_uri: str,
        *,
        files: Sequence[str] | None = None,
        check: UploadCheck | None = None,
        consume_source: bool = False,
    ) -> TransferStats:
        """Upload files under ``local_dir`` in parallel (``check`` runs before each file)."""
        del consume_source  # the files are read, not taken over
        root = Path(local_dir)
        rels = (
            [p.relative_to(root).as_posix() for p in sorted(root.rglob("*")) if p.is_file()]
            if files is None
            else list(files)
        )
        dest = self._path(dest_uri)
        start = time.perf_counter()
        stats = TransferStats()
        if not self._object_store:
            self.fs.create_dir(dest, recursive=True)
        if not rels:
            return stats
        jobs = [functools.partial(self._upload_file, root / r, f"{dest}/{r}", check) for r in rels]
        with ThreadPoolExecutor(max_workers=min(self.max_workers, len(jobs))) as pool:
            for rel, stored in zip(rels, pool.map(lambda job: job(), jobs), strict=True):
                stats.stored[rel] = stored
                stats.files += 1
                stats.bytes += stored.size
        stats.seconds = time.perf_counter() - start
        return stats

    def _download_file(self, path: str, local: Path) -> int:
        local.parent.mkdir(parents=True, exist_ok=True)

        def download() -> int:
            with self.fs.open_input_stream(path) as src, open(local, "wb") as dst:
                shutil.copyfileobj(src, dst, _CHUNK)
            return local.stat().st_size

        size: int = self._retry(download, f"download {path} -> {local}")
        return size

    def download_dir(self, src_uri: str, local_dir: Path) -> TransferStats:
        """Download every file below ``src_uri`` in parallel."""
        rels = self.list_files(src_uri)
        if not rels:
            raise FileNotFoundError(f"checkpoint folder {src_uri} holds no files")
        src = self._path(src_uri)
        root = Path(local_dir)
        start = time.perf_counter()
        stats = TransferStats()
        jobs = [functools.partial(self._download_file, f"{src}/{r}", root / r) for r in rels]
        with ThreadPoolExecutor(max_workers=min(self.max_workers, len(jobs))) as pool:
            for size in pool.map(lambda job: job(), jobs):
                stats.files += 1
                stats.bytes += size
        stats.seconds = time.perf_counter() - start
        return stats

    # -- small objects --------------------------------------------------------------------
    def write_bytes(self, uri: str, data: bytes) -> None:
        """One write that readers see whole: a single PUT on object stores, else a temporary
        file moved into place."""
        path = self._path(uri)

        def write() -> None:
            self._ensure_parent(path)
            if self._object_store:
                with self.fs.open_output_stream(path) as fh:
                    fh.write(data)
                return
            parent, _, name = path.rpartition("/")
            tmp = f"{parent}/.{name}.{uuid.uuid4().hex}.tmp" if parent else f".{name}.tmp"
            try:
                with self.fs.open_output_stream(tmp) as fh:
                    fh.write(data)
                self.fs.move(tmp, path)
            except BaseException:
                with contextlib.suppress(Exception):  # best effort
                    self.fs.delete_file(tmp)
                raise

        self._retry(write, f"write {uri}")

    def read_bytes(self, uri: str) -> bytes:
        """Read one file; FileNotFoundError when missing."""
        path = self._path(uri)

        def read() -> bytes:
            info = self._info(path)
            if info.type.name == "NotFound":
                raise FileNotFoundError(f"{uri} does not exist")
            if info.type.name == "Directory":
                raise IsADirectoryError(f"{uri} is a folder")
            with self.fs.open_input_stream(path) as fh:
                return bytes(fh.read())

        data: bytes = self._retry(read, f"read {uri}")
        return data

    def exists(self, uri: str) -> bool:
        """Whether the file or folder exists."""
        path = self._path(uri)
        return bool(self._retry(lambda: self._info(path).type.name != "NotFound", f"stat {uri}"))

    def _listing(self, uri: str, recursive: bool) -> list[Any]:
        import pyarrow.fs as pafs

        path = self._path(uri)

        def listing() -> list[Any]:
            selector = pafs.FileSelector(path, allow_not_found=True, recursive=recursive)
            return list(self.fs.get_file_info(selector))

        infos: list[Any] = self._retry(listing, f"list {uri}")
        return infos

    def _relative(self, uri: str, info: Any) -> str:
        base = self._path(uri).rstrip("/") + "/"
        return str(info.path)[len(base) :] if str(info.path).startswith(base) else info.base_name

    def list_dirs(self, uri: str) -> list[str]:
        """Sorted names of the immediate sub-folders."""
        return sorted(
            info.base_name for info in self._listing(uri, False) if info.type.name == "Directory"
        )

    def list_files(self, uri: str) -> list[str]:
        """Sorted relative paths of every file below ``uri``."""
        return sorted(
            self._relative(uri, info)
            for info in self._listing(uri, True)
            if info.type.name == "File"
        )

    def list_stored(self, uri: str, *, fingerprints: bool = True) -> dict[str, StoredFile]:
        """Every file below ``uri`` with its size and fingerprint (without ``fingerprints``:
        sizes only, no request per file on S3)."""
        files = [info for info in self._listing(uri, True) if info.type.name == "File"]
        if not fingerprints or not self._is_s3:
            return {
                self._relative(uri, info): (
                    self._fingerprint(info.path, info)
                    if fingerprints
                    else StoredFile(int(info.size or 0), "")
                )
                for info in files
            }
        if not files:
            return {}

        def head(info: Any) -> StoredFile:
            try:
                stored: StoredFile = self._retry(
                    lambda: self._fingerprint(info.path), f"stat {info.path}"
                )
            except FileNotFoundError:  # deleted while listing
                return StoredFile(-1, "")
            return stored

        out: dict[str, StoredFile] = {}
        with ThreadPoolExecutor(max_workers=min(self.max_workers, len(files))) as pool:
            for info, stored in zip(files, pool.map(head, files), strict=True):
                if stored.size >= 0:
                    out[self._relative(uri, info)] = stored
        return out

    def delete_dir(self, uri: str) -> None:
        """Delete ``uri`` and everything below it; a missing folder is not an error."""
        path = self._path(uri)

        def delete() -> None:
            if self._info(path).type.name == "NotFound":
                return
            with contextlib.suppress(FileNotFoundError):
                self.fs.delete_dir(path)

        self._retry(delete, f"delete {uri}")

    def local_path(self, uri: str) -> Path | None:
        """A local path when the filesystem is pyarrow's local one (else None)."""
        if getattr(self.fs, "type_name", "") == "local":
            return Path(self._path(uri))
        return None
