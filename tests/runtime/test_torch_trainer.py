"""TorchTrainer on a real local Ray cluster with real gloo DDP."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch

from tests.runtime.workloads import (
    bad_report_train,
    counting_train,
    ddp_train,
    mismatched_checkpoint_names,
    read_log,
    rendezvous_env_train,
    uneven_reports,
)
from trainer_runtime import (
    CheckpointConfig,
    FailureConfig,
    RunConfig,
    ScalingConfig,
    TrainingFailedError,
)
from trainer_runtime.checkpoint import COMMIT_MARKER
from trainer_runtime.storage import get_storage, join_uri
from trainer_runtime.torch import TorchConfig, TorchTrainer

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_cluster")]

TWO = ScalingConfig(num_workers=2)


def test_ddp_on_two_gloo_workers(tmp_path: Path) -> None:
    result = TorchTrainer(
        ddp_train,
        train_loop_config={"epochs": 3},
        scaling_config=TWO,
        run_config=RunConfig(name="ddp", storage_path=str(tmp_path)),
    ).fit()
    assert result.metrics is not None
    assert result.metrics["ddp"] == "DistributedDataParallel"
    assert result.metrics["in_sync"] is True  # gradients were all-reduced
    assert result.metrics["samples_seen"] == 3 * 256 // 2  # DistributedSampler: half each
    assert result.metrics["epoch"] == 2
    assert result.checkpoint is not None
    with result.checkpoint.as_directory() as folder:
        state = torch.load(Path(folder) / "model.pt")
    assert set(state) == {"module.weight", "module.bias"}
    first, last = result.best_checkpoints[0][1], result.best_checkpoints[-1][1]
    assert last["loss"] < first["loss"]  # it really trained


def test_process_group_rendezvous_with_env_and_tcp_init_methods(tmp_path: Path) -> None:
    # init_method="env" (the default): rank 0 hosts the store; every rank sees its address
    # in MASTER_ADDR/MASTER_PORT (as with env://) and the process group's ranks match
    # RANK/WORLD_SIZE. init_method="tcp", as Ray Train: tcp://addr:port, no MASTER_* set.
    for init_method in ("env", "tcp"):
        result = TorchTrainer(
            rendezvous_env_train,
            scaling_config=TWO,
            torch_config=TorchConfig(backend="gloo", init_method=init_method),
            run_config=RunConfig(name=f"rendezvous-{init_method}", storage_path=str(tmp_path)),
        ).fit()
        assert result.metrics is not None
        views = result.metrics["views"]
        assert [list(v["rank"]) for v in views] == [[0, 0], [1, 1]]
        assert [list(v["world"]) for v in views] == [[2, 2], [2, 2]]
        assert [v["backend"] for v in views] == ["gloo", "gloo"]
        if init_method == "env":
            assert views[0]["master"] == views[1]["master"]
            assert int(views[0]["master"][1]) > 0
        else:
            assert [list(v["master"]) for v in views] == [[None, None], [None, None]]


def test_two_workers_shard_one_checkpoint_async_to_gcs(gcs_bucket: str, tmp_path: Path) -> None:
    log = str(tmp_path / "log")
    storage_path = f"gs://{gcs_bucket}/runs"
    result = TorchTrainer(
        counting_train,
        train_loop_config={"steps": 4, "log": log, "mode": "async"},
        scaling_config=TWO,
        run_config=RunConfig(
            name="sharded",
            storage_path=storage_path,
            checkpoint_config=CheckpointConfig(num_to_keep=2),
        ),
    ).fit()
    starts = sorted(
        (e["rank"], e["world_size"], e["local_rank"], e["node_rank"])
        for e in read_log(log)
        if e["event"] == "start"
    )
    assert starts == [(0, 2, 0, 0), (1, 2, 1, 0)]
    pids = {e["pid"] for e in read_log(log) if e["event"] == "start"}
    assert len(pids) == 2 and os.getpid() not in pids  # ran in two Ray worker processes
    run = join_uri(storage_path, "sharded")
    storage = get_storage(run)
    assert storage.list_dirs(run) == ["checkpoint_000002", "checkpoint_000003"]
    assert storage.list_files(join_uri(run, "checkpoint_000003")) == [
        COMMIT_MARKER,
        "rank_0.json",
        "rank_1.json",
    ]
    assert result.metrics == {"step": 3, "loss": 0.25, "rank": 0}  # rank 0's metrics


def test_killed_worker_restarts_the_group_from_the_latest_checkpoint(tmp_path: Path) -> None:
    log, pid_dir, storage_path = tmp_path / "log", tmp_path / "pids", str(tmp_path / "s")
    pid_dir.mkdir()
    run = join_uri(storage_path, "ft")
    killed: dict[str, int] = {}

    def kill_rank1_after_two_commits() -> None:
        manifest = Path(run) / "checkpoint_manifest.json"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if manifest.exists() and len(json.loads(manifest.read_text())["checkpoints"]) >= 2:
                pid_file = pid_dir / "rank_1_attempt_0"
                pid = int(pid_file.read_text())
                killed["pid"] = pid
                killed["committed"] = json.loads(manifest.read_text())["checkpoints"][-1]["round"]
                os.kill(pid, signal.SIGKILL)
                return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_rank1_after_two_commits)
    killer.start()
    result = TorchTrainer(
        counting_train,
        train_loop_config={
            "steps": 10,
            "log": str(log),
            "pid_dir": str(pid_dir),
            "sleep": 0.3,
            "mode": "async",
        },
        scaling_config=TWO,
        run_config=RunConfig(
            name="ft", storage_path=storage_path, failure_config=FailureConfig(max_failures=2)
        ),
    ).fit()
    killer.join()
    assert "pid" in killed
    assert result.restarts == 1
    assert result.metrics is not None and result.metrics["step"] == 9
    starts = [e for e in read_log(log) if e["event"] == "start"]
    resumed = {e["rank"]: e["start"] for e in starts if e["attempt"] == 1}
    # Both ranks resumed from the same committed checkpoint, at least the one seen at kill time.
    assert resumed[0] == resumed[1] >= killed["committed"] + 1
    ends = [e for e in read_log(log) if e["event"] == "end"]
    assert sorted(e["rank"] for e in ends) == [0, 1]
    for name in get_storage(run).list_dirs(run):  # no uncommitted leftovers
        assert (Path(run) / name / COMMIT_MARKER).exists(), name


def test_exhausted_max_failures_raises_with_the_cause(tmp_path: Path) -> None:
    config = {"steps": 6, "fail": {"rank": 1, "step": 2, "attempts": [0, 1, 2]}, "mode": "sync"}
    with pytest.raises(TrainingFailedError) as info:
        TorchTrainer(
            counting_train,
            train_loop_config=config,
            scaling_config=TWO,
            run_config=RunConfig(
                name="fails",
                storage_path=str(tmp_path),
                failure_config=FailureConfig(max_failures=1),
            ),
        ).fit()
    text = str(info.value)
    assert "after 2 failure(s)" in text and "max_failures=1" in text
    assert "rank 1" in text and "injected failure at step 2" in text
    assert "Traceback" in text  # the worker's traceback is kept
    assert info.value.result is not None and info.value.result.checkpoint is not None
    assert info.value.result.checkpoint.path.endswith("checkpoint_000001")


def test_bad_report_input_fails_the_run_at_once(tmp_path: Path) -> None:
    log = tmp_path / "log"
    with pytest.raises(
        TrainingFailedError, match=r"Passing objects containing Torch tensors as metrics"
    ) as info:
        TorchTrainer(
            bad_report_train,
            train_loop_config={"log": str(log)},
            scaling_config=TWO,
            run_config=RunConfig(
                name="bad",
                storage_path=str(tmp_path),
                failure_config=FailureConfig(max_failures=3),
            ),
        ).fit()
    assert sorted((e["attempt"], e["rank"]) for e in read_log(log)) == [(0, 0), (0, 1)]
    assert info.value.result is not None and info.value.result.restarts == 0


def test_uneven_report_counts_are_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TrainingFailedError, match=r"same number of times.*rank 0: 1, rank 1: 2"):
        TorchTrainer(
            uneven_reports,
            scaling_config=TWO,
            run_config=RunConfig(
                name="uneven",
                storage_path=str(tmp_path),
                failure_config=FailureConfig(max_failures=2),
            ),
        ).fit()


def test_ranks_must_agree_on_the_checkpoint_folder(tmp_path: Path) -> None:
    with pytest.raises(TrainingFailedError, match="same checkpoint_dir_name"):
        TorchTrainer(
            mismatched_checkpoint_names,
            scaling_config=TWO,
            run_config=RunConfig(name="names", storage_path=str(tmp_path)),
        ).fit()
