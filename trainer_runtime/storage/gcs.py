"""Google Cloud Storage backend (``gs://bucket/prefix``) built on ``google-cloud-storage``.

* files of a folder upload and download in parallel (a thread pool);
* files above ``chunked_threshold`` use resumable uploads in ``chunk_size`` pieces (100 MiB,
  google-cloud-storage's own default; ``TRAINJOB_GCS_CHUNK_MIB`` changes it, e.g. to use less
  memory: each file being uploaded holds one chunk in memory);
* every object is checked with crc32c;
* transient errors (HTTP 408/429/5xx, connection resets) are retried with backoff.

``STORAGE_EMULATOR_HOST`` (e.g. fake-gcs-server) is honoured with anonymous credentials.
"""

from __future__ import annotations

import base64
import functools
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from trainer_runtime.storage.base import (
    Storage,
    StorageError,
    StoredFile,
    TransferStats,
    UploadCheck,
    describe_error,
    is_permanent_error,
    retry_call,
)

_TRANSIENT_HTTP = {408, 429, 500, 502, 503, 504}
_CHUNK_ALIGN = 256 * 1024  # resumable upload chunks must be multiples of 256 KiB


def default_chunk_size() -> int:
    """``$TRAINJOB_GCS_CHUNK_MIB`` MiB (rounded to 256 KiB), else 100 MiB.

    100 MiB is google-cloud-storage's default: fewer, larger requests per file. Smaller chunks
    cost throughput: each chunk is a request of its own, with its round trip.
    """
    raw = os.environ.get("TRAINJOB_GCS_CHUNK_MIB")
    if not raw:
        return 100 * 2**20
    try:
        mib = float(raw)
    except ValueError:
        raise ValueError(f"TRAINJOB_GCS_CHUNK_MIB={raw!r} is not a number of MiB") from None
    return max(_CHUNK_ALIGN, round(mib * 2**20 / _CHUNK_ALIGN) * _CHUNK_ALIGN)


def split_gcs_uri(uri: str) -> tuple[str, str]:
    """``gs://bucket/a/b`` -> (``bucket``, ``a/b``)."""
    if not uri.startswith("gs://"):
        raise ValueError(f"not a gs:// URI: {uri!r}")
    bucket, _, key = uri[len("gs://") :].partition("/")
    return bucket, key.strip("/")


def is_transient_gcs_error(exc: BaseException) -> bool:
    """Whether a GCS client error is worth retrying."""
    code = getattr(exc, "code", None)
    if isinstance(code, int) and code in _TRANSIENT_HTTP:
        return True
    import requests

    if isinstance(exc, requests.exceptions.ConnectionError | requests.exceptions.Timeout):
        return True
    return isinstance(exc, ConnectionError | TimeoutError)


