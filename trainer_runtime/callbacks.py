"""Hooks the controller calls as a run progresses.

Two interfaces, both passed as ``RunConfig(callbacks=[...])`` and run on the driver:

* :class:`UserCallback`: Ray Train 2.60's (``ray.train.UserCallback``): ``after_report`` once
  every rank reported a round (with the checkpoint, once committed) and ``after_exception``
  when workers raised.
* :class:`Callback`: the runtime's own, richer hooks (progress displays, the TrainJob status
  publisher): run start, each report, checkpoint commits and validations, validation demand,
  failures, run end.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainer_runtime.checkpoint import Checkpoint
    from trainer_runtime.checkpoint_manager import CheckpointRecord
    from trainer_runtime.config import RunConfig, ScalingConfig
    from trainer_runtime.data_config import DataConfig
    from trainer_runtime.result import Result


@dataclass(frozen=True)
class TrainRunContext:
    """What a :class:`UserCallback` learns about the run (Ray Train's ``TrainRunContext``)."""

    run_config: RunConfig
    train_loop_config: dict[str, Any] | None
    scaling_config: ScalingConfig
    #: A unique id of this ``fit()`` call.
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    #: The trainer's ``dataset_config`` (how its ``datasets`` are split among the workers).
    dataset_config: DataConfig | None = None

    def get_run_config(self) -> RunConfig:
        """The run's ``RunConfig``."""
        return self.run_config


class UserCallback:
    """Ray Train 2.60's callback interface (``ray.train.UserCallback``); runs on the driver.

    Override the hooks you need; they are called with keyword arguments, as Ray calls them.
    A hook that raises is logged and does not stop the run.
    """

    def after_report(
        self,
        run_context: TrainRunContext,
        metrics: list[dict[str, Any]],
        checkpoint: Checkpoint | None,
    ) -> None:
        """Every rank reported one round: ``metrics[i]`` is rank i's metrics; ``checkpoint``
        is the round's checkpoint once stored and committed (None without a checkpoint)."""

    def after_exception(
        self, run_context: TrainRunContext, worker_exceptions: dict[int, BaseException]
    ) -> None:
        """Workers failed: world rank -> the exception each raised (or why it died)."""


class Callback:
    """Subclass and override what you need; every hook runs on the driver."""

    def on_run_start(self, run_path: str, world_size: int, attempt: int) -> None:
        """A worker group of ``world_size`` workers started (``attempt`` counts restarts)."""

    def on_report(self, round_index: int, metrics: dict[str, Any]) -> None:
        """Rank 0 reported ``metrics``."""

    def on_checkpoint(self, record: CheckpointRecord, best: CheckpointRecord | None) -> None:
        """A checkpoint was committed, or its validation finished."""

    def on_validation_demand(self, pending: int, running: int) -> None:
        """The validations that need a validation node now changed.

        ``running`` hold a concurrency slot (started, or waiting for a node); ``pending``
        are queued ones that could start now (at most ``max_concurrent_validations -
        running``). The operator sizes the validation pool by ``pending + running``.
        """

    def on_validation_queue(self, queued: int, running: int, waiting: int) -> None:
        """Raw counts: ``queued`` validations (beyond the concurrency limit too),
        ``running`` ones, and ``waiting``: those of the running ones not started yet
        because no node with the ``validation`` resource is free."""

    def on_failure(self, error: BaseException, failures: int, will_restart: bool) -> None:
        """The worker group failed."""

    def on_run_end(self, result: Result | None, error: BaseException | None) -> None:
        """The run ended (``error`` is None on success)."""


def call_all(callbacks: list[Any], hook: str, *args: Any, **kwargs: Any) -> None:
    """Call ``hook`` on every callback that has it; a failing callback is logged, never fatal."""
    for cb in callbacks:
        method = getattr(cb, hook, None)
        if method is None:
            continue  # a Callback has no UserCallback hooks, and the other way round
        try:
            method(*args, **kwargs)
        except Exception:
            logging.getLogger(__name__).exception("callback %r.%s failed", cb, hook)
