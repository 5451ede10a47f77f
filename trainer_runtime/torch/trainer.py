"""``TorchTrainer``: data-parallel PyTorch on Ray workers (or locally / under torchrun)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainer_runtime.config import RunConfig, ScalingConfig, ValidationConfig
from trainer_runtime.data_config import DataConfig, GenDataset
from trainer_runtime.torch.backend import TorchBackend, TorchConfig
from trainer_runtime.trainer import DataParallelTrainer


class TorchTrainer(DataParallelTrainer):
    """Runs ``train_loop_per_worker`` with a torch.distributed process group (gloo/nccl).

    Same signature as ``ray.train.torch.TorchTrainer``.
    """

    def __init__(
        self,
        train_loop_per_worker: Callable[..., Any],
        *,
        train_loop_config: dict[str, Any] | None = None,
        torch_config: TorchConfig | None = None,
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
            backend=TorchBackend(torch_config),
            validation_config=validation_config,
            datasets=datasets,
            dataset_config=dataset_config,
        )
