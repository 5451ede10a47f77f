"""Asynchronous validation: local threads, and Ray tasks on a separate ``validation`` node."""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

import trainer_runtime as tr
from tests.runtime.workloads import max_overlap, read_log, score_validation, validating_train
from trainer_runtime import (
    Checkpoint,
    CheckpointConfig,
    CheckpointStatus,
    DataParallelTrainer,
    Result,
    RunConfig,
    ScalingConfig,
    TrainingFailedError,
    ValidationConfig,
)
from trainer_runtime import _validation as validation_module
from trainer_runtime.callbacks import Callback
from trainer_runtime.checkpoint_manager import MANIFEST_FILE
from trainer_runtime.storage import join_uri
from trainer_runtime.torch import TorchTrainer


class DemandRecorder(Callback):
    """Collects the validation-demand signal the operator's status publisher would see."""

    def __init__(self) -> None:
        self.demand: list[tuple[int, int]] = []
        self.queue: list[tuple[int, int, int]] = []

    def on_validation_demand(self, pending: int, running: int) -> None:
        self.demand.append((pending, running))

    def on_validation_queue(self, queued: int, running: int, waiting: int) -> None:
        self.queue.append((queued, running, waiting))


def _run(
    tmp_path: Path,
    validate: dict[str, Any],
    steps: int = 4,
    name: str = "val",
    num_workers: int = 0,
    num_to_keep: int = 1,
    score_attribute: str = "val_loss",
    train: dict[str, Any] | None = None,
    **validation: Any,
) -> tuple[Result, DemandRecorder]:
    """Run ``validating_train``: 0 workers is local mode, 1 a Ray actor, 2 TorchTrainer."""
    recorder = DemandRecorder()
    trainer_cls = TorchTrainer if num_workers > 1 else DataParallelTrainer
    result = trainer_cls(
        validating_train,
        train_loop_config={"steps": steps, "validate": validate, **(train or {})},
        scaling_config=ScalingConfig(num_workers=num_workers),
        run_config=RunConfig(
            name=name,
            storage_path=str(tmp_path / "storage"),
            checkpoint_config=CheckpointConfig(
                num_to_keep=num_to_keep,
                checkpoint_score_attribute=score_attribute,
                checkpoint_score_order="min",
            ),
            validation_config=ValidationConfig(**validation),
            callbacks=[recorder],
        ),
    ).fit()
    return result, recorder


def test_local_validation_merges_metrics_and_ranks_by_them(tmp_path: Path) -> None:
    log = str(tmp_path / "vlog")
    result, recorder = _run(
        tmp_path, {"best_step": 1, "log": log, "sleep": 0.2}, steps=4, max_concurrent_validations=1
    )
    # val_loss = |step - 1|: the best checkpoint is step 1, not the latest (step 3).
    assert result.best_checkpoint is not None
    assert result.best_checkpoint.path.endswith("checkpoint_000001")
    kept = {r.name: r for r in result.checkpoints}
    assert set(kept) == {"checkpoint_000001", "checkpoint_000003"}  # best + latest
    assert all(r.status == CheckpointStatus.VALIDATED for r in kept.values())
    assert kept["checkpoint_000001"].all_metrics["val_loss"] == 0.0
    assert kept["checkpoint_000001"].all_metrics["loss"] == 0.5  # training metrics kept too
    entries = read_log(log)
    assert sorted(e["step"] for e in entries) == [0, 1, 2, 3]  # fit() waited for all
    assert max_overlap(entries) == 1  # the concurrency limit held
    assert all(e["path"].startswith(str(tmp_path / "storage")) for e in entries)  # committed
    assert max(p + r for p, r in recorder.demand) >= 1 and recorder.demand[-1] == (0, 0)


def test_failed_and_timed_out_validations_are_recorded_not_fatal(tmp_path: Path) -> None:
    result, _ = _run(
        tmp_path,
        {"best_step": 0, "fail_on": [1], "hang_on": [2]},
        steps=4,
        max_concurrent_validations=2,
        timeout_s=2.0,
    )
    # num_to_keep=1 keeps the best scored (step 0) and the latest (step 3); step 1 (failed)
    # and step 2 (timed out) have no score, so they were evicted once validated.
    statuses = {r.name: r.status for r in result.checkpoints}
    assert statuses == {
        "checkpoint_000000": CheckpointStatus.VALIDATED,
        "checkpoint_000003": CheckpointStatus.VALIDATED,
    }
    assert result.metrics is not None and result.metrics["step"] == 3


