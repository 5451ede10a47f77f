"""Local mode (ScalingConfig(num_workers=0)): the train function runs in this process."""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import trainer_runtime as tr
from tests.gcs import GCSEmulator
from tests.runtime.workloads import bad_report_train, counting_train, read_log
from trainer_runtime import (
    Checkpoint,
    CheckpointConfig,
    CheckpointUploadMode,
    DataParallelTrainer,
    FailureConfig,
    Result,
    RunConfig,
    ScalingConfig,
    TrainingFailedError,
)
from trainer_runtime.checkpoint import COMMIT_MARKER
from trainer_runtime.checkpoint_manager import MANIFEST_FILE, CheckpointManager
from trainer_runtime.storage import get_storage, join_uri
from trainer_runtime.storage.factory import reset_storage_cache

LOCAL = ScalingConfig(num_workers=0)


def _fit(
    fn: Any, config: dict[str, Any], storage_path: str, name: str = "run", **run_kwargs: Any
) -> Result:
    return DataParallelTrainer(
        fn,
        train_loop_config=config,
        scaling_config=LOCAL,
        run_config=RunConfig(name=name, storage_path=storage_path, **run_kwargs),
    ).fit()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_runs_in_this_process_with_checkpoints(
    storage_path: str, tmp_path: Path, mode: str
) -> None:
    log = str(tmp_path / "log")
    result = _fit(
        counting_train,
        {"steps": 5, "mode": mode, "log": log},
        storage_path,
        checkpoint_config=CheckpointConfig(num_to_keep=2),
    )
    starts = [e for e in read_log(log) if e["event"] == "start"]
    assert starts == [
        {
            "event": "start",
            "rank": 0,
            "attempt": 0,
            "start": 0,
            "pid": os.getpid(),
            "world_size": 1,
            "local_rank": 0,
            "node_rank": 0,
            "name": "run",
            "checkpoint": None,
        }
    ]
    assert result.metrics == {"step": 4, "loss": 0.2, "rank": 0}
    run_path = join_uri(storage_path, "run")
    assert result.path == run_path
    assert result.checkpoint == Checkpoint(join_uri(run_path, "checkpoint_000004"))
    storage = get_storage(run_path)
    assert storage.list_dirs(run_path) == ["checkpoint_000003", "checkpoint_000004"]
    assert [c.path for c, _ in result.best_checkpoints] == [  # Ray's order: oldest first
        join_uri(run_path, "checkpoint_000003"),
        join_uri(run_path, "checkpoint_000004"),
    ]
    with result.checkpoint.as_directory() as folder:
        assert json.loads((Path(folder) / "rank_0.json").read_text()) == {"step": 4}


def test_a_new_driver_resumes_from_the_latest_checkpoint(storage_path: str, tmp_path: Path) -> None:
    log = str(tmp_path / "log")
    _fit(counting_train, {"steps": 3, "log": log}, storage_path)
    result = _fit(counting_train, {"steps": 6, "log": log}, storage_path)
    starts = [(e["start"], e["checkpoint"]) for e in read_log(log) if e["event"] == "start"]
    assert starts == [(0, None), (3, join_uri(storage_path, "run", "checkpoint_000002"))]
    assert result.metrics is not None and result.metrics["step"] == 5
    # Round numbers continue: the resumed run never reuses a checkpoint name.
    assert result.checkpoint is not None
    assert result.checkpoint.path.endswith("checkpoint_000005")
    again = Result.from_path(join_uri(storage_path, "run"))
    assert again.checkpoint == result.checkpoint


def test_failure_restarts_from_checkpoint_until_max_failures(tmp_path: Path) -> None:
    log = str(tmp_path / "log")
    config = {"steps": 6, "log": log, "fail": {"rank": 0, "step": 3, "attempts": [0]}}
    result = _fit(
        counting_train, config, str(tmp_path / "s"), failure_config=FailureConfig(max_failures=1)
    )
    starts = [(e["attempt"], e["start"]) for e in read_log(log) if e["event"] == "start"]
    assert starts == [(0, 0), (1, 3)]
    assert result.restarts == 1
    assert result.metrics is not None and result.metrics["step"] == 5

    config["fail"] = {"rank": 0, "step": 2, "attempts": [0, 1]}
    with pytest.raises(TrainingFailedError) as info:
        _fit(
            counting_train,
            config,
            str(tmp_path / "s2"),
            name="again",
            failure_config=FailureConfig(max_failures=1),
        )
    err = info.value
    assert "injected failure at step 2" in str(err)
    assert "max_failures=1" in str(err)
    assert err.result is not None and err.result.checkpoint is not None
    assert err.result.checkpoint.path.endswith("checkpoint_000001")


