"""Asynchronous validation of committed checkpoints.

``report(..., validate_fn=fn, validate_config=cfg)`` queues ``fn(checkpoint, cfg)``
once the checkpoint is committed. In a Ray run each validation is a Ray task
asking for the ``validation`` resource (only the validation pool has it), so it
runs on other, cheaper machines than training and reads the *committed*
checkpoint from storage. In local mode it runs in a background thread.

At most ``max_concurrent_validations`` run at once; the rest wait in FIFO
order. A validation that raises or exceeds ``timeout_s`` is recorded with its
status and error; it never fails training. Results merge into the
checkpoint's metrics and re-rank it for top-k retention.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
import traceback
from abc import ABC, abstractmethod
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from trainer_runtime._coordinator import RunCoordinator, ValidationDispatcher
from trainer_runtime._metrics import validate_metrics
from trainer_runtime.callbacks import call_all
from trainer_runtime.checkpoint import Checkpoint
from trainer_runtime.checkpoint_manager import CheckpointRecord, CheckpointStatus
from trainer_runtime.config import ValidationConfig
from trainer_runtime.errors import UserConfigError

logger = logging.getLogger(__name__)


def run_validation(fn: Any, checkpoint_path: str, config: dict[str, Any] | None) -> dict[str, Any]:
    """Call ``fn(checkpoint, config)`` and check that it returns a metrics dict."""
    result = fn(Checkpoint(checkpoint_path), dict(config or {}))
    if not isinstance(result, dict):
        raise TypeError(f"validate_fn must return a dict of metrics, got {type(result).__name__}")
    return validate_metrics(result)


@dataclass
class _Job:
    record: CheckpointRecord
    fn: Any
    config: dict[str, Any] | None
    queued_at: float = field(default_factory=time.monotonic)
    started_at: float | None = None
    handle: Any = None


class BaseValidationDispatcher(ValidationDispatcher, ABC):
    """Queue, concurrency limit, timeouts and result merging; subclasses launch the work."""

    def __init__(self, coordinator: RunCoordinator, config: ValidationConfig) -> None:
        self.coordinator = coordinator
        self.config = config
        self._queue: collections.deque[_Job] = collections.deque()
        self._running: list[_Job] = []
        self._cond = threading.Condition()
        self._closed = False
        self._outstanding = 0
        self.completed = 0
        self.failed = 0
        self.start_latencies: list[float] = []
        self._thread = threading.Thread(
            target=self._loop, name="validation-dispatcher", daemon=True
        )
        self._thread.start()

    # -- interface to the coordinator ---------------------------------------------------------
    def submit(self, record: CheckpointRecord, fn: Any, config: dict[str, Any] | None) -> None:
        """Queue a validation of a committed checkpoint."""
        with self._cond:
            self._queue.append(_Job(record, fn, config))
            self._outstanding += 1
            self._cond.notify_all()
        self._publish_demand()

    def demand(self) -> tuple[int, int]:
        """(pending, running) validations: what the operator scales the pool by."""
        with self._cond:
            return len(self._queue), len(self._running)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until no validation is pending or running; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._outstanding:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(0.1 if remaining is None else min(0.1, remaining))
        return True

    def close(self) -> None:
        """Stop dispatching; queued validations stay ``pending_validation``."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(10)

    # -- subclass hooks -----------------------------------------------------------------------
    @abstractmethod
    def _launch(self, job: _Job) -> Any:
        """Start one validation; returns a handle."""

    @abstractmethod
    def _finished(self, jobs: list[_Job], timeout: float) -> list[tuple[_Job, Any, str | None]]:
        """Jobs that ended within ``timeout``: (job, metrics or None, error text or None)."""

    @abstractmethod
    def _cancel(self, job: _Job) -> None:
        """Stop a validation that timed out (best effort)."""

    # -- the loop -----------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            failed_to_start: list[tuple[_Job, str]] = []
            with self._cond:
                if self._closed:
                    return
                launched = False
                while self._queue and len(self._running) < self.config.max_concurrent_validations:
                    job = self._queue.popleft()
                    job.started_at = time.monotonic()
                    try:
                        job.handle = self._launch(job)
                    except Exception as exc:  # noqa: BLE001 - recorded, never fatal
                        failed_to_start.append((job, f"could not start validation: {exc!r}"))
                        continue
                    self.start_latencies.append(job.started_at - job.queued_at)
                    self._running.append(job)
                    launched = True
                running = list(self._running)
                if not running and not failed_to_start:
                    self._cond.wait(0.5)
                    continue
            for job, start_error in failed_to_start:
                self._finish(job, None, start_error, CheckpointStatus.VALIDATION_FAILED)
            if launched:
                self._publish_demand()
            if not running:
                continue
            for job, metrics, error in self._finished(running, 0.2):
                status = (
                    CheckpointStatus.VALIDATED
                    if error is None
                    else CheckpointStatus.VALIDATION_FAILED
                )
                self._done(job, metrics, error, status)
            timeout = self.config.timeout_s
            if timeout is not None:
                now = time.monotonic()
                for job in running:
                    if job.started_at is not None and now - job.started_at > timeout:
                        self._cancel(job)
                        self._done(
                            job,
                            None,
                            f"validation exceeded timeout_s={timeout:g}",
                            CheckpointStatus.VALIDATION_TIMEOUT,
                        )

    def _done(
        self, job: _Job, metrics: dict[str, Any] | None, error: str | None, status: str
    ) -> None:
        with self._cond:
            if job not in self._running:
                return  # already timed out
            self._running.remove(job)
        self._finish(job, metrics, error, status)

    def _finish(
        self, job: _Job, metrics: dict[str, Any] | None, error: str | None, status: str
    ) -> None:
        # The coordinator's lock is taken without holding ours (the coordinator calls
        # submit() while holding its lock).
        try:
            self._apply(job, metrics, error, status)
        finally:
            with self._cond:
                self._outstanding -= 1
                self._cond.notify_all()
        self._publish_demand()

    def _apply(
        self, job: _Job, metrics: dict[str, Any] | None, error: str | None, status: str
    ) -> None:
        record = job.record
        coordinator = self.coordinator
        with coordinator.lock:
            record.status = status
            record.validation_metrics = metrics
            record.validation_error = error
            if error is None:
                self.completed += 1
                logger.info("Validated %s: %s", record.name, metrics)
            else:
                self.failed += 1
                logger.warning("Validation of %s %s: %s", record.name, status, error)
            manager = coordinator.manager
            if manager.get(record.name) is None:
                return  # evicted meanwhile (cannot happen while pending, but be safe)
            try:
                manager.check_score_attribute(record)
            except UserConfigError as exc:
                record.status = CheckpointStatus.VALIDATION_FAILED
                record.validation_error = str(exc)
                self.failed += 1
                logger.error("%s", exc)
            manager.update(record)
            call_all(coordinator.callbacks, "on_checkpoint", record, manager.best())

    def _publish_demand(self) -> None:
        pending, running = self.demand()
        call_all(self.coordinator.callbacks, "on_validation_demand", pending, running)


