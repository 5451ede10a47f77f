"""The checks behind the invariant, one at a time: commit verification, fencing, error
classification and restart back-off (real local storage and real files, no Ray)."""

from __future__ import annotations

import errno
import logging
import os
import time
from pathlib import Path

import pytest

from tests.faults.workloads import check_run, integrity_train
from trainer_runtime import DataParallelTrainer, FailureConfig, RunConfig, ScalingConfig
from trainer_runtime._coordinator import RunCoordinator
from trainer_runtime._events import ReportEvent, UploadDoneEvent, UploadFailedEvent
from trainer_runtime._fencing import FenceCheck, FencedStorage, read_epoch, take_over
from trainer_runtime._layout import COMMIT_MARKER
from trainer_runtime._snapshot import take_snapshot
from trainer_runtime._uploader import UploadJob, run_upload
from trainer_runtime.checkpoint_manager import CheckpointManager
from trainer_runtime.config import CheckpointConfig
from trainer_runtime.errors import (
    CheckpointSourceError,
    FencedError,
    UserConfigError,
    WorkerFailure,
)
from trainer_runtime.storage import StorageError, join_uri
from trainer_runtime.storage.base import describe_error, is_permanent_error
from trainer_runtime.storage.local import LocalStorage


def _coordinator(run: str, world: int = 1) -> RunCoordinator:
    storage = LocalStorage()
    coordinator = RunCoordinator(CheckpointManager(run, CheckpointConfig(), storage))
    coordinator.begin_attempt(world)
    return coordinator


def _upload(tmp_path: Path, rank: int, dest: str, files: dict[str, bytes]) -> UploadDoneEvent:
    src = tmp_path / f"src{rank}-{time.monotonic_ns()}"
    src.mkdir()
    for rel, data in files.items():
        (src / rel).write_bytes(data)
    stats = run_upload(LocalStorage(), UploadJob(0, src, dest, delete_after=True))
    return UploadDoneEvent(rank, 0, dest, stats.files, stats.bytes, stored=stats.stored)


def test_shards_of_every_rank_are_listed_in_the_marker(tmp_path: Path) -> None:
    run = str(tmp_path / "run")
    uri = join_uri(run, "checkpoint_000000")
    c = _coordinator(run, world=2)
    for rank in (0, 1):
        c.handle(ReportEvent(rank, 0, {"step": 0}, checkpoint_uri=uri))
        c.handle(_upload(tmp_path, rank, uri, {f"shard{rank}": b"x" * (rank + 1)}))
    record = c.manager.latest
    assert record is not None and record.files is not None
    assert {rel: f.size for rel, f in record.files.items()} == {"shard0": 1, "shard1": 2}


def test_a_stray_file_in_the_folder_blocks_the_commit(tmp_path: Path) -> None:
    run = str(tmp_path / "run")
    uri = join_uri(run, "checkpoint_000000")
    c = _coordinator(run)
    c.handle(ReportEvent(0, 0, {"step": 0}, checkpoint_uri=uri))
    done = _upload(tmp_path, 0, uri, {"w": b"mine"})
    Path(uri, "stale.bin").write_bytes(b"left by a worker of an earlier attempt")
    with pytest.raises(WorkerFailure, match=r"no rank reported \(stale.bin\)"):
        c.handle(done)
    assert not Path(uri, COMMIT_MARKER).exists()
    assert c.abandon_attempt() == [uri]


def test_a_temporary_file_a_killed_writer_left_does_not_block_the_commit(tmp_path: Path) -> None:
    """A worker killed in the middle of storing a file (an elastic resize or a restart stops
    the earlier group) leaves its temporary ``.<name>.<random>.storing``; the next attempt
    writing the same checkpoint commits (seen in CI: every retry refused it, the run failed)."""
    run = str(tmp_path / "run")
    uri = join_uri(run, "checkpoint_000000")
    c = _coordinator(run)
    c.handle(ReportEvent(0, 0, {"step": 0}, checkpoint_uri=uri))
    done = _upload(tmp_path, 0, uri, {"state.json": b"mine"})
    Path(uri, ".state.json.bk6kzuch.storing").write_bytes(b"half a file")
    c.handle(done)
    record = c.manager.latest
    assert record is not None and record.files is not None
    assert set(record.files) == {"state.json"}
    assert Path(uri, COMMIT_MARKER).exists()


