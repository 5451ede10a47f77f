"""Which validation a committed checkpoint gets, and the way validation results come back.

:class:`ValidationRouter` picks the validation of each committed round (a ``validate_fn``
passed to ``report()``, the trainer's ``ValidationConfig.fn`` at ``report(validation=...)``'s
request, or the run-level ``validate_fn``), hands it to the run's dispatcher (``_validation``),
records each outcome through the checkpoint manager, and lets a new driver pick up the
validations a previous driver left pending.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from trainer_runtime import _driver_metrics
from trainer_runtime._events import ReportEvent
from trainer_runtime.callbacks import Callback, call_all
from trainer_runtime.checkpoint_manager import (
    VALIDATE_FN_OF_CONFIG,
    VALIDATE_FN_OF_REPORT,
    VALIDATE_FN_OF_RUN,
    CheckpointManager,
    CheckpointRecord,
    CheckpointStatus,
)
from trainer_runtime.config import ValidationConfig
from trainer_runtime.errors import UserConfigError

logger = logging.getLogger(__name__)


class ValidationDispatcher(Protocol):
    """What runs validations of committed checkpoints (see ``_validation``).

    The router hands it each committed checkpoint that asks for validation; it reports
    back only through :meth:`ValidationRouter.record_validation`.
    """

    def submit(
        self,
        record: CheckpointRecord,
        fn: Any,
        config: dict[str, Any] | None,
        timeout_s: float | None = None,
    ) -> None:
        """Queue a validation of ``record`` (``timeout_s``: None for the configured default)."""


#: Builds the run's dispatcher, given where it reports results (the router itself).
DispatcherFactory = Callable[["ValidationRouter"], ValidationDispatcher]


@dataclass(frozen=True)
class KeywordValidation:
    """A Ray 2.60 validation function, called as ``fn(checkpoint, **fn_kwargs)``."""

    fn: Any

    def __call__(self, checkpoint: Any, fn_kwargs: dict[str, Any]) -> Any:
        """Validate ``checkpoint``."""
        return self.fn(checkpoint, **fn_kwargs)


@dataclass(frozen=True)
class ValidationRequest:
    """The validation a committed round gets: its function, config and source."""

    fn: Any
    config: dict[str, Any] | None
    source: str
    timeout_s: float | None = None


class ValidationRouter:
    """Routes committed checkpoints to validation and validation results to the manager.

    ``default``: the run-level ``(validate_fn, validate_config)`` for checkpoints reported
    without one; ``config``: the trainer's ``ValidationConfig`` when it has an ``fn``
    (``report(validation=...)``). ``make_dispatcher`` builds the dispatcher, which reports
    back to this router (None: this run cannot validate). ``lock`` is the coordinator's,
    taken by the dispatcher's way back; ``on_result`` runs (under it) after each result
    (waiting ``get_all_reported_checkpoints()`` calls may be answered then).
    """

    def __init__(
        self,
        manager: CheckpointManager,
        lock: threading.RLock,
        *,
        callbacks: Sequence[Callback] = (),
        default: tuple[Any, dict[str, Any] | None] | None = None,
        config: ValidationConfig | None = None,
        make_dispatcher: DispatcherFactory | None = None,
        on_result: Callable[[], None] = lambda: None,
    ) -> None:
        self._manager = manager
        self._lock = lock
        self._callbacks = list(callbacks)
        self.default = default
        self.config = config if config is not None and config.fn is not None else None
        self._on_result = on_result
        #: Built last: it may report back as soon as it exists.
        self.dispatcher = None if make_dispatcher is None else make_dispatcher(self)

    @property
    def can_dispatch(self) -> bool:
        """Whether a requested validation can be queued."""
        return self.dispatcher is not None

    def request_for(self, reports: list[ReportEvent]) -> ValidationRequest | None:
        """Which validation a committed round gets (``reports``: its reports, by rank): a
        ``validate_fn`` passed to ``report()`` (Ray 2.51), else ``report(validation=...)``
        (Ray 2.60, the trainer's ``ValidationConfig.fn``), else the run-level
        ``validate_fn`` (every checkpoint); None: no validation."""
        for r in reports:
            if r.validate_fn is not None:
                return ValidationRequest(r.validate_fn, r.validate_config, VALIDATE_FN_OF_REPORT)
        asked = next((r.validation for r in reports if r.validation is not None), None)
        config = self.config
        if asked is not None and config is not None and config.fn is not None:
            assert config.task_config is not None
            kwargs = {**(config.task_config.fn_kwargs or {}), **(asked.fn_kwargs or {})}
            timeout = asked.timeout_s or config.task_config.timeout_s
            return ValidationRequest(
                KeywordValidation(config.fn), kwargs, VALIDATE_FN_OF_CONFIG, timeout
            )
        if self.default is not None:
            fn, cfg = self.default
            return ValidationRequest(fn, cfg, VALIDATE_FN_OF_RUN)
        return None

    def submit(self, record: CheckpointRecord, request: ValidationRequest) -> None:
        """Queue ``request`` for the committed ``record``."""
        if self.dispatcher is None:
            raise UserConfigError(
                "report() asked for a validation but this run has no validation dispatcher"
            )
        self.dispatcher.submit(record, request.fn, request.config, request.timeout_s)

    # -- the dispatcher's way back ----------------------------------------------------------
    def record_validation(
        self,
        name: str,
        status: CheckpointStatus,
        metrics: dict[str, Any] | None,
        error: str | None,
    ) -> CheckpointRecord | None:
        """The dispatcher's one way back: how a validation ended (see
        :meth:`CheckpointManager.record_validation`); callbacks see the updated record."""
        with self._lock:
            record = self._manager.record_validation(name, status, metrics, error)
            if record is not None:
                call_all(self._callbacks, "on_checkpoint", record, self._manager.best())
            self._on_result()
            return record

    def validation_queue_changed(
        self, pending: int, running: int, queued: int, waiting: int
    ) -> None:
        """Tell callbacks the validation demand (the operator sizes the pool by it)."""
        _driver_metrics.note_validation_queue(queued, running)
        call_all(self._callbacks, "on_validation_demand", pending, running)
        call_all(self._callbacks, "on_validation_queue", queued, running, waiting)

    # -- a new driver -----------------------------------------------------------------------
    def resume(self) -> tuple[list[CheckpointRecord], list[str]]:
        """A new driver picks up validations a previous driver left pending.

        Those of the run-level validate function (``ValidationConfig.validate_fn``, a
        TrainJob's ``spec.validation.entrypoint``) and of the trainer's ``ValidationConfig.fn``
        (with the ``fn_kwargs`` recorded at commit) are queued again with the function this
        driver has: they read the committed checkpoint from storage. A
        ``validate_fn`` passed to ``report()`` cannot be recovered by another process, so
        those (and any pending validation when no run-level function is configured) are
        recorded as ``validation_lost``. Returns (re-queued records, names of lost ones).
        """
        with self._lock:
            default, dispatcher, config = self.default, self.dispatcher, self.config
            pending = [r for r in self._manager.records if r.status.is_pending]
            resumable = {
                VALIDATE_FN_OF_RUN: default is not None,
                VALIDATE_FN_OF_CONFIG: config is not None and config.fn is not None,
            }
            requeue = [
                r
                for r in pending
                if dispatcher is not None and resumable.get(r.validation_source or "", False)
            ]
            lost = self._manager.mark_validations_lost(
                [r.name for r in pending if r not in requeue],
                "the driver that queued this validation exited before it ran, and its "
                "validate_fn (passed to report()) cannot be recovered by a new driver",
            )
        if lost:
            logger.warning(
                "%d validation(s) queued by a previous driver were lost: %s",
                len(lost),
                ", ".join(r.name for r in lost),
            )
        if requeue:
            assert dispatcher is not None
            logger.info(
                "Re-queueing %d validation(s) a previous driver left pending: %s",
                len(requeue),
                ", ".join(r.name for r in requeue),
            )
            for record in requeue:
                fn_config: dict[str, Any] | None
                if record.validation_source == VALIDATE_FN_OF_CONFIG:
                    assert config is not None
                    fn: Any = KeywordValidation(config.fn)
                    fn_config = record.validation_kwargs or {}
                else:
                    assert default is not None
                    fn, fn_config = default
                dispatcher.submit(record, fn, fn_config)
        return requeue, [r.name for r in lost]
