"""Ray Train 2.60's newer API on the runtime: ``collective``, ``get_all_reported_checkpoints``,
``report(checkpoint_upload_fn=...)``, ``UserCallback``, ``ScalingConfig(label_selector=...)``,
``RunConfig(worker_runtime_env=...)``; in local mode and on Ray workers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import trainer_runtime as tr
from tests.runtime.api_workloads import (
    collective_train,
    read_lines,
    reported_train,
    returning_train,
    slow_validate,
    upload_fn_train,
)
from tests.runtime.workloads import report_with_checkpoint
from trainer_runtime import (
    CheckpointConfig,
    DataParallelTrainer,
    FailureConfig,
    Result,
    RunConfig,
    ScalingConfig,
    TrainingFailedError,
    UserCallback,
    ValidationConfig,
)


def _fit(workers: int, fn: Any, config: dict[str, Any], path: Path, **run: Any) -> Result:
    extra = {k: run.pop(k) for k in ("validation_config",) if k in run}
    return DataParallelTrainer(
        fn,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=workers),
        run_config=RunConfig(name="run", storage_path=str(path / "storage"), **run),
        **extra,
    ).fit()


@pytest.fixture(params=[0, pytest.param(2, marks=pytest.mark.ray)], ids=["local", "ray"])
def workers(request: pytest.FixtureRequest) -> int:
    """Local mode (the function runs in this process), or two Ray workers."""
    if request.param:
        request.getfixturevalue("ray_cluster")
    return int(request.param)


def test_broadcast_and_barrier(workers: int, tmp_path: Path) -> None:
    log = tmp_path / "log"
    _fit(workers, collective_train, {"log": str(log), "delay_s": 0.5}, tmp_path)
    lines = sorted(read_lines(log), key=lambda x: x["rank"])
    assert [x["rank"] for x in lines] == list(range(max(workers, 1)))
    for line in lines:
        assert line["got"] == {"from": 0, "seed": 42}  # rank 0's data on every rank
        assert line["left_after"]  # nobody left the barrier before rank 0 reached it


@pytest.mark.ray
def test_a_rank_that_skips_a_collective_fails_the_run_clearly(
    ray_cluster: Any, tmp_path: Path
) -> None:
    with pytest.raises(TrainingFailedError, match=r"wait in trainer_runtime\.collective\.barrier"):
        _fit(2, collective_train, {"log": str(tmp_path / "log"), "skip_barrier_on": 1}, tmp_path)


@pytest.mark.parametrize("mode", ["SYNC", "ASYNC"])
def test_get_all_reported_checkpoints_in_rays_order(
    workers: int, tmp_path: Path, mode: str
) -> None:
    log = tmp_path / "log"
    _fit(
        workers,
        reported_train,
        {"losses": [0.5, 0.2, 0.1, 0.9], "mode": mode, "log": str(log)},
        tmp_path,
        checkpoint_config=CheckpointConfig(
            num_to_keep=2, checkpoint_score_attribute="loss", checkpoint_score_order="min"
        ),
    )
    [reported] = read_lines(log)
    # The two best by loss, worst first, and the latest (kept though not among the best), as
    # Ray orders them: ascending by score, min order flipping the sign.
    assert reported == [
        [3, {"step": 3, "loss": 0.9}, "COMMITTED"],
        [1, {"step": 1, "loss": 0.2}, "COMMITTED"],
        [2, {"step": 2, "loss": 0.1}, "COMMITTED"],
    ]


@pytest.mark.parametrize(
    ("consistency", "status"), [("VALIDATED", "VALIDATED"), ("COMMITTED", "PENDING_VALIDATION")]
)
def test_get_all_reported_checkpoints_waits_for_validations(
    workers: int, tmp_path: Path, consistency: str, status: str
) -> None:
    log = tmp_path / "log"
    _fit(
        workers,
        reported_train,
        {"losses": [0.5, 0.2], "validate": True, "consistency": consistency, "log": str(log)},
        tmp_path,
        validation_config=ValidationConfig(
            slow_validate, task_config=tr.ValidationTaskConfig(fn_kwargs={"delay_s": 1.5})
        ),
    )
    [reported] = read_lines(log)
    assert [r[0] for r in reported] == [0, 1]
    assert reported[-1][2] == status
    if status == "VALIDATED":
        assert reported[-1][1] == {"step": 1, "loss": 0.2, "val": 1.0}


def test_get_all_reported_checkpoints_returns_after_its_timeout(tmp_path: Path) -> None:
    log = tmp_path / "log"
    _fit(
        0,
        reported_train,
        {"losses": [0.5], "validate": True, "timeout_s": 0.2, "log": str(log)},
        tmp_path,
        validation_config=ValidationConfig(
            slow_validate, task_config=tr.ValidationTaskConfig(fn_kwargs={"delay_s": 3})
        ),
    )
    [reported] = read_lines(log)
    assert reported == [[0, {"step": 0, "loss": 0.5}, "PENDING_VALIDATION"]]


@pytest.mark.parametrize(
    ("mode", "delete", "left"),
    [("SYNC", None, True), ("ASYNC", None, False), ("SYNC", True, False)],
)
def test_checkpoint_upload_fn(
    workers: int, tmp_path: Path, mode: str, delete: bool | None, left: bool
) -> None:
    log = tmp_path / "log"
    result = _fit(
        workers,
        upload_fn_train,
        {"steps": 3, "mode": mode, "delete": delete, "log": str(log)},
        tmp_path,
        checkpoint_config=CheckpointConfig(num_to_keep=2),
    )
    [line] = read_lines(log)
    assert line == {"latest": 2, "sources_left": [left] * 3}
    assert [
        json.loads(Path(c.path, "state.json").read_text())["step"]
        for c, _ in result.best_checkpoints
    ] == [1, 2]
    again = Result.from_path(result.path)  # committed like any checkpoint: markers verify
    assert [c.path for c, _ in again.best_checkpoints] == [
        c.path for c, _ in result.best_checkpoints
    ]


def _bad_upload(checkpoint: tr.Checkpoint, name: str) -> tr.Checkpoint:
    return checkpoint  # not stored anywhere: outside the run folder


def _bad_upload_train(config: dict[str, Any]) -> None:
    folder = Path(config["folder"])
    folder.mkdir(exist_ok=True)
    (folder / "x").write_text("1")
    tr.report(
        {"step": 0},
        checkpoint=tr.Checkpoint.from_directory(folder),
        checkpoint_upload_fn=_bad_upload,
    )


def test_an_upload_fn_returning_another_folder_is_rays_value_error(tmp_path: Path) -> None:
    with pytest.raises(TrainingFailedError) as info:
        _fit(0, _bad_upload_train, {"folder": str(tmp_path / "src")}, tmp_path)
    assert isinstance(info.value, tr.WorkerGroupError)
    failure = info.value.worker_failures[0]
    assert isinstance(failure, ValueError)
    assert "returned a checkpoint outside the experiment directory" in str(failure)


def test_result_return_value_is_rank_0s_and_tensors_are_refused(
    workers: int, tmp_path: Path
) -> None:
    result = _fit(
        workers,
        returning_train,
        {"marker": str(tmp_path / "failed-once")},
        tmp_path,
        failure_config=FailureConfig(max_failures=1),
    )
    assert result.return_value == {"rank": 0, "pair": (1, 2), "attempt": True}
    assert result.restarts == 1
    with pytest.raises(TrainingFailedError) as info:
        _fit(workers, returning_train, {"tensor": True}, tmp_path / "t")
    assert isinstance(info.value, tr.WorkerGroupError)
    failure = next(iter(info.value.worker_failures.values()))
    assert isinstance(failure, ValueError)
    assert str(failure).startswith(
        "Returning objects containing Torch tensors from the training function is not supported"
    )
    assert info.value.result is None or info.value.result.return_value is None


class _Recorder(UserCallback):
    def __init__(self, path: str) -> None:
        self.path = path

    def after_report(self, run_context: Any, metrics: Any, checkpoint: Any) -> None:
        assert run_context.get_run_config().name == "run"
        with open(self.path, "a") as fh:
            step = None
            if checkpoint is not None:
                step = json.loads(Path(checkpoint.path, "state.json").read_text())["step"]
            fh.write(json.dumps(["report", metrics, step]) + "\n")

    def after_exception(self, run_context: Any, worker_exceptions: Any) -> None:
        with open(self.path, "a") as fh:
            fh.write(
                json.dumps(
                    ["exception", {str(k): type(v).__name__ for k, v in worker_exceptions.items()}]
                )
                + "\n"
            )


def _failing_once_train(config: dict[str, Any]) -> None:
    rank = tr.get_context().get_world_rank()
    start = 0 if tr.get_checkpoint() is None else 1
    for step in range(start, 2):
        marker = Path(config["marker"])
        if step == 1 and rank == 0 and not marker.exists():
            marker.write_text("x")
            raise KeyError("once")
        checkpoint = None
        if rank == 0:
            folder = Path(config["tmp"]) / f"c{step}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "state.json").write_text(json.dumps({"step": step}))
            checkpoint = tr.Checkpoint.from_directory(folder)
        tr.report({"step": step, "rank": rank}, checkpoint=checkpoint)


def test_user_callbacks_see_reports_and_exceptions(workers: int, tmp_path: Path) -> None:
    log = tmp_path / "callbacks"
    _fit(
        workers,
        _failing_once_train,
        {"marker": str(tmp_path / "marker"), "tmp": str(tmp_path / "src")},
        tmp_path,
        callbacks=[_Recorder(str(log))],
        failure_config=FailureConfig(max_failures=1, restart_backoff_s=0),
    )
    ranks = range(max(workers, 1))
    assert read_lines(log) == [
        ["report", [{"step": 0, "rank": r} for r in ranks], 0],
        ["exception", {"0": "KeyError"}],
        ["report", [{"step": 1, "rank": r} for r in ranks], 1],
    ]


@pytest.mark.ray
def test_label_selector_places_workers_by_ray_node_labels(ray_cluster: Any, tmp_path: Path) -> None:
    import ray

    head = ray.get_runtime_context().get_node_id()
    scaling = ScalingConfig(num_workers=2, label_selector={"ray.io/node-id": head})
    result = DataParallelTrainer(
        _node_train,
        scaling_config=scaling,
        run_config=RunConfig(name="labels", storage_path=str(tmp_path)),
    ).fit()
    assert result.metrics == {"node": head}
    nowhere = ScalingConfig(
        num_workers=1, label_selector={"pool": "nowhere"}, placement_timeout_s=2
    )
    with pytest.raises(TrainingFailedError, match=r"label_selector \(\[\('pool', 'nowhere'\)\]"):
        DataParallelTrainer(
            _node_train,
            scaling_config=nowhere,
            run_config=RunConfig(name="nowhere", storage_path=str(tmp_path)),
        ).fit()


def _node_train() -> None:
    import ray

    report_with_checkpoint({"node": ray.get_runtime_context().get_node_id()})


def _env_train() -> None:
    import os

    report_with_checkpoint(
        {"a": os.environ.get("RUNTIME_ENV_A"), "b": os.environ.get("WORKER_ENV_B")}
    )


@pytest.mark.ray
def test_worker_runtime_env_reaches_the_workers(ray_cluster: Any, tmp_path: Path) -> None:
    result = DataParallelTrainer(
        _env_train,
        scaling_config=ScalingConfig(num_workers=1),
        run_config=RunConfig(
            name="env",
            storage_path=str(tmp_path),
            worker_runtime_env={"env_vars": {"RUNTIME_ENV_A": "1", "WORKER_ENV_B": "x"}},
            worker_env={"WORKER_ENV_B": "2"},  # ours win over the runtime env's
        ),
    ).fit()
    assert result.metrics == {"a": "1", "b": "2"}


def test_unknown_consistency_mode_is_a_value_error(tmp_path: Path) -> None:
    def fn() -> None:
        tr.get_all_reported_checkpoints("SOMETIMES")  # type: ignore[arg-type]

    with pytest.raises(TrainingFailedError) as info:
        _fit(0, fn, {}, tmp_path)
    assert isinstance(info.value.worker_failures[0], ValueError)  # type: ignore[attr-defined]


@pytest.mark.ray
@pytest.mark.parametrize("how", ["uri", "filesystem", "query"])
def test_two_ray_workers_shard_checkpoints_on_s3_and_resume(
    ray_cluster: Any, s3_server: Any, tmp_path: Path, how: str
) -> None:
    """Two Ray workers store shards of each checkpoint on moto's S3 (``s3://`` with the AWS
    settings through ``worker_runtime_env``, a pickled ``S3FileSystem`` as
    ``storage_filesystem``, or ``s3://...?endpoint_override=...``); validation reads the
    committed checkpoint back from S3; after a failure the group resumes from the latest
    commit."""
    from tests.runtime.workloads import counting_train, read_log

    bucket = s3_server.new_bucket()
    if how == "uri":
        where: dict[str, Any] = {
            "storage_path": f"s3://{bucket}/runs",
            "worker_runtime_env": {"env_vars": s3_server.env},
        }
    elif how == "query":  # pyarrow's query parameters; the workers' env endpoint is dead
        host = s3_server.url.removeprefix("http://")
        where = {
            "storage_path": f"s3://{bucket}/runs?region=us-east-1&endpoint_override={host}"
            "&scheme=http",
            "worker_runtime_env": {
                "env_vars": {**s3_server.env, "AWS_ENDPOINT_URL": "http://127.0.0.1:9"}
            },
        }
    else:
        where = {"storage_path": f"{bucket}/runs", "storage_filesystem": s3_server.filesystem()}
    log = str(tmp_path / "log")
    result = DataParallelTrainer(
        counting_train,
        train_loop_config={
            "steps": 4,
            "log": log,
            "mode": "async",
            "fail": {"rank": 1, "step": 2},
        },
        scaling_config=ScalingConfig(num_workers=2),
        validation_config=ValidationConfig(  # every checkpoint, read back from S3
            validate_fn=_s3_validate,
            ray_remote_kwargs={"runtime_env": {"env_vars": s3_server.env}},
        ),
        run_config=RunConfig(
            name="sharded",
            checkpoint_config=CheckpointConfig(num_to_keep=2),
            failure_config=FailureConfig(max_failures=1, restart_backoff_s=0),
            **where,
        ),
    ).fit()
    starts = sorted(
        (e["attempt"], e["rank"], e["start"]) for e in read_log(log) if e["event"] == "start"
    )
    assert starts == [(0, 0, 0), (0, 1, 0), (1, 0, 2), (1, 1, 2)]  # resumed after step 1
    assert result.metrics is not None and result.metrics["step"] == 3
    kept = [c for c, _ in result.best_checkpoints]
    assert [result.checkpoint_status(c) for c in kept] == ["validated", "validated"]
    assert [m["shards"] for _, m in result.best_checkpoints] == [2, 2]
    if how == "query":  # as in Ray: the path on the filesystem the query configured
        assert result.path == f"{bucket}/runs/sharded"
        where["storage_filesystem"] = result.filesystem
    again = Result.from_path(result.path, storage_filesystem=where.get("storage_filesystem"))
    assert [c.path for c, _ in again.best_checkpoints] == [
        c.path for c, _ in result.best_checkpoints
    ]


def _s3_validate(checkpoint: tr.Checkpoint, config: dict[str, Any]) -> dict[str, Any]:
    with checkpoint.as_directory() as folder:
        return {"shards": len(list(Path(folder).glob("rank_*.json")))}
