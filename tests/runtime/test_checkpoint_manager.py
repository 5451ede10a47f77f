"""CheckpointManager: top-k retention, deletion from storage, manifest and recovery."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer_runtime.checkpoint import COMMIT_MARKER
from trainer_runtime.checkpoint_manager import (
    STATUS_TRANSITIONS,
    CheckpointManager,
    CheckpointRecord,
    CheckpointStatus,
)
from trainer_runtime.config import CheckpointConfig
from trainer_runtime.errors import UserConfigError
from trainer_runtime.storage import get_storage, join_uri
from trainer_runtime.storage.local import LocalStorage


def _commit(manager: CheckpointManager, round_index: int, **metrics: float) -> CheckpointRecord:
    """Store a checkpoint folder with a marker, as the coordinator does, and register it."""
    storage = manager.storage
    path = join_uri(manager.run_path, f"checkpoint_{round_index:06d}")
    storage.write_bytes(join_uri(path, "weights.bin"), b"w" * round_index)
    record = CheckpointRecord(f"checkpoint_{round_index:06d}", path, round_index, dict(metrics))
    storage.write_bytes(join_uri(path, COMMIT_MARKER), json.dumps(record.to_json()).encode())
    manager.register(record)
    return record


def _manager(storage_path: str, **config: object) -> CheckpointManager:
    run = join_uri(storage_path, "run")
    return CheckpointManager(run, CheckpointConfig(**config), get_storage(run))  # type: ignore[arg-type]


def test_keeps_top_k_by_score_and_deletes_the_rest(storage_path: str) -> None:
    m = _manager(
        storage_path, num_to_keep=2, checkpoint_score_attribute="acc", checkpoint_score_order="max"
    )
    for i, acc in enumerate([0.5, 0.9, 0.7, 0.6]):
        _commit(m, i, acc=acc)
    # Top 2 by acc are rounds 1 (0.9) and 2 (0.7); round 3 is the latest and always kept.
    assert [r.round for r in m.records] == [1, 2, 3]
    assert m.best() is not None and m.best().round == 1  # type: ignore[union-attr]
    assert m.storage.list_dirs(m.run_path) == [
        "checkpoint_000001",
        "checkpoint_000002",
        "checkpoint_000003",
    ]


def test_min_order_and_no_score_attribute(storage_path: str) -> None:
    m = _manager(
        storage_path, num_to_keep=1, checkpoint_score_attribute="loss", checkpoint_score_order="min"
    )
    _commit(m, 0, loss=0.1)
    _commit(m, 1, loss=0.5)
    assert [r.round for r in m.records] == [0, 1]  # best (0) + latest (1)
    _commit(m, 2, loss=0.05)
    assert [r.round for r in m.records] == [2]  # best and latest at once

    recent = _manager(storage_path + "/other", num_to_keep=2)
    for i in range(4):
        _commit(recent, i, loss=1.0)
    assert [r.round for r in recent.records] == [2, 3]


def test_missing_score_attribute_names_the_attribute_and_metrics(storage_path: str) -> None:
    m = _manager(storage_path, num_to_keep=2, checkpoint_score_attribute="val_acc")
    with pytest.raises(UserConfigError, match=r"'val_acc'.*metrics seen: \['loss', 'step'\]"):
        _commit(m, 0, loss=1.0, step=3)


def test_pending_validation_is_never_evicted(storage_path: str) -> None:
    m = _manager(storage_path, num_to_keep=1, checkpoint_score_attribute="val_acc")
    pending = CheckpointRecord(
        "checkpoint_000000",
        join_uri(m.run_path, "checkpoint_000000"),
        0,
        {"loss": 1.0},
        status=CheckpointStatus.PENDING_VALIDATION,
    )
    m.storage.write_bytes(join_uri(pending.path, "w"), b"x")
    m.register(pending)  # no score yet, but pending: accepted
    _commit(m, 1, val_acc=0.3)
    _commit(m, 2, val_acc=0.2)
    names = [r.name for r in m.records]
    assert "checkpoint_000000" in names  # pending: protected
    assert "checkpoint_000001" in names  # best
    assert "checkpoint_000002" in names  # latest
    m.record_validation("checkpoint_000000", CheckpointStatus.VALIDATED, {"val_acc": 0.1})
    assert [r.name for r in m.records] == ["checkpoint_000001", "checkpoint_000002"]


def test_manifest_lets_a_new_manager_resume(storage_path: str) -> None:
    m = _manager(storage_path, num_to_keep=3)
    for i in range(3):
        _commit(m, i, loss=float(i))
    m.note_round(7)  # metrics-only rounds after the last checkpoint
    m.save()
    again = _manager(storage_path, num_to_keep=3)
    again.restore()
    assert [r.round for r in again.records] == [0, 1, 2]
    assert again.latest is not None and again.latest.metrics == {"loss": 2.0}
    assert again.next_round == 8


def test_restore_recovers_marked_checkpoint_and_ignores_unmarked_folder(storage_path: str) -> None:
    m = _manager(storage_path)
    _commit(m, 0, loss=1.0)
    storage = m.storage
    # Committed (marker written) but the driver died before updating the manifest:
    rec = CheckpointRecord(
        "checkpoint_000001", join_uri(m.run_path, "checkpoint_000001"), 1, {"loss": 0.5}
    )
    storage.write_bytes(join_uri(rec.path, "w"), b"x")
    storage.write_bytes(join_uri(rec.path, COMMIT_MARKER), json.dumps(rec.to_json()).encode())
    # An interrupted upload: files but no marker.
    storage.write_bytes(join_uri(m.run_path, "checkpoint_000002", "w"), b"partial")

    again = _manager(storage_path)
    again.restore()
    assert [r.name for r in again.records] == ["checkpoint_000000", "checkpoint_000001"]
    assert again.latest is not None and again.latest.round == 1


def test_manifest_is_json_with_latest_and_best(tmp_path: Path) -> None:
    m = _manager(str(tmp_path), checkpoint_score_attribute="acc")
    _commit(m, 0, acc=0.9)
    _commit(m, 1, acc=0.1)
    data = json.loads((tmp_path / "run" / "checkpoint_manifest.json").read_text())
    assert data["latest"] == "checkpoint_000001"
    assert data["best"] == "checkpoint_000000"
    assert [c["name"] for c in data["checkpoints"]] == ["checkpoint_000000", "checkpoint_000001"]


def test_restore_deletes_uncommitted_folders_only_when_asked(storage_path: str) -> None:
    m = _manager(storage_path)
    _commit(m, 0, loss=1.0)
    storage = m.storage
    # An interrupted upload (no marker), an interrupted deletion (a tombstone), and a folder
    # holding a marker copied from another checkpoint: none of them is committed.
    storage.write_bytes(join_uri(m.run_path, "checkpoint_000001", "w"), b"partial")
    m.delete_checkpoint(join_uri(m.run_path, "checkpoint_000002"))
    storage.write_bytes(join_uri(m.run_path, "checkpoint_000002", "w"), b"left over")
    copied = join_uri(m.run_path, "checkpoint_000003")
    storage.write_bytes(join_uri(copied, "w"), b"copy")
    marker_of_0 = storage.read_bytes(join_uri(m.run_path, "checkpoint_000000", COMMIT_MARKER))
    storage.write_bytes(join_uri(copied, COMMIT_MARKER), marker_of_0)

    reader = _manager(storage_path)
    assert reader.restore() == []  # a reader (e.g. another torchrun rank) deletes nothing
    assert [r.name for r in reader.records] == ["checkpoint_000000"]
    assert len(storage.list_dirs(m.run_path)) == 4

    driver = _manager(storage_path)
    deleted = driver.restore(delete_uncommitted=True)
    assert deleted == ["checkpoint_000001", "checkpoint_000002", "checkpoint_000003"]
    assert [r.name for r in driver.records] == ["checkpoint_000000"]
    assert storage.list_dirs(m.run_path) == ["checkpoint_000000"]
    # The names are not used again: a writer fenced off from this run (a worker of an
    # earlier driver) may still be finishing a file there.
    assert driver.next_round == 4


class CrashingDeleteStorage(LocalStorage):
    """Real local storage whose deletions stop part-way, leaving the commit marker for last.

    Like a driver killed while deleting an evicted checkpoint's files.
    """

    def delete_dir(self, uri: str) -> None:
        for rel in self.list_files(uri):
            if rel != COMMIT_MARKER:
                (Path(uri) / rel).unlink()
        raise OSError(f"killed while deleting {uri}")


def test_an_interrupted_eviction_never_leaves_a_committed_partial_folder(tmp_path: Path) -> None:
    run = str(tmp_path / "run")
    crashing = CheckpointManager(run, CheckpointConfig(num_to_keep=1), CrashingDeleteStorage())
    _commit(crashing, 0, loss=1.0)
    with pytest.raises(OSError, match="killed while deleting"):
        _commit(crashing, 1, loss=0.5)  # evicts checkpoint_000000, and "dies" doing it
    assert (tmp_path / "run" / "checkpoint_000000" / COMMIT_MARKER).exists()  # a tombstone

    again = CheckpointManager(run, CheckpointConfig(num_to_keep=1), LocalStorage())
    assert again.restore(delete_uncommitted=True) == ["checkpoint_000000"]
    assert [r.name for r in again.records] == ["checkpoint_000001"]


def _pending(m: CheckpointManager, round_index: int, **metrics: float) -> CheckpointRecord:
    path = join_uri(m.run_path, f"checkpoint_{round_index:06d}")
    m.storage.write_bytes(join_uri(path, "w"), b"x")
    record = CheckpointRecord(f"checkpoint_{round_index:06d}", path, round_index, dict(metrics))
    m.commit(record, validating=True)
    return record


def test_the_manager_owns_every_status_change(storage_path: str) -> None:
    m = _manager(storage_path, checkpoint_score_attribute="val_acc")
    record = _pending(m, 0, loss=1.0)
    assert record.status is CheckpointStatus.PENDING_VALIDATION and record.status.is_pending
    updated = m.record_validation(record.name, CheckpointStatus.VALIDATED, {"val_acc": 0.9})
    assert updated is record and record.status is CheckpointStatus.VALIDATED
    assert record.all_metrics == {"loss": 1.0, "val_acc": 0.9}
    # A final status never changes again, and nothing skips the table.
    with pytest.raises(ValueError, match="validated cannot change to validation_lost"):
        m.mark_validations_lost([record.name], "late")
    assert m.record_validation("checkpoint_000099", CheckpointStatus.VALIDATED) is None
    for status, allowed in STATUS_TRANSITIONS.items():
        assert allowed <= set(CheckpointStatus) and status not in allowed


def test_a_validation_without_the_score_is_recorded_as_failed(storage_path: str) -> None:
    m = _manager(storage_path, checkpoint_score_attribute="val_acc")
    record = _pending(m, 0, loss=1.0)
    m.record_validation(record.name, CheckpointStatus.VALIDATED, {"val_loss": 0.3})
    assert record.status is CheckpointStatus.VALIDATION_FAILED
    assert "'val_acc' is not among the metrics" in (record.validation_error or "")
    again = _manager(storage_path, checkpoint_score_attribute="val_acc")
    again.restore()
    assert again.records[0].status is CheckpointStatus.VALIDATION_FAILED  # saved


def test_lost_validations_are_recorded_in_one_write(storage_path: str) -> None:
    m = _manager(storage_path)
    names = [_pending(m, i).name for i in range(3)]
    lost = m.mark_validations_lost(names[:2], "driver gone")
    assert [r.name for r in lost] == names[:2]
    again = _manager(storage_path)
    again.restore()
    statuses = [(r.status, r.validation_error) for r in again.records]
    assert statuses == [
        (CheckpointStatus.VALIDATION_LOST, "driver gone"),
        (CheckpointStatus.VALIDATION_LOST, "driver gone"),
        (CheckpointStatus.PENDING_VALIDATION, None),
    ]
