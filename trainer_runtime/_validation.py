"""Asynchronous validation of committed checkpoints.

``report(..., validation=True)`` (Ray 2.60: the trainer's ``ValidationConfig.fn`` as
``fn(checkpoint, **fn_kwargs)``) or ``report(..., validate_fn=fn, validate_config=cfg)``
(Ray 2.51: ``fn(checkpoint, cfg)``) queues a validation once the checkpoint is committed.
In a Ray run each validation is a Ray task; where the cluster advertises the
``validation`` resource (only a TrainJob's validation pool has it) it asks for it, so it
runs on other, cheaper machines than training, and it reads the *committed* checkpoint
from storage (see ``ValidationConfig.task_options``). In local mode it runs in a
background thread.

At most ``max_concurrent_validations`` run at once; the rest wait in FIFO
order. A validation that raises or exceeds ``timeout_s`` is recorded with its
status and error; it never fails training. ``timeout_s`` counts from when the
validation starts running: a Ray task first reports its start (it is a
streaming generator whose first item is a start signal), so time spent waiting
for a node with the ``validation`` resource (a pool scaling up from zero) never
counts. Results merge into the checkpoint's metrics and re-rank it for top-k
retention.

A failure of the dispatcher itself (e.g. the manifest cannot be saved) is
recorded and raised by :meth:`BaseValidationDispatcher.raise_if_failed`;
:meth:`~BaseValidationDispatcher.wait` never hangs on it.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import threading
import time
import traceback
from abc import ABC, abstractmethod
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from typing import Any, Protocol

from trainer_runtime import _driver_metrics
from trainer_runtime._metrics import validate_metrics
from trainer_runtime.checkpoint import Checkpoint
from trainer_runtime.checkpoint_manager import CheckpointRecord, CheckpointStatus
from trainer_runtime.config import ValidationConfig
from trainer_runtime.data_config import select_data_nodes
from trainer_runtime.errors import ValidationDispatchError

logger = logging.getLogger(__name__)

#: How often (seconds) to log validations still waiting for a node to run on.
WAITING_LOG_INTERVAL_S = 60.0
#: The first item a Ray validation task yields: "I am running now".
_STARTED = "__trainjob_validation_started__"


def run_validation(
    fn: Any, checkpoint: Checkpoint | str, config: dict[str, Any] | None
) -> dict[str, Any]:
    """Call ``fn(checkpoint, config)`` and check that it returns a metrics dict."""
    if not isinstance(checkpoint, Checkpoint):
        checkpoint = Checkpoint(checkpoint)
    result = fn(checkpoint, dict(config or {}))
    if not isinstance(result, dict):
        raise TypeError(f"validate_fn must return a dict of metrics, got {type(result).__name__}")
    return validate_metrics(result)


DATA_LABELS_ENV = "TRAINJOB_VALIDATION_DATA_LABEL_SELECTOR"
"""Ray node labels (JSON) for the Ray Data tasks a validation starts. A TrainJob's validation
pool sets it on its pods (the operator's ``VALIDATION_DATA_LABELS_ENV``), so that they run on
the pool's nodes only, also once training ended and the worker pods' CPUs are free."""


def keep_ray_data_on_this_pool() -> None:
    """When :data:`DATA_LABELS_ENV` is set (a TrainJob's validation pool), make it Ray Data's
    ``DataContext.execution_options.label_selector`` in this process; otherwise do nothing."""
    value = os.environ.get(DATA_LABELS_ENV)
    if not value:
        return
    select_data_nodes(json.loads(value))


def validation_task(
    fn: Any, checkpoint: Checkpoint | str, config: dict[str, Any] | None
) -> Iterator[Any]:
    """The Ray task body: yields a start signal, then :func:`run_validation`'s metrics (Ray
    Data kept on the validation pool, see :func:`keep_ray_data_on_this_pool`)."""
    yield _STARTED
    keep_ray_data_on_this_pool()
    yield run_validation(fn, checkpoint, config)


class ValidationResults(Protocol):
    """Where a dispatcher reports to (the run's ``_validation_routing.ValidationRouter``)."""

    def record_validation(
        self,
        name: str,
        status: CheckpointStatus,
        metrics: dict[str, Any] | None,
        error: str | None,
    ) -> CheckpointRecord | None:
        """Record how the validation of checkpoint ``name`` ended; the updated record."""

    def validation_queue_changed(
        self, pending: int, running: int, queued: int, waiting: int
    ) -> None:
        """The queue changed: ``pending``/``running`` demand, ``queued``/``waiting`` counts."""


@dataclass
class _Job:
    record: CheckpointRecord
    fn: Any
    config: dict[str, Any] | None
    #: This validation's timeout (None: ``ValidationConfig.timeout_s``).
    timeout_s: float | None = None
    queued_at: float = field(default_factory=time.monotonic)
    #: When it took a concurrency slot and was handed to Ray / a thread.
    launched_at: float | None = None
    #: When it started running (None while it waits for a node): ``timeout_s`` counts from here.
    started_at: float | None = None
    handle: Any = None


class BaseValidationDispatcher(ABC):
    """Queue, concurrency limit and timeouts; subclasses launch the work.

    It gets committed checkpoints through :meth:`submit` and reports each outcome through
    ``results.record_validation``: the checkpoint manager alone changes a record.
    """

    def __init__(self, results: ValidationResults, config: ValidationConfig) -> None:
        self.results = results
        self.config = config
        self._queue: collections.deque[_Job] = collections.deque()
        self._running: list[_Job] = []
        self._cond = threading.Condition()
        self._closed = False
        self._outstanding = 0
        self._error: BaseException | None = None
        self._last_waiting_log = float("-inf")
        self.completed = 0
        self.failed = 0
        #: Seconds from submit to start of each validation that started.
        self.start_latencies: list[float] = []
        self._thread = threading.Thread(
            target=self._loop, name="validation-dispatcher", daemon=True
        )
        self._thread.start()

    # -- interface to the coordinator and the controller --------------------------------------
    def submit(
        self,
        record: CheckpointRecord,
        fn: Any,
        config: dict[str, Any] | None,
        timeout_s: float | None = None,
    ) -> None:
        """Queue a validation of a committed checkpoint."""
        with self._cond:
            self._queue.append(_Job(record, fn, config, timeout_s))
            self._outstanding += 1
            self._cond.notify_all()
        self._publish_demand()

    def counts(self) -> tuple[int, int, int]:
        """(queued, running, waiting): queued for a concurrency slot, holding one, and those
        of the running ones still waiting for a node to start on."""
        with self._cond:
            waiting = sum(1 for job in self._running if job.started_at is None)
            return len(self._queue), len(self._running), waiting

    def demand(self) -> tuple[int, int]:
        """(pending, running): what the operator sizes the validation pool by.

        ``running`` validations hold a concurrency slot (started, or waiting for a node);
        ``pending`` counts only queued ones that could start now, at most
        ``max_concurrent_validations - running``: validations queued beyond the limit
        would not use another node.
        """
        queued, running, _ = self.counts()
        free = max(0, self.config.max_concurrent_validations - running)
        return min(queued, free), running

    def wait(self, timeout: float | None = None) -> bool:
        """Block until no validation is pending or running; False on timeout.

        Returns early (True) when the dispatcher failed; :meth:`raise_if_failed` tells.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._outstanding and self._thread.is_alive():
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(0.1 if remaining is None else min(0.1, remaining))
        return True

    @property
    def error(self) -> BaseException | None:
        """The first failure of the dispatcher itself (not of a validate_fn), if any."""
        with self._cond:
            return self._error

    def raise_if_failed(self) -> None:
        """Raise :class:`ValidationDispatchError` when recording validations failed."""
        error = self.error
        if error is not None:
            raise ValidationDispatchError(
                f"recording validation results failed: {type(error).__name__}: {error}"
            ) from error

    def close(self) -> None:
        """Stop dispatching; queued validations stay ``pending_validation``.

        Running validations are cancelled: their results would no longer be recorded,
        and they would keep holding validation nodes.
        """
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(10)
        with self._cond:
            running, self._running = list(self._running), []
        for job in running:
            self._cancel(job)

    # -- subclass hooks -----------------------------------------------------------------------
    @abstractmethod
    def _launch(self, job: _Job) -> Any:
        """Start one validation; returns a handle. Calls :meth:`_mark_started` once it runs."""

    @abstractmethod
    def _poll(self, jobs: list[_Job], timeout: float) -> list[tuple[_Job, Any, str | None]]:
        """Jobs that ended within ``timeout``: (job, metrics or None, error text or None).

        Also marks jobs that started running meanwhile (:meth:`_mark_started`).
        """

    @abstractmethod
    def _cancel(self, job: _Job) -> None:
        """Stop a validation (best effort)."""

    def _capacity_hint(self) -> str:
        """Why launched validations may not start (for the periodic waiting log)."""
        return ""

    def _placement(self) -> str:
        """What a validation asks for (for the periodic waiting log)."""
        return "a free slot"

    def _mark_started(self, job: _Job) -> None:
        job.started_at = time.monotonic()
        self.start_latencies.append(job.started_at - job.queued_at)

    # -- the loop -----------------------------------------------------------------------------
    def _loop(self) -> None:
        try:
            while self._step():
                pass
        except BaseException as exc:  # noqa: BLE001 - recorded, raised by raise_if_failed
            self._broken(exc)

    def _step(self) -> bool:
        """Launch what fits, collect results, apply timeouts. False once closed."""
        failed_to_start: list[tuple[_Job, str]] = []
        with self._cond:
            if self._closed:
                return False
            launched = False
            while self._queue and len(self._running) < self.config.max_concurrent_validations:
                job = self._queue.popleft()
                job.launched_at = time.monotonic()
                try:
                    job.handle = self._launch(job)
                except Exception as exc:  # noqa: BLE001 - recorded, never fatal
                    failed_to_start.append((job, f"could not start validation: {exc!r}"))
                    continue
                self._running.append(job)
                launched = True
            running = list(self._running)
            if not running and not failed_to_start:
                self._cond.wait(0.5)
                return True
        for job, start_error in failed_to_start:
            self._finish(job, None, start_error, CheckpointStatus.VALIDATION_FAILED)
        if launched:
            self._publish_demand()
        if not running:
            return True
        for job, metrics, error in self._poll(running, 0.2):
            status = (
                CheckpointStatus.VALIDATED if error is None else CheckpointStatus.VALIDATION_FAILED
            )
            if self._take(job):
                self._finish(job, metrics, error, status)
        self._apply_timeouts(running)
        self._log_waiting(running)
        return True

    def _apply_timeouts(self, running: list[_Job]) -> None:
        now = time.monotonic()
        for job in running:
            timeout = job.timeout_s or self.config.timeout_s
            if timeout is None:
                continue
            if job.started_at is None or now - job.started_at <= timeout:
                continue  # still waiting for a node: not running yet, so not timed
            if self._take(job):
                self._cancel(job)
                self._finish(
                    job,
                    None,
                    f"validation exceeded timeout_s={timeout:g}",
                    CheckpointStatus.VALIDATION_TIMEOUT,
                )

    def _log_waiting(self, running: list[_Job]) -> None:
        """Every ``WAITING_LOG_INTERVAL_S``, say how many validations wait for a node."""
        now = time.monotonic()
        waiting = [j for j in running if j.started_at is None and j.launched_at is not None]
        if not waiting or now - self._last_waiting_log < WAITING_LOG_INTERVAL_S:
            return
        oldest = max(now - (j.launched_at or now) for j in waiting)
        if oldest < WAITING_LOG_INTERVAL_S:
            return
        self._last_waiting_log = now
        queued, _, _ = self.counts()
        logger.warning(
            "%d validation(s) waiting for a node with %s to run on (the oldest for %.0fs; "
            "%d more queued)%s",
            len(waiting),
            self._placement(),
            oldest,
            queued,
            self._capacity_hint(),
        )

    def _take(self, job: _Job) -> bool:
        """Remove ``job`` from the running ones; False when it already ended."""
        with self._cond:
            if job not in self._running:
                return False
            self._running.remove(job)
            return True

    def _finish(
        self,
        job: _Job,
        metrics: dict[str, Any] | None,
        error: str | None,
        status: CheckpointStatus,
    ) -> None:
        # The coordinator's lock is taken without holding ours (the coordinator calls
        # submit() while holding its lock).
        _driver_metrics.note_validation_done(time.monotonic() - job.queued_at)
        try:
            self._apply(job, metrics, error, status)
        except Exception as exc:
            logger.exception("Recording the validation of %s failed", job.record.name)
            with self._cond:
                if self._error is None:
                    self._error = exc
        finally:
            with self._cond:
                self._outstanding -= 1
                self._cond.notify_all()
        self._publish_demand()

    def _broken(self, exc: BaseException) -> None:
        """The loop itself failed: record why, give up on every validation, wake waiters.

        Their checkpoints stay ``pending_validation`` in the manifest.
        """
        logger.error("The validation dispatcher failed: %r", exc, exc_info=exc)
        with self._cond:
            if self._error is None:
                self._error = exc
            running, self._running = list(self._running), []
            self._queue.clear()
            self._outstanding = 0
            self._cond.notify_all()
        for job in running:
            self._cancel(job)

    def _apply(
        self,
        job: _Job,
        metrics: dict[str, Any] | None,
        error: str | None,
        status: CheckpointStatus,
    ) -> None:
        name = job.record.name
        record = self.results.record_validation(name, status, metrics, error)
        if record is None:
            return  # evicted meanwhile (cannot happen while pending, but be safe)
        if record.status is CheckpointStatus.VALIDATED:
            self.completed += 1
            logger.info("Validated %s: %s", name, metrics)
        else:
            self.failed += 1
            logger.warning(
                "Validation of %s %s: %s", name, record.status.value, record.validation_error
            )

    def _publish_demand(self) -> None:
        pending, running = self.demand()
        queued, _, waiting = self.counts()
        self.results.validation_queue_changed(pending, running, queued, waiting)


class RayValidationDispatcher(BaseValidationDispatcher):
    """Each validation is a Ray task asking for ``ValidationConfig.resources``.

    The task is a streaming generator: its first item says it started running, so
    the time it waited for a node with those resources is not part of ``timeout_s``.
    """

    def __init__(self, results: ValidationResults, config: ValidationConfig) -> None:
        import ray

        self._task: Any = ray.remote(validation_task)
        #: Ray ``.options()`` of each task, chosen once (see ``ValidationConfig``).
        self.task_options = config.task_options(ray.cluster_resources())
        super().__init__(results, config)

    def _launch(self, job: _Job) -> Any:
        options = {"max_retries": 0, **self.task_options}
        return self._task.options(
            **options, num_returns="streaming", name=f"validate:{job.record.name}"
        ).remote(job.fn, job.record.checkpoint, job.config)

    def _placement(self) -> str:
        resources = self.task_options.get("resources")
        if resources:
            return str(resources)
        return f"{self.task_options.get('num_cpus', 1)} CPU(s)"

    def _poll(self, jobs: list[_Job], timeout: float) -> list[tuple[_Job, Any, str | None]]:
        import ray

        by_id = {id(job.handle): job for job in jobs}
        ready, _ = ray.wait([job.handle for job in jobs], num_returns=len(jobs), timeout=timeout)
        out: list[tuple[_Job, Any, str | None]] = []
        for ready_item in ready:
            job = by_id[id(ready_item)]
            generator: Iterator[Any] = job.handle
            while True:
                try:
                    value = ray.get(next(generator))
                except StopIteration:
                    out.append((job, None, "the validation task ended without a result"))
                    break
                except Exception as exc:  # noqa: BLE001 - the validation's own error
                    out.append((job, None, _short_error(exc)))
                    break
                if job.started_at is None and value == _STARTED:
                    self._mark_started(job)
                    if ray.wait([generator], timeout=0)[0]:
                        continue  # it already finished too
                    break
                out.append((job, value, None))
                break
        return out

    def _cancel(self, job: _Job) -> None:
        import ray

        try:
            ray.cancel(job.handle, force=True)
        except Exception as exc:  # noqa: BLE001
            logger.debug("cancel failed: %s", exc)

    def _capacity_hint(self) -> str:
        import ray

        try:
            total = ray.cluster_resources()
        except Exception:  # noqa: BLE001 - only a hint
            return ""
        wanted: dict[str, float] = dict(self.task_options.get("resources") or {})
        missing = {k: v for k, v in wanted.items() if total.get(k, 0.0) < v}
        if missing:
            return (
                f"; the Ray cluster has no node with {missing} (in all: "
                f"{ {k: total.get(k, 0.0) for k in missing} }). A TrainJob's validation pool "
                "adds such nodes as it scales up (kubectl get pods -l "
                "trainjob.dev/role=validation); elsewhere start one with "
                f"ray start --num-cpus=0 --resources='{json.dumps(missing)}'"
            )
        return "; every node that has them is busy"


class ThreadValidationDispatcher(BaseValidationDispatcher):
    """Local mode: each validation runs in a daemon thread of this process.

    Daemon threads (not a thread pool) so that a validation stuck past its
    timeout cannot keep the process alive at exit.
    """

    def _launch(self, job: _Job) -> Future[dict[str, Any]]:
        future: Future[dict[str, Any]] = Future()

        def target() -> None:
            try:
                future.set_result(run_validation(job.fn, job.record.checkpoint, job.config))
            except BaseException as exc:  # noqa: BLE001 - delivered through the future
                future.set_exception(exc)

        threading.Thread(target=target, name=f"validate-{job.record.name}", daemon=True).start()
        self._mark_started(job)
        return future

    def _poll(self, jobs: list[_Job], timeout: float) -> list[tuple[_Job, Any, str | None]]:
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
