"""Fencing: one driver at a time writes to a run folder.

A driver that starts (the run's owner: ``trainjob run``, the in-pod driver, ``fit()``) takes
the run over by writing ``<run>/.trainjob_driver.json`` with an epoch one above the one it
found. Everything that writes into the run folder on that driver's behalf does so through a
:class:`FencedStorage`: a storage wrapper that checks the epoch before every write (each file
of an upload, each ``write_bytes``, each ``delete_dir``), so no write site checks by hand:

* workers (``TrainSession``) check at most once per ``check_interval_s`` (remote storage
  costs a read per check), so the workers of a driver that was killed stop uploading within
  about a second once a new driver took over;
* the driver (its ``CheckpointManager``) checks before every write (commit markers, the
  manifest, deletions), so a driver that lost the run (e.g. it was partitioned away and a
  new one started) can never commit into it.

A writer that finds a newer epoch raises :class:`~trainer_runtime.errors.FencedError`.
What a fenced writer stored already is never committed: the new driver deletes folders
without a valid commit marker, and a commit checks every file against what the ranks
reported (:meth:`~trainer_runtime.checkpoint_manager.CheckpointManager.commit`).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from trainer_runtime._layout import DRIVER_FILE
from trainer_runtime.errors import FencedError
from trainer_runtime.storage import Storage, TransferStats, join_uri
from trainer_runtime.storage.base import StoredFile, UploadCheck


def driver_file_uri(run_path: str) -> str:
    """Where the run's owner is recorded."""
    return join_uri(run_path, DRIVER_FILE)


def read_epoch(storage: Storage, run_path: str) -> int:
    """The epoch of the driver that owns the run now (0 when none ever did)."""
    try:
        data = json.loads(storage.read_bytes(driver_file_uri(run_path)))
    except FileNotFoundError:
        return 0
    except (ValueError, IsADirectoryError):
        return 0  # damaged: the next take-over rewrites it
    epoch = data.get("epoch") if isinstance(data, dict) else None
    return epoch if isinstance(epoch, int) and not isinstance(epoch, bool) else 0


def take_over(storage: Storage, run_path: str) -> int:
    """Become the run's driver: write and return an epoch above the current one."""
    epoch = read_epoch(storage, run_path) + 1
    record: dict[str, Any] = {
        "epoch": epoch,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started_at": time.time(),
    }
    storage.write_bytes(driver_file_uri(run_path), json.dumps(record).encode())
    return epoch


class FenceCheck:
    """A callable that raises :class:`FencedError` once a newer driver owns the run.

    Calls closer than ``check_interval_s`` to the last read return at once (an upload of
    many small files reads the epoch about once a second, not once a file).
    """

    def __init__(
        self, storage: Storage, run_path: str, epoch: int, check_interval_s: float = 1.0
    ) -> None:
        self.storage = storage
        self.run_path = run_path
        self.epoch = epoch
        self.check_interval_s = check_interval_s
        self._last = -float("inf")
        self._fenced: FencedError | None = None
        self._lock = threading.Lock()

    def __call__(self, force: bool = False) -> None:
        """Raise FencedError when another driver took the run over (and from then on)."""
        with self._lock:
            if self._fenced is not None:
                raise self._fenced
            now = time.monotonic()
            if not force and now - self._last < self.check_interval_s:
                return
            self._last = now
        current = read_epoch(self.storage, self.run_path)
        if current != self.epoch:
            error = FencedError(
                f"run folder {self.run_path} was taken over by another driver (epoch "
                f"{current}, this process writes for epoch {self.epoch}); stopping so that "
                "nothing of this attempt lands in the run"
            )
            with self._lock:
                self._fenced = error
            raise error


class FencedStorage(Storage):
    """``inner`` with ``fence`` called before every write; reads pass straight through.

    The one place fencing is applied: whoever writes into a run folder on a driver's behalf
    is handed this wrapper (with a :class:`FenceCheck` of the driver's epoch) instead of
    the plain storage. ``fence`` raises (:class:`FencedError`) to stop the write.
    """

    def __init__(self, inner: Storage, fence: Callable[[], None]) -> None:
        self.inner = inner
        self.fence = fence
        self.filesystem = inner.filesystem

    def upload_dir(
        self,
        local_dir: Path,
        dest_uri: str,
        *,
        files: Sequence[str] | None = None,
        check: UploadCheck | None = None,
        consume_source: bool = False,
    ) -> TransferStats:
        """Upload, checking the fence before each file (then the caller's ``check``)."""

        def fenced() -> None:
            self.fence()
            if check is not None:
                check()

        return self.inner.upload_dir(
            local_dir, dest_uri, files=files, check=fenced, consume_source=consume_source
        )

    def download_dir(self, src_uri: str, local_dir: Path) -> TransferStats:
        """A read: not fenced."""
        return self.inner.download_dir(src_uri, local_dir)

    def write_bytes(self, uri: str, data: bytes) -> None:
        """Check the fence, then write."""
        self.fence()
        self.inner.write_bytes(uri, data)

    def read_bytes(self, uri: str) -> bytes:
        """A read: not fenced."""
        return self.inner.read_bytes(uri)

    def exists(self, uri: str) -> bool:
        """A read: not fenced."""
        return self.inner.exists(uri)

    def list_dirs(self, uri: str) -> list[str]:
        """A read: not fenced."""
        return self.inner.list_dirs(uri)

    def list_files(self, uri: str) -> list[str]:
        """A read: not fenced."""
        return self.inner.list_files(uri)

    def list_stored(self, uri: str, *, fingerprints: bool = True) -> dict[str, StoredFile]:
        """A read: not fenced."""
        return self.inner.list_stored(uri, fingerprints=fingerprints)

    def delete_dir(self, uri: str) -> None:
        """Check the fence, then delete."""
        self.fence()
        self.inner.delete_dir(uri)

    def local_path(self, uri: str) -> Path | None:
        """The inner storage's local path."""
        return self.inner.local_path(uri)