class GCSStorage(Storage):
    """Objects in one or more GCS buckets."""

    def __init__(
        self,
        *,
        max_workers: int = 8,
        chunk_size: int | None = None,
        chunked_threshold: int = 64 * 2**20,
        attempts: int | None = None,
        timeout_s: float = 120.0,
        client: Any = None,
    ) -> None:
        self.max_workers = max_workers
        self.chunk_size = chunk_size if chunk_size is not None else default_chunk_size()
        self.chunked_threshold = chunked_threshold
        # Retries are ours (jittered exponential backoff), not the client library's: its
        # default keeps retrying a refused connection for two minutes per call.
        self.attempts = attempts or int(os.environ.get("TRAINJOB_GCS_ATTEMPTS", "6"))
        self.timeout_s = timeout_s
        self._client = client
        self._lock = threading.Lock()

    # -- client ---------------------------------------------------------------------------
    @property
    def client(self) -> Any:
        """The ``google.cloud.storage.Client`` (created on first use)."""
        with self._lock:
            if self._client is None:
                self._client = _make_client(self.max_workers)
            return self._client

    def _blob(self, uri: str) -> Any:
        bucket, key = split_gcs_uri(uri)
        return self.client.bucket(bucket).blob(key)

    def _retry(self, fn: Callable[[], Any], what: str) -> Any:
        try:
            return retry_call(
                fn, attempts=self.attempts, is_retriable=is_transient_gcs_error, what=what
            )
        except FileNotFoundError:
            raise
        except Exception as exc:
            if _is_not_found(exc):
                raise FileNotFoundError(f"{what}: not found ({exc})") from exc
            if is_permanent_error(exc):
                raise StorageError(
                    f"{what} failed (not retried: {describe_error(exc)})", permanent=True
                ) from exc
            raise StorageError(
                f"{what} failed after {self.attempts} attempts: {describe_error(exc)}"
            ) from exc

    # -- transfers ------------------------------------------------------------------------
    def _upload_file(self, path: Path, uri: str, check: UploadCheck | None) -> StoredFile:
        if check is not None:
            check()
        size = path.stat().st_size

        def upload() -> StoredFile:
            blob = self._blob(uri)
            if size > self.chunked_threshold:
                blob.chunk_size = self.chunk_size
            blob.upload_from_filename(
                str(path), checksum="crc32c", retry=None, timeout=self.timeout_s
            )
            return StoredFile(int(blob.size or size), str(blob.generation or ""))

        stored: StoredFile = self._retry(upload, f"upload {path} -> {uri}")
        return stored

    def _download_file(self, uri: str, path: Path) -> int:
        path.parent.mkdir(parents=True, exist_ok=True)

        def download() -> None:
            blob = self._blob(uri)
            blob.reload(retry=None, timeout=self.timeout_s)  # size, crc32c, media link
            if blob.content_encoding or not blob.crc32c or not blob.media_link:
                # Transcoded (e.g. gzip) objects: the library's own download decodes them.
                blob.download_to_filename(
                    str(path), checksum="crc32c", retry=None, timeout=self.timeout_s
                )
                return
            _stream_to_file(self.client._http, blob, path, self.timeout_s)

        self._retry(download, f"download {uri} -> {path}")
        return path.stat().st_size

    def _parallel(self, jobs: Iterable[Callable[[], int]]) -> TransferStats:
        start = time.perf_counter()
        stats = TransferStats()
        job_list = list(jobs)
        if not job_list:
            return stats
        with ThreadPoolExecutor(max_workers=min(self.max_workers, len(job_list))) as pool:
            for size in pool.map(lambda job: job(), job_list):
                stats.files += 1
                stats.bytes += size
        stats.seconds = time.perf_counter() - start
        return stats

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
        dest = dest_uri.rstrip("/")
        start = time.perf_counter()
        stats = TransferStats()
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

    def download_dir(self, src_uri: str, local_dir: Path) -> TransferStats:
        """Download every object below ``src_uri`` in parallel."""
        rels = self.list_files(src_uri)
        if not rels:
            raise FileNotFoundError(f"checkpoint folder {src_uri} holds no objects")
        src = src_uri.rstrip("/")
        root = Path(local_dir)
        return self._parallel(
            functools.partial(self._download_file, f"{src}/{r}", root / r) for r in rels
        )

    # -- small objects --------------------------------------------------------------------
    def write_bytes(self, uri: str, data: bytes) -> None:
        """One object write (GCS object writes are atomic)."""
        self._retry(
            lambda: self._blob(uri).upload_from_string(
                data, checksum="crc32c", retry=None, timeout=self.timeout_s
            ),
            f"write {uri}",
        )

    def read_bytes(self, uri: str) -> bytes:
        """Read one object; FileNotFoundError when missing."""
        data: bytes = self._retry(
            lambda: self._blob(uri).download_as_bytes(retry=None, timeout=self.timeout_s),
            f"read {uri}",
        )
        return data

    def exists(self, uri: str) -> bool:
        """Whether the object exists."""
        return bool(
            self._retry(
                lambda: self._blob(uri).exists(retry=None, timeout=self.timeout_s), f"stat {uri}"
            )
        )

    def list_dirs(self, uri: str) -> list[str]:
        """Immediate 'folders' (common prefixes) below ``uri``."""
        bucket, key = split_gcs_uri(uri)
        prefix = f"{key}/" if key else ""

        def list_prefixes() -> list[str]:
            it = self.client.list_blobs(
                bucket, prefix=prefix, delimiter="/", retry=None, timeout=self.timeout_s
            )
            for _ in it:  # consume pages so .prefixes is complete
                pass
            return sorted(p[len(prefix) :].rstrip("/") for p in it.prefixes)

        result: list[str] = self._retry(list_prefixes, f"list {uri}")
        return result

    def list_files(self, uri: str) -> list[str]:
        """Every object below ``uri``, relative to it."""
        bucket, key = split_gcs_uri(uri)
        prefix = f"{key}/" if key else ""

        def list_all() -> list[str]:
            return sorted(
                b.name[len(prefix) :]
                for b in self.client.list_blobs(
                    bucket, prefix=prefix, retry=None, timeout=self.timeout_s
                )
            )

        result: list[str] = self._retry(list_all, f"list {uri}")
        return result

    def list_stored(self, uri: str, *, fingerprints: bool = True) -> dict[str, StoredFile]:
        """Every object below ``uri`` with its size and generation."""
        bucket, key = split_gcs_uri(uri)
        prefix = f"{key}/" if key else ""

        def list_all() -> dict[str, StoredFile]:
            return {
                b.name[len(prefix) :]: StoredFile(int(b.size or 0), str(b.generation or ""))
                for b in self.client.list_blobs(
                    bucket, prefix=prefix, retry=None, timeout=self.timeout_s
                )
            }

        result: dict[str, StoredFile] = self._retry(list_all, f"list {uri}")
        return result

    def delete_dir(self, uri: str) -> None:
        """Delete every object below ``uri`` (in parallel)."""
        rels = self.list_files(uri)
        base = uri.rstrip("/")

        def delete(rel: str) -> int:
            def op() -> None:
                try:
                    self._blob(f"{base}/{rel}").delete(retry=None, timeout=self.timeout_s)
                except Exception as exc:
                    if not _is_not_found(exc):
                        raise

            self._retry(op, f"delete {base}/{rel}")
            return 0

        self._parallel(functools.partial(delete, r) for r in rels)