def test_statuses_of_failed_and_timed_out_validations(tmp_path: Path) -> None:
    result, _ = _run(
        tmp_path,
        {"best_step": 0, "fail_on": [1], "hang_on": [2]},
        steps=3,
        max_concurrent_validations=3,
        timeout_s=2.0,
    )
    by_name = {r.name: r for r in result.checkpoints}
    # The latest (step 2) is always kept, so its timeout is visible; step 1 failed and was
    # evicted (no score), step 0 is the best.
    assert by_name["checkpoint_000002"].status == CheckpointStatus.VALIDATION_TIMEOUT
    assert "timeout_s=2" in (by_name["checkpoint_000002"].validation_error or "")
    assert by_name["checkpoint_000000"].status == CheckpointStatus.VALIDATED
    assert result.checkpoint_status(result.checkpoint) == CheckpointStatus.VALIDATION_TIMEOUT  # type: ignore[arg-type]


def test_failed_validation_error_is_kept(tmp_path: Path) -> None:
    result, _ = _run(tmp_path, {"best_step": 0, "fail_on": [1]}, steps=2)
    latest = {r.name: r for r in result.checkpoints}["checkpoint_000001"]
    assert latest.status == CheckpointStatus.VALIDATION_FAILED
    assert "validation data for step 1 is corrupt" in (latest.validation_error or "")


def test_not_waiting_leaves_pending_and_a_new_driver_records_them_lost(tmp_path: Path) -> None:
    result, _ = _run(tmp_path, {"best_step": 0, "sleep": 30}, steps=2, wait_for_validations=False)
    # fit() returned while validations were still queued/running.
    assert {r.status for r in result.checkpoints} == {CheckpointStatus.PENDING_VALIDATION}
    # A new driver (same name) cannot resume another process's validations: recorded lost.
    resumed = Result.from_path(join_uri(str(tmp_path / "storage"), "val"))
    assert any(r.status == CheckpointStatus.PENDING_VALIDATION for r in resumed.checkpoints)
    again, _ = _run(tmp_path, {"best_step": 0}, steps=1, num_to_keep=5)
    statuses = {r.name: r.status for r in again.checkpoints}
    assert statuses == {
        "checkpoint_000000": CheckpointStatus.VALIDATION_LOST,
        "checkpoint_000001": CheckpointStatus.VALIDATION_LOST,
        "checkpoint_000002": CheckpointStatus.VALIDATED,
    }


@pytest.mark.ray
def test_ray_validation_runs_on_the_validation_node(
    tmp_path: Path, ray_validation_node: str
) -> None:
    log = str(tmp_path / "vlog")
    result, recorder = _run(
        tmp_path,
        {"best_step": 2, "log": log, "sleep": 0.5},
        steps=4,
        num_workers=2,
        max_concurrent_validations=2,
    )
    entries = read_log(log)
    assert sorted(e["step"] for e in entries) == [0, 1, 2, 3]
    assert {e["node_id"] for e in entries} == {ray_validation_node}
    assert max_overlap(entries) <= 2
    assert result.best_checkpoint is not None
    assert result.best_checkpoint.path.endswith("checkpoint_000002")
    assert max(p + r for p, r in recorder.demand) >= 1


@pytest.mark.ray
def test_ray_validation_failure_and_timeout_do_not_stop_training(
    tmp_path: Path, ray_validation_node: str
) -> None:
    result, _ = _run(
        tmp_path,
        {"best_step": 0, "fail_on": [1], "hang_on": [2]},
        steps=3,
        num_workers=2,
        max_concurrent_validations=2,
        timeout_s=5.0,
        num_to_keep=5,
    )
    by_name = {r.name: r for r in result.checkpoints}
    assert by_name["checkpoint_000000"].status == CheckpointStatus.VALIDATED
    assert by_name["checkpoint_000001"].status == CheckpointStatus.VALIDATION_FAILED
    assert "validation data for step 1 is corrupt" in (
        by_name["checkpoint_000001"].validation_error or ""
    )
    assert by_name["checkpoint_000002"].status == CheckpointStatus.VALIDATION_TIMEOUT
    assert result.metrics is not None and result.metrics["step"] == 2


