"""Framework set-up hooks: what a trainer does to its workers before and after training."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainer_runtime.config import ScalingConfig
    from trainer_runtime.context import TrainContext
    from trainer_runtime.worker_group import WorkerGroup


class Backend:
    """No framework set-up (plain Python / custom collectives)."""

    #: Whether this backend can run several local processes under ``torchrun``.
    supports_torchrun = False

    def on_start(self, group: WorkerGroup, scaling: ScalingConfig) -> None:
        """Called once the worker actors exist, before the train function starts."""

    def on_shutdown(self, group: WorkerGroup) -> None:
        """Called before the worker actors are killed (best effort)."""

    def on_local_start(self, context: TrainContext, scaling: ScalingConfig) -> None:
        """Local mode: set-up in this process."""

    def on_local_shutdown(self) -> None:
        """Local mode: tear-down in this process."""
