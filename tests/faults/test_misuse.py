"""A committed checkpoint is never lost or torn, whatever the train function does.

Each scenario runs in local mode and on Ray with two workers, then checks the run folder
against the commit invariant (``check_run``). Before these fixes each of them committed an
empty or torn checkpoint, deleted files outside the run, or bricked the run folder.
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path
from typing import Any

import pytest

import trainer_runtime as tr
from tests.faults.workloads import (
    check_run,
    integrity_train,
    shared_names_train,
    write_checkpoint,
)
from trainer_runtime import (
    Checkpoint,
    CheckpointConfig,
    DataParallelTrainer,
    FailureConfig,
    Result,
    RunConfig,
    ScalingConfig,
    TrainingFailedError,
)
from trainer_runtime.checkpoint import COMMIT_MARKER
from trainer_runtime.checkpoint_manager import MANIFEST_FILE, verified_files
from trainer_runtime.errors import ReportError, UserConfigError, WorkerGroupError
from trainer_runtime.storage import get_storage, join_uri

SCALINGS = {"local": ScalingConfig(num_workers=0), "ray": ScalingConfig(num_workers=2)}


@pytest.fixture(params=["local", pytest.param("ray", marks=pytest.mark.ray)])
def scaling(request: pytest.FixtureRequest) -> ScalingConfig:
    """Local mode, or two Ray workers on the session's real local Ray cluster."""
    if request.param == "ray":
        request.getfixturevalue("ray_cluster")
    return SCALINGS[request.param]


def _fit(
    fn: Any, config: dict[str, Any], storage: str, scaling: ScalingConfig, **run: Any
) -> Result:
    return DataParallelTrainer(
        fn,
        train_loop_config=config,
        scaling_config=scaling,
        run_config=RunConfig(name="run", storage_path=storage, **run),
    ).fit()


def _world(scaling: ScalingConfig) -> int:
    return max(1, scaling.num_workers)


def test_a_folder_deleted_before_its_async_upload_fails_the_report(
    tmp_path: Path, scaling: ScalingConfig
) -> None:
    storage = str(tmp_path / "storage")
    config = {"steps": 3, "mode": "async", "misuse": "delete", "size": 4 << 20, "files": 4}
    with pytest.raises(TrainingFailedError) as info:
        _fit(integrity_train, config, storage, scaling, failure_config=FailureConfig(3))
    message = str(info.value)
    assert "was deleted" in message or "changed" in message, message
    assert "ckpt_" in message and "tempfile.mkdtemp()" in message  # the folder and the fix
    assert info.value.result is not None and info.value.result.restarts == 0  # not retried
    result = check_run(join_uri(storage, "run"), _world(scaling))
    assert all(len(r.files or {}) > 1 for r in result.checkpoints)


def test_the_same_folder_reported_twice_never_commits_a_torn_checkpoint(
    tmp_path: Path, scaling: ScalingConfig
) -> None:
    storage = str(tmp_path / "storage")
    config = {"steps": 4, "mode": "async", "misuse": "reuse", "size": 8 << 20, "files": 2}
    with pytest.raises(TrainingFailedError, match="changed"):
        _fit(integrity_train, config, storage, scaling)
    check_run(join_uri(storage, "run"), _world(scaling))  # whatever was committed is whole


@pytest.mark.parametrize("mode", ["SYNC", "ASYNC"])
def test_shared_file_names_shared_folders_and_empty_checkpoints_commit(
    tmp_path: Path, scaling: ScalingConfig, mode: str
) -> None:
    """As Ray Train 2.60: ranks storing the same file name (identical content) into one
    checkpoint make one file, ranks reporting one local folder holding every rank's shard
    commit it, and an empty folder is a valid checkpoint (see ``shared_names_train``)."""
    storage = str(tmp_path / "s")
    config = {"shared": str(tmp_path / "shared"), "mode": mode}
    result = _fit(shared_names_train, config, storage, scaling)
    world = _world(scaling)
    assert [r.metrics["step"] for r in result.checkpoints] == [0, 1, 2]
    first, second, empty = result.checkpoints
    shards = {f"shard_{rank}.bin" for rank in range(world)}
    assert set(first.files or {}) == shards | {"checkpoint.pkl"}
    # Each rank stored what it listed at report(); the folder ends with every shard.
    assert shards >= set(second.files or {}) >= {f"shard_{world - 1}.bin"}
    assert empty.files == {}
    assert Path(empty.path).is_dir() and not any(
        p.name != COMMIT_MARKER for p in Path(empty.path).iterdir()
    )
    again = Result.from_path(join_uri(storage, "run"))  # the empty one verifies on restore
    assert [r.metrics["step"] for r in again.checkpoints] == [0, 1, 2]
    assert again.checkpoint is not None and again.checkpoint.path == empty.path
    with again.checkpoint.as_directory() as folder:
        assert not any(p.name != COMMIT_MARKER for p in Path(folder).iterdir())


def test_ranks_storing_one_name_with_different_contents_fail_the_commit(
    tmp_path: Path,
) -> None:
    """Identical content under one name is one file; different content is still refused."""
    storage = get_storage(str(tmp_path))
    uri = str(tmp_path / "checkpoint_000000")
    src = tmp_path / "src"
    src.mkdir()
    (src / "checkpoint.pkl").write_bytes(b"a" * 10)
    same = storage.upload_dir(src, uri).stored
    again = storage.upload_dir(src, uri).stored
    assert verified_files(storage, uri, 0, {0: same, 1: again}).keys() == {"checkpoint.pkl"}
    (src / "checkpoint.pkl").write_bytes(b"b" * 12)
    other = storage.upload_dir(src, uri).stored
    with pytest.raises(UserConfigError, match="ranks wrote different files under the same name"):
        verified_files(storage, uri, 0, {0: same, 1: other})
    assert not [p for p in Path(uri).iterdir() if p.name.endswith(".storing")]


