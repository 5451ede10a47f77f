"""The controller's bookkeeping: events in, committed checkpoints out.

Transport-independent: the Ray controller, local mode and torchrun mode all feed worker
events into one :class:`RunCoordinator`, which routes each to the part that owns its job
and holds the one lock they share:

* :class:`~trainer_runtime._rounds.RoundTracker`: report rounds, matched and committed in
  round order (the commit's file checks are the checkpoint manager's);
* :class:`~trainer_runtime._validation_routing.ValidationRouter`: which validation a
  committed checkpoint gets, results back into the manager, resume by a new driver;
* :class:`~trainer_runtime._requests.WorkerRequests`: collectives,
  ``get_all_reported_checkpoints()`` and upload claims;
* :class:`~trainer_runtime._preemption_state.PreemptionState`: the preemption notice and the
  ranks still required (``relax_collectives_on_preemption``).

Every dependency is passed to the constructor; what belongs to one worker group (its size,
how answers reach its ranks) is passed to :meth:`RunCoordinator.begin_attempt`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from trainer_runtime._events import (
    Event,
    ReportEvent,
    RequestEvent,
    UploadDoneEvent,
    UploadFailedEvent,
    WorkerFinishedEvent,
)
from trainer_runtime._preemption_state import PreemptionState
from trainer_runtime._requests import Reply, WorkerRequests
from trainer_runtime._rounds import RoundTracker
from trainer_runtime._validation_routing import (
    DispatcherFactory,
    KeywordValidation,
    ValidationDispatcher,
    ValidationRouter,
)
from trainer_runtime.callbacks import Callback
from trainer_runtime.checkpoint_manager import CheckpointManager, CheckpointRecord, CheckpointStatus
from trainer_runtime.config import ValidationConfig
from trainer_runtime.errors import CheckpointUploadError, WorkerFailure
from trainer_runtime.preemption import PreemptionInfo

__all__ = ["KeywordValidation", "Reply", "RunCoordinator", "ValidationDispatcher"]


class RunCoordinator:
    """Turns worker events into metrics, committed checkpoints and failures.

    ``default_validation``: the run-level ``(validate_fn, validate_config)``;
    ``validation_config``: the trainer's ``ValidationConfig`` (used when it has an ``fn``);
    ``make_validator``: builds the validation dispatcher, given where it reports results
    (None: this run cannot validate); ``run_context``: Ray Train's ``TrainRunContext``,
    passed to ``UserCallback`` hooks.
    """

    def __init__(
        self,
        manager: CheckpointManager,
        callbacks: Sequence[Callback] | None = None,
        *,
        run_context: Any = None,
        default_validation: tuple[Any, dict[str, Any] | None] | None = None,
        validation_config: ValidationConfig | None = None,
        make_validator: DispatcherFactory | None = None,
    ) -> None:
        callbacks = list(callbacks or [])
        self.manager = manager
        self.lock = threading.RLock()
        self.world_size = 1
        self.preemption = PreemptionState(manager)
        self.validation = ValidationRouter(
            manager,
            self.lock,
            callbacks=callbacks,
            default=default_validation,
            config=validation_config,
            make_dispatcher=make_validator,
            on_result=self._answer_queries,
        )
        self.rounds = RoundTracker(
            manager,
            self.preemption,
            self.validation,
            callbacks=callbacks,
            run_context=run_context,
            on_round_done=self._answer_queries,
        )
        self.requests = WorkerRequests(manager, self.rounds, self.preemption)
        #: What rank 0's train function returned in this attempt (``Result.return_value``).
        self.return_value: Any = None

    def _answer_queries(self) -> None:
        # Rounds and validation results can end a get_all_reported_checkpoints() wait.
        self.requests.answer_queries()

    # -- attempts -------------------------------------------------------------------------
    def begin_attempt(self, world_size: int, reply: Reply | None = None) -> int:
        """Start tracking a new worker group whose ranks get answers through ``reply``;
        returns its first round index."""
        with self.lock:
            self.world_size = world_size
            self.return_value = None
            cursor = self.rounds.begin(world_size)
            self.requests.begin(world_size, reply)
            # A notice belongs to the worker group that got it: the next group runs elsewhere.
            self.preemption.begin(world_size)
            return cursor

    def end_attempt(self) -> None:
        """The worker group is gone: its ranks can no longer be answered."""
        with self.lock:
            self.requests.end()

    def relax_for(self, notice: PreemptionInfo) -> list[int] | None:
        """Let report rounds and collectives complete without the ranks ``notice`` names
        (``FailureConfig.relax_collectives_on_preemption``, as Ray Train 2.60 narrows its
        barriers), so the survivors can commit a checkpoint while the preempted ranks are
        gone or stuck. Returns the surviving ranks; None (nothing relaxed) when rank 0 is
        preempted (it writes the metrics and the collectives' answers) or no rank survives.

        A preempted rank that did report a checkpoint is still waited for (its shard is
        never committed half-written); what it reports after its round committed is
        dropped, and ``get_preemption_info()`` answered without it still names it."""
        with self.lock:
            surviving = self.preemption.relax(notice)
            if surviving is None:
                return None
            self.requests.answer_collectives()
            self.rounds.commit_ready()
            return surviving

    def abandon_attempt(self) -> list[str]:
        """Forget the failed group's unfinished rounds; returns their checkpoint folders.

        Those folders hold partial uploads that were never committed; the caller
        deletes them so they cannot be mistaken for checkpoints.
        """
        with self.lock:
            return self.rounds.abandon()

    def finish_attempt(self) -> None:
        """Check that every round completed (all ranks reported equally often)."""
        with self.lock:
            self.rounds.check_all_complete()

    # -- events ---------------------------------------------------------------------------
    def handle(self, event: Event) -> None:
        """Apply one event. Raises WorkerFailure / UserConfigError on failures."""
        with self.lock:
            if self.rounds.is_stale(event):
                return
            if isinstance(event, ReportEvent):
                self.rounds.on_report(event)
            elif isinstance(event, UploadDoneEvent):
                self.rounds.on_upload_done(event)
            elif isinstance(event, UploadFailedEvent):
                what = f"rank {event.rank} failed to upload checkpoint {event.uri}: {event.error}"
                cause = event.exception or CheckpointUploadError(event.error)
                if event.permanent and not event.source_error:
                    what += (
                        ". Retrying cannot fix this error, so the run stops instead of "
                        "restarting the workers; fix the storage configuration or permissions"
                    )
                raise WorkerFailure(
                    what, rank=event.rank, exception=cause, permanent=event.permanent
                ) from cause
            elif isinstance(event, RequestEvent):
                self.requests.on_request(event)
            elif isinstance(event, WorkerFinishedEvent) and event.error is None:
                if event.rank == 0:
                    self.return_value = event.return_value
                self.requests.on_finished(event.rank)
            elif isinstance(event, WorkerFinishedEvent) and event.error is not None:
                # config_error: a bad report() call or configuration, which every restart
                # would repeat: the run fails at once.
                raise WorkerFailure(
                    f"the train function failed on rank {event.rank}: {event.error}",
                    rank=event.rank,
                    traceback_text=event.traceback,
                    exception=event.exception or RuntimeError(event.error),
                    permanent=event.config_error,
                )

    def tick(self) -> None:
        """Called by the controller at least once a second: answers queries whose
        ``timeout_s`` passed."""
        with self.lock:
            self.requests.answer_queries(time.monotonic())

    # -- preemption -----------------------------------------------------------------------
    def note_drained_nodes(self, nodes: dict[str, int]) -> None:
        """The Ray nodes of this worker group being drained now (node id -> deadline ms)."""
        with self.lock:
            self.preemption.note_drained_nodes(nodes)

    @property
    def drained_nodes(self) -> dict[str, int]:
        """Ray nodes of this worker group being drained (node id -> deadline ms)."""
        return self.preemption.drained_nodes

    @property
    def preemption_notice(self) -> PreemptionInfo | None:
        """The first non-None answer to ``get_preemption_info()`` of this worker group."""
        return self.preemption.notice

    @property
    def required_ranks(self) -> set[int] | None:
        """The ranks rounds and collectives wait for once relaxed; None: every rank."""
        return self.preemption.required_ranks

    @property
    def relaxed_notice(self) -> PreemptionInfo | None:
        """The notice the collectives were relaxed for."""
        return self.preemption.relaxed_notice

    def preempted_and_committed(self) -> bool:
        """Whether the train function was told of a preemption and a checkpoint was
        committed since: the run can stop, nothing is lost."""
        return self.preemption.preempted_and_committed()

    # -- validation -----------------------------------------------------------------------
    @property
    def validator(self) -> ValidationDispatcher | None:
        """The run's validation dispatcher (None: this run cannot validate)."""
        return self.validation.dispatcher

    def record_validation(
        self,
        name: str,
        status: CheckpointStatus,
        metrics: dict[str, Any] | None,
        error: str | None,
    ) -> CheckpointRecord | None:
        """How a validation ended (see :meth:`ValidationRouter.record_validation`)."""
        return self.validation.record_validation(name, status, metrics, error)

    def resume_validations(self) -> tuple[list[CheckpointRecord], list[str]]:
        """Pick up validations a previous driver left pending (see
        :meth:`ValidationRouter.resume`)."""
        return self.validation.resume()

    # -- queries --------------------------------------------------------------------------
    def next_round_waits_only_on(self, ranks: set[int]) -> bool:
        """Whether the next round to commit lacks only reports or uploads from ``ranks``.

        After a failure, the controller keeps listening to the surviving ranks
        while this holds: their part of that round is still on its way, and
        committing it saves a restart from repeating those steps.
        """
        with self.lock:
            return self.rounds.next_round_waits_only_on(ranks, self.world_size)

    @property
    def pending_rounds(self) -> int:
        """Rounds reported by some rank but not yet complete."""
        with self.lock:
            return self.rounds.pending

    @property
    def latest_metrics(self) -> dict[str, Any] | None:
        """Rank 0's latest reported metrics."""
        return self.rounds.latest_metrics

    @property
    def latest_metrics_round(self) -> int | None:
        """The report round of :attr:`latest_metrics`."""
        return self.rounds.latest_metrics_round

    def summary(self) -> dict[str, Any]:
        """A small dict for progress displays."""
        with self.lock:
            latest = self.manager.latest
            return {
                "reports": self.rounds.reports_seen,
                "metrics": self.rounds.latest_metrics,
                "latest_checkpoint": latest.path if latest else None,
                "checkpoints": len(self.manager.records),
                "time": time.time(),
            }
