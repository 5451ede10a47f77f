"""JaxTrainer on a real local Ray cluster: real multi-process JAX on CPU (jax.distributed, gloo).

No TPU is involved here (see test_tpu.py for slice placement on faked TPU hosts).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from examples.jax_quickstart.train import train_func, validate_func
from tests.runtime.jax_workloads import collective_train, steps_train
from trainer_runtime import (
    CheckpointConfig,
    FailureConfig,
    Result,
    RunConfig,
    ScalingConfig,
    ValidationConfig,
)
from trainer_runtime.jax import JaxConfig, JaxTrainer

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_cluster")]

TWO = ScalingConfig(num_workers=2)


def _records(out_dir: Path) -> list[dict[str, object]]:
    return [json.loads(p.read_text()) for p in sorted(out_dir.glob("rank_*.json"))]


def _log(path: Path) -> list[dict[str, int]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def test_two_cpu_processes_share_one_jax_distributed_job(tmp_path: Path) -> None:
    """Each process contributes rank + 1: allgather gives [1, 2] and psum gives 3 everywhere."""
    out = tmp_path / "out"
    out.mkdir()
    result = JaxTrainer(
        collective_train,
        train_loop_config={"out_dir": str(out)},
        scaling_config=TWO,
        run_config=RunConfig(name="collective", storage_path=str(tmp_path / "s")),
    ).fit()
    records = _records(out)
    assert [r["rank"] for r in records] == [0, 1]
    assert [r["process_index"] for r in records] == [0, 1]  # process_id = world rank
    for r in records:
        assert r["process_count"] == 2 and r["device_count"] == 2
        assert r["platform"] == "cpu"
        assert r["gathered"] == [1.0, 2.0]
        assert r["psum"] == 3.0
        assert r["env"]["JAX_PLATFORMS"] == "cpu"  # type: ignore[index]
        assert r["env"]["MEGASCALE_NUM_SLICES"] is None  # type: ignore[index]
    pids = {r["pid"] for r in records}
    assert len(pids) == 2 and os.getpid() not in pids  # two Ray worker processes
    assert result.metrics is not None and result.metrics["psum"] == 3.0


def test_numpy_checkpoint_and_resume_continue_the_steps(tmp_path: Path) -> None:
    """A second fit() with the same RunConfig name resumes after the latest checkpoint."""
    log = tmp_path / "log"
    run = RunConfig(
        name="resume",
        storage_path=str(tmp_path / "s"),
        checkpoint_config=CheckpointConfig(num_to_keep=2),
    )
    first = JaxTrainer(
        steps_train,
        train_loop_config={"steps": 4, "ckpt_every": 2, "log": str(log)},
        scaling_config=TWO,
        run_config=run,
    ).fit()
    assert first.metrics == {"step": 3, "w": 6.0, "processes": 2}  # 4 steps x mean(1, 2)
    assert first.checkpoint is not None
    with first.checkpoint.as_directory() as folder:
        np.testing.assert_allclose(np.load(Path(folder) / "w.npy"), [6.0, 6.0, 6.0])

    second = JaxTrainer(
        steps_train,
        train_loop_config={"steps": 7, "ckpt_every": 2, "log": str(log)},
        scaling_config=TWO,
        run_config=RunConfig(name="resume", storage_path=str(tmp_path / "s")),
    ).fit()
    starts = sorted((e["rank"], e["start"]) for e in _log(log))
    assert starts == [(0, 0), (0, 4), (1, 0), (1, 4)]  # the second run continued at step 4
    # Result.metrics: the latest checkpoint's (step 5: (5+1) % 2), after 6 steps in total.
    assert second.metrics == {"step": 5, "w": 9.0, "processes": 2}
    assert [r.name for r in second.checkpoints][-1] == "checkpoint_000005"
    assert second.checkpoint is not None
    with second.checkpoint.as_directory() as folder:
        np.testing.assert_allclose(np.load(Path(folder) / "w.npy"), [9.0, 9.0, 9.0])


def test_failed_worker_restarts_jax_distributed_from_the_checkpoint(tmp_path: Path) -> None:
    """Rank 1 fails at step 3 once: a new group re-joins jax.distributed and resumes."""
    log = tmp_path / "log"
    result = JaxTrainer(
        steps_train,
        train_loop_config={
            "steps": 5,
            "ckpt_every": 1,
            "log": str(log),
            "fail": {"rank": 1, "step": 3, "attempts": [0]},
        },
        jax_config=JaxConfig(shutdown_timeout_s=5),
        scaling_config=TWO,
        run_config=RunConfig(
            name="restart",
            storage_path=str(tmp_path / "s"),
            failure_config=FailureConfig(max_failures=1),
        ),
    ).fit()
    assert result.restarts == 1
    entries = _log(log)
    assert sorted((e["attempt"], e["rank"]) for e in entries) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert all(e["processes"] == 2 for e in entries)  # the new group joined a new job
    resumed = {e["rank"]: e["start"] for e in entries if e["attempt"] == 1}
    # Both ranks resumed from the same committed checkpoint: step 2's (or step 1's when rank
    # 0's step-2 report had not reached the controller before rank 1 failed).
    assert resumed[0] == resumed[1] in (2, 3)
    assert result.metrics == {"step": 4, "w": 7.5, "processes": 2}


def test_local_mode_runs_in_process_without_jax_distributed(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    result = JaxTrainer(
        collective_train,
        train_loop_config={"out_dir": str(out)},
        scaling_config=ScalingConfig(num_workers=0),
        run_config=RunConfig(name="local", storage_path=str(tmp_path / "s")),
    ).fit()
    [record] = _records(out)
    assert record["pid"] == os.getpid()
    assert record["process_count"] == 1 and record["gathered"] == [1.0] and record["psum"] == 1.0
    assert result.metrics is not None and result.metrics["process_count"] == 1


def test_quickstart_example_trains_checkpoints_validates_and_resumes(tmp_path: Path) -> None:
    """examples/jax_quickstart on 2 processes: loss falls, checkpoints validate, resume works."""
    storage = str(tmp_path / "s")

    def run(steps: int) -> Result:
        return JaxTrainer(
            train_func,
            train_loop_config={
                "steps": steps,
                "lr": 0.01,
                "batch_size": 64,
                "checkpoint_every": 10,
            },
            scaling_config=TWO,
            run_config=RunConfig(
                name="quickstart",
                storage_path=storage,
                checkpoint_config=CheckpointConfig(
                    checkpoint_score_attribute="val_loss", checkpoint_score_order="min"
                ),
                validation_config=ValidationConfig(
                    validate_fn=validate_func,
                    validate_config={"samples": 512},
                    resources={},  # any node of the test cluster
                    num_cpus=0.5,
                ),
            ),
        ).fit()

    first = run(30)
    assert first.metrics is not None and first.metrics["step"] == 29
    records = first.checkpoints
    assert [r.name for r in records] == [
        "checkpoint_000009",
        "checkpoint_000019",
        "checkpoint_000029",
    ]
    assert all("val_loss" in r.all_metrics for r in records)
    assert [r.all_metrics["val_step"] for r in records] == [9, 19, 29]
    assert records[-1].all_metrics["val_loss"] < records[0].all_metrics["val_loss"]  # learns

    second = run(40)
    assert second.metrics is not None and second.metrics["step"] == 39
    assert [r.name for r in second.checkpoints][-1] == "checkpoint_000039"
    assert second.checkpoints[-1].all_metrics["val_step"] == 39