#: Piece size of :func:`_stream_to_file`: google-cloud-storage's own download writes 8 KiB
#: pieces from Python, which caps it at a few hundred MiB/s of one core.
_STREAM_CHUNK = 4 * 2**20


def _stream_to_file(session: Any, blob: Any, path: Path, timeout_s: float) -> None:
    """Download ``blob`` (its metadata loaded, not transcoded) to ``path`` in 4 MiB pieces over
    the client's authorized session, checking its size and crc32c; the media link names the
    object's generation, so a concurrent rewrite cannot mix two versions. A short or corrupt
    body raises ``ConnectionError`` (retried); the partial file is removed."""
    import google_crc32c
    import requests
    from google.api_core import exceptions

    crc = google_crc32c.Checksum()
    size = 0
    try:
        with session.get(blob.media_link, stream=True, timeout=timeout_s) as resp:
            if resp.status_code >= 400:
                raise exceptions.from_http_response(resp)
            with open(path, "wb") as fh:
                for chunk in resp.iter_content(chunk_size=_STREAM_CHUNK):
                    crc.update(chunk)
                    fh.write(chunk)
                    size += len(chunk)
        if size != int(blob.size or 0) or base64.b64encode(crc.digest()).decode() != blob.crc32c:
            raise ConnectionError(
                f"download of {blob.name}: {size} bytes, crc32c "
                f"{base64.b64encode(crc.digest()).decode()}; expected {blob.size} bytes, "
                f"crc32c {blob.crc32c}"
            )
    except requests.exceptions.ChunkedEncodingError as exc:
        path.unlink(missing_ok=True)
        raise ConnectionError(f"download of {blob.name} interrupted: {exc}") from exc
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def _is_not_found(exc: BaseException) -> bool:
    return getattr(exc, "code", None) == 404


def _make_client(pool_size: int) -> Any:
    try:
        from google.cloud import storage
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise StorageError(
            "gs:// storage needs google-cloud-storage: pip install 'trainjob-operator[gcs]'"
        ) from exc
    project = os.environ.get("GOOGLE_CLOUD_PROJECT")
    if os.environ.get("STORAGE_EMULATOR_HOST"):
        from google.auth.credentials import AnonymousCredentials

        client = storage.Client(
            project=project or "trainjob-emulator", credentials=AnonymousCredentials()
        )
    else:
        client = storage.Client(project=project)
    try:  # room for every upload thread in the HTTP connection pool
        import requests.adapters

        adapter = requests.adapters.HTTPAdapter(
            pool_connections=pool_size, pool_maxsize=pool_size * 2
        )
        client._http.mount("https://", adapter)
        client._http.mount("http://", adapter)
    except Exception:  # noqa: BLE001 - best effort; the default pool still works
        pass
    return client