def test_validation_metrics_win_over_training_metrics_of_the_same_name(tmp_path: Path) -> None:
    # Training loss 1/(step+1) is lowest at the latest step; the validation's "loss"
    # (|step - 0|) is lowest at step 0 and must rank the checkpoints.
    result, _ = _run(tmp_path, {"best_step": 0, "as_loss": True}, steps=3, score_attribute="loss")
    by_name = {r.name: r for r in result.checkpoints}
    assert set(by_name) == {"checkpoint_000000", "checkpoint_000002"}  # best + latest
    first = by_name["checkpoint_000000"]
    assert first.metrics["loss"] == 1.0 and first.all_metrics["loss"] == 0.0
    assert result.best_checkpoint is not None
    assert result.best_checkpoint.path.endswith("checkpoint_000000")
    assert result.best_checkpoints[-1][1]["loss"] == 0.0  # Ray's order: best last


def test_demand_counts_only_validations_that_could_run_now(tmp_path: Path) -> None:
    result, recorder = _run(
        tmp_path, {"best_step": 0, "sleep": 0.5}, steps=3, max_concurrent_validations=1
    )
    assert {r.status for r in result.checkpoints} == {CheckpointStatus.VALIDATED}
    assert max(queued for queued, _, _ in recorder.queue) >= 2  # they did pile up
    assert all(p + r <= 1 for p, r in recorder.demand)  # but one pod is all they can use
    assert max(p + r for p, r in recorder.demand) == 1
    assert recorder.demand[-1] == (0, 0) and recorder.queue[-1] == (0, 0, 0)


def _resume_validations(tmp_path: Path, num_workers: int) -> None:
    """A first driver exits with validations pending; a second driver resumes them."""
    log = str(tmp_path / "vlog")
    slow = {"best_step": 0, "sleep": 30}
    first, _ = _run(
        tmp_path,
        slow,  # the validate_config of step 0's report(validate_fn=...)
        steps=2,
        num_workers=num_workers,
        num_to_keep=5,
        train={"per_report_steps": [0]},  # step 1 uses the run-level validate_fn
        validate_fn=score_validation,
        validate_config=slow,
        wait_for_validations=False,
    )
    assert {r.status for r in first.checkpoints} == {CheckpointStatus.PENDING_VALIDATION}
    again, _ = _run(
        tmp_path,
        {},
        steps=1,
        num_workers=num_workers,
        num_to_keep=5,
        train={"per_report_steps": []},
        validate_fn=score_validation,
        validate_config={"best_step": 0, "log": log},
    )
    by_name = {r.name: r for r in again.checkpoints}
    # Step 0's validate_fn was passed to report() by the first driver: it cannot be recovered.
    assert by_name["checkpoint_000000"].status == CheckpointStatus.VALIDATION_LOST
    # Step 1 used the run-level function: re-queued with this driver's function and config.
    assert by_name["checkpoint_000001"].status == CheckpointStatus.VALIDATED
    assert by_name["checkpoint_000002"].status == CheckpointStatus.VALIDATED
    validated = sorted(e["path"].rsplit("/", 1)[-1] for e in read_log(log))
    assert validated == ["checkpoint_000001", "checkpoint_000002"]


def test_a_new_driver_requeues_pending_run_level_validations(tmp_path: Path) -> None:
    _resume_validations(tmp_path, num_workers=0)


@pytest.mark.timeout(120)
def test_a_failing_dispatcher_fails_the_run_instead_of_hanging(tmp_path: Path) -> None:
    manifest = tmp_path / "storage" / "broken" / MANIFEST_FILE

    def validate(checkpoint: Checkpoint, config: dict[str, Any]) -> dict[str, Any]:
        if checkpoint.path.endswith("checkpoint_000000"):
            while "checkpoint_000001" not in manifest.read_text():
                time.sleep(0.05)  # both checkpoints are committed
            manifest.unlink()  # from now on the manifest cannot be saved
            manifest.mkdir()
            (manifest / "in-the-way").write_text("")
        return {"val_loss": 1.0}

    def train() -> None:
        for step in range(2):
            folder = tempfile.mkdtemp(dir=tmp_path)
            Path(folder, "weights").write_text(str(step))
            tr.report({"step": step}, checkpoint=Checkpoint(folder), validate_fn=validate)

    with pytest.raises(TrainingFailedError, match="recording validation results failed") as info:
        DataParallelTrainer(
            train,
            scaling_config=ScalingConfig(num_workers=0),
            run_config=RunConfig(name="broken", storage_path=str(tmp_path / "storage")),
        ).fit()
    assert "Is a directory" in str(info.value)


