"""The controller's bookkeeping: events in, committed checkpoints out.

Transport-independent: the Ray controller, local mode and torchrun mode all
feed worker events into one :class:`RunCoordinator`. A report round ``r`` is
complete once every rank's report of ``r`` arrived and every rank that gave a
checkpoint has stored its files; complete rounds are committed strictly in
round order, so checkpoints commit in report order even when uploads finish
out of order.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from trainer_runtime._events import (
    Event,
    ReportEvent,
    RequestEvent,
    UploadDoneEvent,
    UploadFailedEvent,
    WorkerFinishedEvent,
)
from trainer_runtime._layout import COMMIT_MARKER
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
from trainer_runtime.errors import (
    CheckpointUploadError,
    FencedError,
    UserConfigError,
    WorkerFailure,
)
from trainer_runtime.preemption import PREEMPTION_CALLER, PreemptionInfo, combine, merge
from trainer_runtime.storage import Storage, StorageError
from trainer_runtime.storage.base import (
    StoredFile,
    describe_error,
    is_permanent_error,
    uri_name,
)

logger = logging.getLogger(__name__)


@dataclass
class _Round:
    index: int
    reports: dict[int, ReportEvent] = field(default_factory=dict)
    uploaded: set[int] = field(default_factory=set)
    #: What each rank stored (None: written in place, see ``UploadDoneEvent.stored``).
    stored: dict[int, dict[str, StoredFile] | None] = field(default_factory=dict)
    #: Ranks whose upload was claimed before their report (relaxed collectives, SYNC):
    #: waited for like the uploads of ranks that reported a checkpoint.
    claimed: set[int] = field(default_factory=set)

    @property
    def checkpoint_uri(self) -> str | None:
        return next((r.checkpoint_uri for r in self.reports.values() if r.checkpoint_uri), None)

    def complete(self, required: set[int]) -> bool:
        """Every required rank reported, and every rank that reported a checkpoint (required
        or not) finished storing it: a round never commits with a shard half-written."""
        if not required <= self.reports.keys():
            return False
        need = {rank for rank, r in self.reports.items() if r.checkpoint_uri} | self.claimed
        return need <= self.uploaded


class ValidationDispatcher(Protocol):
    """What runs validations of committed checkpoints (see ``_validation``).

    The coordinator hands it each committed checkpoint that asks for validation; it
    reports back only through :meth:`RunCoordinator.record_validation`.
    """

    def submit(
        self,
        record: CheckpointRecord,
        fn: Any,
        config: dict[str, Any] | None,
        timeout_s: float | None = None,
    ) -> None:
        """Queue a validation of ``record`` (``timeout_s``: None for the configured default)."""


@dataclass(frozen=True)
class KeywordValidation:
    """A Ray 2.60 validation function, called as ``fn(checkpoint, **fn_kwargs)``."""

    fn: Any

    def __call__(self, checkpoint: Any, fn_kwargs: dict[str, Any]) -> Any:
        """Validate ``checkpoint``."""
        return self.fn(checkpoint, **fn_kwargs)


#: Sends an answer to a rank: ``reply(rank, request_id, value)`` (see ``RequestEvent``).
Reply = Any


@dataclass
class _Query:
    """A rank waiting in ``get_all_reported_checkpoints()``."""

    rank: int
    request_id: int
    #: Rounds below this one must be processed (the rank reported them).
    until_round: int
    validated: bool
    deadline: float | None


@dataclass
class _Collective:
    """Ranks inside one collective call (by sequence number)."""

    caller: str
    arrived: dict[int, int] = field(default_factory=dict)  # rank -> request id
    data: Any = None
    gathered: dict[int, Any] = field(default_factory=dict)  # rank -> its data


@dataclass(frozen=True)
class _ValidationRequest:
    fn: Any
    config: dict[str, Any] | None
    source: str
    timeout_s: float | None = None


class RunCoordinator:
    """Turns worker events into metrics, committed checkpoints and failures."""

    def __init__(
        self, manager: CheckpointManager, storage: Storage, callbacks: list[Callback] | None = None
    ) -> None:
        self.manager = manager
        self.storage = storage
        self.callbacks = callbacks or []
        self.validator: ValidationDispatcher | None = None
        #: (validate_fn, validate_config) for checkpoints reported without a validate_fn.
        self.default_validation: tuple[Any, dict[str, Any] | None] | None = None
        #: The trainer's ``ValidationConfig`` when it has an ``fn`` (``report(validation=)``).
        self.validation_config: ValidationConfig | None = None
        self.latest_metrics: dict[str, Any] | None = None
        self.reports_seen = 0
        self.bytes_uploaded = 0
        self.world_size = 1
        self._rounds: dict[int, _Round] = {}
        self._cursor = 0
        self._report_counts: dict[int, int] = {}
        self.lock = threading.RLock()
        #: How answers reach the ranks (set by the controller for each attempt).
        self.reply: Reply | None = None
        #: Ray Train's ``TrainRunContext``, passed to ``UserCallback`` hooks.
        self.run_context: Any = None
        self._queries: list[_Query] = []
        self._collectives: dict[int, _Collective] = {}
        self._finished: set[int] = set()
        self._offset = 0
        #: Ray nodes being drained (node id -> deadline ms), kept current by the controller.
        self.drained_nodes: dict[str, int] = {}
        #: The first non-None answer to ``get_preemption_info()``, and the latest committed
        #: checkpoint when it was given (the controller stops once a newer one is committed).
        self.preemption_notice: PreemptionInfo | None = None
        self.latest_at_notice: Any = None
        #: ``FailureConfig.relax_collectives_on_preemption`` in effect: the ranks that report
        #: rounds and collectives wait for (the survivors); None: every rank.
        self.required_ranks: set[int] | None = None
        #: The notice the collectives were relaxed for (what answers without them include).
        self.relaxed_notice: PreemptionInfo | None = None
        #: Collectives answered without some ranks (seq -> answer), for those arriving late.
        self._answered: dict[int, Any] = {}

    # -- attempts -------------------------------------------------------------------------
    def begin_attempt(self, world_size: int) -> int:
        """Start tracking a new worker group; returns its first round index."""
        with self.lock:
            self.world_size = world_size
            self._rounds.clear()
            self._report_counts = {rank: 0 for rank in range(world_size)}
            self._cursor = self._offset = self.manager.next_round
            self._queries.clear()
            self._collectives.clear()
            self._finished.clear()
            # A notice belongs to the worker group that got it: the next group runs elsewhere.
            self.drained_nodes = {}
            self.preemption_notice = None
            self.latest_at_notice = None
            self.required_ranks = None
            self.relaxed_notice = None
            self._answered.clear()
            return self._cursor

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
            surviving = set(range(self.world_size)) - set(notice.preempted_ranks)
            if 0 not in surviving:
                return None
            self.required_ranks = surviving
            self.relaxed_notice = combine(self.relaxed_notice, notice)
            for seq in sorted(self._collectives):
                self._answer_collective(seq)
            self._commit_ready()
            return sorted(surviving)

    @property
    def _required(self) -> set[int]:
        if self.required_ranks is not None:
            return self.required_ranks
        return set(range(self.world_size))

    def abandon_attempt(self) -> list[str]:
        """Forget the failed group's unfinished rounds; returns their checkpoint folders.

        Those folders hold partial uploads that were never committed; the caller
        deletes them so they cannot be mistaken for checkpoints.
        """
        with self.lock:
            uris = sorted({u for r in self._rounds.values() if (u := r.checkpoint_uri)})
            for r in self._rounds.values():
                self.manager.note_round(r.index)
            self._rounds.clear()
            committed = {rec.path for rec in self.manager.records}
            return [u for u in uris if u not in committed]

    def finish_attempt(self) -> None:
        """Check that every round completed (all ranks reported equally often)."""
        with self.lock:
            if self._rounds:
                counts = ", ".join(f"rank {k}: {v}" for k, v in sorted(self._report_counts.items()))
                raise UserConfigError(
                    "every rank must call report() the same number of times, but the counts "
                    f"differ ({counts}); {len(self._rounds)} report round(s) never completed"
                )

    # -- events ---------------------------------------------------------------------------
    def handle(self, event: Event) -> None:
        """Apply one event. Raises WorkerFailure / UserConfigError on failures."""
        with self.lock:
            if self._stale(event):
                return
            if isinstance(event, ReportEvent):
                self._on_report(event)
            elif isinstance(event, UploadDoneEvent):
                rnd = self._round(event.round)
                rnd.uploaded.add(event.rank)
                rnd.stored[event.rank] = event.stored
                self.bytes_uploaded += event.bytes
                self._commit_ready()
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
                self._on_request(event)
            elif isinstance(event, WorkerFinishedEvent) and event.error is None:
                self._finished.add(event.rank)
                self._check_stranded()
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

    def _stale(self, event: Event) -> bool:
        """A report or upload of a round already committed without this rank (relaxed
        collectives): dropped."""
        if self.required_ranks is None or not isinstance(event, (ReportEvent, UploadDoneEvent)):
            return False
        if event.round >= self._cursor:
            return False
        logger.warning(
            "Dropping rank %d's %s of report round %d: the round was committed without it "
            "(relax_collectives_on_preemption)",
            event.rank,
            "report" if isinstance(event, ReportEvent) else "upload",
            event.round,
        )
        return True

    # -- requests: collectives and get_all_reported_checkpoints() ----------------------------
    def _send(self, rank: int, request_id: int, value: Any) -> None:
        if self.reply is None:
            raise UserConfigError(
                f"rank {rank} waits for the controller, but this run cannot answer workers"
            )
        self.reply(rank, request_id, value)

    def _on_request(self, event: RequestEvent) -> None:
        if event.kind == "collective":
            seq, caller, data = event.payload
            if seq in self._answered:  # answered without this rank (relaxed collectives)
                self._send(event.rank, event.request_id, self._answered[seq])
                return
            collective = self._collectives.setdefault(seq, _Collective(caller))
            collective.arrived[event.rank] = event.request_id
            if event.rank == 0:
                collective.data = data
            collective.gathered[event.rank] = data
            if not self._answer_collective(seq):
                self._check_stranded()
        elif event.kind == "reported_checkpoints":
            until_round, mode, timeout_s = event.payload
            deadline = None if timeout_s is None else time.monotonic() + float(timeout_s)
            self._queries.append(
                _Query(event.rank, event.request_id, until_round, mode == "VALIDATED", deadline)
            )
            self._answer_queries()
            self._check_stranded()
        elif event.kind == "upload_claim":
            self._send(event.rank, event.request_id, self._claim_upload(event.rank, event.payload))
        else:  # pragma: no cover - the session sends only the kinds above
            raise UserConfigError(f"unknown request {event.kind!r} from rank {event.rank}")

    def _claim_upload(self, rank: int, round_index: int) -> bool:
        """A rank is about to store its checkpoint of ``round_index``: the round now waits
        for that upload (True), or it was committed without the rank (False: relaxed
        collectives), and nothing may be written into the committed folder."""
        if round_index < self._cursor:
            logger.warning(
                "Rank %d may not store its checkpoint of report round %d: the round was "
                "committed without it (relax_collectives_on_preemption)",
                rank,
                round_index,
            )
            return False
        self._round(round_index).claimed.add(rank)
        return True

    def _answer_collective(self, seq: int) -> bool:
        """Answer collective ``seq`` if every required rank is in it; whether it was."""
        collective = self._collectives[seq]
        if not self._required <= collective.arrived.keys():
            return False
        del self._collectives[seq]
        answer = collective.data
        if collective.caller == PREEMPTION_CALLER:
            answer = self._preemption_answer(collective.gathered)
        if len(collective.arrived) < self.world_size:
            self._answered[seq] = answer
        for rank, request_id in sorted(collective.arrived.items()):
            self._send(rank, request_id, answer)
        return True

    def _preemption_answer(self, gathered: dict[int, Any]) -> PreemptionInfo | None:
        """``get_preemption_info()``'s one answer for every rank: the ranks' own notices
        (SIGTERM) and the drained Ray nodes of this worker group."""
        info = combine(merge(gathered, self.drained_nodes), self.relaxed_notice)
        if info is not None and self.preemption_notice is None:
            self.preemption_notice = info
            self.latest_at_notice = self.manager.latest
            logger.warning(
                "Preemption notice for ranks %s (deadline %s ms): the run stops once the next "
                "checkpoint is committed",
                info.preempted_ranks,
                info.deadline_ms,
            )
        return info

    def preempted_and_committed(self) -> bool:
        """Whether the train function was told of a preemption and a checkpoint was
        committed since: the run can stop, nothing is lost."""
        return (
            self.preemption_notice is not None and self.manager.latest is not self.latest_at_notice
        )

    def _answer_queries(self, now: float | None = None) -> None:
        """Answer the ``get_all_reported_checkpoints()`` calls whose wait is over."""
        if not self._queries:
            return
        pending_validation = any(r.status.is_pending for r in self.manager.records)
        waiting: list[_Query] = []
        answer: list[Any] | None = None
        for query in self._queries:
            ready = self._cursor >= query.until_round and not (
                query.validated and pending_validation
            )
            timed_out = query.deadline is not None and (now or time.monotonic()) >= query.deadline
            if not (ready or timed_out):
                waiting.append(query)
                continue
            if answer is None:
                answer = self.manager.reported_checkpoints()
            self._send(query.rank, query.request_id, answer)
        self._queries = waiting

    def tick(self) -> None:
        """Called by the controller at least once a second: answers queries whose
        ``timeout_s`` passed."""
        with self.lock:
            self._answer_queries(time.monotonic())

    def _check_stranded(self) -> None:
        """Fail the attempt when ranks wait for a rank whose train function already returned:
        in a collective it never joins, or for rounds it never reports."""
        if not self._finished:
            return
        for collective in self._collectives.values():
            missing = sorted(set(range(self.world_size)) - set(collective.arrived))
            done = sorted(set(missing) & self._finished)
            if done:
                raise UserConfigError(
                    f"ranks {sorted(collective.arrived)} wait in {collective.caller}() but the "
                    f"train function of rank(s) {done} returned without calling it; every rank "
                    "must call the same collectives in the same order"
                )
        for query in self._queries:
            short = sorted(
                rank
                for rank in self._finished
                if self._offset + self._report_counts.get(rank, 0) < query.until_round
            )
            if short:
                raise UserConfigError(
                    f"rank {query.rank} waits in get_all_reported_checkpoints() for report "
                    f"rounds that rank(s) {short} never reported (their train function "
                    "returned); every rank must call report() the same number of times"
                )

    def _round(self, index: int) -> _Round:
        rnd = self._rounds.get(index)
        if rnd is None:
            rnd = self._rounds[index] = _Round(index)
        return rnd

    def _on_report(self, event: ReportEvent) -> None:
        rnd = self._round(event.round)
        if event.rank in rnd.reports:
            raise WorkerFailure(f"rank {event.rank} reported round {event.round} twice")
        other = rnd.checkpoint_uri
        if event.checkpoint_uri and other and other != event.checkpoint_uri:
            raise UserConfigError(
                f"report round {event.round}: ranks reported different checkpoints "
                f"({other} vs {event.checkpoint_uri} from rank {event.rank}); all ranks of one "
                "report() round must use the same checkpoint_dir_name (each rank may write its "
                "own shard files into it)"
            )
        if event.checkpoint_uri and any(
            r.path == event.checkpoint_uri and r.round != event.round for r in self.manager.records
        ):
            raise UserConfigError(
                f"report round {event.round}: checkpoint folder {event.checkpoint_uri} already "
                "holds a committed checkpoint of an earlier round; pick a new checkpoint_dir_name"
            )
        rnd.reports[event.rank] = event
        self._report_counts[event.rank] = self._report_counts.get(event.rank, 0) + 1
        if event.rank == 0:
            self.latest_metrics = event.metrics
            self.reports_seen += 1
            call_all(self.callbacks, "on_report", event.round, event.metrics)
        self._commit_ready()

    def _commit_ready(self) -> None:
        while True:
            rnd = self._rounds.get(self._cursor)
            if rnd is None or not rnd.complete(self._required):
                return
            self.manager.note_round(rnd.index)
            record = None
            if rnd.checkpoint_uri is not None:
                # A round whose commit fails stays in ``_rounds``: ``abandon_attempt``
                # then hands its folder to the controller for deletion.
                record = self._commit(rnd)
            del self._rounds[self._cursor]
            self._cursor += 1
            call_all(
                self.callbacks,
                "after_report",
                run_context=self.run_context,
                metrics=[rnd.reports[rank].metrics for rank in sorted(rnd.reports)],
                checkpoint=None if record is None else record.checkpoint,
            )
            self._answer_queries()

    def _commit(self, rnd: _Round) -> CheckpointRecord:
        uri = rnd.checkpoint_uri
        assert uri is not None
        rank0 = rnd.reports[0]
        record = CheckpointRecord(
            name=uri_name(uri), path=uri, round=rnd.index, metrics=rank0.metrics
        )
        request = self._validation_request(rnd)
        if request is not None:
            record.validation_source = request.source
            if request.source == VALIDATE_FN_OF_CONFIG:
                record.validation_kwargs = request.config
        validating = request is not None and self.validator is not None
        try:
            record.files = self._verified_files(rnd, uri)
            self.manager.commit(record, validating=validating)
        except FencedError:
            raise
        except (StorageError, OSError) as exc:
            message = f"committing checkpoint {uri} failed: {describe_error(exc)}"
            if is_permanent_error(exc):
                raise UserConfigError(
                    f"{message}. Retrying cannot fix this error, so the run stops instead of "
                    "restarting the workers"
                ) from exc
            raise WorkerFailure(message) from exc
        logger.info("Committed checkpoint %s (round %d)", uri, rnd.index)
        call_all(self.callbacks, "on_checkpoint", record, self.manager.best())
        if request is not None:
            if self.validator is None:
                raise UserConfigError(
                    "report() asked for a validation but this run has no validation dispatcher"
                )
            self.validator.submit(record, request.fn, request.config, request.timeout_s)
        return record

    def _validation_request(self, rnd: _Round) -> _ValidationRequest | None:
        """Which validation a committed round gets: a ``validate_fn`` passed to ``report()``
        (Ray 2.51), else ``report(validation=...)`` (Ray 2.60, the trainer's
        ``ValidationConfig.fn``), else the run-level ``validate_fn`` (every checkpoint)."""
        reports = [rnd.reports[rank] for rank in sorted(rnd.reports)]
        for r in reports:
            if r.validate_fn is not None:
                return _ValidationRequest(r.validate_fn, r.validate_config, VALIDATE_FN_OF_REPORT)
        asked = next((r.validation for r in reports if r.validation is not None), None)
        config = self.validation_config
        if asked is not None and config is not None and config.fn is not None:
            assert config.task_config is not None
            kwargs = {**(config.task_config.fn_kwargs or {}), **(asked.fn_kwargs or {})}
            timeout = asked.timeout_s or config.task_config.timeout_s
            return _ValidationRequest(
                KeywordValidation(config.fn), kwargs, VALIDATE_FN_OF_CONFIG, timeout
            )
        if self.default_validation is not None:
            fn, cfg = self.default_validation
            return _ValidationRequest(fn, cfg, VALIDATE_FN_OF_RUN)
        return None

    def _verified_files(self, rnd: _Round, uri: str) -> dict[str, StoredFile]:
        """The checkpoint's files, checked in storage against what every rank stored.

        Refuses (nothing is committed) a checkpoint with no files, files that are missing
        or not the ones the ranks wrote (another writer, such as a worker of an earlier
        driver, touched the folder), or files no rank reported.
        """
        listed = {
            rel: f for rel, f in self.storage.list_stored(uri).items() if rel != COMMIT_MARKER
        }
        expected: dict[str, list[tuple[int, StoredFile]]] = {}
        in_place = False
        for rank, stored in sorted(rnd.stored.items()):
            if stored is None:
                in_place = True
                continue
            for rel, f in stored.items():
                expected.setdefault(rel, []).append((rank, f))
        if not listed and not any(expected.values()):
            raise UserConfigError(
                f"checkpoint {uri} of report round {rnd.index} holds no files: every rank "
                "reported an empty folder. Write the checkpoint files before calling "
                "report(), or pass checkpoint=None on ranks with nothing to save"
            )
        for rel, by_rank in sorted(expected.items()):
            sizes = {f.size for _, f in by_rank}
            if len(sizes) > 1:
                ranks = ", ".join(f"rank {r}: {f.size} bytes" for r, f in by_rank)
                raise UserConfigError(
                    f"checkpoint {uri}: ranks wrote different files under the same name "
                    f"{rel} ({ranks}); only one survives. Give each rank's files their own "
                    "names (e.g. f'shard_{rank}.pt')"
                )
            now = listed.get(rel)
            if now is None:
                raise WorkerFailure(f"checkpoint {uri} is incomplete: {rel} is missing")
            if all(now != f for _, f in by_rank):
                raise WorkerFailure(
                    f"checkpoint {uri}: {rel} was overwritten after rank "
                    f"{by_rank[-1][0]} stored it (another process wrote into the folder)"
                )
        if not in_place:
            extra = sorted(set(listed) - set(expected))
            if extra:
                raise WorkerFailure(
                    f"checkpoint {uri} holds {len(extra)} file(s) no rank reported ("
                    f"{', '.join(extra[:3])}{', ...' if len(extra) > 3 else ''}), e.g. left "
                    "by a worker of an earlier attempt; it is not committed"
                )
        return listed

    # -- validation results -------------------------------------------------------------------
    def record_validation(
        self,
        name: str,
        status: CheckpointStatus,
        metrics: dict[str, Any] | None,
        error: str | None,
    ) -> CheckpointRecord | None:
        """The validator's one way back: how a validation ended (see
        :meth:`CheckpointManager.record_validation`); callbacks see the updated record."""
        with self.lock:
            record = self.manager.record_validation(name, status, metrics, error)
            if record is not None:
                call_all(self.callbacks, "on_checkpoint", record, self.manager.best())
            self._answer_queries()
            return record

    def validation_queue_changed(
        self, pending: int, running: int, queued: int, waiting: int
    ) -> None:
        """Tell callbacks the validation demand (the operator sizes the pool by it)."""
        call_all(self.callbacks, "on_validation_demand", pending, running)
        call_all(self.callbacks, "on_validation_queue", queued, running, waiting)

    def resume_validations(self) -> tuple[list[CheckpointRecord], list[str]]:
        """A new driver picks up validations a previous driver left pending.

        Those of the run-level validate function (``ValidationConfig.validate_fn``, a
        TrainJob's ``spec.validation.entrypoint``) and of the trainer's ``ValidationConfig.fn``
        (with the ``fn_kwargs`` recorded at commit) are queued again with the function this
        driver has: they read the committed checkpoint from storage. A
        ``validate_fn`` passed to ``report()`` cannot be recovered by another process, so
        those (and any pending validation when no run-level function is configured) are
        recorded as ``validation_lost``. Returns (re-queued records, names of lost ones).
        """
        with self.lock:
            default, validator = self.default_validation, self.validator
            config = self.validation_config
            pending = [r for r in self.manager.records if r.status.is_pending]
            resumable = {
                VALIDATE_FN_OF_RUN: default is not None,
                VALIDATE_FN_OF_CONFIG: config is not None and config.fn is not None,
            }
            requeue = [
                r
                for r in pending
                if validator is not None and resumable.get(r.validation_source or "", False)
            ]
            lost = self.manager.mark_validations_lost(
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
            assert validator is not None
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
                validator.submit(record, fn, fn_config)
        return requeue, [r.name for r in lost]

    def next_round_waits_only_on(self, ranks: set[int]) -> bool:
        """Whether the next round to commit lacks only reports or uploads from ``ranks``.

        After a failure, the controller keeps listening to the surviving ranks
        while this holds: their part of that round is still on its way, and
        committing it saves a restart from repeating those steps.
        """
        with self.lock:
            rnd = self._rounds.get(self._cursor)
            if rnd is None:
                return False
            missing = set(range(self.world_size)) - set(rnd.reports)
            missing |= {
                rank
                for rank, report in rnd.reports.items()
                if report.checkpoint_uri and rank not in rnd.uploaded
            }
            return bool(missing) and missing <= ranks

    @property
    def pending_rounds(self) -> int:
        """Rounds reported by some rank but not yet complete."""
        with self.lock:
            return len(self._rounds)

    def summary(self) -> dict[str, Any]:
        """A small dict for progress displays."""
        with self.lock:
            latest = self.manager.latest
            return {
                "reports": self.reports_seen,
                "metrics": self.latest_metrics,
                "latest_checkpoint": latest.path if latest else None,
                "checkpoints": len(self.manager.records),
                "time": time.time(),
            }
