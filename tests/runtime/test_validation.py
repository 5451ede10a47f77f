"""Asynchronous validation: local threads, and Ray tasks on a separate ``validation`` node."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.runtime.workloads import max_overlap, read_log, validating_train
from trainer_runtime import (
    CheckpointConfig,
    CheckpointStatus,
    DataParallelTrainer,
    Result,
    RunConfig,
    ScalingConfig,
    ValidationConfig,
)
from trainer_runtime.callbacks import Callback
from trainer_runtime.storage import join_uri
from trainer_runtime.torch import TorchTrainer


class DemandRecorder(Callback):
    """Collects the validation-demand signal the operator's status publisher would see."""

    def __init__(self) -> None:
        self.demand: list[tuple[int, int]] = []

    def on_validation_demand(self, pending: int, running: int) -> None:
        self.demand.append((pending, running))


def _run(
    tmp_path: Path,
    validate: dict[str, Any],
    steps: int = 4,
    name: str = "val",
    num_workers: int = 0,
    num_to_keep: int = 1,
    **validation: Any,
) -> tuple[Result, DemandRecorder]:
    recorder = DemandRecorder()
    trainer_cls = TorchTrainer if num_workers else DataParallelTrainer
    result = trainer_cls(
        validating_train,
        train_loop_config={"steps": steps, "validate": validate},
        scaling_config=ScalingConfig(num_workers=num_workers),
        run_config=RunConfig(
            name=name,
            storage_path=str(tmp_path / "storage"),
            checkpoint_config=CheckpointConfig(
                num_to_keep=num_to_keep,
                checkpoint_score_attribute="val_loss",
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
