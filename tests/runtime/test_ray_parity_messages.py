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


# -- the train function's signature (Ray's count_required_parameters and its rule)


def _no_args() -> str:
    return "none"


def _config_only(config: dict[str, Any]) -> Any:
    return config


def _config_and_defaults(config: dict[str, Any], epochs: int = 10) -> Any:
    return (config, epochs)


def _star_args(*args: Any) -> Any:
    return args


def _two_required(config: dict[str, Any], other: Any) -> None:
    return None


SIGNATURES = [_no_args, _config_only, _config_and_defaults, _star_args, _two_required]


@pytest.mark.parametrize("fn", SIGNATURES, ids=lambda fn: fn.__name__)
def test_required_parameters_are_counted_as_ray_counts_them(fn: Any) -> None:
    from ray.train._internal.utils import count_required_parameters as rays

    from trainer_runtime._worker import count_required_parameters

    assert count_required_parameters(fn) == rays(fn)


def test_the_train_function_is_called_by_rays_rule(tmp_path: Path) -> None:
    config = {"a": 1}
    # One required argument, with defaults after it: called with the config.
    assert _fit(_config_and_defaults, config, tmp_path / "1").return_value == (config, 10)
    # None required: called without it, even with a train_loop_config (Ray drops it).
    assert _fit(_no_args, config, tmp_path / "2").return_value == "none"
    assert _fit(_star_args, config, tmp_path / "3").return_value == (config,)


def test_a_train_function_of_two_required_arguments_is_rays_error_at_fit(tmp_path: Path) -> None:
    trainer = DataParallelTrainer(
        _two_required,
        scaling_config=ScalingConfig(num_workers=0),
        run_config=RunConfig(name="run", storage_path=str(tmp_path)),
    )
    with pytest.raises(ValueError) as info:
        trainer.fit()
    assert str(info.value) == (
        "train_loop_per_worker should take in 0 or 1 required arguments, but it accepts "
        "2 required arguments instead."
    )


# -- ScalingConfig: accelerators as Ray's config checks and asks for them


@pytest.mark.parametrize(
    "kwargs",
    [
        {"resources_per_worker": {"GPU": 1}},
        {"resources_per_worker": {"TPU": 4}},
        {"use_gpu": True, "use_tpu": True},
    ],
    ids=["gpu-without-use_gpu", "tpu-without-use_tpu", "gpu-and-tpu"],
)
def test_accelerator_resources_without_their_flag_are_rays_error(kwargs: dict[str, Any]) -> None:
    from ray.train.v2.api.config import ScalingConfig as RayScalingConfig

    with pytest.raises(ValueError) as ray_error:
        RayScalingConfig(**kwargs)
    with pytest.raises(ValueError) as ours:
        ScalingConfig(**kwargs)
    assert str(ours.value).startswith(str(ray_error.value))


def test_a_gpu_accelerator_type_asks_for_rays_constraint_resource() -> None:
    from ray.train.v2.api.config import ScalingConfig as RayScalingConfig

    kwargs: dict[str, Any] = {"num_workers": 2, "use_gpu": True, "accelerator_type": "A100"}
    ray_worker = RayScalingConfig(**kwargs)._resources_per_worker_not_none
    ours = ScalingConfig(**kwargs).worker_resources()
    assert ours["accelerator_type:A100"] == ray_worker["accelerator_type:A100"] == 0.001
    assert ours["GPU"] == ray_worker["GPU"] == 1
    # use_gpu with GPU 0 asks for one GPU, as Ray does.
    zero = {"use_gpu": True, "resources_per_worker": {"CPU": 1, "GPU": 0}}
    assert ScalingConfig(**zero).worker_resources()["GPU"] == 1
    assert RayScalingConfig(**zero)._resources_per_worker_not_none["GPU"] == 1


# -- Result: nested metric names, the metrics dataframe, from_path's words


def _nested_metrics(config: dict[str, Any]) -> None:
    for step, loss in enumerate([0.5, 0.2, 0.4]):
        checkpoint = _checkpoint(Path(config["dir"]) / f"c{step}", step)
        tr.report({"step": step, "val": {"loss": loss}}, checkpoint=checkpoint)


def test_best_checkpoint_by_a_nested_metric_and_the_metrics_dataframe(tmp_path: Path) -> None:
    result = _fit(_nested_metrics, {"dir": str(tmp_path / "src")}, tmp_path)
    best = result.get_best_checkpoint("val/loss", "min")
    assert best is not None and Path(best.path).name == "checkpoint_000001"
    frame = result.metrics_dataframe
    assert list(frame["step"]) == [m["step"] for _, m in result.best_checkpoints]
    assert list(frame["val"]) == [{"loss": 0.5}, {"loss": 0.2}, {"loss": 0.4}]
    again = tr.Result.from_path(result.path)
    worst = again.get_best_checkpoint("val/loss", "max")
    assert worst is not None and Path(worst.path).name == "checkpoint_000000"
    assert len(again.metrics_dataframe) == 3


def test_from_path_of_a_folder_holding_no_run_opens_with_rays_words(tmp_path: Path) -> None:
    (tmp_path / "not-a-run").mkdir()
    (tmp_path / "not-a-run" / "notes.txt").write_text("x")
    with pytest.raises(RuntimeError, match=r"^Failed to restore the Result object: no run found"):
        tr.Result.from_path(str(tmp_path / "not-a-run"))


def test_validation_fn_is_exported_as_in_ray_train() -> None:
    import ray.train

    assert "ValidationFn" in ray.train.__all__
    assert "ValidationFn" in tr.__all__
