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
    #: Modules every Ray worker starts importing as soon as its actor exists, while the
    #: controller is still assigning ranks; ``on_start``'s set-up and the train function run
    #: once they are imported. Only what the set-up imports anyway: nothing that reads the
    #: rank environment at import time.
    preload: tuple[str, ...] = ()

    def on_start(self, group: WorkerGroup, scaling: ScalingConfig) -> None:
        """Called once the worker actors exist, before the train function starts."""

    def on_shutdown(self, group: WorkerGroup) -> None:
        """Called before the worker actors are killed (best effort)."""

    def on_local_start(self, context: TrainContext, scaling: ScalingConfig) -> None:
        """Local mode: set-up in this process."""

    def on_local_shutdown(self) -> None:
        """Local mode: tear-down in this process."""
