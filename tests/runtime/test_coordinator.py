"""RunCoordinator's commit protocol, fed worker events directly (real storage, no Ray)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from trainer_runtime._coordinator import RunCoordinator
from trainer_runtime._events import ReportEvent, UploadDoneEvent
from trainer_runtime.callbacks import Callback
from trainer_runtime.checkpoint_manager import CheckpointManager, CheckpointRecord, CheckpointStatus
from trainer_runtime.config import CheckpointConfig
from trainer_runtime.errors import UserConfigError
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
