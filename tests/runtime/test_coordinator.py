"""RunCoordinator's commit protocol, fed worker events directly (real storage, no Ray)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer_runtime._coordinator import RunCoordinator
from trainer_runtime._events import ReportEvent, UploadDoneEvent
from trainer_runtime.checkpoint_manager import CheckpointManager
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
