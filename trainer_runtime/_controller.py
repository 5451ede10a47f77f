"""The driver-side run loop: start a worker group, consume events, restart on failure.

The loop moves through explicit states (:class:`ControllerState`, as Ray Train V2's
controller does): ``INITIALIZING`` (take the run folder over, restore its checkpoints,
resume validations), ``SCHEDULING`` (start a worker group), ``RUNNING`` (apply its events),
then ``FINISHED``, or, for an error that ended the attempt, whatever the
:class:`~trainer_runtime._failure_policy.FailurePolicy` decides: ``RESTARTING`` (back to
``SCHEDULING``) or ``ERRORED``. With elastic training (``ScalingConfig(num_workers=(min,
max))``) the :mod:`~trainer_runtime._scaling_policy` decides each group's size in
``SCHEDULING``, and a running group whose size no longer matches what the cluster can place
goes through ``RESIZING`` (back to ``SCHEDULING``, from the latest checkpoint, not counted as
a failure), as in Ray Train.

The same :class:`RunCoordinator` bookkeeping backs the Ray controller here and
the local / torchrun controllers in ``_local``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from trainer_runtime import _driver_metrics
from trainer_runtime._coordinator import RunCoordinator
from trainer_runtime._events import WorkerFinishedEvent
from trainer_runtime._failure_policy import DECIDED_ERRORS, FailureDecision, FailurePolicy
from trainer_runtime._fencing import FenceCheck, FencedStorage, take_over
from trainer_runtime._scaling_policy import ScalingPolicy, make_scaling_policy
from trainer_runtime._validation import (
    BaseValidationDispatcher,
    RayValidationDispatcher,
    ThreadValidationDispatcher,
    ValidationResults,
)
from trainer_runtime.backend import Backend
from trainer_runtime.callbacks import TrainRunContext, call_all
from trainer_runtime.checkpoint_manager import CheckpointManager, CheckpointRecord
from trainer_runtime.config import RunConfig, ScalingConfig
from trainer_runtime.context import TrainContext
from trainer_runtime.data_config import (
    DataConfig,
    GenDataset,
    TrainingResourceRequest,
    capture_data_context,
    group_shards,
    shutdown_shards,
)
from trainer_runtime.errors import (
    ControllerError,
    FencedError,
    PreemptionError,
    PreemptionStop,
    TrainingFailedError,
    UserConfigError,
    WorkerFailure,
    WorkerGroupError,
)
from trainer_runtime.preemption import (
    HeadWatch,
    PreemptionInfo,
    combine,
    driver_stop_time,
    merge,
)
from trainer_runtime.result import Result
from trainer_runtime.storage import Storage, StorageError, get_storage
from trainer_runtime.storage.base import describe_error
from trainer_runtime.storage.factory import client_modules
from trainer_runtime.worker_group import WorkerGroup

logger = logging.getLogger("trainer_runtime")

POLL_TIMEOUT_S = 1.0
#: How long a failed attempt keeps listening to the surviving workers (see ``_salvage``).
SALVAGE_TIMEOUT_S = 10.0
#: How long it listens to them in any case, for other ranks failing at the same time.
FAILURE_GRACE_S = 1.0
#: How long a preemption notice without a deadline is waited on (Ray Train's
#: ``DEFAULT_PREEMPTION_DEADLINE_S``).
DEFAULT_PREEMPTION_DEADLINE_S = 120.0


class ControllerState(StrEnum):
    """Where the controller's run loop is (Ray Train V2's ``TrainControllerStateType``)."""

    #: Taking the run folder over, restoring its checkpoints, resuming validations.
    INITIALIZING = "initializing"
    #: Starting a worker group.
    SCHEDULING = "scheduling"
    #: The worker group trains; its events are applied.
    RUNNING = "running"
    #: An attempt failed and the failure policy restarts (after a back-off, or at once for
    #: a preemption).
    RESTARTING = "restarting"
    #: Elastic training: the running group's size no longer matches what the cluster can
    #: place; it stops and a group of the new size starts from the latest checkpoint.
    RESIZING = "resizing"
    #: Training finished (terminal).
    FINISHED = "finished"
    #: The run failed or stopped for a preemption; ``fit()`` raises (terminal).
    ERRORED = "errored"

    @property
    def is_terminal(self) -> bool:
        """Whether the run loop is over."""
        return self in (ControllerState.FINISHED, ControllerState.ERRORED)


#: The state changes the run loop makes (any state may end in ERRORED).
STATE_TRANSITIONS: dict[ControllerState, frozenset[ControllerState]] = {
    ControllerState.INITIALIZING: frozenset({ControllerState.SCHEDULING}),
    ControllerState.SCHEDULING: frozenset(
        {ControllerState.RUNNING, ControllerState.RESTARTING, ControllerState.FINISHED}
    ),
    ControllerState.RUNNING: frozenset(
        {ControllerState.RESTARTING, ControllerState.RESIZING, ControllerState.FINISHED}
    ),
    ControllerState.RESTARTING: frozenset({ControllerState.SCHEDULING}),
    ControllerState.RESIZING: frozenset({ControllerState.SCHEDULING}),
    ControllerState.FINISHED: frozenset(),
    ControllerState.ERRORED: frozenset(),
}


class ResizeStop(Exception):
    """Ends a running attempt whose group should have ``new_size`` workers (RESIZING)."""

    def __init__(self, old_size: int, new_size: int) -> None:
        super().__init__(f"resize the worker group from {old_size} to {new_size} workers")
        self.old_size = old_size
        self.new_size = new_size


#: What ends an attempt early and is decided on by the run loop (not raised from ``fit()``
#: as it is): the failure policy's errors, and a resize.
ATTEMPT_ENDINGS: tuple[type[BaseException], ...] = (*DECIDED_ERRORS, ResizeStop)


@dataclass
class RunSpec:
    """Everything one run needs."""

    train_fn: Callable[..., Any]
    train_config: dict[str, Any] | None
    scaling: ScalingConfig
    run: RunConfig
    backend: Backend
    #: The trainer's ``datasets`` (name -> Ray Dataset, or a function returning one).
    datasets: dict[str, GenDataset] = field(default_factory=dict)
    #: The trainer's ``dataset_config`` (how the datasets are split among the workers).
    data_config: DataConfig = field(default_factory=DataConfig)


class BaseController:
    """Restart-until-done logic shared by the Ray and local controllers."""

    #: Built by :meth:`run` once the run folder is taken over (the manager writes through
    #: the fence of this driver's epoch).
    manager: CheckpointManager
    coordinator: RunCoordinator

    def __init__(self, spec: RunSpec) -> None:
        self.spec = spec
        run = spec.run
        assert run.checkpoint_config is not None and run.failure_config is not None
        self.run_path = run.run_path
        self.storage = get_storage(self.run_path, run.storage_filesystem)
        #: What Ray Train's ``UserCallback`` hooks get as ``run_context``.
        self.run_context = TrainRunContext(
            run, spec.train_config, spec.scaling, dataset_config=spec.data_config
        )
        self.failure_policy = FailurePolicy(
            run.failure_config, preemption_in_place=self._retries_preemption_in_place()
        )
        self.state = ControllerState.INITIALIZING
        #: Every state the run loop entered, in order.
        self.state_history: list[ControllerState] = [self.state]
        #: Failures of other ranks seen while the last attempt was failing.
        self.other_failures: dict[int, BaseException] = {}
        #: The latest committed checkpoint when the current attempt started.
        self._latest_before: CheckpointRecord | None = None
        self.attempt = 0
        #: This driver's epoch in the run folder (see ``_fencing``); 0 until it takes over.
        self.epoch = 0
        self.validator: BaseValidationDispatcher | None = None
        self._drain_polled = 0.0
        #: When this attempt's preemption notice was first seen (``time.time()``), or None.
        self._notice_seen_at: float | None = None
        #: Preempted ranks that relax_collectives_on_preemption could not relax for.
        self._relax_refused: list[int] | None = None
        #: The driver's ``ray.data.DataContext`` when ``fit()`` was called, installed in every
        #: worker (None without datasets: ray.data is not imported then).
        self.data_context: Any = capture_data_context() if spec.datasets else None
        #: With datasets: the current worker group's resources as registered with Ray Data.
        self._data_request: TrainingResourceRequest | None = None
        #: The size of every worker group started, in order (``Result.world_sizes``).
        self.world_sizes: list[int] = []
        #: Groups stopped for RESIZING (``Result.resizes``; not counted as failures).
        self.resizes = 0

    @property
    def failures(self) -> int:
        """Failures counted against ``FailureConfig.max_failures`` (``Result.restarts``)."""
        return self.failure_policy.failures

    @property
    def preemptions(self) -> int:
        """Preemptions the run restarted from, or stopped for (``max_preemption_failures``)."""
        return self.failure_policy.preemptions

    def _enter(self, state: ControllerState) -> None:
        """Move the run loop to ``state`` (ERRORED from anywhere but a terminal state)."""
        allowed = STATE_TRANSITIONS[self.state]
        if state is ControllerState.ERRORED and not self.state.is_terminal:
            allowed = allowed | {ControllerState.ERRORED}
        if state not in allowed:
            raise AssertionError(f"controller state {self.state} cannot change to {state}")
        logger.debug("Controller state: %s -> %s", self.state, state)
        self.state = state
        self.state_history.append(state)

    @property
    def validation_fn_set(self) -> bool:
        """Whether the trainer has a ``ValidationConfig.fn`` (``report(validation=True)``)."""
        validation = self.spec.run.validation_config
        return validation is not None and validation.fn is not None

    def _make_validator(self, results: ValidationResults) -> BaseValidationDispatcher:
        assert self.spec.run.validation_config is not None
        return ThreadValidationDispatcher(results, self.spec.run.validation_config)

    def _install_validator(self, results: ValidationResults) -> BaseValidationDispatcher:
        """The coordinator's validator factory: :meth:`_make_validator`, kept for the loop
        (waiting for validations at the end, closing the dispatcher)."""
        self.validator = self._make_validator(results)
        return self.validator

    def result(self, error: BaseException | None = None) -> Result:
        """The current outcome as a :class:`Result`."""
        latest = self.manager.latest
        best = self.manager.best()
        return Result(
            metrics=latest.all_metrics if latest else None,
            checkpoint=latest.checkpoint if latest else None,
            path=self.run_path,
            error=error,
            best_checkpoints=[(r.checkpoint, r.all_metrics) for r in self.manager.top_k()],
            checkpoints=list(self.manager.records),
            best_checkpoint=best.checkpoint if best else None,
            restarts=self.failures,
            return_value=self.coordinator.return_value if error is None else None,
            world_sizes=list(self.world_sizes),
            resizes=self.resizes,
            _storage_filesystem=self.spec.run.storage_filesystem,
        )

    def _retries_preemption_in_place(self) -> bool:
        """Whether a preemption restarts the worker group within this ``fit()``, as Ray
        Train does up to ``FailureConfig.max_preemption_failures``. Only Ray workers can
        move off a preempted node; in local mode this very process is going away, so
        ``fit()`` raises :class:`PreemptionError` at once."""
        return False

    def _owns_run_folder(self) -> bool:
        """Whether this process is the run's driver: the one that may clean up the run
        folder and resume validations (not the other ranks of a torchrun job)."""
        return True

    def run(self) -> Result:
        """Run attempts until one succeeds or the failure policy gives up."""
        try:
            owner = self._initialize()
            assert self.validator is not None
            try:
                while not self.state.is_terminal:
                    self._enter(ControllerState.SCHEDULING)
                    error = self._attempt()
                    if error is None:
                        self._enter(ControllerState.FINISHED)
                    elif isinstance(error, ResizeStop):
                        self._resize(error)
                    else:
                        self._recover(error)  # raises unless it restarts
                if owner:
                    self.manager.delete_orphans()
            finally:
                self.validator.close()
        except BaseException:
            if not self.state.is_terminal:
                self._enter(ControllerState.ERRORED)
            raise
        result = self.result()
        call_all(self.spec.run.callbacks, "on_run_end", result, None)
        return result

    def _initialize(self) -> bool:
        """INITIALIZING: take the run folder over (the run's driver only), restore its
        checkpoints, build the coordinator and the validation dispatcher, and resume
        validations a previous driver left pending. Returns whether this process owns the
        run folder."""
        run = self.spec.run
        assert run.checkpoint_config is not None
        owner = self._owns_run_folder()
        try:
            storage: Storage = self.storage
            if owner:
                # Before any worker starts: from now on only this driver (and its workers)
                # write to the run folder; an earlier driver's workers stop at their next check.
                self.epoch = take_over(self.storage, self.run_path)
                fence = FenceCheck(self.storage, self.run_path, self.epoch, check_interval_s=0)
                storage = FencedStorage(self.storage, fence)
            self.manager = CheckpointManager(self.run_path, run.checkpoint_config, storage)
            self.manager.restore(delete_uncommitted=owner)
        except (OSError, StorageError) as exc:
            raise TrainingFailedError(
                f"Training failed: cannot prepare the run folder {self.run_path}: "
                f"{describe_error(exc)}",
                cause=exc,
            ) from exc
        latest = self.manager.latest
        if latest is not None:
            logger.info("Resuming run %s from checkpoint %s", self.run_path, latest.path)
        if owner:
            _driver_metrics.serve_from_env()
        _driver_metrics.note_run_start()
        _driver_metrics.note_restored(latest.committed_at if latest is not None else None)
        validation = run.validation_config
        self.coordinator = RunCoordinator(
            self.manager,
            run.callbacks,
            run_context=self.run_context,
            default_validation=(
                (validation.validate_fn, validation.validate_config)
                if validation is not None and validation.validate_fn is not None
                else None
            ),
            validation_config=validation,
            make_validator=self._install_validator,
        )
        if owner:
            self.coordinator.resume_validations()
        return owner

    def _attempt(self) -> BaseException | None:
        """SCHEDULING and RUNNING: one worker group, start to end. Returns the error that
        ended it (one the failure policy decides on), None when training finished."""
        self._latest_before = self.manager.latest
        self.other_failures = {}
        self._notice_seen_at = None
        self._relax_refused = None
        try:
            self._run_attempt()
            self._after_success()
        except ATTEMPT_ENDINGS as exc:
            return exc
        return None

    def _resize(self, stop: ResizeStop) -> None:
        """RESIZING: the group stopped for a size that fits better; the next one starts from
        the latest committed checkpoint (as Ray Train, not counted against max_failures)."""
        self._enter(ControllerState.RESIZING)
        self._cleanup_partial()
        self.resizes += 1
        logger.warning(
            "Resizing the worker group from %d to %d workers; restarting from %s "
            "(not counted against FailureConfig.max_failures)",
            stop.old_size,
            stop.new_size,
            self.manager.latest.path if self.manager.latest else "scratch",
        )
        self.attempt += 1

    def _recover(self, exc: BaseException) -> None:
        """Carry out the failure policy's decision on ``exc``: RESTARTING (returns), or
        ERRORED (raises what ``fit()`` raises)."""
        progressed = self.manager.latest is not self._latest_before
        if isinstance(exc, WorkerFailure):
            self._after_exception(exc)
        elif isinstance(exc, PreemptionStop):
            self._cleanup_partial()
            # The driver itself is going away (a worker lost meanwhile included): no restart.
            exc.driver = exc.driver or driver_stop_time() is not None
        action = self.failure_policy.decide(exc, progressed=progressed)
        failure_config = self.failure_policy.config
        if action.counted:
            call_all(self.spec.run.callbacks, "on_failure", exc, self.failures, action.will_restart)
        if action.decision is FailureDecision.RAISE:
            self._enter(ControllerState.ERRORED)
            raise self._fail(exc) from exc
        if action.decision is FailureDecision.RAISE_PREEMPTION:
            assert isinstance(exc, PreemptionStop)
            _driver_metrics.note_preemption()
            self._enter(ControllerState.ERRORED)
            result = self.result(exc)
            call_all(self.spec.run.callbacks, "on_run_end", None, exc)
            raise PreemptionError(exc.preemption_info, exc.drain_timed_out, result=result) from exc
        self._enter(ControllerState.RESTARTING)
        if action.decision is FailureDecision.RETRY_PREEMPTED:
            assert isinstance(exc, PreemptionStop)
            _driver_metrics.note_preemption()
            _driver_metrics.note_restart("preemption")
            info = exc.preemption_info
            logger.warning(
                "Preemption of ranks %s (Ray nodes %s%s): restarting the worker group "
                "on other nodes from %s (preemption %d of %s; not counted against "
                "FailureConfig.max_failures)",
                info.preempted_ranks,
                ", ".join(info.preempted_node_ids),
                ", the deadline passed first" if exc.drain_timed_out else "",
                self.manager.latest.path if self.manager.latest else "scratch",
                self.preemptions,
                _limit(failure_config.max_preemption_failures),
            )
        else:
            _driver_metrics.note_restart("failure")
            logger.warning(
                "Worker group failed (%s); restarting (failure %d of %s) in %.1f s from %s",
                str(exc).splitlines()[0],
                self.failures,
                _limit(failure_config.max_failures),
                action.delay_s,
                self.manager.latest.path if self.manager.latest else "scratch",
            )
            self._cleanup_partial()
            time.sleep(action.delay_s)
        self.attempt += 1

    def _fail(self, exc: BaseException) -> TrainingFailedError:
        """The exception ``fit()`` raises for ``exc``: Ray's ``WorkerGroupError`` when a
        worker failed, its ``ControllerError`` otherwise (both are TrainingFailedError)."""
        if not isinstance(exc, FencedError):  # a fenced driver must not touch the run
            self._cleanup_partial()
        max_failures = self.spec.run.failure_config.max_failures  # type: ignore[union-attr]
        retried = isinstance(exc, WorkerFailure) and not exc.permanent
        if retried:
            head = (
                f"Training failed after {self.failures} failure(s) "
                f"(FailureConfig.max_failures={max_failures}): {exc}"
            )
        else:
            head = f"Training failed: {exc}"
        result = self.result(exc)
        call_all(self.spec.run.callbacks, "on_run_end", None, exc)
        latest = result.checkpoint
        if latest is not None:
            head += f"\nThe latest committed checkpoint is {latest.path}."
        if isinstance(exc, WorkerFailure) and exc.rank is not None:
            failures = {**self.other_failures, exc.rank: exc.exception or RuntimeError(str(exc))}
            return WorkerGroupError(
                head,
                dict(sorted(failures.items())),
                cause=exc,
                result=result,
                traceback_text=exc.traceback_text,
            )
        return ControllerError(exc, head, result=result)

    def _after_exception(self, exc: WorkerFailure) -> None:
        """Ray Train's ``UserCallback.after_exception``: rank -> exception of every worker
        that failed (not called for failures of the controller itself)."""
        if exc.rank is None:
            return
        failures = {**self.other_failures, exc.rank: exc.exception or RuntimeError(str(exc))}
        call_all(
            self.spec.run.callbacks,
            "after_exception",
            run_context=self.run_context,
            worker_exceptions=dict(sorted(failures.items())),
        )

    def _cleanup_partial(self) -> None:
        for uri in self.coordinator.abandon_attempt():
            logger.info("Deleting uncommitted checkpoint folder %s", uri)
            try:
                self.manager.delete_uncommitted(uri)
            except Exception as exc:  # noqa: BLE001 - it is never used anyway
                logger.warning("Could not delete %s: %s", uri, exc)

    def _after_success(self) -> None:
        assert self.validator is not None and self.spec.run.validation_config is not None
        queued, running, _ = self.validator.counts()
        if self.spec.run.validation_config.wait_for_validations and (queued or running):
            logger.info("Training finished; waiting for %d validation(s)", queued + running)
            self.validator.wait()
        self.validator.raise_if_failed()

    def _run_attempt(self) -> None:
        raise NotImplementedError


def _limit(max_failures: int) -> str:
    return "unlimited" if max_failures == -1 else str(max_failures)


def _deadline_text(deadline_ms: int | None) -> str:
    if deadline_ms is None:
        return f"none given; waiting at most {DEFAULT_PREEMPTION_DEADLINE_S:.0f} s"
    return f"in {deadline_ms / 1000 - time.time():.1f} s"


def _ensure_ray() -> None:
    """Connect to ``RAY_ADDRESS``, or start a local Ray that also has validation slots."""
    import ray

    if ray.is_initialized():
        return
    address = os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=True)
    else:
        ray.init(address="local", resources={"validation": 2.0}, log_to_driver=True)


#: How long a group about to start may wait for resources a group just stopped still holds
#: in Ray's view, when fewer than ``max_workers`` fit (Ray Train re-reads its reservations
#: every second: ``GET_RESERVED_RESOURCES_INTERVAL_S``).
RESOURCE_SETTLE_S = 1.0
#: Seconds between two looks at the cluster while fewer than ``min_workers`` fit.
SCALING_POLL_S = 1.0


def _watch_head() -> HeadWatch | None:
    """A watch on this Ray job's head (its GCS address), None where Ray gives none."""
    import ray

    try:
        address = ray.get_runtime_context().gcs_address
    except Exception as exc:  # noqa: BLE001 - no watch: the stop time still applies
        logger.debug("no GCS address to watch: %s", exc)
        return None
    return HeadWatch(address) if address else None


class RayController(BaseController):
    """Runs the workers as Ray actors."""

    #: Whether this driver process got a termination notice of its own (see
    #: :meth:`_check_driver_notice`), and the latest committed checkpoint then.
    _driver_noticed = False
    _latest_at_driver_notice: CheckpointRecord | None = None
    #: The Ray head, watched once the driver got its notice (None: no notice, or no address).
    _head_watch: HeadWatch | None = None

    def __init__(self, spec: RunSpec) -> None:
        super().__init__(spec)
        self.scaling_policy: ScalingPolicy = make_scaling_policy(spec.scaling)
        #: When the running group started (``time.monotonic()``), for the resize monitor.
        self._group_started = 0.0

    def _group_scaling(self) -> ScalingConfig:
        """SCHEDULING: the scaling of the next group, at the size the policy decides.

        Elastic: waits (looking every ``SCALING_POLL_S``) while fewer than ``min_workers``
        fit, up to ``placement_timeout_s``; when fewer than ``max_workers`` fit, looks again
        for up to ``RESOURCE_SETTLE_S`` so that the resources of a group just stopped count.
        """
        scaling = self.spec.scaling
        if not scaling.elasticity_enabled:
            return scaling
        start = time.monotonic()
        deadline = start + scaling.placement_timeout_s
        first_fit: float | None = None
        while True:
            try:
                size = self.scaling_policy.decide_for_new_group()
            except Exception as exc:  # noqa: BLE001 - Ray Train too waits and looks again
                logger.warning("Could not read the cluster's resources: %s", exc)
                size = None
            now = time.monotonic()
            if size is not None:
                first_fit = now if first_fit is None else first_fit
                if size >= scaling.max_workers or now - first_fit >= RESOURCE_SETTLE_S:
                    return scaling.for_group(size)
                time.sleep(0.2)
                continue
            self._stop_if_driver_noticed()
            if now >= deadline:
                raise UserConfigError(
                    f"could not place min_workers={scaling.min_workers} workers with "
                    f"{scaling.worker_resources()} each within {scaling.placement_timeout_s:.0f}s "
                    f"(ScalingConfig(num_workers={scaling.num_workers})); add nodes or lower "
                    "min_workers/resources_per_worker"
                )
            time.sleep(min(SCALING_POLL_S, max(0.0, deadline - now)))

    def _check_resize(self, group: Any) -> None:
        """RUNNING: ask the policy whether the group should have another size (elastic only;
        at most every ``elastic_resize_monitor_interval_s``); raise :class:`ResizeStop` if so.
        Not while a preemption notice is handled (Ray Train's controller is then in
        PREEMPTING, which makes no scaling decision): the group's last checkpoint comes first."""
        if not self.spec.scaling.elasticity_enabled or self._notice(group) is not None:
            return
        held: dict[str, list[dict[str, float]]] = {}
        for w, bundle in zip(group.workers, group.bundles, strict=False):
            held.setdefault(w.node_id, []).append(bundle)
        try:
            size = self.scaling_policy.decide_for_running_group(
                group.world_size, self._group_started, held
            )
        except Exception as exc:  # noqa: BLE001 - a failed look is retried next interval
            logger.warning("Could not read the cluster's resources for resizing: %s", exc)
            return
        if size is not None and size != group.world_size:
            raise ResizeStop(group.world_size, size)

    def _retries_preemption_in_place(self) -> bool:
        """A new worker group is placed off the preempted nodes: Ray schedules nothing new
        on a draining node."""
        return True

    def _run_attempt(self) -> None:
        import ray

        _ensure_ray()
        spec = self.spec
        scaling = self._group_scaling()
        group = self._make_group(scaling)
        shards: list[dict[str, Any]] = []
        try:
            group.start()
            spec.backend.on_start(group, scaling)
            world = group.world_size
            self.world_sizes.append(world)
            self._group_started = time.monotonic()
            if spec.datasets:
                # A new split for every worker group: its size, its workers' nodes.
                shards = group_shards(
                    spec.datasets,
                    spec.data_config,
                    world,
                    [w.node_id for w in group.workers],
                )
                # What the workers hold is not Ray Data's to budget (as in Ray Train).
                self._data_request = TrainingResourceRequest(
                    f"train-{self.run_context.run_id}", list(group.bundles)
                )
                self._data_request.renew(force=True)
            offset = self.coordinator.begin_attempt(world, _ray_reply(group))
            latest = self.manager.latest
            assert spec.run.name is not None and spec.run.storage_path is not None
            assert spec.run.failure_config is not None
            relax = spec.run.failure_config.relax_collectives_on_preemption
            ray.get(
                [
                    w.actor.start.remote(
                        spec.train_fn,
                        spec.train_config,
                        TrainContext(
                            w.rank,
                            world,
                            w.local_rank,
                            w.local_world_size,
                            w.node_rank,
                            spec.run.name,
                            spec.run.storage_path,
                            self.attempt,
                            spec.run.storage_filesystem,
                        ),
                        latest.path if latest else None,
                        offset,
                        spec.run.checkpoint_upload_mode,
                        self.epoch,
                        self.validation_fn_set,
                        relax,
                        shards[w.rank] if shards else None,
                        self.data_context,
                    )
                    for w in group.workers
                ]
            )
            logger.info(
                "Started %d workers (attempt %d)%s",
                world,
                self.attempt,
                f", resuming from {latest.path}" if latest else "",
            )
            call_all(spec.run.callbacks, "on_run_start", self.run_path, world, self.attempt)
            self._enter(ControllerState.RUNNING)
            self._consume_events(group)
            self.coordinator.finish_attempt()
        finally:
            self.coordinator.end_attempt()
            try:
                spec.backend.on_shutdown(group)
            except Exception as exc:  # noqa: BLE001 - tear-down is best effort
                logger.debug("backend shutdown failed: %s", exc)
            group.shutdown(prestart_successor=True)
            shutdown_shards(shards)
            if self._data_request is not None:
                self._data_request.cancel()
                self._data_request = None
            time.sleep(0)  # let Ray process the kills before a restart asks for resources

    def _make_validator(self, results: ValidationResults) -> BaseValidationDispatcher:
        _ensure_ray()
        config = self.spec.run.validation_config
        assert config is not None
        return RayValidationDispatcher(results, config)

    def _consume_events(self, group: Any) -> None:
        """Apply every worker's events until all train functions finished."""
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        by_rank = {w.rank: w for w in group.workers}
        pending = {w.actor.poll.remote(POLL_TIMEOUT_S): w.rank for w in group.workers}
        finished: set[int] = set()
        #: Preempted ranks whose worker went away while the survivors carry on.
        gone: set[int] = set()
        try:
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=30.0)
                if ready and len(pending) > 1:
                    # Every other answer already in, too: one pass over the pending polls
                    # per batch of answers, not per answer (O(ranks) each).
                    others = [ref for ref in pending if ref != ready[0]]
                    more, _ = ray.wait(others, num_returns=len(others), timeout=0)
                    ready += more
                for ref in ready:
                    rank = pending.pop(ref)
                    try:
                        events = ray.get(ref)
                    except (RayActorError, GetTimeoutError) as exc:
                        w = by_rank[rank]
                        notice = self._notice(group)
                        if notice is not None and rank in notice.preempted_ranks:
                            # the preempted node went away: the notice's end, not a failure
                            logger.warning(
                                "Worker rank %d on preempted Ray node %s is gone", rank, w.node_id
                            )
                            required = self.coordinator.required_ranks
                            if required is None or rank in required:
                                raise PreemptionStop(notice) from exc
                            # relaxed collectives: the survivors may still commit without it
                            gone.add(rank)
                            self._watch_preemption(group)
                            continue
                        raise WorkerFailure(
                            f"worker rank {rank} (pid {w.pid} on {w.ip}) died: "
                            f"{str(exc).splitlines()[0]}",
                            rank=rank,
                        ) from exc
                    for event in events:
                        self.coordinator.handle(event)
                        if isinstance(event, WorkerFinishedEvent):
                            finished.add(event.rank)
                    self.coordinator.tick()
                    self._watch_preemption(group)
                    self._check_resize(group)
                    if self._data_request is not None:
                        self._data_request.renew()
                    if rank not in finished:
                        pending[by_rank[rank].actor.poll.remote(POLL_TIMEOUT_S)] = rank
            if gone:  # the survivors returned: the attempt ends as the preemption's
                notice = self._notice(group)
                assert notice is not None
                raise PreemptionStop(notice)
        except WorkerFailure as exc:
            self._salvage(pending, group, finished, exclude=exc.rank)
            raise

    def _watch_preemption(self, group: Any) -> None:
        """Keep the coordinator's view of drained Ray nodes current (at most once a second,
        as Ray Train's watcher polls ``get_draining_nodes()``), and stop the attempt once
        the train function was told of a preemption and a checkpoint was committed since,
        or once the notice's deadline (plus ``FailureConfig.preemption_grace_s``) passed,
        as Ray Train's controller does (``drain_timed_out``)."""
        now = time.monotonic()
        if now - self._drain_polled >= 1.0:
            self._drain_polled = now
            nodes = {w.node_id for w in group.workers}
            try:
                draining = ray_draining_nodes()
            except Exception as exc:  # noqa: BLE001 - a missed poll is retried
                logger.debug("get_draining_nodes failed: %s", exc)
            else:
                self.coordinator.note_drained_nodes(
                    {n: d for n, d in draining.items() if n in nodes}
                )
        self._check_driver_notice(group)
        notice = self._notice(group)
        if notice is None:
            return
        if self.coordinator.preempted_and_committed():
            raise PreemptionStop(notice)
        failure_config = self.spec.run.failure_config
        assert failure_config is not None
        if self._notice_seen_at is None:
            self._notice_seen_at = time.time()
            logger.warning(
                "Preemption notice for ranks %s on Ray nodes %s (deadline %s)",
                notice.preempted_ranks,
                ", ".join(notice.preempted_node_ids),
                _deadline_text(notice.deadline_ms),
            )
        if failure_config.relax_collectives_on_preemption:
            self._relax_collectives(notice)
            if self.coordinator.preempted_and_committed():
                raise PreemptionStop(notice)
        grace_s = failure_config.preemption_grace_s
        deadline_s = (
            notice.deadline_ms / 1000
            if notice.deadline_ms is not None
            else self._notice_seen_at + DEFAULT_PREEMPTION_DEADLINE_S
        )
        if time.time() >= deadline_s + grace_s:
            raise PreemptionStop(notice, drain_timed_out=True)

    def _check_driver_notice(self, group: Any) -> None:
        """The driver process itself got a termination notice (its pod deleted, evicted or
        drained; :func:`~trainer_runtime.preemption.driver_stop_time`): every node of the
        group counts as drained until the stop time, so ``get_preemption_info()`` names
        every rank and the train function can save a last checkpoint. The attempt stops
        (``fit()`` raises :class:`PreemptionError`, no restart in place: the driver is going
        away) once a checkpoint is committed after the notice (the round in flight, or the
        one saved on the notice), at the stop time, before the kubelet's SIGKILL, or as soon
        as the Ray head has not answered for :data:`~trainer_runtime.preemption.HEAD_GONE_S`
        (every pod of the job is going: nothing more can be committed)."""
        stop_at = driver_stop_time()
        if stop_at is None:
            return
        if not self._driver_noticed:
            self._driver_noticed = True
            self._latest_at_driver_notice = self.manager.latest
            self._head_watch = _watch_head()
            logger.warning(
                "Termination notice to the driver: the run stops once a checkpoint is "
                "committed, in %.1f s at the latest",
                stop_at - time.time(),
            )
        deadline_ms = int(stop_at * 1000)
        drained = dict(self.coordinator.drained_nodes)
        drained.update({w.node_id: deadline_ms for w in group.workers})
        self.coordinator.note_drained_nodes(drained)
        notice = self._notice(group)
        assert notice is not None
        if self.manager.latest is not self._latest_at_driver_notice:
            raise PreemptionStop(notice, driver=True)
        if time.time() >= stop_at:
            raise PreemptionStop(notice, drain_timed_out=True, driver=True)
        if self._head_watch is not None and self._head_watch.gone():
            logger.warning(
                "The Ray head at %s is gone: nothing more can be committed; stopping now",
                self._head_watch.address,
            )
            raise PreemptionStop(notice, drain_timed_out=True, driver=True)

    def _relax_collectives(self, notice: PreemptionInfo) -> None:
        """``FailureConfig.relax_collectives_on_preemption``: report rounds and collectives
        stop waiting for the preempted ranks (once per set of preempted ranks)."""
        relaxed = self.coordinator.relaxed_notice
        if relaxed is not None and set(notice.preempted_ranks) <= set(relaxed.preempted_ranks):
            return
        if self._relax_refused == notice.preempted_ranks:
            return
        surviving = self.coordinator.relax_for(notice)
        if surviving is None:
            self._relax_refused = notice.preempted_ranks
            logger.info(
                "Rank 0 is being preempted (preempted ranks %s), so "
                "relax_collectives_on_preemption is ignored",
                notice.preempted_ranks,
            )
            return
        logger.warning(
            "Preemption of ranks %s: report() rounds and collectives now complete with "
            "ranks %s only (relax_collectives_on_preemption)",
            notice.preempted_ranks,
            surviving,
        )

    def _notice(self, group: Any) -> PreemptionInfo | None:
        """This attempt's preemption notice: what ``get_preemption_info()`` answered (the
        ranks' own SIGTERMs included) and the drained Ray nodes of this group, as one."""
        told = self.coordinator.preemption_notice
        drained = self.coordinator.drained_nodes
        if not drained:  # the usual case, checked after every batch of events
            return told
        # the ranks as get_preemption_info()'s merge sees them, none with a SIGTERM of its own
        ranks = {w.rank: (w.node_id, False, None) for w in group.workers}
        return combine(told, merge(ranks, drained))

    def _salvage(
        self, pending: dict[Any, int], group: Any, finished: set[int], exclude: int | None
    ) -> None:
        """After a failure, apply what the surviving workers already sent or are still sending.

        A round that the failed rank had fully reported (and uploaded) is still
        committed once the survivors' parts arrive, so a restart resumes from it
        instead of an older checkpoint. Survivors are listened to for at most
        ``SALVAGE_TIMEOUT_S``, and only while the next round waits on them alone.
        """
        import ray

        survivors = {w.rank for w in group.workers if w.rank != exclude and w.rank not in finished}
        by_rank = {w.rank: w for w in group.workers}
        refs = dict(pending)
        for rank in survivors - set(refs.values()):
            refs[by_rank[rank].actor.poll.remote(0.2)] = rank
        start = time.monotonic()
        deadline = start + SALVAGE_TIMEOUT_S
        first_pass = True
        while refs:
            # Keep listening while the next round waits only on the survivors, and for a
            # moment in any case: a rank failing at the same step is reported too.
            in_grace = time.monotonic() - start < FAILURE_GRACE_S
            if (
                not first_pass
                and not in_grace
                and not self.coordinator.next_round_waits_only_on(set(refs.values()))
            ):
                break
            timeout = max(0.0, deadline - time.monotonic())
            ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=timeout)
            if not ready:
                break
            first_pass = False
            for ref in ready:
                rank = refs.pop(ref)
                try:
                    events = ray.get(ref)
                except Exception:  # noqa: BLE001 - that worker is gone too
                    continue
                done = self._apply_salvaged(events)
                if not done and time.monotonic() < deadline:
                    refs[by_rank[rank].actor.poll.remote(POLL_TIMEOUT_S)] = rank

    def _apply_salvaged(self, events: list[Any]) -> bool:
        """Apply salvaged events; returns whether that worker's train function ended.

        A survivor's train function that failed too is recorded among the attempt's worker
        failures (Ray Train reports every failed rank in ``worker_failures``).
        """
        done = False
        for event in events:
            if isinstance(event, WorkerFinishedEvent):
                done = True
                if event.error is not None:
                    self.other_failures[event.rank] = event.exception or RuntimeError(event.error)
                continue
            try:
                self.coordinator.handle(event)
            except Exception as exc:  # noqa: BLE001 - already failing; keep salvaging
                logger.debug("ignoring event %r after failure: %s", event, exc)
        return done

    def _make_group(self, scaling: ScalingConfig) -> Any:
        group = WorkerGroup(
            scaling,
            env=self.spec.run.worker_env,
            runtime_env=self.spec.run.worker_runtime_env,
            # The storage's client library too: a resumed run's first step waits for it.
            preload=(
                *self.spec.backend.preload,
                *client_modules(self.spec.run.storage_path, self.spec.run.storage_filesystem),
            ),
        )
        group.check_while_starting = self._stop_if_driver_noticed
        return group

    def _stop_if_driver_noticed(self) -> None:
        """While a worker group is not running yet (waiting for its resources, its actors
        starting): the driver's own termination notice stops the run at once. Nothing has
        trained since the latest committed checkpoint, so nothing is lost, and the driver
        leaves without waiting out its grace period for a group that would only save that
        checkpoint again (a suspension or a restart right after a resume)."""
        stop_at = driver_stop_time()
        if stop_at is None:
            return
        logger.warning(
            "Termination notice to the driver before the worker group runs: stopping now "
            "(nothing trained since %s)",
            self.manager.latest.path if self.manager.latest else "the start",
        )
        raise PreemptionStop(PreemptionInfo(int(stop_at * 1000), {}), driver=True)


def ray_draining_nodes() -> dict[str, int]:
    """Ray Core's draining nodes, ``node id -> deadline ms`` (0: no deadline)."""
    import ray._private.state

    return dict(ray._private.state.state.get_draining_nodes())


def _ray_reply(group: Any) -> Any:
    """Answers reach a Ray worker through its actor's ``deliver`` (fire and forget)."""
    by_rank = {w.rank: w for w in group.workers}

    def reply(rank: int, request_id: int, value: Any) -> None:
        by_rank[rank].actor.deliver.remote(request_id, value)

    return reply
