"""RunCoordinator's commit protocol, fed worker events directly (real storage, no Ray)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from trainer_runtime._coordinator import RunCoordinator
from trainer_runtime._events import ReportEvent, RequestEvent, UploadDoneEvent
from trainer_runtime._layout import COMMIT_MARKER
from trainer_runtime.callbacks import Callback
from trainer_runtime.checkpoint_manager import CheckpointManager, CheckpointRecord, CheckpointStatus
from trainer_runtime.config import CheckpointConfig
from trainer_runtime.errors import UserConfigError
from trainer_runtime.preemption import PREEMPTION_CALLER, PreemptionInfo
from trainer_runtime.storage import get_storage, join_uri


def test_a_checkpoint_that_cannot_be_scored_is_never_marked_committed(tmp_path: Path) -> None:
    run = str(tmp_path / "run")
    storage = get_storage(run)
    config = CheckpointConfig(checkpoint_score_attribute="val_acc")
    coordinator = RunCoordinator(CheckpointManager(run, config, storage))
    coordinator.begin_attempt(1)
    uri = join_uri(run, "checkpoint_000000")
    storage.write_bytes(join_uri(uri, "weights"), b"w")
    coordinator.handle(ReportEvent(0, 0, {"loss": 1.0}, checkpoint_uri=uri))
    with pytest.raises(UserConfigError, match=r"'val_acc'.*metrics seen: \['loss'\]"):
        coordinator.handle(UploadDoneEvent(0, 0, uri))
    assert storage.list_files(uri) == ["weights"]  # no commit marker: restore() never uses it
    assert coordinator.abandon_attempt() == [uri]  # handed to the controller for deletion


class _Validator:
    """A dispatcher stand-in that only records what it was handed."""

    def __init__(self) -> None:
        self.submitted: list[str] = []

    def submit(
        self,
        record: CheckpointRecord,
        fn: Any,
        config: dict[str, Any] | None,
        timeout_s: float | None = None,
    ) -> None:
        self.submitted.append(record.name)


class _Seen(Callback):
    def __init__(self) -> None:
        self.checkpoints: list[tuple[str, str]] = []

    def on_checkpoint(self, record: CheckpointRecord, best: CheckpointRecord | None) -> None:
        self.checkpoints.append((record.name, record.status.value))


def test_commits_go_to_the_validator_and_results_come_back_through_one_method(
    tmp_path: Path,
) -> None:
    run = str(tmp_path / "run")
    storage = get_storage(run)
    seen = _Seen()
    manager = CheckpointManager(run, CheckpointConfig(), storage)
    validator = _Validator()
    coordinator = RunCoordinator(
        manager,
        [seen],
        default_validation=(lambda c, cfg: {}, None),
        make_validator=lambda results: validator,
    )
    coordinator.begin_attempt(1)
    uri = join_uri(run, "checkpoint_000000")
    storage.write_bytes(join_uri(uri, "weights"), b"w")
    coordinator.handle(ReportEvent(0, 0, {"loss": 1.0}, checkpoint_uri=uri))
    coordinator.handle(UploadDoneEvent(0, 0, uri))
    assert validator.submitted == ["checkpoint_000000"]
    assert seen.checkpoints == [("checkpoint_000000", "pending_validation")]

    record = coordinator.record_validation(
        "checkpoint_000000", CheckpointStatus.VALIDATED, {"val": 2.0}, None
    )
    assert record is not None and record.all_metrics == {"loss": 1.0, "val": 2.0}
    assert seen.checkpoints[-1] == ("checkpoint_000000", "validated")

    # A new driver: the run-level validation is queued again, nothing is lost.
    again = RunCoordinator(
        CheckpointManager(run, CheckpointConfig(), storage),
        default_validation=(lambda c, cfg: {}, None),
        make_validator=lambda results: _Validator(),
    )
    again.manager.restore()
    assert again.resume_validations() == ([], [])  # already validated


def test_a_report_level_validation_cannot_be_resumed_and_is_recorded_lost(
    tmp_path: Path,
) -> None:
    run = str(tmp_path / "run")
    storage = get_storage(run)
    coordinator = RunCoordinator(
        CheckpointManager(run, CheckpointConfig(), storage),
        make_validator=lambda results: _Validator(),
    )
    coordinator.begin_attempt(1)
    uri = join_uri(run, "checkpoint_000000")
    storage.write_bytes(join_uri(uri, "weights"), b"w")
    coordinator.handle(ReportEvent(0, 0, {}, checkpoint_uri=uri, validate_fn=lambda c, cfg: {}))
    coordinator.handle(UploadDoneEvent(0, 0, uri))

    again = RunCoordinator(
        CheckpointManager(run, CheckpointConfig(), storage),
        make_validator=lambda results: _Validator(),
    )
    again.manager.restore()
    requeued, lost = again.resume_validations()
    assert (requeued, lost) == ([], ["checkpoint_000000"])
    assert again.manager.records[0].status is CheckpointStatus.VALIDATION_LOST


def _relax_fixture(
    tmp_path: Path, world_size: int, reply: Any = None
) -> tuple[RunCoordinator, Any, str, list]:
    run = str(tmp_path / "run")
    storage = get_storage(run)
    coordinator = RunCoordinator(CheckpointManager(run, CheckpointConfig(), storage))
    answers: list[tuple[int, int, Any]] = []

    def record(rank: int, request_id: int, value: Any) -> None:
        answers.append((rank, request_id, value))

    coordinator.begin_attempt(world_size, reply or record)
    return coordinator, storage, join_uri(run, "checkpoint_000000"), answers


def _store_shard(storage: Any, uri: str, rank: int) -> dict[str, Any]:
    """Rank ``rank`` writes its shard; what its UploadDoneEvent reports as stored."""
    name = f"shard_{rank}"
    storage.write_bytes(join_uri(uri, name), f"weights of rank {rank}".encode())
    return {name: storage.list_stored(uri)[name]}


def test_relaxed_collectives_commit_the_survivors_checkpoint_without_the_preempted_rank(
    tmp_path: Path,
) -> None:
    """relax_collectives_on_preemption: rank 2's node is preempted and rank 2 never reports;
    ranks 0 and 1 commit their round (only their shards), and what rank 2 sends for that
    round afterwards is dropped."""
    coordinator, storage, uri, _ = _relax_fixture(tmp_path, 3)
    for rank in (0, 1):
        stored = _store_shard(storage, uri, rank)
        coordinator.handle(ReportEvent(rank, 0, {"step": 7}, checkpoint_uri=uri))
        coordinator.handle(UploadDoneEvent(rank, 0, uri, stored=stored))
    assert coordinator.manager.latest is None  # strict: rank 2 is still waited for

    notice = PreemptionInfo(deadline_ms=None, preempted_node_to_ranks={"node-c": [2]})
    assert coordinator.relax_for(notice) == [0, 1]
    latest = coordinator.manager.latest
    assert latest is not None and latest.path == uri and latest.metrics == {"step": 7}
    assert sorted(latest.files) == ["shard_0", "shard_1"]

    coordinator.handle(ReportEvent(2, 0, {"step": 7}, checkpoint_uri=uri))  # too late
    assert coordinator.pending_rounds == 0
    # the next round needs ranks 0 and 1 only
    coordinator.handle(ReportEvent(0, 1, {"step": 8}))
    assert coordinator.pending_rounds == 1
    coordinator.handle(ReportEvent(1, 1, {"step": 8}))
    assert coordinator.pending_rounds == 0


def test_relaxed_rounds_still_wait_for_a_preempted_rank_that_reported_a_checkpoint(
    tmp_path: Path,
) -> None:
    """Relaxing never commits a shard half-written: a preempted rank that reported a
    checkpoint is waited for until its upload is done."""
    coordinator, storage, uri, _ = _relax_fixture(tmp_path, 2)
    stored = {rank: _store_shard(storage, uri, rank) for rank in (0, 1)}
    coordinator.handle(ReportEvent(0, 0, {"step": 3}, checkpoint_uri=uri))
    coordinator.handle(UploadDoneEvent(0, 0, uri, stored=stored[0]))
    coordinator.handle(ReportEvent(1, 0, {"step": 3}, checkpoint_uri=uri))
    notice = PreemptionInfo(deadline_ms=None, preempted_node_to_ranks={"node-b": [1]})
    assert coordinator.relax_for(notice) == [0]
    assert coordinator.manager.latest is None  # rank 1's shard is still being stored
    coordinator.handle(UploadDoneEvent(1, 0, uri, stored=stored[1]))
    latest = coordinator.manager.latest
    assert latest is not None and sorted(latest.files) == ["shard_0", "shard_1"]


def test_relaxed_collectives_answer_without_the_preempted_rank_and_name_it(
    tmp_path: Path,
) -> None:
    """get_preemption_info() waiting on a rank whose node is gone is answered for the
    survivors once relaxed, naming the preempted rank; the rank, if it still arrives,
    gets the same answer at once."""
    coordinator, _, _, answers = _relax_fixture(tmp_path, 2)
    payload = (0, PREEMPTION_CALLER, ("node-a", False, None))
    coordinator.handle(RequestEvent(0, 11, "collective", payload))
    assert answers == []
    notice = PreemptionInfo(deadline_ms=1234, preempted_node_to_ranks={"node-b": [1]})
    assert coordinator.relax_for(notice) == [0]
    [(rank, request_id, info)] = answers
    assert (rank, request_id) == (0, 11)
    assert info.preempted_ranks == [1] and info.deadline_ms == 1234
    coordinator.handle(RequestEvent(1, 12, "collective", (0, PREEMPTION_CALLER, None)))
    assert answers[-1] == (1, 12, info)


def test_relaxing_is_refused_when_rank_zero_is_preempted(tmp_path: Path) -> None:
    """Rank 0 writes the metrics and the collectives' answers (Ray Train ignores the
    option then too): nothing is relaxed."""
    coordinator, storage, uri, _ = _relax_fixture(tmp_path, 2)
    stored = _store_shard(storage, uri, 1)
    coordinator.handle(ReportEvent(1, 0, {"step": 1}, checkpoint_uri=uri))
    coordinator.handle(UploadDoneEvent(1, 0, uri, stored=stored))
    notice = PreemptionInfo(deadline_ms=None, preempted_node_to_ranks={"node-a": [0]})
    assert coordinator.relax_for(notice) is None
    assert coordinator.required_ranks is None and coordinator.manager.latest is None


def test_an_upload_claimed_after_its_round_committed_is_refused(tmp_path: Path) -> None:
    """A preempted rank that is still alive asks before storing its shard of a round the
    survivors committed without it: refused, so nothing is written into the committed
    folder. A claim for a round still open is granted, and the round then waits for that
    upload even though the rank is not required (it reported nothing yet: SYNC stores
    before it reports)."""
    coordinator, storage, uri, answers = _relax_fixture(tmp_path, 2)
    coordinator.relax_for(PreemptionInfo(deadline_ms=None, preempted_node_to_ranks={"b": [1]}))
    stored = _store_shard(storage, uri, 0)
    coordinator.handle(ReportEvent(0, 0, {"step": 1}, checkpoint_uri=uri))
    coordinator.handle(UploadDoneEvent(0, 0, uri, stored=stored))
    assert coordinator.manager.latest is not None  # committed with rank 0 alone

    coordinator.handle(RequestEvent(1, 5, "upload_claim", 0))
    assert answers[-1] == (1, 5, False)

    next_uri = uri.replace("checkpoint_000000", "checkpoint_000001")
    coordinator.handle(RequestEvent(1, 6, "upload_claim", 1))
    assert answers[-1] == (1, 6, True)
    stored0 = _store_shard(storage, next_uri, 0)
    coordinator.handle(ReportEvent(0, 1, {"step": 2}, checkpoint_uri=next_uri))
    coordinator.handle(UploadDoneEvent(0, 1, next_uri, stored=stored0))
    assert coordinator.manager.latest.path == uri  # round 1 waits for rank 1's claimed shard
    stored1 = _store_shard(storage, next_uri, 1)
    coordinator.handle(ReportEvent(1, 1, {"step": 2}, checkpoint_uri=next_uri))
    coordinator.handle(UploadDoneEvent(1, 1, next_uri, stored=stored1))
    latest = coordinator.manager.latest
    assert latest.path == next_uri and sorted(latest.files) == ["shard_0", "shard_1"]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_late_preempted_rank_writes_nothing_into_a_committed_checkpoint(
    tmp_path: Path, mode: str
) -> None:
    """The whole protocol without Ray: two workers' sessions wired to one coordinator.
    Rank 1 is preempted and the round commits with rank 0's shard alone; rank 1, alive
    after all, then reports its shard of that round: its upload is refused before it
    writes, so the committed folder holds exactly what the commit marker lists, and a
    restore finds the checkpoint intact."""
    from trainer_runtime._session import TrainSession
    from trainer_runtime.checkpoint import Checkpoint
    from trainer_runtime.context import TrainContext

    sessions: dict[int, TrainSession] = {}
    coordinator, storage, uri, _ = _relax_fixture(
        tmp_path, 2, lambda rank, request_id, value: sessions[rank].deliver(request_id, value)
    )
    run = uri.rsplit("/", 1)[0]
    for rank in (0, 1):
        context = TrainContext(rank, 2, rank, 2, 0, "run", str(tmp_path))
        sessions[rank] = TrainSession(
            context, coordinator.handle, None, round_offset=0, claim_uploads=True
        )
    coordinator.relax_for(PreemptionInfo(deadline_ms=None, preempted_node_to_ranks={"b": [1]}))

    def shard(rank: int) -> Checkpoint:
        folder = tmp_path / f"local_{rank}"
        folder.mkdir()
        (folder / f"shard_{rank}").write_bytes(f"weights of rank {rank}".encode())
        return Checkpoint.from_directory(folder)

    sessions[0].report({"step": 1}, checkpoint=shard(0), checkpoint_upload_mode=mode)
    sessions[0].finish(None)
    committed = coordinator.manager.latest
    assert committed is not None and committed.path == uri
    sessions[1].report({"step": 1}, checkpoint=shard(1), checkpoint_upload_mode=mode)
    sessions[1].finish(None)

    assert sorted(storage.list_files(uri)) == [COMMIT_MARKER, "shard_0"]
    assert sessions[1].latest_checkpoint is None  # its checkpoint was never stored
    again = CheckpointManager(run, CheckpointConfig(), storage)
    again.restore()
    assert [r.name for r in again.records] == ["checkpoint_000000"]