def _reporting(call: Any) -> Any:
    def train() -> None:
        call()

    return train


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: tr.report(
                {"x": 1},
                checkpoint=Checkpoint.from_directory(tempfile.mkdtemp()),
                checkpoint_upload_mode="eventually",
            ),
            r"checkpoint_upload_mode='eventually' is not valid",
        ),
        (
            lambda: tr.report({"x": 1}, checkpoint=Checkpoint.from_directory("/no/such/dir")),
            r"checkpoint directory /no/such/dir does not exist",
        ),
        (
            lambda: tr.report({"loss": torch.tensor(0.5)}),
            r"Passing objects containing Torch tensors as metrics.*\['loss'\]",
        ),
        (lambda: tr.report({"f": open}), r"metrics\['f'\] has type builtin_function_or_method"),
        (
            lambda: tr.report({"x": 1}, checkpoint="/tmp"),  # type: ignore[arg-type]
            r"must be a trainer_runtime.Checkpoint",
        ),
    ],
)
def test_bad_report_arguments_fail_the_run_with_a_clear_error(
    tmp_path: Path, call: Any, message: str
) -> None:
    with pytest.raises(TrainingFailedError, match=message):
        _fit(_reporting(call), {}, str(tmp_path))


def test_bad_report_input_fails_at_once_whatever_max_failures(tmp_path: Path) -> None:
    log = tmp_path / "log"
    with pytest.raises(
        TrainingFailedError, match=r"Passing objects containing Torch tensors as metrics"
    ) as info:
        _fit(
            bad_report_train,
            {"log": str(log)},
            str(tmp_path / "s"),
            failure_config=FailureConfig(max_failures=3),
        )
    assert [e["attempt"] for e in read_log(log)] == [0]  # ran once: no restart
    assert info.value.result is not None and info.value.result.restarts == 0
    assert "max_failures" not in str(info.value).splitlines()[0]


def test_uneven_report_counts_are_caught_at_the_end(tmp_path: Path) -> None:
    # A single process always "agrees with itself"; the check matters for multi-worker runs
    # and is covered there. Here: report() outside a run is a clear error.
    with pytest.raises(RuntimeError, match=r"report\(\) was called outside a training function"):
        tr.report({"x": 1})
    with pytest.raises(RuntimeError, match=r"get_context\(\) was called outside"):
        tr.get_context()


def test_missing_score_attribute_fails_at_once_with_the_metrics_seen(tmp_path: Path) -> None:
    with pytest.raises(
        TrainingFailedError,
        match=r"'val_acc'.*metrics seen: \['loss', 'rank', "
        r"'step'\]",
    ):
        _fit(
            counting_train,
            {"steps": 3},
            str(tmp_path),
            checkpoint_config=CheckpointConfig(checkpoint_score_attribute="val_acc"),
            failure_config=FailureConfig(max_failures=3),
        )


def test_a_checkpoint_without_its_score_is_never_marked_committed(tmp_path: Path) -> None:
    with pytest.raises(TrainingFailedError, match="val_acc"):
        _fit(
            counting_train,
            {"steps": 2},
            str(tmp_path),
            checkpoint_config=CheckpointConfig(checkpoint_score_attribute="val_acc"),
        )
    run = tmp_path / "run"
    assert not list(run.glob(f"*/{COMMIT_MARKER}"))
    manager = CheckpointManager(str(run), CheckpointConfig(), get_storage(str(run)))
    manager.restore()
    assert manager.records == []  # a new driver never resumes from it


def test_a_new_driver_never_commits_files_left_by_an_interrupted_upload(
    storage_path: str,
) -> None:
    _fit(counting_train, {"steps": 1}, storage_path)
    run = join_uri(storage_path, "run")
    storage = get_storage(run)
    # A driver died while uploading the next checkpoint: files, no commit marker.
    storage.write_bytes(join_uri(run, "checkpoint_000001", "stale.bin"), b"old")
    result = _fit(counting_train, {"steps": 2}, storage_path)
    # The stale folder is deleted and its name never used again (a fenced-off writer may
    # still be finishing a file there); the new checkpoint holds only its own files.
    assert result.checkpoint == Checkpoint(join_uri(run, "checkpoint_000002"))
    assert storage.list_dirs(run) == ["checkpoint_000000", "checkpoint_000002"]
    assert storage.list_files(join_uri(run, "checkpoint_000002")) == [
        COMMIT_MARKER,
        "rank_0.json",
    ]


@pytest.mark.parametrize(
    ("mode", "delete", "kept"),
    [("async", None, False), ("async", False, True), ("sync", None, True), ("sync", True, False)],
)
def test_local_folder_is_deleted_after_upload_by_default_only_for_async(
    tmp_path: Path, mode: str, delete: bool | None, kept: bool
) -> None:
    """A deleted folder's file is hard-linked into the run folder (its data never copied); a
    kept folder's file is copied, so writing to it later leaves the checkpoint as reported."""
    folders: list[Path] = []
    inodes: list[int] = []

    def train() -> None:
        folder = Path(tempfile.mkdtemp(dir=tmp_path))
        (folder / "w").write_text("x")
        folders.append(folder)
        inodes.append(os.stat(folder / "w").st_ino)
        tr.report(
            {"step": 0},
            checkpoint=Checkpoint.from_directory(folder),
            checkpoint_upload_mode=mode,
            delete_local_checkpoint_after_upload=delete,
        )

    result = _fit(train, {}, str(tmp_path / "s"))
    assert folders[0].exists() is kept
    assert result.checkpoint is not None
    stored = Path(result.checkpoint.path) / "w"
    assert stored.read_text() == "x"
    assert (os.stat(stored).st_ino == inodes[0]) is not kept
    if kept:
        (folders[0] / "w").write_text("changed after the run")
        assert stored.read_text() == "x"