@pytest.mark.ray
def test_ray_concurrency_limit_holds_below_the_free_slots(
    tmp_path: Path, ray_validation_node: str
) -> None:
    log = str(tmp_path / "vlog")
    result, _ = _run(
        tmp_path,
        {"best_step": 0, "log": log, "sleep": 1.0},
        steps=3,
        num_workers=1,
        max_concurrent_validations=1,  # the node has 2 validation slots
    )
    entries = read_log(log)
    assert sorted(e["step"] for e in entries) == [0, 1, 2]
    assert {e["node_id"] for e in entries} == {ray_validation_node}
    assert max_overlap(entries) == 1
    assert result.best_checkpoint is not None


@pytest.mark.ray
def test_ray_timeout_counts_from_the_start_not_the_wait_for_a_node(
    tmp_path: Path, ray_validation_node: str
) -> None:
    # Each validation needs the whole node (2 slots), so the second one waits ~4 s for the
    # first, then runs 4 s: 8 s after it was handed to Ray, but only 4 s of it running.
    result, _ = _run(
        tmp_path,
        {"best_step": 0, "sleep": 4.0},
        steps=2,
        num_workers=1,
        num_to_keep=5,
        max_concurrent_validations=2,
        resources={"validation": 2.0},
        timeout_s=6.0,
    )
    assert {r.name: r.status for r in result.checkpoints} == {
        "checkpoint_000000": CheckpointStatus.VALIDATED,
        "checkpoint_000001": CheckpointStatus.VALIDATED,
    }


@pytest.mark.ray
def test_ray_validations_waiting_for_a_node_are_logged_and_never_time_out(
    tmp_path: Path,
    ray_cluster: Any,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(validation_module, "WAITING_LOG_INTERVAL_S", 1.0)
    caplog.set_level(logging.WARNING, logger=validation_module.__name__)
    result, recorder = _run(
        tmp_path,
        {"best_step": 0},
        steps=1,
        num_workers=1,
        train={"sleep": 4.0},  # training goes on while the validation waits
        resources={"no_such_pool": 1.0},
        timeout_s=1.0,
        wait_for_validations=False,
    )
    assert [r.status for r in result.checkpoints] == [CheckpointStatus.PENDING_VALIDATION]
    waiting = [r.getMessage() for r in caplog.records if "waiting for a node" in r.getMessage()]
    assert waiting, caplog.text
    assert "1 validation(s) waiting for a node with {'no_such_pool': 1.0}" in waiting[0]
    assert "the Ray cluster has no node with {'no_such_pool': 1.0}" in waiting[0]
    assert (0, 1, 1) in recorder.queue  # running (holding its slot) but waiting for a node


@pytest.mark.ray
def test_ray_a_new_driver_requeues_pending_run_level_validations(
    tmp_path: Path, ray_validation_node: str
) -> None:
    _resume_validations(tmp_path, num_workers=1)


@pytest.mark.ray
def test_ray_validation_fans_out_on_a_node_without_cpus(
    tmp_path: Path, ray_validation_node: str
) -> None:
    """The README's fan-out pattern, on a node with only validation slots and 0 CPUs."""
    import ray

    node = next(n for n in ray.nodes() if n["NodeID"] == ray_validation_node)
    assert node["Resources"].get("CPU", 0) == 0 and node["Resources"]["validation"] == 2
    log = str(tmp_path / "shards")
    result, _ = _run(
        tmp_path,
        {"shards": 3, "log": log},
        steps=1,
        num_workers=1,
        train={"validate_fn": "fanout_validation"},
        timeout_s=60.0,
    )
    record = result.checkpoints[0]
    assert record.status == CheckpointStatus.VALIDATED, record.validation_error
    assert record.all_metrics["val_loss"] == 1.0  # shards 0, 1, 2 of step 0
    entries = read_log(log)
    assert sorted(e["shard"] for e in entries) == [0, 1, 2]
    assert {e["node_id"] for e in entries} == {ray_validation_node}
