"""Ray Data ingestion: ``datasets=``, ``DataConfig`` and ``get_dataset_shard``.

The configuration checks need no Ray; local mode runs Ray Data on the session's cluster.
The behaviour beside Ray Train's (splits, epochs, restarts, DataContext) is in
``tests/compat/test_differential.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import trainer_runtime as tr
from trainer_runtime import DataConfig, DataParallelTrainer, RunConfig, ScalingConfig
from trainer_runtime.errors import UserConfigError

LOCAL = ScalingConfig(num_workers=0)


def _range_fn() -> Any:
    import ray.data

    return ray.data.range(8)


def test_data_config_refuses_what_ray_refuses() -> None:
    with pytest.raises(TypeError, match="`datasets_to_split` should be a 'all' or a list"):
        DataConfig(datasets_to_split="train")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"Received \[1\] among the names"):
        DataConfig(datasets_to_split=["train", 1])  # type: ignore[list-item]
    assert DataConfig()._datasets_to_split == "all"


def test_an_unknown_name_in_datasets_to_split_is_refused_at_construction() -> None:
    with pytest.raises(ValueError) as info:
        DataParallelTrainer(
            lambda: None,
            datasets={"train": _range_fn},
            dataset_config=DataConfig(datasets_to_split=["train", "valid"]),
        )
    text = str(info.value)
    assert "datasets_to_split" in text and "['valid']" in text and "['train']" in text
    assert "remove them from datasets_to_split" in text


def test_datasets_and_dataset_config_of_the_wrong_type_are_refused() -> None:
    with pytest.raises(TypeError, match="datasets must be a dict"):
        DataParallelTrainer(lambda: None, datasets=[_range_fn])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"datasets\['train'\] must be a ray.data.Dataset"):
        DataParallelTrainer(lambda: None, datasets={"train": 3})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match=r"dataset_config must be a trainer_runtime\.DataConfig"):
        DataParallelTrainer(lambda: None, dataset_config={"datasets_to_split": "all"})  # type: ignore[arg-type]


def test_the_framework_trainers_take_datasets() -> None:
    from trainer_runtime.torch import TorchTrainer

    config = DataConfig(datasets_to_split=[])
    trainer = TorchTrainer(lambda: None, datasets={"train": _range_fn}, dataset_config=config)
    assert trainer.datasets == {"train": _range_fn} and trainer.data_config is config
    assert DataParallelTrainer(lambda: None).datasets == {}


def test_get_dataset_shard_of_a_name_not_given_says_so(tmp_path: Path) -> None:
    seen: list[str] = []

    def train_fn() -> None:
        try:
            tr.get_dataset_shard("train")
        except KeyError as exc:
            seen.append(str(exc))

    DataParallelTrainer(
        train_fn, scaling_config=LOCAL, run_config=RunConfig(name="r", storage_path=str(tmp_path))
    ).fit()
    [text] = seen
    # Ray Train's sentence, then what was given and the fix
    assert "Dataset shard for 'train' not found. Please ensure that the dataset is passed" in text
    assert "The trainer was given no datasets" in text
    assert "datasets={'train': ray.data.Dataset}" in text


def test_datasets_under_torchrun_with_several_processes_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(key, value)
    trainer = DataParallelTrainer(
        lambda: None,
        scaling_config=LOCAL,
        run_config=RunConfig(name="r", storage_path=str(tmp_path)),
        datasets={"train": _range_fn},
    )
    with pytest.raises(UserConfigError) as info:
        trainer.fit()
    text = str(info.value)
    assert text.startswith("Ray Data is not supported in local mode with multiple workers.")
    assert "WORLD_SIZE=2" in text and "['train']" in text and "num_workers=N" in text


@pytest.mark.usefixtures("ray_cluster")
def test_local_mode_reads_each_dataset_whole_once_per_epoch(tmp_path: Path) -> None:
    import ray.data

    seen: list[Any] = []

    def train_fn() -> None:
        for _epoch in range(2):
            shard = tr.get_dataset_shard("train")
            ids = [int(i) for b in shard.iter_batches(batch_size=3) for i in b["id"]]
            valid = tr.get_dataset_shard("valid")
            seen.append((type(shard).__name__, sorted(ids), valid.materialize().count()))
        try:
            tr.get_dataset_shard("test")
        except KeyError as exc:
            seen.append(str(exc))

    DataParallelTrainer(
        train_fn,
        scaling_config=LOCAL,
        run_config=RunConfig(name="r", storage_path=str(tmp_path)),
        datasets={"train": ray.data.range(10), "valid": _range_fn},
        # split or not, one process reads every dataset whole
        dataset_config=DataConfig(datasets_to_split=["train"]),
    ).fit()
    assert seen[:2] == [("DataIteratorImpl", list(range(10)), 8)] * 2
    assert "The trainer's datasets are ['train', 'valid']" in seen[2]


def test_the_guides_snippet_trains_two_workers_on_their_shards(
    tmp_path: Path, ray_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``docs/snippets/ray_data_ingest.py``, which the Ray Data guide includes, as it is."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "docs" / "snippets" / "ray_data_ingest.py"
    spec = importlib.util.spec_from_file_location("snippet_ray_data_ingest", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    seen: list[dict[str, Any]] = []

    class Record(tr.UserCallback):
        def after_report(self, run_context: Any, metrics: Any, checkpoint: Any) -> None:
            # Ray Train's TrainRunContext carries the trainer's dataset_config too
            split = run_context.dataset_config._datasets_to_split
            seen.append({"ranks": metrics, "split": split})

    monkeypatch.setattr(module, "RunConfig", lambda **kw: RunConfig(callbacks=[Record()], **kw))
    module.main(storage_path=str(tmp_path))
    # 256 rows split in two equal halves, 64 validation rows on each worker, every epoch
    assert [[dict(m) for m in r["ranks"]] for r in seen] == [
        [{"epoch": e, "rows": 128, "val_rows": 64}] * 2 for e in range(2)
    ]
    assert [r["split"] for r in seen] == [["train"]] * 2


def test_the_workers_resources_are_registered_with_ray_data(ray_cluster: Any) -> None:
    """As Ray Train 2.60 does, so that Ray Data budgets what the workers do not hold."""
    from trainer_runtime.data_config import TrainingResourceRequest

    request = TrainingResourceRequest("train-test-registration", [{"CPU": 1.0}] * 2)
    request.renew(force=True)
    coordinator = request._handle()

    def reserved() -> Any:
        return ray_cluster.get(
            coordinator.get_reserved_resources.remote(request.requester_id, recompute=True)
        )

    assert sum(r.get("CPU", 0) for r in reserved().values()) == 2
    request.renew()  # within the interval: nothing sent, the registration stands
    request.cancel()
    assert reserved() == {}