@pytest.mark.parametrize(
    "contains", ["storage_path", "run folder", "a folder above storage_path", "a symlink"]
)
def test_delete_after_upload_refuses_a_folder_holding_the_storage(
    tmp_path: Path, scaling: ScalingConfig, contains: str
) -> None:
    storage = tmp_path / "data" / "storage"
    other_run = storage / "other-run" / "keep.bin"
    other_run.parent.mkdir(parents=True)
    other_run.write_bytes(b"another run's data")
    target = {
        "storage_path": storage,
        "run folder": storage / "run",
        "a folder above storage_path": tmp_path / "data",
        "a symlink": tmp_path / "link-to-data",  # another name for tmp_path/data
    }[contains]
    (tmp_path / "link-to-data").symlink_to(tmp_path / "data")

    def train() -> None:
        folder = Path(target)
        write_checkpoint(folder, 0, tr.get_context().get_world_rank(), 1, 10)
        tr.report(
            {"step": 0},
            checkpoint=Checkpoint.from_directory(folder),
            checkpoint_upload_mode="async",
        )

    with pytest.raises(TrainingFailedError, match=r"contains this run's .*delete_local") as info:
        _fit(train, {}, str(storage), scaling)
    # As in Ray Train: a WorkerGroupError whose worker failure is the ValueError.
    assert isinstance(info.value, WorkerGroupError)
    assert isinstance(info.value.worker_failures[0], ValueError)
    assert other_run.read_bytes() == b"another run's data"
    assert (target / "rank0_0.bin").exists()


@pytest.mark.parametrize("name", [MANIFEST_FILE, ".trainjob_driver.json", ".hidden", "a/b"])
def test_reserved_checkpoint_names_are_refused_and_the_run_stays_readable(
    tmp_path: Path, name: str
) -> None:
    def train() -> None:
        folder = Path(tempfile.mkdtemp())
        write_checkpoint(folder, 0, 0, 1, 10)
        tr.report({"step": 0}, checkpoint=Checkpoint.from_directory(folder))
        folder = Path(tempfile.mkdtemp())
        write_checkpoint(folder, 1, 0, 1, 10)
        tr.report(
            {"step": 1}, checkpoint=Checkpoint.from_directory(folder), checkpoint_dir_name=name
        )

    with pytest.raises(WorkerGroupError, match="checkpoint_dir_name") as info:
        _fit(train, {}, str(tmp_path), SCALINGS["local"])
    assert isinstance(info.value.worker_failures[0], ReportError)
    assert info.value.result is not None and info.value.result.restarts == 0
    result = check_run(str(tmp_path / "run"), 1)
    assert [r.name for r in result.checkpoints] == ["checkpoint_000000"]


def test_nan_scores_rank_below_every_real_score(tmp_path: Path, scaling: ScalingConfig) -> None:
    losses = [0.5, math.nan, 0.1, 0.9, math.nan, 0.8]
    keep = CheckpointConfig(
        num_to_keep=2, checkpoint_score_attribute="loss", checkpoint_score_order="min"
    )
    result = _fit(
        integrity_train,
        {"steps": len(losses), "losses": losses},
        str(tmp_path),
        scaling,
        checkpoint_config=keep,
    )
    kept = [m["loss"] for _, m in result.best_checkpoints]
    assert kept == [0.5, 0.1]  # the top 2 by loss, worst first (Ray Train's order)
    assert result.best_checkpoints[-1][0].path.endswith("checkpoint_000002")
    assert [r.metrics["loss"] for r in result.checkpoints] == [0.5, 0.1, 0.8]  # + the latest
    again = check_run(str(tmp_path / "run"), _world(scaling))
    # Result.from_path lists every kept checkpoint, the latest too, worst first (as Ray
    # Train's: tests/compat's top-k case compares them).
    assert [m["loss"] for _, m in again.best_checkpoints] == [0.8, *kept]


def test_non_finite_metrics_are_strict_json_and_read_back(tmp_path: Path) -> None:
    def train() -> None:
        folder = Path(tempfile.mkdtemp())
        write_checkpoint(folder, 0, 0, 1, 10)
        metrics = {"step": 0, "nan": math.nan, "inf": math.inf, "neg": -math.inf, "text": "NaNa"}
        tr.report(metrics, checkpoint=Checkpoint.from_directory(folder))

    _fit(train, {}, str(tmp_path), SCALINGS["local"])
    run = tmp_path / "run"
    check_run(str(run), 1)  # parses the manifest and the markers strictly
    marker = (run / "checkpoint_000000" / ".trainjob_committed.json").read_text()
    assert json.loads(marker, parse_constant=lambda c: 1 / 0)["metrics"]["inf"] == "Infinity"
    metrics = Result.from_path(run).metrics
    assert metrics is not None and math.isnan(metrics["nan"]) and metrics["neg"] == -math.inf
    assert metrics["text"] == "NaNa"


def test_the_manifest_does_not_copy_every_checkpoints_metrics(tmp_path: Path) -> None:
    def train() -> None:
        for step in range(3):
            folder = Path(tempfile.mkdtemp())
            write_checkpoint(folder, step, 0, 1, 10)
            metrics = {f"m{i}": float(i) for i in range(20_000)} | {"step": step}
            tr.report(metrics, checkpoint=Checkpoint.from_directory(folder))

    _fit(train, {}, str(tmp_path), SCALINGS["local"])
    manifest = tmp_path / "run" / MANIFEST_FILE
    assert manifest.stat().st_size < 4096  # metrics live in each marker, written once
    result = check_run(str(tmp_path / "run"), 1)
    assert len(result.checkpoints[-1].metrics) == 20_001
