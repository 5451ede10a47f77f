"""Report rounds: matching every rank's report of a round, and committing rounds in order.

A report round ``r`` is complete once every required rank's report of ``r`` arrived and
every rank that gave a checkpoint has stored its files; complete rounds are committed
strictly in round order, so checkpoints commit in report order even when uploads finish
out of order. The commit itself (the file checks, then the marker) is the checkpoint
manager's (:meth:`~trainer_runtime.checkpoint_manager.CheckpointManager.commit`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainer_runtime import _driver_metrics
from trainer_runtime._events import Event, ReportEvent, UploadDoneEvent
from trainer_runtime._preemption_state import PreemptionState
from trainer_runtime._validation_routing import ValidationRouter
from trainer_runtime.callbacks import Callback, call_all
from trainer_runtime.checkpoint_manager import (
    VALIDATE_FN_OF_CONFIG,
    CheckpointManager,
    CheckpointRecord,
)
from trainer_runtime.errors import FencedError, UserConfigError, WorkerFailure
from trainer_runtime.storage import StorageError
from trainer_runtime.storage.base import (
    StoredFile,
    describe_error,
    is_permanent_error,
    uri_name,
)

logger = logging.getLogger(__name__)


@dataclass
class _Round:
    """One report round's reports and uploads.

    Kept so that each report and each upload costs O(1), not O(ranks): a round of N ranks
    is matched and checked in O(N) in all (the folder, whether every rank reported, and
    the uploads still awaited are updated as events arrive, not recomputed from them).
    """

    index: int
    reports: dict[int, ReportEvent] = field(default_factory=dict)
    uploaded: set[int] = field(default_factory=set)
    #: What each rank stored (None: written in place, see ``UploadDoneEvent.stored``).
    stored: dict[int, dict[str, StoredFile] | None] = field(default_factory=dict)
    #: Ranks whose upload was claimed before their report (relaxed collectives, SYNC):
    #: waited for like the uploads of ranks that reported a checkpoint.
    claimed: set[int] = field(default_factory=set)
    #: The round's checkpoint folder: the first reported one (all ranks must agree).
    checkpoint_uri: str | None = None
    #: Ranks that reported a checkpoint or claimed an upload and have not stored it yet.
    awaiting: set[int] = field(default_factory=set)
    #: Every required rank reported (stays true: reports only arrive, and the required
    #: ranks only shrink within a worker group).
    all_reported: bool = False

    def add_report(self, event: ReportEvent) -> None:
        """Record ``event`` (its rank's first report of this round)."""
        self.reports[event.rank] = event
        if event.checkpoint_uri:
            if self.checkpoint_uri is None:
                self.checkpoint_uri = event.checkpoint_uri
            if event.rank not in self.uploaded:
                self.awaiting.add(event.rank)

    def add_claim(self, rank: int) -> None:
        """``rank`` is about to store its checkpoint of this round."""
        self.claimed.add(rank)
        if rank not in self.uploaded:
            self.awaiting.add(rank)

    def add_upload(self, rank: int, stored: dict[str, StoredFile] | None) -> None:
        """``rank`` stored its files of this round."""
        self.uploaded.add(rank)
        self.stored[rank] = stored
        self.awaiting.discard(rank)

    def complete(self, required: set[int]) -> bool:
        """Every required rank reported, and every rank that reported a checkpoint (required
        or not) finished storing it: a round never commits with a shard half-written."""
        if not self.all_reported:
            # The count first: the set comparison only once the last report is in.
            if len(self.reports) < len(required) or not required <= self.reports.keys():
                return False
            self.all_reported = True
        return not self.awaiting


class RoundTracker:
    """Matches reports and uploads into rounds and commits complete rounds in order.

    ``preemption`` tells which ranks a round waits for; ``validation`` routes each
    committed checkpoint to its validation; ``on_round_done`` runs after each round is
    processed (committed or not), e.g. to answer ``get_all_reported_checkpoints()`` calls
    waiting for it. ``run_context`` is what Ray Train's ``UserCallback`` hooks get.
    """

    def __init__(
        self,
        manager: CheckpointManager,
        preemption: PreemptionState,
        validation: ValidationRouter,
        *,
        callbacks: Sequence[Callback] = (),
        run_context: Any = None,
        on_round_done: Callable[[], None] = lambda: None,
    ) -> None:
        self._manager = manager
        self._preemption = preemption
        self._validation = validation
        self._callbacks = list(callbacks)
        self._run_context = run_context
        self._on_round_done = on_round_done
        self.latest_metrics: dict[str, Any] | None = None
        self.latest_metrics_round: int | None = None
        self.reports_seen = 0
        self.bytes_uploaded = 0
        self._rounds: dict[int, _Round] = {}
        #: The next round to commit.
        self.cursor = 0
        #: The first round of this attempt.
        self.offset = 0
        #: Reports of this attempt, by rank.
        self.report_counts: dict[int, int] = {}
        #: ``_committed_rounds``' index and the manager's record list it was built from.
        self._indexed: list[CheckpointRecord] | None = None
        self._rounds_by_path: dict[str, set[int]] = {}

    # -- attempts -------------------------------------------------------------------------
    def begin(self, world_size: int) -> int:
        """A new worker group; returns its first round index."""
        self._rounds.clear()
        self.report_counts = {rank: 0 for rank in range(world_size)}
        self.cursor = self.offset = self._manager.next_round
        return self.cursor

    def abandon(self) -> list[str]:
        """Forget the unfinished rounds; returns their checkpoint folders not committed."""
        uris = sorted({u for r in self._rounds.values() if (u := r.checkpoint_uri)})
        for r in self._rounds.values():
            self._manager.note_round(r.index)
        self._rounds.clear()
        committed = {rec.path for rec in self._manager.records}
        return [u for u in uris if u not in committed]

    def check_all_complete(self) -> None:
        """Check that every round completed (all ranks reported equally often)."""
        if self._rounds:
            counts = ", ".join(f"rank {k}: {v}" for k, v in sorted(self.report_counts.items()))
            raise UserConfigError(
                "every rank must call report() the same number of times, but the counts "
                f"differ ({counts}); {len(self._rounds)} report round(s) never completed"
            )

    @property
    def pending(self) -> int:
        """Rounds reported by some rank but not yet complete."""
        return len(self._rounds)

    # -- events ---------------------------------------------------------------------------
    def is_stale(self, event: Event) -> bool:
        """A report or upload of a round already committed without this rank (relaxed
        collectives): to be dropped."""
        if not self._preemption.relaxed or not isinstance(event, (ReportEvent, UploadDoneEvent)):
            return False
        if event.round >= self.cursor:
            return False
        logger.warning(
            "Dropping rank %d's %s of report round %d: the round was committed without it "
            "(relax_collectives_on_preemption)",
            event.rank,
            "report" if isinstance(event, ReportEvent) else "upload",
            event.round,
        )
        return True

    def on_report(self, event: ReportEvent) -> None:
        """A rank reported a round."""
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
            index != event.round for index in self._committed_rounds(event.checkpoint_uri)
        ):
            raise UserConfigError(
                f"report round {event.round}: checkpoint folder {event.checkpoint_uri} already "
                "holds a committed checkpoint of an earlier round; pick a new checkpoint_dir_name"
            )
        rnd.add_report(event)
        self.report_counts[event.rank] = self.report_counts.get(event.rank, 0) + 1
        _driver_metrics.note_report_blocked(event.previous_report_s)
        _driver_metrics.note_report(event.rank, event.round, event.metrics)
        if event.rank == 0:
            self.latest_metrics = event.metrics
            self.latest_metrics_round = event.round
            self.reports_seen += 1
            call_all(self._callbacks, "on_report", event.round, event.metrics)
        self.commit_ready()

    def on_upload_done(self, event: UploadDoneEvent) -> None:
        """A rank stored its files of a round."""
        rnd = self._round(event.round)
        rnd.add_upload(event.rank, event.stored)
        self.bytes_uploaded += event.bytes
        if event.seconds or event.bytes:  # not NO_UPLOAD's "stored in place"
            _driver_metrics.note_upload(event.seconds, event.bytes)
        self.commit_ready()

    def claim(self, rank: int, round_index: int) -> bool:
        """A rank is about to store its checkpoint of ``round_index``: the round now waits
        for that upload (True), or it was committed without the rank (False: relaxed
        collectives), and nothing may be written into the committed folder."""
        if round_index < self.cursor:
            logger.warning(
                "Rank %d may not store its checkpoint of report round %d: the round was "
                "committed without it (relax_collectives_on_preemption)",
                rank,
                round_index,
            )
            return False
        self._round(round_index).add_claim(rank)
        return True

    def next_round_waits_only_on(self, ranks: set[int], world_size: int) -> bool:
        """Whether the next round to commit lacks only reports or uploads from ``ranks``."""
        rnd = self._rounds.get(self.cursor)
        if rnd is None:
            return False
        missing = set(range(world_size)) - set(rnd.reports)
        missing |= {
            rank
            for rank, report in rnd.reports.items()
            if report.checkpoint_uri and rank not in rnd.uploaded
        }
        return bool(missing) and missing <= ranks

    def _committed_rounds(self, path: str) -> set[int]:
        """The rounds of the committed checkpoints in folder ``path`` (usually none).

        An index of the manager's records, rebuilt when they change (the manager replaces
        its list on every change, never edits it), so a report costs O(1), not O(records).
        """
        records = self._manager.records
        if self._indexed is not records:
            self._indexed = records
            self._rounds_by_path = {}
            for record in records:
                self._rounds_by_path.setdefault(record.path, set()).add(record.round)
        return self._rounds_by_path.get(path, set())

    # -- commits --------------------------------------------------------------------------
    def _round(self, index: int) -> _Round:
        rnd = self._rounds.get(index)
        if rnd is None:
            rnd = self._rounds[index] = _Round(index)
        return rnd

    def commit_ready(self) -> None:
        """Commit every complete round at the cursor, in order."""
        while True:
            rnd = self._rounds.get(self.cursor)
            if rnd is None or not rnd.complete(self._preemption.required):
                return
            self._manager.note_round(rnd.index)
            record = None
            if rnd.checkpoint_uri is not None:
                # A round whose commit fails stays in ``_rounds``: ``abandon``
                # then hands its folder to the controller for deletion.
                record = self._commit(rnd)
            del self._rounds[self.cursor]
            self.cursor += 1
            call_all(
                self._callbacks,
                "after_report",
                run_context=self._run_context,
                metrics=[rnd.reports[rank].metrics for rank in sorted(rnd.reports)],
                checkpoint=None if record is None else record.checkpoint,
            )
            self._on_round_done()

    def _commit(self, rnd: _Round) -> CheckpointRecord:
        uri = rnd.checkpoint_uri
        assert uri is not None
        rank0 = rnd.reports[0]
        record = CheckpointRecord(
            name=uri_name(uri), path=uri, round=rnd.index, metrics=rank0.metrics
        )
        request = self._validation.request_for([rnd.reports[r] for r in sorted(rnd.reports)])
        if request is not None:
            record.validation_source = request.source
            if request.source == VALIDATE_FN_OF_CONFIG:
                record.validation_kwargs = request.config
        validating = request is not None and self._validation.can_dispatch
        try:
            self._manager.commit(record, validating=validating, stored=rnd.stored)
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
        _driver_metrics.note_commit(min(r.time for r in rnd.reports.values()), record.committed_at)
        call_all(self._callbacks, "on_checkpoint", record, self._manager.best())
        if request is not None:
            self._validation.submit(record, request)
        return record
