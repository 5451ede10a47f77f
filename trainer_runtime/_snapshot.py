"""What a rank reported: the files of a checkpoint folder at ``report()`` time.

``report()`` lists the folder (names, sizes, modification times). The upload stores
exactly those files and checks, before and after, that the folder still holds them
unchanged: a folder deleted, emptied or rewritten before its upload finished (e.g. the
same folder reported again for the next checkpoint) fails that report instead of
committing a checkpoint with missing files or files of another round. Files added after
``report()`` (another rank's shards written into the same local folder) are left out of
this report's upload and are no error.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from trainer_runtime._layout import COMMIT_MARKER
from trainer_runtime.errors import CheckpointSourceError

_FIX = (
    "Write each checkpoint into a new folder (e.g. tempfile.mkdtemp()) and leave it alone "
    "until the upload is done: with CheckpointUploadMode.ASYNC the upload runs after "
    "report() returns, and the folder is deleted for you afterwards"
)


@dataclass(frozen=True)
class FolderSnapshot:
    """The files of a folder: relative path -> (size, mtime in ns)."""

    root: Path
    files: dict[str, tuple[int, int]]
    #: The folder held a commit marker (left out of ``files``): it is, or was copied from, a
    #: committed checkpoint.
    has_commit_marker: bool = False

    @property
    def total_bytes(self) -> int:
        """Bytes in all files."""
        return sum(size for size, _ in self.files.values())

    def verify(self, when: str) -> None:
        """Raise :class:`CheckpointSourceError` unless the folder still matches."""
        if not self.root.is_dir():
            raise CheckpointSourceError(
                f"checkpoint folder {self.root} was deleted {when}; it held "
                f"{len(self.files)} file(s) when report() was called. {_FIX}"
            )
        now = take_snapshot(self.root).files
        if now == self.files:
            return
        # Files added since report() are not stored and do not tear this checkpoint: ranks
        # on one machine may write their shards into one folder and each report it (Ray
        # Train allows it). Only the files this report listed must stay as they were.
        gone = sorted(set(self.files) - set(now))
        changed = sorted(r for r in set(now) & set(self.files) if now[r] != self.files[r])
        if not gone and not changed:
            return
        parts = [
            f"{label}: {_names(names)}"
            for label, names in (("removed", gone), ("rewritten", changed))
            if names
        ]
        raise CheckpointSourceError(
            f"checkpoint folder {self.root} changed {when} ({'; '.join(parts)}), so the "
            f"stored copy could mix files of different checkpoints. {_FIX}"
        )


def _names(names: list[str], limit: int = 5) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def take_snapshot(root: Path) -> FolderSnapshot:
    """List ``root``'s files (the commit marker of a committed checkpoint left out).

    As ``os.walk``: symlinked folders are not entered, a symlinked file counts with its
    target's size, and unreadable folders or vanished files are skipped. One ``scandir``
    per folder and one ``stat`` per file: this runs in ``report()``'s calling thread.
    """
    files: dict[str, tuple[int, int]] = {}
    marker = _list_into(files, str(root), "")
    return FolderSnapshot(root, files, marker)


def _list_into(files: dict[str, tuple[int, int]], folder: str, prefix: str) -> bool:
    """Add ``folder``'s files to ``files``; True when it holds ``prefix + COMMIT_MARKER``."""
    marker = False
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return marker
    for entry in entries:
        try:
            is_dir = entry.is_dir()
        except OSError:
            is_dir = False
        if is_dir:
            if not entry.is_symlink():
                _list_into(files, entry.path, f"{prefix}{entry.name}/")
            continue
        rel = prefix + entry.name
        if rel == COMMIT_MARKER:
            marker = True
            continue
        try:
            st = entry.stat()
        except FileNotFoundError:
            continue
        files[rel] = (st.st_size, st.st_mtime_ns)
    return marker
