"""``JaxTrainer``: multi-process JAX on Ray workers (CPU or TPU slices), or locally."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainer_runtime.config import RunConfig, ScalingConfig, ValidationConfig
from trainer_runtime.data_config import DataConfig, GenDataset
from trainer_runtime.jax.backend import JaxBackend, JaxConfig
from trainer_runtime.trainer import DataParallelTrainer


class JaxTrainer(DataParallelTrainer):
    """Runs ``train_loop_per_worker`` on every worker, all joined in one ``jax.distributed`` job.

    Same shape as ``ray.train.v2.jax.JaxTrainer``. With
    ``ScalingConfig(use_tpu=True, accelerator_type=..., topology=..., num_slices=...)`` there is
    one worker per TPU host and each slice is reserved as a unit; without TPUs the workers run
    JAX on CPU (gloo collectives across processes). ``num_workers=0`` runs the function in this
    process without ``jax.distributed``. Reporting, checkpoints, validation and restarts are
    those of :class:`~trainer_runtime.trainer.DataParallelTrainer`.
    """

    def __init__(
        self,
        train_loop_per_worker: Callable[..., Any],
        *,
        train_loop_config: dict[str, Any] | None = None,
        jax_config: JaxConfig | None = None,
        scaling_config: ScalingConfig | None = None,
        run_config: RunConfig | None = None,
        validation_config: ValidationConfig | None = None,
        datasets: dict[str, GenDataset] | None = None,
        dataset_config: DataConfig | None = None,
    ) -> None:
        super().__init__(
            train_loop_per_worker,
            train_loop_config=train_loop_config,
            scaling_config=scaling_config,
            run_config=run_config,
            backend=JaxBackend(jax_config),
            validation_config=validation_config,
            datasets=datasets,
            dataset_config=dataset_config,
        )
