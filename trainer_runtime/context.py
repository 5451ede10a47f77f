"""``get_context()``: who this worker is within the run, and where the run stores things."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainer_runtime.storage import join_uri, pyarrow_filesystem


@dataclass(frozen=True)
class StorageInfo:
    """Where the run keeps checkpoints (the shape of Ray's ``StorageContext``).

    Paths are local paths, URIs (``gs://``, ``s3://`` ...) or, with
    ``RunConfig(storage_filesystem=...)``, paths on that filesystem.
    """

    storage_path: str
    experiment_name: str
    #: ``RunConfig.storage_filesystem`` (None: resolved from the path).
    custom_filesystem: Any = None

    @property
    def storage_filesystem(self) -> Any:
        """The ``pyarrow.fs.FileSystem`` of the storage (as Ray's
        ``StorageContext.storage_filesystem``; needs pyarrow)."""
        return pyarrow_filesystem(self.storage_path, self.custom_filesystem)

    @property
    def storage_fs_path(self) -> str:
        """``storage_path`` (Ray's name for it)."""
        return self.storage_path

    @property
    def experiment_dir_name(self) -> str:
        """``RunConfig.name`` (Ray's name for it)."""
        return self.experiment_name

    @property
    def experiment_fs_path(self) -> str:
        """``<storage_path>/<experiment_name>``: the run folder."""
        return join_uri(self.storage_path, self.experiment_name)

    def build_checkpoint_path_from_name(self, name: str) -> str:
        """Final location of a checkpoint folder called ``name`` (for ``NO_UPLOAD``)."""
        return join_uri(self.experiment_fs_path, name)


@dataclass(frozen=True)
class TrainContext:
    """Ranks and run information of the calling worker (Ray Train's ``TrainContext`` API)."""

    world_rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    experiment_name: str
    storage_path: str
    #: How many times the worker group has been (re)started in this run, from 0.
    attempt: int = 0
    #: ``RunConfig.storage_filesystem`` (a ``pyarrow.fs.FileSystem``), when given.
    storage_filesystem: Any = None

    def get_world_rank(self) -> int:
        """Global rank of this worker (0 .. world_size-1)."""
        return self.world_rank

    def get_world_size(self) -> int:
        """Number of workers."""
        return self.world_size

    def get_local_rank(self) -> int:
        """Rank among the workers on this node."""
        return self.local_rank

    def get_local_world_size(self) -> int:
        """Number of workers on this node."""
        return self.local_world_size

    def get_node_rank(self) -> int:
        """Index of this worker's node."""
        return self.node_rank

    def get_experiment_name(self) -> str:
        """``RunConfig.name``."""
        return self.experiment_name

    def get_storage(self) -> StorageInfo:
        """Storage locations of the run."""
        return StorageInfo(self.storage_path, self.experiment_name, self.storage_filesystem)

    def get_run_path(self) -> str:
        """The run folder (``<storage_path>/<name>``)."""
        return self.get_storage().experiment_fs_path
