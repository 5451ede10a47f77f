"""``Checkpoint.as_directory()``'s download of a checkpoint in storage, shared by a node.

As Ray Train's ``Checkpoint.as_directory``: when several processes of one machine (the ranks
of a worker group that resume from the same checkpoint) open the same checkpoint at once, one
downloads it and the others wait, then all read the same folder; the last to leave deletes it.
Without this every rank downloaded the whole checkpoint for itself: two ranks of a sharded
1 GiB checkpoint fetched 2 GiB.

The folder is ``<tmp>/trainjob_checkpoint_<hash of the path>``. An ``flock`` on one of
:data:`LOCK_STRIPES` files in ``<tmp>/trainjob_checkpoint_locks/`` (picked by the same hash) is
held while the folder is downloaded, checked or deleted: the downloader holds it for the whole
download, so the others wait on it. Lock files are never deleted (a waiter could lock a deleted
file while a newcomer locks a new one), hence a fixed number of them. Next to the folder:

* ``<folder>.readers/``: one file per process using the folder, ``flock``-ed by it while it
  does; a file nobody holds is a reader that died (its lock went with it) and does not count;
* ``<folder>.complete``: the listing (sizes and generations) the folder was downloaded from.
  A folder is reused only when the checkpoint's listing is still the same, so a path written
  again (a run started over) is downloaded again; when its content changed while another
  process still reads the old copy, this process downloads a private copy instead.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from trainer_runtime.storage.base import Storage

#: Prefix of the shared folders in the temp dir.
SHARED_PREFIX = "trainjob_checkpoint_"
#: How many lock files the shared folders of a machine share (two checkpoints whose hashes
#: pick the same one wait for each other's download).
LOCK_STRIPES = 16


def shared_folder(path: str) -> Path:
    """The node-wide folder the checkpoint at ``path`` is downloaded to."""
    digest = hashlib.sha256(path.encode()).hexdigest()[:32]
    return Path(tempfile.gettempdir()) / f"{SHARED_PREFIX}{digest}"


@contextlib.contextmanager
def _flock(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` (created when missing)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _live_readers(readers: Path) -> int:
    """Readers still holding their file; files of dead readers are removed."""
    live = 0
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(readers):
            try:
                fd = os.open(entry.path, os.O_RDWR)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                live += 1
            else:  # nobody holds it: its process is gone
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
            finally:
                os.close(fd)
    return live


def _listing(storage: Storage, path: str) -> str:
    stored = storage.list_stored(path)
    return json.dumps({rel: f.to_json() for rel, f in sorted(stored.items())})


@contextlib.contextmanager
def shared_directory(
    path: str, storage: Storage, download: Callable[[Path], None]
) -> Iterator[str]:
    """A local copy of the checkpoint at ``path``, downloaded once per machine by
    ``download(folder)`` and shared with every process that opens it at the same time."""
    folder = shared_folder(path)
    locks = folder.with_name(f"{SHARED_PREFIX}locks")
    locks.mkdir(exist_ok=True)
    lock = locks / f"{int(folder.name[len(SHARED_PREFIX) :], 16) % LOCK_STRIPES}.lock"
    readers = folder.with_name(folder.name + ".readers")
    complete = folder.with_name(folder.name + ".complete")
    me = readers / f"{os.getpid()}-{uuid.uuid4().hex}"
    me_fd: int | None = None
    private: str | None = None
    try:
        with _flock(lock):
            listing = _listing(storage, path)
            readers.mkdir(exist_ok=True)
            done = complete.read_text() if complete.exists() else None
            if done != listing:
                if done is not None and _live_readers(readers):
                    # Others read an older copy of this path: leave it to them.
                    private = tempfile.mkdtemp(prefix="checkpoint_")
                else:
                    complete.unlink(missing_ok=True)
                    shutil.rmtree(folder, ignore_errors=True)
                    folder.mkdir()
                    download(folder)
                    complete.write_text(listing)
            if private is None:
                me_fd = os.open(me, os.O_RDWR | os.O_CREAT, 0o600)
                fcntl.flock(me_fd, fcntl.LOCK_EX)
        if private is not None:
            download(Path(private))
            yield private
        else:
            yield str(folder)
    finally:
        if private is not None:
            shutil.rmtree(private, ignore_errors=True)
        if me_fd is not None:
            with contextlib.suppress(FileNotFoundError):
                me.unlink()
            os.close(me_fd)
            with _flock(lock):
                if not _live_readers(readers):
                    complete.unlink(missing_ok=True)
                    shutil.rmtree(folder, ignore_errors=True)
                    with contextlib.suppress(OSError):
                        readers.rmdir()
