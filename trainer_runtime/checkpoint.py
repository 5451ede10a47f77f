"""``Checkpoint``: a folder of files, local or in storage (same API as ``ray.train.Checkpoint``)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from enum import StrEnum
from pathlib import Path
from typing import Any

from trainer_runtime._layout import COMMIT_MARKER
from trainer_runtime._shared_download import shared_directory
from trainer_runtime.storage import get_storage, pyarrow_filesystem
from trainer_runtime.storage.base import uri_scheme

__all__ = ["COMMIT_MARKER", "METADATA_FILE", "Checkpoint", "CheckpointUploadMode"]

METADATA_FILE = ".metadata.json"


class CheckpointUploadMode(StrEnum):
    """How ``report()`` persists a checkpoint.

    * ``SYNC``: upload before ``report()`` returns.
    * ``ASYNC``: hand the folder to a background uploader and return at once;
      the checkpoint is committed when the upload finishes.
    * ``NO_UPLOAD``: the checkpoint is already in its final storage location.
    """

    SYNC = "sync"
    ASYNC = "async"
    NO_UPLOAD = "no_upload"

    @classmethod
    def parse(cls, value: CheckpointUploadMode | str) -> CheckpointUploadMode:
        """Accept the enum or its name/value (case-insensitive); clear error otherwise."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            key = value.strip().lower().replace("-", "_")
            aliases = {"none": "no_upload", "noupload": "no_upload"}
            key = aliases.get(key, key)
            # A dict lookup, not a loop over the members: report() parses its mode on every
            # call, and reading each member's ``.value`` was a quarter of a report()'s time.
            mode = _UPLOAD_MODES.get(key)
            if mode is not None:
                return mode
        valid = ", ".join(f"CheckpointUploadMode.{m.name}" for m in cls)
        raise ValueError(f"checkpoint_upload_mode={value!r} is not valid; use one of {valid}")


_UPLOAD_MODES: dict[str, CheckpointUploadMode] = {m.value: m for m in CheckpointUploadMode}


class Checkpoint:
    """A checkpoint folder at ``path``: a local folder, a URI (``gs://``, ``s3://`` ...), or a
    path on ``filesystem`` (a ``pyarrow.fs.FileSystem``, its scheme stripped), as
    ``ray.train.Checkpoint(path, filesystem=None)``."""

    def __init__(self, path: str | os.PathLike[str], filesystem: Any = None) -> None:
        text = os.fspath(path)
        self._filesystem = filesystem
        if filesystem is not None or uri_scheme(text) not in (None, "file"):
            self.path: str = text.rstrip("/") or "/"
        else:
            self.path = os.path.abspath(text.removeprefix("file://"))

    @property
    def filesystem(self) -> Any:
        """The ``pyarrow.fs.FileSystem`` of :attr:`path` (as Ray Train's): the one given, else
        the one its URI names (``pyarrow.fs.LocalFileSystem`` for a local folder)."""
        return pyarrow_filesystem(self.path, self._filesystem)

    @property
    def _storage(self) -> Any:
        return get_storage(self.path, self._filesystem)

    @classmethod
    def from_directory(cls, path: str | os.PathLike[str]) -> Checkpoint:
        """A checkpoint of the files in a local folder (e.g. written by the train loop)."""
        return cls(path)

    @property
    def is_local(self) -> bool:
        """Whether the checkpoint's files are on this machine's filesystem."""
        if self._filesystem is not None:
            return getattr(self._filesystem, "type_name", "") == "local"
        return uri_scheme(self.path) is None

    def to_directory(self, path: str | os.PathLike[str] | None = None) -> str:
        """Copy (or download) the checkpoint's files into ``path`` (a new temp dir by default).

        The run's commit marker is not copied: a copy is not a committed checkpoint, and
        reporting it again must not carry the old checkpoint's marker along.
        """
        target = Path(path) if path is not None else Path(tempfile.mkdtemp(prefix="checkpoint_"))
        target.mkdir(parents=True, exist_ok=True)
        if self.is_local:
            src = Path(self.path)
            if not src.is_dir():
                raise FileNotFoundError(f"checkpoint folder {self.path} does not exist")
            if src.resolve() != target.resolve():
                shutil.copytree(src, target, dirs_exist_ok=True, ignore=_skip_commit_marker(src))
        else:
            self._download(target)
        return str(target)

    @contextlib.contextmanager
    def as_directory(self) -> Iterator[str]:
        """A local folder holding the files: the folder itself when local, else a temp copy.

        As Ray Train's: the processes of one machine that open the same checkpoint at once
        share one download of it (one process downloads, the others wait for it); the copy is
        deleted when the last of them leaves it. Treat the folder as read-only: when local it
        is the checkpoint itself, else it is shared.
        """
        if self.is_local:
            yield self.path
            return
        with shared_directory(self.path, self._storage, self._download) as folder:
            yield folder

    def _download(self, target: Path) -> None:
        """Download the files into the existing folder ``target``, less the commit marker."""
        self._storage.download_dir(self.path, target)
        (target / COMMIT_MARKER).unlink(missing_ok=True)

    def get_metadata(self) -> dict[str, Any]:
        """The user metadata stored with the checkpoint (``{}`` when none)."""
        storage = self._storage
        try:
            data = storage.read_bytes(f"{self.path}/{METADATA_FILE}")
        except FileNotFoundError:
            return {}
        loaded: dict[str, Any] = json.loads(data)
        return loaded

    def set_metadata(self, metadata: dict[str, Any]) -> None:
        """Replace the metadata (JSON-serialisable dict)."""
        try:
            data = json.dumps(metadata, sort_keys=True).encode()
        except TypeError as exc:
            raise TypeError(f"checkpoint metadata must be JSON-serialisable: {exc}") from exc
        self._storage.write_bytes(f"{self.path}/{METADATA_FILE}", data)

    def update_metadata(self, metadata: dict[str, Any]) -> None:
        """Merge ``metadata`` into the stored metadata."""
        merged = self.get_metadata()
        merged.update(metadata)
        self.set_metadata(merged)

    def __repr__(self) -> str:
        # Ray Train's form, e.g. Checkpoint(filesystem=local, path=/tmp/run/checkpoint_000001)
        if self._filesystem is not None:
            filesystem = getattr(self._filesystem, "type_name", type(self._filesystem).__name__)
        else:
            scheme = uri_scheme(self.path)
            filesystem = "local" if scheme is None else {"gs": "gcs"}.get(scheme, scheme)
        return f"Checkpoint(filesystem={filesystem}, path={self.path})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Checkpoint) and other.path == self.path

    def __hash__(self) -> int:
        return hash(self.path)

    def __reduce__(self) -> tuple[type[Checkpoint], tuple[str, Any]]:
        return (Checkpoint, (self.path, self._filesystem))


def _skip_commit_marker(root: Path) -> Callable[[str, list[str]], list[str]]:
    """A ``shutil.copytree`` ``ignore`` that leaves out ``root``'s commit marker."""

    def ignore(folder: str, names: list[str]) -> list[str]:
        return [COMMIT_MARKER] if COMMIT_MARKER in names and Path(folder) == root else []

    return ignore