def test_a_file_overwritten_after_its_upload_blocks_the_commit(tmp_path: Path) -> None:
    run = str(tmp_path / "run")
    uri = join_uri(run, "checkpoint_000000")
    c = _coordinator(run)
    c.handle(ReportEvent(0, 0, {"step": 0}, checkpoint_uri=uri))
    done = _upload(tmp_path, 0, uri, {"w": b"mine"})
    time.sleep(0.01)
    Path(uri, "w").write_bytes(b"them")  # same size, other bytes: another writer
    with pytest.raises(WorkerFailure, match="w was overwritten"):
        c.handle(done)
    assert not Path(uri, COMMIT_MARKER).exists()


def test_ranks_writing_one_name_with_different_content_is_a_user_error(tmp_path: Path) -> None:
    run = str(tmp_path / "run")
    uri = join_uri(run, "checkpoint_000000")
    c = _coordinator(run, world=2)
    for rank in (0, 1):
        c.handle(ReportEvent(rank, 0, {"step": 0}, checkpoint_uri=uri))
    c.handle(_upload(tmp_path, 0, uri, {"model.pt": b"rank zero"}))
    with pytest.raises(UserConfigError, match=r"model.pt \(rank 0: 9 bytes, rank 1: 3 bytes\)"):
        c.handle(_upload(tmp_path, 1, uri, {"model.pt": b"one"}))


def test_upload_failures_that_retrying_cannot_fix_fail_the_run(tmp_path: Path) -> None:
    c = _coordinator(str(tmp_path / "run"))
    uri = join_uri(str(tmp_path / "run"), "checkpoint_000000")
    c.handle(ReportEvent(0, 0, {}, checkpoint_uri=uri))
    with pytest.raises(WorkerFailure, match="timed out"):
        c.handle(UploadFailedEvent(0, 0, uri, "TimeoutError: timed out"))
    with pytest.raises(WorkerFailure, match="Retrying cannot fix") as info:
        c.handle(UploadFailedEvent(0, 0, uri, "PermissionError: denied", permanent=True))
    assert info.value.permanent and info.value.rank == 0  # fails the run, no restart


def test_the_snapshot_names_the_folder_and_what_changed(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "a").write_text("1")
    (folder / "b").write_text("2")
    snap = take_snapshot(folder)
    snap.verify("now")
    (folder / "a").unlink()
    (folder / "c").write_text("3")
    os.utime(folder / "b", ns=(1, 1))
    with pytest.raises(CheckpointSourceError) as info:
        snap.verify("before its upload started")
    text = str(info.value)
    assert str(folder) in text and "removed: a" in text and "added" not in text
    assert "rewritten: b" in text and "tempfile.mkdtemp()" in text


def test_files_added_after_report_are_no_torn_checkpoint(tmp_path: Path) -> None:
    """Ranks on one machine writing shards into one folder and each reporting it (as Ray
    Train's own tests do): another rank's new files are fine; changes to this report's files
    or their removal are still caught, an emptied or deleted folder too."""
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "shard_0").write_text("0")
    snap = take_snapshot(folder)
    (folder / "shard_1").write_text("1")  # rank 1's shard, written after rank 0's report()
    snap.verify("while it was being uploaded")
    assert set(snap.files) == {"shard_0"}  # what this report stores
    (folder / "shard_0").unlink()
    with pytest.raises(CheckpointSourceError, match="removed: shard_0"):
        snap.verify("while it was being uploaded")
    empty = tmp_path / "empty"  # an empty folder is a checkpoint too, until deleted
    empty.mkdir()
    snap = take_snapshot(empty)
    snap.verify("now")
    empty.rmdir()
    with pytest.raises(CheckpointSourceError, match="was deleted"):
        snap.verify("before its upload started")


def test_the_snapshot_lists_files_as_os_walk_does(tmp_path: Path) -> None:
    """Nested files by relative path, a symlinked file with its target's size, no symlinked
    folder, no dangling link, no commit marker (the upload stores exactly these)."""
    folder = tmp_path / "ckpt"
    (folder / "model" / "shard").mkdir(parents=True)
    (folder / "model" / "shard" / "w.bin").write_bytes(b"x" * 7)
    (folder / "meta.json").write_text("{}")
    (folder / COMMIT_MARKER).write_text("{}")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "big.bin").write_bytes(b"y" * 11)
    (folder / "linked.bin").symlink_to(outside / "big.bin")
    (folder / "linked_dir").symlink_to(outside)
    (folder / "dangling").symlink_to(tmp_path / "missing")
    snapshot = take_snapshot(folder)
    files = snapshot.files
    assert snapshot.has_commit_marker  # report() uploads a copy without it
    assert sorted(files) == ["linked.bin", "meta.json", "model/shard/w.bin"]
    assert files["model/shard/w.bin"][0] == 7 and files["linked.bin"][0] == 11
    expected = {
        os.path.relpath(os.path.join(d, n), folder): os.stat(os.path.join(d, n)).st_size
        for d, _, names in os.walk(folder)
        for n in names
        if os.path.exists(os.path.join(d, n)) and n != COMMIT_MARKER
    }
    assert {rel: size for rel, (size, _) in files.items()} == expected
    # Only a marker at the top counts: one in a subfolder is a file like any other.
    (folder / COMMIT_MARKER).unlink()
    (folder / "model" / COMMIT_MARKER).write_text("{}")
    again = take_snapshot(folder)
    assert not again.has_commit_marker and f"model/{COMMIT_MARKER}" in again.files


