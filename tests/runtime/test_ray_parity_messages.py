"""Ray Train 2.60's behaviour where users see it: local mode's ``Result.metrics`` and the
error sentences users match (Ray's sentence first, then ours). Local mode: no Ray needed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import trainer_runtime as tr
from trainer_runtime import (
    DataParallelTrainer,
    Result,
    RunConfig,
    ScalingConfig,
    TrainingFailedError,
    ValidationConfig,
)


def _fit(fn: Any, config: dict[str, Any], path: Path, **kwargs: Any) -> Result:
    return DataParallelTrainer(
        fn,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=0),
        run_config=RunConfig(name="run", storage_path=str(path / "storage")),
        **kwargs,
    ).fit()


def _checkpoint(folder: Path, step: int) -> tr.Checkpoint:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "state.txt").write_text(str(step))
    return tr.Checkpoint.from_directory(str(folder))


def _reports_then_metrics_only(config: dict[str, Any]) -> None:
    tr.report({"step": 0}, checkpoint=_checkpoint(Path(config["dir"]) / "c0", 0))
    tr.report({"step": 1, "loss": 0.5})  # no checkpoint: still Result.metrics in Ray


def test_local_mode_result_metrics_are_the_last_report(tmp_path: Path) -> None:
    # Ray Train 2.60's local mode: Result.metrics is the last report()'s metrics, with or
    # without a checkpoint; the checkpoint stays the latest committed one here.
    result = _fit(_reports_then_metrics_only, {"dir": str(tmp_path / "src")}, tmp_path)
    assert result.metrics == {"step": 1, "loss": 0.5}
    assert result.checkpoint is not None
    assert [r.metrics for r in result.checkpoints] == [{"step": 0}]


def _validate(checkpoint: tr.Checkpoint, **_: Any) -> dict[str, Any]:
    return {"score": 1.0}


def _validated_last(config: dict[str, Any]) -> None:
    tr.report({"step": 0})
    tr.report({"step": 1}, checkpoint=_checkpoint(Path(config["dir"]) / "c1", 1), validation=True)


def test_local_mode_result_metrics_keep_the_last_checkpoints_validation(tmp_path: Path) -> None:
    result = _fit(
        _validated_last,
        {"dir": str(tmp_path / "src")},
        tmp_path,
        validation_config=ValidationConfig(fn=_validate),
    )
    assert result.metrics == {"step": 1, "score": 1.0}


def _not_a_checkpoint(checkpoint: tr.Checkpoint, name: str) -> Any:
    return checkpoint.path  # a str, not a Checkpoint


def _upload_fn_train(config: dict[str, Any]) -> None:
    tr.report(
        {"step": 0},
        checkpoint=_checkpoint(Path(config["dir"]) / "c0", 0),
        checkpoint_upload_fn=_not_a_checkpoint,
    )


def _cause(info: pytest.ExceptionInfo[TrainingFailedError]) -> str:
    error: BaseException | None = info.value
    texts = []
    while error is not None:
        texts.append(str(error))
        error = error.__cause__
    return "\n".join(texts)


def test_upload_fn_not_returning_a_checkpoint_is_rays_sentence(tmp_path: Path) -> None:
    with pytest.raises(TrainingFailedError) as info:
        _fit(_upload_fn_train, {"dir": str(tmp_path / "src")}, tmp_path)
    assert (
        "checkpoint_upload_fn must return a `ray.train.Checkpoint`. Actual type is "
        "<class 'str'>. Here: return a `trainer_runtime.Checkpoint`"
    ) in _cause(info)


def _validation_without_checkpoint(config: dict[str, Any]) -> None:
    tr.report({"step": 0}, validation=True)


def test_validation_without_checkpoint_is_rays_sentence(tmp_path: Path) -> None:
    with pytest.raises(TrainingFailedError) as info:
        _fit(
            _validation_without_checkpoint,
            {},
            tmp_path,
            validation_config=ValidationConfig(fn=_validate),
        )
    assert (
        "Validation requires a checkpoint to be provided. Pass the checkpoint to validate in "
        "the same report() call"
    ) in _cause(info)
