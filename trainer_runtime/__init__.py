"""trainer_runtime: Ray Train V2's user API on Ray core, with async checkpoints and validation.

Switch from Ray Train by changing imports::

    from trainer_runtime import Checkpoint, RunConfig, ScalingConfig, report, get_checkpoint
    from trainer_runtime.torch import TorchTrainer, prepare_model
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainer_runtime._session import get_session
from trainer_runtime.callbacks import Callback, TrainRunContext, UserCallback
from trainer_runtime.checkpoint import Checkpoint, CheckpointUploadMode
from trainer_runtime.checkpoint_manager import CheckpointRecord, CheckpointStatus
from trainer_runtime.config import (
    CheckpointConfig,
    FailureConfig,
    RunConfig,
    ScalingConfig,
    ValidationConfig,
    ValidationFn,
    ValidationTaskConfig,
)
from trainer_runtime.context import StorageInfo, TrainContext
from trainer_runtime.data_config import DataConfig
from trainer_runtime.errors import (
    CheckpointUploadError,
    ControllerError,
    PreemptionError,
    ReportError,
    TrainingFailedError,
    UserConfigError,
    WorkerGroupError,
)
from trainer_runtime.preemption import PreemptionInfo
from trainer_runtime.reported_checkpoint import (
    CheckpointConsistencyMode,
    ReportedCheckpoint,
    ReportedCheckpointStatus,
)
from trainer_runtime.result import Result
from trainer_runtime.trainer import DataParallelTrainer

__version__ = "0.1.0"


def report(
    metrics: dict[str, Any],
    checkpoint: Checkpoint | None = None,
    checkpoint_dir_name: str | None = None,
    checkpoint_upload_mode: CheckpointUploadMode | str | None = None,
    delete_local_checkpoint_after_upload: bool | None = None,
    checkpoint_upload_fn: Callable[[Checkpoint, str], Checkpoint] | None = None,
    validation: bool | ValidationTaskConfig = False,
    validate_fn: Callable[[Checkpoint, dict[str, Any]], dict[str, Any]] | None = None,
    validate_config: dict[str, Any] | None = None,
) -> None:
    """Report metrics (and optionally a checkpoint) from every worker.

    Every rank calls ``report`` the same number of times; rank 0's metrics are
    recorded. Non-None checkpoints of one call are one logical checkpoint: each
    rank's files go into the same folder ``checkpoint_dir_name`` (default
    ``checkpoint_<round>``) in the run's storage.

    * ``checkpoint_upload_mode`` defaults to ``RunConfig.checkpoint_upload_mode``,
      itself ``SYNC`` by default (as in Ray Train). ``SYNC`` uploads before
      returning; ``ASYNC`` returns after handing the folder to a background
      uploader (bounded queue: it blocks only when uploads fall behind);
      ``NO_UPLOAD`` registers a checkpoint already in its storage location.
    * ``delete_local_checkpoint_after_upload`` defaults to True for ASYNC.
    * An earlier failed ASYNC upload is raised here.
    * Validation, Ray 2.60 form: ``validation=True`` (or a ``ValidationTaskConfig`` whose
      ``fn_kwargs`` override the trainer's) runs the trainer's ``ValidationConfig.fn`` once
      the checkpoint is committed; without a checkpoint it is a ``ValueError``, as in Ray.
      Ray 2.51 form: ``validate_fn(checkpoint, validate_config) -> dict``; ignored on a
      report without a checkpoint (e.g. the ranks that save nothing). Either runs as a Ray
      task (on the validation pool when there is one); its metrics merge into the
      checkpoint's.
    * ``checkpoint_upload_fn(checkpoint, checkpoint_dir_name) -> Checkpoint`` (Ray Train's):
      with ``SYNC`` or ``ASYNC``, this function stores the checkpoint instead of the runtime
      (in the calling thread, or in the background uploader in report order), into
      ``get_context().get_storage().build_checkpoint_path_from_name(checkpoint_dir_name)``,
      and returns ``Checkpoint(that path)``; a ``ValueError`` when it returns anything else.
      The commit then checks the stored folder's listing; ``delete_local_checkpoint_after_upload``
      deletes the reported folder after it returned.
    """
    get_session("report").report(
        metrics,
        checkpoint=checkpoint,
        checkpoint_dir_name=checkpoint_dir_name,
        checkpoint_upload_mode=checkpoint_upload_mode,
        delete_local_checkpoint_after_upload=delete_local_checkpoint_after_upload,
        validation=validation,
        validate_fn=validate_fn,
        validate_config=validate_config,
        checkpoint_upload_fn=checkpoint_upload_fn,
    )


def get_checkpoint() -> Checkpoint | None:
    """The latest checkpoint of this run, as Ray Train's ``get_checkpoint()``.

    When the worker group starts: the latest committed checkpoint (None on a fresh run).
    After this worker's ``report(checkpoint=...)`` stored its files: that checkpoint, in
    storage (stored by this rank; committed once every rank's part is stored).
    """
    return get_session("get_checkpoint").latest_checkpoint


def get_all_reported_checkpoints(
    consistency_mode: CheckpointConsistencyMode = CheckpointConsistencyMode.VALIDATED,
    timeout_s: float | None = None,
) -> list[ReportedCheckpoint]:
    """Every kept checkpoint of the run so far, as Ray Train 2.60's function of the same name.

    Waits until every ``report()`` this rank made is processed by the controller (its
    checkpoint committed: ``CheckpointConsistencyMode.COMMITTED``), and with ``VALIDATED``
    (the default) until no validation is pending either; after ``timeout_s`` seconds (None:
    no limit) it returns what is there. Each :class:`ReportedCheckpoint` holds the
    checkpoint, its metrics (rank 0's, with validation metrics merged in) and its
    :class:`ReportedCheckpointStatus`, in Ray's order: by score, worst first, when
    ``CheckpointConfig.checkpoint_score_attribute`` is set, else oldest first.
    """
    return get_session("get_all_reported_checkpoints").get_all_reported_checkpoints(
        consistency_mode, timeout_s
    )


def get_dataset_shard(dataset_name: str | None = None) -> Any:
    """This worker's ``ray.data.DataIterator`` for the trainer's dataset ``dataset_name``
    (Ray Train's ``get_dataset_shard``).

    For a dataset in ``DataConfig.datasets_to_split`` (all by default): this worker's part of
    Ray Data's ``streaming_split(num_workers, equal=True)``, so every worker gets the same
    number of rows and together they read each row once per epoch; other datasets: the
    whole dataset. Iterate it once per epoch (``iter_torch_batches``, ``iter_batches``,
    ``iter_rows``): each pass executes the dataset again, streaming while the worker trains.
    Split shards are read in lockstep: every worker must start each epoch. In local mode
    the shard is the whole dataset. A ``KeyError`` (Ray's) for a name not in the trainer's
    ``datasets``.

    ::

        def train_fn(config):
            for epoch in range(2):
                for batch in trainer_runtime.get_dataset_shard("train").iter_torch_batches():
                    ...

        TorchTrainer(train_fn, datasets={"train": ray.data.read_parquet(...)}).fit()
    """
    return get_session("get_dataset_shard").get_dataset_shard(dataset_name)


def get_context() -> TrainContext:
    """Ranks, world size, experiment name and storage of the calling worker."""
    return get_session("get_context").context


def get_preemption_info() -> PreemptionInfo | None:
    """The imminent preemption of this run's workers, or ``None`` (Ray Train 2.60's
    ``ray.train.get_preemption_info()``).

    Non-None once a process running a worker got SIGTERM (Kubernetes' termination notice:
    the pod's node is drained, reclaimed or under maintenance) or, with Ray workers, once
    a node of the worker group is being drained in Ray. Every rank must call it the same
    number of times (it is a collective) and every rank gets the same answer. Save and
    ``report()`` one last checkpoint when it is not None: once that checkpoint is
    committed, ``fit()`` raises :class:`PreemptionError` and the next run with the same
    ``storage_path`` and ``name`` resumes from it. The deadline is the notice's time plus
    the grace period (``TRAINJOB_TERMINATION_GRACE_PERIOD_S``, default 30 s).
    """
    return get_session("get_preemption_info").get_preemption_info()


def __getattr__(name: str) -> Any:
    # ``trainer_runtime.TorchTrainer`` / ``JaxTrainer`` without importing torch/jax eagerly.
    if name == "TorchTrainer":
        from trainer_runtime.torch import TorchTrainer

        return TorchTrainer
    if name == "JaxTrainer":
        from trainer_runtime.jax import JaxTrainer

        return JaxTrainer
    raise AttributeError(f"module 'trainer_runtime' has no attribute {name!r}")


__all__ = [
    "Callback",
    "Checkpoint",
    "CheckpointConfig",
    "CheckpointConsistencyMode",
    "CheckpointRecord",
    "CheckpointStatus",
    "CheckpointUploadError",
    "CheckpointUploadMode",
    "ControllerError",
    "DataConfig",
    "DataParallelTrainer",
    "FailureConfig",
    "PreemptionError",
    "PreemptionInfo",
    "ReportError",
    "ReportedCheckpoint",
    "ReportedCheckpointStatus",
    "Result",
    "RunConfig",
    "ScalingConfig",
    "StorageInfo",
    "TrainContext",
    "TrainRunContext",
    "TrainingFailedError",
    "UserCallback",
    "UserConfigError",
    "ValidationConfig",
    "ValidationFn",
    "ValidationTaskConfig",
    "WorkerGroupError",
    "get_all_reported_checkpoints",
    "get_checkpoint",
    "get_context",
    "get_dataset_shard",
    "get_preemption_info",
    "report",
]
