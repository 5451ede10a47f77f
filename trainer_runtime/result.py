"""``Result``: what ``fit()`` returns (the shape of ``ray.train.Result``)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainer_runtime._fencing import driver_file_uri
from trainer_runtime.checkpoint import Checkpoint
from trainer_runtime.checkpoint_manager import CheckpointManager, CheckpointRecord
from trainer_runtime.storage import (
    get_storage,
    pyarrow_filesystem,
    split_query_uri,
    validate_storage_uri,
)


def metric_value(metric: str, metrics: Mapping[str, Any]) -> Any:
    """``metrics[metric]``, else the nested value ``metric`` names with ``/`` between keys
    (list indices as numbers), as Ray's ``unflattened_lookup``; None when absent."""
    if metric in metrics:
        return metrics[metric]
    value: Any = metrics
    for key in metric.split("/"):
        try:
            if isinstance(value, Mapping):
                value = value[key]
            elif isinstance(value, Sequence) and not isinstance(value, str):
                value = value[int(key)]
            else:
                return None
        except (KeyError, IndexError, ValueError):
            return None
    return value


@dataclass
class Result:
    """The outcome of a run.

    ``metrics``: the latest committed checkpoint's metrics (validation metrics merged
    over them), None when no checkpoint was committed, as Ray Train 2.60; metrics-only
    reports reach callbacks, not the Result. ``checkpoint``: the latest committed
    checkpoint. ``best_checkpoints``: the ``num_to_keep`` best checkpoints as
    ``(Checkpoint, metrics)`` pairs in Ray Train's order, worst first (see
    :meth:`CheckpointManager.top_k`). ``checkpoints``: every kept checkpoint's record, with
    its validation status.
    """

    metrics: dict[str, Any] | None
    checkpoint: Checkpoint | None
    path: str
    error: BaseException | None = None
    best_checkpoints: list[tuple[Checkpoint, dict[str, Any]]] = field(default_factory=list)
    checkpoints: list[CheckpointRecord] = field(default_factory=list)
    best_checkpoint: Checkpoint | None = None
    restarts: int = 0
    #: What the train function returned on rank 0 (in local mode: in this process), or None
    #: when it returned nothing or the run failed, as Ray Train 2.60's ``Result.return_value``.
    return_value: Any = None
    #: The number of workers of every worker group the run started, in order (one entry per
    #: attempt; with ``ScalingConfig(num_workers=(min, max))`` they differ as the run
    #: shrinks and grows; empty in local mode and for :meth:`from_path`).
    world_sizes: list[int] = field(default_factory=list)
    #: Worker groups stopped to resize (elastic training's RESIZING); not in ``restarts``,
    #: which counts failures against ``FailureConfig.max_failures``.
    resizes: int = 0
    #: ``RunConfig.storage_filesystem`` (see :attr:`filesystem`).
    _storage_filesystem: Any = field(default=None, repr=False)

    @property
    def filesystem(self) -> Any:
        """The ``pyarrow.fs.FileSystem`` that holds :attr:`path` (as Ray Train's): the run's
        ``storage_filesystem``, else the one its URI names (``LocalFileSystem`` for a folder)."""
        return pyarrow_filesystem(self.path, self._storage_filesystem)

    @property
    def metrics_dataframe(self) -> Any:
        """Ray Train's ``Result.metrics_dataframe``: a ``pandas.DataFrame`` with one row per
        checkpoint of :attr:`best_checkpoints` (its metrics), in their order; None when there
        is none."""
        if not self.best_checkpoints:
            return None
        import pandas as pd

        return pd.DataFrame([metrics for _, metrics in self.best_checkpoints])

    def checkpoint_status(self, checkpoint: Checkpoint) -> str | None:
        """The status of a kept checkpoint (``committed``, ``validated``, ...)."""
        return next((r.status for r in self.checkpoints if r.path == checkpoint.path), None)

    def get_best_checkpoint(self, metric: str, mode: str) -> Checkpoint | None:
        """The checkpoint of ``best_checkpoints`` with the best ``metric`` (as Ray Train's).

        ``metric`` may name a nested value as Ray's does (``"val/loss"`` is
        ``metrics["val"]["loss"]`` unless ``"val/loss"`` is a key itself). Checkpoints without
        the metric are left out. RuntimeError when there is no
        checkpoint or none has the metric; ValueError for a ``mode`` other than max/min.
        """
        if not self.best_checkpoints:
            raise RuntimeError("No checkpoint exists in the trial directory!")
        if mode not in ("max", "min"):
            raise ValueError(f'Unsupported mode: {mode}. Please choose from ["min", "max"]!')
        values = [(c, metric_value(metric, m)) for c, m in self.best_checkpoints]
        scored = [
            (c, v) for c, v in values if isinstance(v, int | float) and not isinstance(v, bool)
        ]
        if not scored:
            raise RuntimeError(
                f"Invalid metric name {metric}! You may choose from the following metrics: "
                f"{(self.metrics or {}).keys()}."
            )
        pick = max if mode == "max" else min
        return pick(scored, key=lambda cm: cm[1])[0]

    @classmethod
    def from_path(cls, path: str | os.PathLike[str], storage_filesystem: Any = None) -> Result:
        """Rebuild a Result from a run folder (e.g. after the driver exited).

        ``path``: a local folder or URI, or with ``storage_filesystem`` (a
        ``pyarrow.fs.FileSystem``) a path on it, as in Ray Train. Only checkpoints that verify
        against their commit markers are listed (see :meth:`CheckpointManager.restore`);
        nothing in the folder is changed. ``best_checkpoints`` lists every checkpoint the run
        kept, worst first by its score (the latest included when it is not among the best,
        unlike ``fit()``'s Result), as Ray Train's does. Raises RuntimeError when ``path``
        holds no run (``"Experiment folder ... doesn't exist."``, as Ray Train, for a missing
        folder).
        """
        path, storage_filesystem = split_query_uri(os.fspath(path), storage_filesystem)
        uri = validate_storage_uri(path, "path", filesystem=storage_filesystem)
        storage = get_storage(uri, storage_filesystem)
        manager = CheckpointManager.for_reading(uri, storage)
        if (
            not manager.records
            and manager.manifest_data is None
            and not storage.exists(driver_file_uri(uri))
        ):
            local = storage.local_path(uri)
            if (not local.is_dir()) if local is not None else not storage.list_files(uri):
                # Ray Train's sentence first (users match its text), then ours.
                raise RuntimeError(
                    f"Experiment folder {uri} doesn't exist. No run found there: pass the run "
                    "folder, RunConfig.storage_path/RunConfig.name"
                )
            raise RuntimeError(  # Ray Train's opening words, then ours
                f"Failed to restore the Result object: no run found at {uri}: it holds "
                "neither a checkpoint manifest nor committed checkpoints (pass the run "
                "folder: RunConfig.storage_path/RunConfig.name)"
            )
        latest = manager.latest
        best = manager.best()
        return cls(
            metrics=latest.all_metrics if latest else None,
            checkpoint=latest.checkpoint if latest else None,
            path=uri,
            # Every kept checkpoint (the latest too, when it is not among the best), worst
            # first: Ray Train rebuilds its manager with a default CheckpointConfig, which
            # lists all that its snapshot kept, in the run's score order.
            best_checkpoints=[(r.checkpoint, r.all_metrics) for r in manager.reported_order()],
            checkpoints=list(manager.records),
            best_checkpoint=best.checkpoint if best else None,
            _storage_filesystem=storage_filesystem,
        )