def test_an_async_upload_error_restarts_from_the_last_checkpoint(tmp_path: Path) -> None:
    log = tmp_path / "log"

    def train() -> None:
        ctx = tr.get_context()
        start = 0
        if (ckpt := tr.get_checkpoint()) is not None:
            with ckpt.as_directory() as folder:
                start = json.loads((Path(folder) / "state.json").read_text())["step"] + 1
        with open(log, "a") as fh:
            fh.write(json.dumps({"attempt": ctx.attempt, "start": start}) + "\n")
        for step in range(start, 3):
            if step == 1 and ctx.attempt == 0:
                # Storage refuses this upload: a file stands where its folder goes.
                Path(ctx.get_run_path(), "checkpoint_000001").write_text("not a folder")
            scratch = Path(tempfile.mkdtemp(dir=tmp_path))
            (scratch / "state.json").write_text(json.dumps({"step": step}))
            tr.report(
                {"step": step},
                checkpoint=Checkpoint.from_directory(scratch),
                checkpoint_upload_mode="async",
            )

    result = _fit(train, {}, str(tmp_path / "s"), failure_config=FailureConfig(max_failures=1))
    assert read_log(log) == [{"attempt": 0, "start": 0}, {"attempt": 1, "start": 1}]
    assert result.restarts == 1
    assert result.metrics == {"step": 2}
    assert result.checkpoint is not None
    with result.checkpoint.as_directory() as folder:
        assert json.loads((Path(folder) / "state.json").read_text()) == {"step": 2}


def test_no_upload_mode_registers_a_checkpoint_written_in_place(tmp_path: Path) -> None:
    def train() -> None:
        path = tr.get_context().get_storage().build_checkpoint_path_from_name("final")
        Path(path).mkdir(parents=True)
        (Path(path) / "w").write_text("in place")
        tr.report(
            {"done": 1},
            checkpoint=Checkpoint.from_directory(path),
            checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD,
        )

    result = _fit(train, {}, str(tmp_path))
    assert result.checkpoint == Checkpoint(tmp_path / "run" / "final")
    assert (tmp_path / "run" / "final" / "w").read_text() == "in place"


def _read_or_empty(uri: str) -> bytes:
    try:
        return get_storage(uri).read_bytes(uri)
    except FileNotFoundError:
        return b""


@pytest.mark.slow
def test_async_upload_failure_surfaces_and_nothing_half_uploaded_is_kept(
    tmp_path: Path, gcs_emulator: GCSEmulator
) -> None:
    """A dedicated emulator is stopped mid-run: the failed upload is never committed."""
    server = GCSEmulator(root=tmp_path / "gcs-data").start()
    old = os.environ["STORAGE_EMULATOR_HOST"]
    os.environ["STORAGE_EMULATOR_HOST"] = server.url
    reset_storage_cache()
    try:
        bucket = server.new_bucket("flaky")

        def train() -> None:
            folder = Path(tempfile.mkdtemp())
            (folder / "w").write_text("0")
            tr.report({"step": 0}, checkpoint=Checkpoint.from_directory(folder))  # SYNC
            manifest = f"gs://{bucket}/runs/run/{MANIFEST_FILE}"
            while b"checkpoint_000000" not in _read_or_empty(manifest):  # committed by the
                time.sleep(0.01)  # controller thread
            server.stop()  # storage goes away
            folder = Path(tempfile.mkdtemp())
            (folder / "w").write_text("1")
            tr.report(
                {"step": 1},
                checkpoint=Checkpoint.from_directory(folder),
                checkpoint_upload_mode="async",
            )
            tr.report({"step": 2})  # raises the upload error (or fit() does at the end)

        with pytest.raises(TrainingFailedError, match="upload") as info:
            _fit(train, {}, f"gs://{bucket}/runs")
        assert info.value.result is not None
        assert info.value.result.checkpoint is not None
        assert info.value.result.checkpoint.path.endswith("checkpoint_000000")
        server.start()  # same data folder: what was stored is still there
        run = f"gs://{bucket}/runs/run"
        assert Result.from_path(run).checkpoint == Checkpoint(f"{run}/checkpoint_000000")
        assert [r.name for r in Result.from_path(run).checkpoints] == ["checkpoint_000000"]
    finally:
        server.cleanup()
        os.environ["STORAGE_EMULATOR_HOST"] = old
        reset_storage_cache()
