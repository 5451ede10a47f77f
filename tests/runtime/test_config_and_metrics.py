"""Config objects and report() argument checks: bad input gives clear errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow.fs
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
    with pytest.raises(ValueError, match=r"Cannot specify both.*mutually exclusive"):
        ScalingConfig(use_gpu=True, use_tpu=True)
    with pytest.raises(ValueError, match="PACK, SPREAD"):
        ScalingConfig(placement_strategy="ANYWHERE")
    assert ScalingConfig(num_workers=2, use_gpu=True).worker_resources() == {"CPU": 1.0, "GPU": 1.0}
    tpu_host = ScalingConfig(use_tpu=True, resources_per_worker={"cpu": 2, "TPU": 4})
    assert tpu_host.worker_resources() == {
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
    with pytest.raises(ValueError, match=r"RunConfig\.storage_path.*https://"):
        RunConfig(storage_path="https://x/y")
    assert RunConfig(name="n", storage_path="s3://x/y/").run_path == "s3://x/y/n"
    with pytest.raises(ValueError, match=r"without the s3:// prefix \(e\.g\. 'x/y'\)"):
        RunConfig(storage_path="s3://x/y", storage_filesystem=pyarrow.fs.LocalFileSystem())
    with pytest.raises(ValueError, match=r"must be a pyarrow\.fs\.FileSystem"):
        RunConfig(storage_filesystem="s3")
    custom = RunConfig(name="n", storage_path="bucket/p/", storage_filesystem=_mock_fs())
    assert custom.run_path == "bucket/p/n"  # a path on that filesystem, kept as it is
    with pytest.raises(ValueError, match="UserCallback"):
        RunConfig(callbacks=[object()])
    with pytest.raises(ValueError, match="worker_runtime_env"):
        RunConfig(worker_runtime_env=["pip"])
    env = RunConfig(worker_env={"A": "1"}, worker_runtime_env={"env_vars": {"A": "0", "B": "2"}})
    assert env.worker_runtime_env_with({"C": "3"}) == {"env_vars": {"A": "1", "B": "2", "C": "3"}}


def _mock_fs() -> Any:
    return pyarrow.fs._MockFileSystem()


def test_label_selector_is_checked_as_in_ray() -> None:
    one = ScalingConfig(num_workers=2, label_selector={"pool": "a"})
    assert one.label_selector_per_worker() == [{"pool": "a"}, {"pool": "a"}]
    per = ScalingConfig(num_workers=2, label_selector=[{"pool": "a"}, {"pool": "b"}])
    assert per.label_selector_per_worker() == [{"pool": "a"}, {"pool": "b"}]
    with pytest.raises(ValueError, match="same length"):
        ScalingConfig(num_workers=3, label_selector=[{"pool": "a"}])
    with pytest.raises(ValueError, match="label -> value strings"):
        ScalingConfig(num_workers=1, label_selector={"pool": 1})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="Cannot set `label_selector` when `use_tpu=True`"):
        ScalingConfig(
            num_workers=4,
            use_tpu=True,
            topology="4x4",
            accelerator_type="TPU-V6E",
            label_selector={"pool": "a"},
        )
    single = ScalingConfig(num_workers=1, use_tpu=True, label_selector={"pool": "tpu"})
    assert single.label_selector_per_worker() == [{"pool": "tpu"}]
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
    # Ray Train 2.60's rule and sentence: anything holding a torch tensor or module is
    # refused (dict keys and values, lists, tuples); ours names the keys after it.
    ray_sentence = "Passing objects containing Torch tensors as metrics is not supported"
    with pytest.raises(ReportError, match=rf"^{ray_sentence}.*\['loss'\]"):
        validate_metrics({"loss": torch.tensor(1.0)})
    with pytest.raises(ValueError, match=rf"^{ray_sentence}.*\['deep'\]"):
        validate_metrics({"ok": 1, "deep": {"a": [1, (2, torch.zeros(2))]}})
    with pytest.raises(ReportError, match=ray_sentence):
        validate_metrics({"model": torch.nn.Linear(1, 1)})
    # Plain Python values are kept (tuples as lists: metrics are stored as JSON).
    kept = validate_metrics({"pair": (1, "a"), "lst": [1, (2.5,)], "none": None, "b": True})
    assert kept == {"pair": [1, "a"], "lst": [1, [2.5]], "none": None, "b": True}
    with pytest.raises(ReportError, match=r"metrics\['w'\] is a numpy.ndarray.*\.tolist\(\)"):
        validate_metrics({"w": np.zeros(3)})
    with pytest.raises(ReportError, match=r"metrics\['obj'\] has type object"):
        validate_metrics({"obj": object()})
    with pytest.raises(ReportError, match="must be a dict"):
        validate_metrics([1, 2])
    with pytest.raises(ReportError, match="metric names must be strings"):
        validate_metrics({1: 2})


def test_torch_config_init_method_as_in_ray() -> None:
    # Ray Train 2.60's fields, in its order (positional arguments mean the same).
    import dataclasses

    from trainer_runtime.torch import TorchConfig

    assert [f.name for f in dataclasses.fields(TorchConfig)] == [
        "backend",
        "init_method",
        "timeout_s",
    ]
    assert TorchConfig().init_method == "env"
    assert TorchConfig("gloo", "tcp", 60).init_method == "tcp"
    # Ray Train's ValueError, word for word.
    with pytest.raises(ValueError) as excinfo:
        TorchConfig(init_method="file")
    assert str(excinfo.value) == (
        "The provided init_method (file) is not supported. Must be either 'env' or 'tcp'."
    )


def test_scaling_config_total_resources_and_default_num_workers_as_in_ray() -> None:
    # The values Ray Train 2.60's ScalingConfig gives for the same arguments.
    assert ScalingConfig().num_workers == 1
    assert ScalingConfig().total_resources == {"CPU": 1.0}
    assert ScalingConfig(num_workers=4).total_resources == {"CPU": 4.0}
    assert ScalingConfig(
        num_workers=2, use_gpu=True, resources_per_worker={"CPU": 2, "GPU": 1, "memory": 0}
    ).total_resources == {"CPU": 4.0, "GPU": 2.0}
    assert ScalingConfig(num_workers=0).total_resources == {"CPU": 0.0}
    assert ScalingConfig(use_tpu=True).total_resources == {"TPU": 1.0}
    # Where the workers' requests differ from Ray Train's (documented): 1 CPU beside the GPU.
    assert ScalingConfig(num_workers=2, use_gpu=True).total_resources == {
        "CPU": 2.0,
        "GPU": 2.0,
    }
    assert ScalingConfig(
        num_workers=4, use_tpu=True, topology="4x4", accelerator_type="v6e"
    ).total_resources == {"TPU": 16.0}
