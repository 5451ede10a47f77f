"""RunCoordinator's commit protocol, fed worker events directly (real storage, no Ray)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from trainer_runtime._coordinator import RunCoordinator
from trainer_runtime._events import ReportEvent, RequestEvent, UploadDoneEvent
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
    coordinator = RunCoordinator(CheckpointManager(run, config, storage), storage)
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
    coordinator = RunCoordinator(manager, storage, [seen])
    validator = _Validator()
    coordinator.validator = validator
    coordinator.default_validation = (lambda c, cfg: {}, None)
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
    again = RunCoordinator(CheckpointManager(run, CheckpointConfig(), storage), storage)
    again.manager.restore()
    again.validator = _Validator()
    again.default_validation = (lambda c, cfg: {}, None)
    assert again.resume_validations() == ([], [])  # already validated


def test_a_report_level_validation_cannot_be_resumed_and_is_recorded_lost(
    tmp_path: Path,
) -> None:
    run = str(tmp_path / "run")
    storage = get_storage(run)
    coordinator = RunCoordinator(CheckpointManager(run, CheckpointConfig(), storage), storage)
    coordinator.validator = _Validator()
    coordinator.begin_attempt(1)
    uri = join_uri(run, "checkpoint_000000")
    storage.write_bytes(join_uri(uri, "weights"), b"w")
    coordinator.handle(ReportEvent(0, 0, {}, checkpoint_uri=uri, validate_fn=lambda c, cfg: {}))
    coordinator.handle(UploadDoneEvent(0, 0, uri))

    again = RunCoordinator(CheckpointManager(run, CheckpointConfig(), storage), storage)
    again.manager.restore()
    again.validator = _Validator()
    requeued, lost = again.resume_validations()
    assert (requeued, lost) == ([], ["checkpoint_000000"])
    assert again.manager.records[0].status is CheckpointStatus.VALIDATION_LOST


def _relax_fixture(tmp_path: Path, world_size: int) -> tuple[RunCoordinator, Any, str, list]:
    run = str(tmp_path / "run")
    storage = get_storage(run)
    coordinator = RunCoordinator(CheckpointManager(run, CheckpointConfig(), storage), storage)
    coordinator.begin_attempt(world_size)
    answers: list[tuple[int, int, Any]] = []
    coordinator.reply = lambda rank, request_id, value: answers.append((rank, request_id, value))
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
