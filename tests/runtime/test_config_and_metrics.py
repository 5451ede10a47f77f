"""Config objects and report() argument checks: bad input gives clear errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trainer_runtime import (
    CheckpointConfig,
    CheckpointUploadMode,
    FailureConfig,
    RunConfig,
    ScalingConfig,
)
from trainer_runtime._metrics import validate_metrics
from trainer_runtime.errors import ReportError


def test_scaling_config_errors() -> None:
    with pytest.raises(ValueError, match="num_workers must be >= 0"):
        ScalingConfig(num_workers=-1)
    with pytest.raises(ValueError, match="mutually exclusive"):
        ScalingConfig(use_gpu=True, use_tpu=True)
    with pytest.raises(ValueError, match="PACK, SPREAD"):
        ScalingConfig(placement_strategy="ANYWHERE")
    assert ScalingConfig(num_workers=2, use_gpu=True).worker_resources() == {"CPU": 1.0, "GPU": 1.0}
    assert ScalingConfig(resources_per_worker={"cpu": 2, "TPU": 4}).worker_resources() == {
        "CPU": 2,
        "TPU": 4,
    }
    assert ScalingConfig(num_workers=0).local_mode


def test_other_configs() -> None:
    with pytest.raises(ValueError, match="num_to_keep"):
        CheckpointConfig(num_to_keep=0)
    with pytest.raises(ValueError, match="'max' or 'min'"):
        CheckpointConfig(checkpoint_score_order="up")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_failures"):
        FailureConfig(max_failures=-2)
    assert FailureConfig(max_failures=-1).allows(10**6)
    assert not FailureConfig(max_failures=1).allows(2)
    with pytest.raises(ValueError, match=r"RunConfig\.name"):
        RunConfig(name="a/b")
    with pytest.raises(ValueError, match=r"RunConfig\.storage_path.*s3://"):
        RunConfig(storage_path="s3://x/y")
    run = RunConfig(name="n", storage_path="gs://b/p/")
    assert run.run_path == "gs://b/p/n"


def test_upload_mode_parsing() -> None:
    assert CheckpointUploadMode.parse("ASYNC") is CheckpointUploadMode.ASYNC
    assert CheckpointUploadMode.parse("none") is CheckpointUploadMode.NO_UPLOAD
    with pytest.raises(ValueError, match=r"'later'.*CheckpointUploadMode.SYNC"):
        CheckpointUploadMode.parse("later")


def test_metrics_validation() -> None:
    out = validate_metrics(
        {"loss": np.float32(0.5), "n": np.int64(3), "tags": ["a", 1], "nested": {"x": 1.0}}
    )
    assert out == {"loss": 0.5, "n": 3, "tags": ["a", 1], "nested": {"x": 1.0}}
    assert type(out["loss"]) is float
    with pytest.raises(ReportError, match=r"metrics\['loss'\] is a torch.Tensor.*\.item\(\)"):
        validate_metrics({"loss": torch.tensor(1.0)})
    with pytest.raises(ReportError, match=r"metrics\['w'\] is a numpy.ndarray.*\.tolist\(\)"):
        validate_metrics({"w": np.zeros(3)})
    with pytest.raises(ReportError, match=r"metrics\['obj'\] has type object"):
        validate_metrics({"obj": object()})
    with pytest.raises(ReportError, match="must be a dict"):
        validate_metrics([1, 2])
    with pytest.raises(ReportError, match="metric names must be strings"):
        validate_metrics({1: 2})
