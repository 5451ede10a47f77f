"""The layout of a run folder: the names the runtime writes, in one place.

A run folder (``<storage_path>/<name>``) holds:

* ``checkpoint_manifest.json``: the kept checkpoints (see ``checkpoint_manager``);
* ``.trainjob_driver.json``: which driver owns the run now (see ``_fencing``);
* one folder per committed checkpoint, each with a commit marker
  ``.trainjob_committed.json`` that lists every file of the checkpoint.

These names are reserved: ``report(checkpoint_dir_name=...)`` refuses them, and so it
refuses any name starting with ``.`` (the runtime's temporary files start with one).
"""

from __future__ import annotations

import re

MANIFEST_FILE = "checkpoint_manifest.json"
COMMIT_MARKER = ".trainjob_committed.json"
DRIVER_FILE = ".trainjob_driver.json"

RESERVED_NAMES = frozenset({MANIFEST_FILE, COMMIT_MARKER, DRIVER_FILE})

STORE_TEMP_SUFFIX = ".storing"
"""A file being stored is written as ``.<name>.<random>.storing`` next to ``<name>`` and renamed
over it when whole (the local and pyarrow storages)."""


def is_store_temp(rel: str) -> bool:
    """Whether ``rel`` (a path in a checkpoint) is a store's temporary file, not a file of the
    checkpoint: one a writer killed mid-store (a worker of an earlier attempt) left behind."""
    name = rel.rsplit("/", 1)[-1]
    return name.startswith(".") and name.endswith(STORE_TEMP_SUFFIX) and name.count(".") >= 3


_DEFAULT_NAME = re.compile(r"^checkpoint_(\d{6,})$")


def default_checkpoint_dir_name(round_index: int) -> str:
    """The folder name of the checkpoint reported in round ``round_index``."""
    return f"checkpoint_{round_index:06d}"


def round_of_default_name(name: str) -> int | None:
    """The round a default checkpoint folder name stands for (None for other names)."""
    match = _DEFAULT_NAME.match(name)
    return int(match.group(1)) if match else None


def checkpoint_dir_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a checkpoint folder name, or None when it can."""
    if not isinstance(name, str) or not name:
        return "it must be a non-empty string"
    if "/" in name or "\\" in name or name in (".", ".."):
        return "use a plain folder name, without '/'"
    if name.startswith("."):
        return "names starting with '.' are reserved for the runtime's own files"
    if name in RESERVED_NAMES:
        return f"{name!r} is the name of a file the runtime keeps in the run folder"
    return None
