"""Hooks the controller calls as a run progresses (progress displays, status publishers)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainer_runtime.checkpoint_manager import CheckpointRecord
    from trainer_runtime.result import Result


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


def call_all(callbacks: list[Callback], hook: str, *args: Any) -> None:
    """Call ``hook`` on every callback; a failing callback is logged, never fatal."""
    import logging

    for cb in callbacks:
        try:
            getattr(cb, hook)(*args)
        except Exception:
            logging.getLogger(__name__).exception("callback %r.%s failed", cb, hook)