class RayValidationDispatcher(BaseValidationDispatcher):
    """Each validation is a Ray task asking for ``ValidationConfig.resources``."""

    def __init__(self, coordinator: RunCoordinator, config: ValidationConfig) -> None:
        import ray

        self._task: Any = ray.remote(run_validation)
        super().__init__(coordinator, config)

    def _launch(self, job: _Job) -> Any:
        return self._task.options(
            num_cpus=self.config.num_cpus,
            resources=dict(self.config.resources),
            max_retries=0,
            name=f"validate:{job.record.name}",
        ).remote(job.fn, job.record.path, job.config)

    def _finished(self, jobs: list[_Job], timeout: float) -> list[tuple[_Job, Any, str | None]]:
        import ray

        by_ref = {job.handle: job for job in jobs}
        ready, _ = ray.wait(list(by_ref), num_returns=len(by_ref), timeout=timeout)
        out: list[tuple[_Job, Any, str | None]] = []
        for ref in ready:
            try:
                out.append((by_ref[ref], ray.get(ref), None))
            except Exception as exc:  # noqa: BLE001 - the validation's own error
                out.append((by_ref[ref], None, _short_error(exc)))
        return out

    def _cancel(self, job: _Job) -> None:
        import ray

        try:
            ray.cancel(job.handle, force=True)
        except Exception as exc:  # noqa: BLE001
            logger.debug("cancel failed: %s", exc)


class ThreadValidationDispatcher(BaseValidationDispatcher):
    """Local mode: each validation runs in a daemon thread of this process.

    Daemon threads (not a thread pool) so that a validation stuck past its
    timeout cannot keep the process alive at exit.
    """

    def _launch(self, job: _Job) -> Future[dict[str, Any]]:
        future: Future[dict[str, Any]] = Future()

        def target() -> None:
            try:
                future.set_result(run_validation(job.fn, job.record.path, job.config))
            except BaseException as exc:  # noqa: BLE001 - delivered through the future
                future.set_exception(exc)

        threading.Thread(target=target, name=f"validate-{job.record.name}", daemon=True).start()
        return future

    def _finished(self, jobs: list[_Job], timeout: float) -> list[tuple[_Job, Any, str | None]]:
        from concurrent.futures import FIRST_COMPLETED
        from concurrent.futures import wait as wait_futures

        by_future = {job.handle: job for job in jobs}
        done, _ = wait_futures(list(by_future), timeout=timeout, return_when=FIRST_COMPLETED)
        out: list[tuple[_Job, Any, str | None]] = []
        for future in done:
            exc = future.exception()
            if exc is None:
                out.append((by_future[future], future.result(), None))
            else:
                text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
                out.append((by_future[future], None, text))
        return out

    def _cancel(self, job: _Job) -> None:
        """A thread cannot be killed: its late result is ignored."""


def _short_error(exc: BaseException) -> str:
    cause = getattr(exc, "cause", None)
    if cause is not None:
        return f"{type(cause).__name__}: {cause}"
    return str(exc).strip().splitlines()[-1] if str(exc).strip() else repr(exc)


def mark_lost_validations(coordinator: RunCoordinator) -> list[CheckpointRecord]:
    """A new driver cannot resume validations a previous driver queued: record them as lost."""
    lost = [
        r for r in coordinator.manager.records if r.status == CheckpointStatus.PENDING_VALIDATION
    ]
    for record in lost:
        record.status = CheckpointStatus.VALIDATION_LOST
        record.validation_error = "the driver that queued this validation exited before it ran"
    if lost:
        coordinator.manager.update(lost[0])
        logger.warning(
            "%d validation(s) queued by a previous driver were lost: %s",
            len(lost),
            ", ".join(r.name for r in lost),
        )
    return lost
