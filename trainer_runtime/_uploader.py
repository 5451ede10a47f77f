"""The background checkpoint uploader of one worker process.

``submit`` hands a folder over and returns at once unless ``max_pending``
uploads are already queued (backpressure instead of filling the disk). Uploads
run one after another, so checkpoints are stored in report order. After a
failure every later upload is dropped (a later checkpoint must not be
committed before an earlier one) and the error is raised by the next
``raise_if_failed()``, i.e. at the next ``report()`` or when the run ends.

The uploader thread runs at a lower CPU priority (``TRAINJOB_UPLOAD_NICE``, default 10 nice
levels; the threads it starts inherit it): where an upload and the training step compete
for a core, the step wins and the upload takes the idle time.
"""

from __future__ import annotations

import logging
import os
import queue
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trainer_runtime._snapshot import FolderSnapshot, take_snapshot
from trainer_runtime.errors import CheckpointUploadError
from trainer_runtime.storage import Storage, TransferStats
from trainer_runtime.storage.base import describe_error

logger = logging.getLogger(__name__)

#: Nice levels the uploader thread adds to its own (0: the process's priority).
UPLOAD_NICE_ENV = "TRAINJOB_UPLOAD_NICE"
DEFAULT_UPLOAD_NICE = 10


def lower_thread_priority(levels: int) -> int | None:
    """Add ``levels`` nice levels (up to 19) to the calling thread, and so to the threads it
    starts from now on (Linux: nice is per thread). Returns the new nice value; None where
    the platform has no per-thread priority or refused."""
    if levels <= 0 or not hasattr(os, "setpriority"):
        return None
    try:
        tid = threading.get_native_id()
        nice = min(19, os.getpriority(os.PRIO_PROCESS, tid) + levels)
        os.setpriority(os.PRIO_PROCESS, tid, nice)
        return nice
    except OSError as exc:  # a sandbox without setpriority: run at the process's priority
        logger.debug("cannot lower the uploader's priority: %s", exc)
        return None


def _upload_nice() -> int:
    raw = os.environ.get(UPLOAD_NICE_ENV, "")
    try:
        return int(raw) if raw else DEFAULT_UPLOAD_NICE
    except ValueError:
        logger.warning("Ignoring %s=%r (not an integer)", UPLOAD_NICE_ENV, raw)
        return DEFAULT_UPLOAD_NICE


@dataclass
class UploadJob:
    """One checkpoint folder to store: exactly the files ``snapshot`` lists."""

    round: int
    local_dir: Path
    dest_uri: str
    delete_after: bool
    #: The folder as ``report()`` saw it (default: listed when the job is made).
    snapshot: FolderSnapshot | None = None
    #: ``report(checkpoint_upload_fn=...)``: stores the checkpoint itself (and deletes the
    #: source when asked); returns the stored folder. No snapshot or copy of ours then.
    upload_fn: Callable[[], str] | None = None
    #: Asked once before anything is stored: False when the report round was already
    #: committed without this rank (``relax_collectives_on_preemption``), and the upload is
    #: skipped so that nothing is written into a committed checkpoint's folder.
    claim: Callable[[], bool] | None = None

    def __post_init__(self) -> None:
        if self.snapshot is None and self.upload_fn is None:
            self.snapshot = take_snapshot(self.local_dir)


OnDone = Callable[[UploadJob, TransferStats], None]
OnFailed = Callable[[UploadJob, BaseException], None]


def run_upload(storage: Storage, job: UploadJob) -> TransferStats | None:
    """Store the reported files, check the folder did not change meanwhile, then delete the
    local copy when asked (and not the same folder).

    Returns None, storing nothing, when ``job.claim`` refuses the upload (its round was
    committed without this rank). Raises :class:`~trainer_runtime.errors.CheckpointSourceError`
    when the folder vanished or changed since ``report()``: the checkpoint must not be
    committed.
    """
    if job.claim is not None and not job.claim():
        logger.warning(
            "Not storing checkpoint %s: report round %d was committed without this rank "
            "(relax_collectives_on_preemption)",
            job.dest_uri,
            job.round,
        )
        if job.delete_after:
            shutil.rmtree(job.local_dir, ignore_errors=True)
        return None
    if job.upload_fn is not None:
        start = time.perf_counter()
        job.dest_uri = job.upload_fn()
        return TransferStats(seconds=time.perf_counter() - start)
    snapshot = job.snapshot
    assert snapshot is not None
    snapshot.verify("before its upload started")
    try:
        stats = storage.upload_dir(
            job.local_dir,
            job.dest_uri,
            files=sorted(snapshot.files),
            consume_source=job.delete_after,
        )
    except FileNotFoundError:
        snapshot.verify("while it was being uploaded")  # names the folder and the fix
        raise
    snapshot.verify("while it was being uploaded")
    if job.delete_after:
        local = storage.local_path(job.dest_uri)
        if local is None or local.resolve() != job.local_dir.resolve():
            shutil.rmtree(job.local_dir, ignore_errors=True)
    return stats


class AsyncUploader:
    """A daemon thread draining a bounded FIFO of :class:`UploadJob`."""

    def __init__(
        self, storage: Storage, on_done: OnDone, on_failed: OnFailed, max_pending: int = 2
    ) -> None:
        self.storage = storage
        self._on_done = on_done
        self._on_failed = on_failed
        self._queue: queue.Queue[UploadJob | None] = queue.Queue(maxsize=max_pending)
        self._error: BaseException | None = None
        self._error_lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="checkpoint-uploader", daemon=True)
        self._thread.start()
        self.blocked_seconds = 0.0

    def submit(self, job: UploadJob) -> None:
        """Queue a folder (blocks only while ``max_pending`` uploads are waiting)."""
        self.raise_if_failed()
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            start = time.perf_counter()
            logger.info("Checkpoint upload queue full; waiting (backpressure)")
            self._queue.put(job)
            self.blocked_seconds += time.perf_counter() - start

    def raise_if_failed(self) -> None:
        """Raise the first upload error, if any."""
        with self._error_lock:
            error = self._error
        if error is not None:
            raise CheckpointUploadError(
                f"an earlier checkpoint upload failed: {describe_error(error)}"
            ) from error

    @property
    def pending(self) -> int:
        """Uploads queued or running."""
        return self._queue.unfinished_tasks

    def drain(self) -> None:
        """Wait for every queued upload, then raise the first error, if any."""
        self._queue.join()
        self.raise_if_failed()

    def close(self) -> None:
        """Finish the queue and stop the thread."""
        self._queue.put(None)
        self._thread.join()

    def _loop(self) -> None:
        lower_thread_priority(_upload_nice())
        while True:
            job = self._queue.get()
            try:
                if job is None:
                    return
                with self._error_lock:
                    failed = self._error is not None
                if failed:
                    logger.warning("Dropping upload of %s after an earlier failure", job.dest_uri)
                    continue
                try:
                    stats = run_upload(self.storage, job)
                except BaseException as exc:  # noqa: BLE001 - reported, never lost
                    logger.error(
                        "Checkpoint upload to %s failed: %s", job.dest_uri, describe_error(exc)
                    )
                    with self._error_lock:
                        self._error = exc
                    self._on_failed(job, exc)
                else:
                    if stats is not None:
                        self._on_done(job, stats)
            finally:
                self._queue.task_done()