def test_permanent_errors_are_told_from_transient_ones() -> None:
    assert is_permanent_error(PermissionError(errno.EACCES, "Permission denied", "/x"))
    assert is_permanent_error(OSError(errno.EROFS, "Read-only file system"))
    assert is_permanent_error(StorageError("403", permanent=True))
    assert is_permanent_error(CheckpointSourceError("gone"))
    assert not is_permanent_error(OSError(errno.ENOSPC, "No space left on device"))
    assert not is_permanent_error(ConnectionResetError(errno.ECONNRESET, "reset"))
    assert not is_permanent_error(StorageError("503 after retries"))
    wrapped = StorageError("upload failed")
    wrapped.__cause__ = PermissionError(errno.EPERM, "Operation not permitted")
    assert is_permanent_error(wrapped)


def test_errors_keep_their_paths() -> None:
    exc = FileNotFoundError(errno.ENOENT, "No such file or directory")
    exc.filename = "/ckpt/files.bin"
    assert "/ckpt/files.bin" in describe_error(exc)
    two = OSError(errno.EXDEV, "Invalid cross-device link", "/a", None, "/b")
    assert describe_error(two).startswith("OSError: ") and "/a" in describe_error(two)


def test_a_newer_driver_fences_off_the_old_ones_writes(tmp_path: Path) -> None:
    storage = LocalStorage()
    run = str(tmp_path / "run")
    old = take_over(storage, run)
    new = take_over(storage, run)
    assert (old, new) == (1, 2) and read_epoch(storage, run) == 2
    stale = FenceCheck(storage, run, old)
    with pytest.raises(FencedError, match="taken over by another driver"):
        stale()
    FenceCheck(storage, run, new)()  # the owner passes

    # A worker of the old driver stops before storing a file ...
    src = tmp_path / "src"
    src.mkdir()
    (src / "w").write_bytes(b"late")
    dest = join_uri(run, "checkpoint_000003")
    with pytest.raises(FencedError):
        run_upload(FencedStorage(storage, stale), UploadJob(3, src, dest, delete_after=False))
    assert not Path(dest, "w").exists()
    # ... and the old driver cannot commit, evict or rewrite the manifest.
    manager = CheckpointManager(run, CheckpointConfig(), FencedStorage(storage, stale))
    with pytest.raises(FencedError):
        manager.save()
    assert not Path(run, "checkpoint_manifest.json").exists()


def test_restarts_back_off_and_start_over_after_progress(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = FailureConfig(max_failures=5, restart_backoff_s=0.05, max_restart_backoff_s=0.15)
    assert [config.backoff_s(n) for n in range(1, 5)] == [0.05, 0.1, 0.15, 0.15]
    assert FailureConfig(restart_backoff_s=0).backoff_s(3) == 0
    with pytest.raises(ValueError, match="restart_backoff_s"):
        FailureConfig(restart_backoff_s=-1)

    # Fails at step 2 in attempts 0-2 (no progress after the first), then at step 4 in
    # attempt 3 (after committing steps 2-3: the back-off starts over).
    train_config = {
        "steps": 6,
        "files": 1,
        "size": 10,
        "fail": {"step": 2, "rank": 0, "attempts": [0, 1, 2]},
    }
    with caplog.at_level(logging.WARNING, logger="trainer_runtime"):
        result = DataParallelTrainer(
            integrity_train,
            train_loop_config=train_config,
            scaling_config=ScalingConfig(num_workers=0),
            run_config=RunConfig(name="run", storage_path=str(tmp_path), failure_config=config),
        ).fit()
    delays = [
        r.getMessage().split(" in ")[1].split(" s")[0]
        for r in caplog.records
        if "restarting (failure" in r.getMessage()
    ]
    assert delays == ["0.1", "0.1", "0.1"]  # 0.05, 0.10, 0.15 rounded to one decimal
    assert result.restarts == 3
    check_run(str(tmp_path / "run"), 1)
