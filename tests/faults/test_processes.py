"""Real processes killed with signals, a storage server stopped and restarted, a run folder
made read-only: after each, the run folder is checked against the commit invariant."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO_ROOT
from tests.faults.workloads import check_run, integrity_train, read_events
from tests.gcs import GCSEmulator
from tests.support.waiting import wait_for
from trainer_runtime import (
    DataParallelTrainer,
    FailureConfig,
    Result,
    RunConfig,
    ScalingConfig,
    TrainingFailedError,
)
from trainer_runtime.checkpoint import COMMIT_MARKER
from trainer_runtime.storage.factory import reset_storage_cache


def _wait_for(what: str, check: Callable[[], Any], timeout: float = 120.0) -> Any:
    """Polled every 20 ms: these tests catch short-lived process states."""
    return wait_for(what, check, timeout, every=0.02)


def _uploading_folder(run: Path, after_round: int) -> Path | None:
    """A checkpoint folder of round > ``after_round`` that has files but no marker yet."""
    if not run.is_dir():
        return None
    for folder in sorted(run.glob("checkpoint_0*")):
        try:
            names = {p.name for p in folder.iterdir()}
        except (FileNotFoundError, NotADirectoryError):
            continue
        if int(folder.name.split("_")[1]) > after_round and names and COMMIT_MARKER not in names:
            return folder
    return None


def _in_background(fn: Callable[[], None]) -> threading.Thread:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:
            errors.append(exc)
            raise

    thread = threading.Thread(target=run, daemon=True)
    thread.errors = errors  # type: ignore[attr-defined]
    thread.start()
    return thread


def _epoch(run: Path) -> int:
    """The epoch of the driver that owns ``run`` (see ``trainer_runtime._fencing``)."""
    return int(json.loads((run / ".trainjob_driver.json").read_text())["epoch"])


BIG = {"files": 8, "size": 2 << 20, "mode": "async", "sleep": 0.2}


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_a_worker_killed_mid_upload_restarts_from_a_whole_checkpoint(
    tmp_path: Path, ray_cluster: Any
) -> None:
    log = tmp_path / "log"
    run = tmp_path / "storage" / "run"
    config = {**BIG, "steps": 6, "log": str(log)}

    def kill_rank_1_mid_upload() -> None:
        folder = _wait_for("an upload in progress", lambda: _uploading_folder(run, 1))
        starts = [e for e in read_events(log) if e["event"] == "start" and e["rank"] == 1]
        os.kill(starts[0]["pid"], signal.SIGKILL)
        print(f"killed rank 1 while {folder.name} was being uploaded")

    killer = _in_background(kill_rank_1_mid_upload)
    result = DataParallelTrainer(
        integrity_train,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            name="run",
            storage_path=str(tmp_path / "storage"),
            failure_config=FailureConfig(max_failures=2, restart_backoff_s=0.1),
        ),
    ).fit()
    killer.join(10)
    assert not killer.errors  # type: ignore[attr-defined]
    assert result.restarts == 1
    assert result.metrics is not None and result.metrics["step"] == 5
    checked = check_run(str(run), world_size=2)
    # Nothing uncommitted is left behind: every folder of the run is a listed checkpoint.
    assert sorted(p.name for p in run.iterdir() if p.is_dir()) == sorted(
        r.name for r in checked.checkpoints
    )


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_a_killed_driver_is_fenced_off_and_a_new_driver_resumes(
    tmp_path: Path, ray_cluster: Any
) -> None:
    import ray

    log = tmp_path / "log"
    storage = tmp_path / "storage"
    run = storage / "run"
    config = {**BIG, "steps": 6, "log": str(log)}
    env = {
        **os.environ,
        "RAY_ADDRESS": ray.get_runtime_context().gcs_address,
        "PYTHONPATH": str(REPO_ROOT),
    }
    spec = json.dumps({"config": config, "storage": str(storage)})
    driver = subprocess.Popen(
        [sys.executable, "-m", "tests.faults.driver_main", spec],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        # Uploads are asynchronous: a later round's files can land before an earlier round is
        # committed (a loaded machine made it so), so wait for both.
        _wait_for(
            "a committed checkpoint and an upload in progress",
            lambda: _uploading_folder(run, 1) and any(run.glob(f"checkpoint_0*/{COMMIT_MARKER}")),
        )
        driver.send_signal(signal.SIGKILL)
        driver.wait(30)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert _epoch(run) == 1
    first = check_run(str(run), world_size=2)
    assert first.checkpoints, "the killed driver had committed checkpoints"

    result = DataParallelTrainer(
        integrity_train,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="run", storage_path=str(storage)),
    ).fit()
    assert _epoch(run) == 2
    assert result.metrics is not None and result.metrics["step"] == 5
    resumed = [e for e in read_events(log) if e["event"] == "start"][-1]["start"]
    assert resumed == first.metrics["step"] + 1  # type: ignore[index]
    checked = check_run(str(run), world_size=2)
    assert sorted(p.name for p in run.iterdir() if p.is_dir()) == sorted(
        r.name for r in checked.checkpoints
    )


@pytest.fixture
def private_gcs(tmp_path: Path) -> Iterator[GCSEmulator]:
    """A fake-gcs-server of this test alone (filesystem backend: data survives restarts)."""
    emulator = GCSEmulator(root=tmp_path / "gcs-data").start()
    saved = {k: os.environ.get(k) for k in ("STORAGE_EMULATOR_HOST", "TRAINJOB_GCS_ATTEMPTS")}
    os.environ["STORAGE_EMULATOR_HOST"] = emulator.url
    os.environ["TRAINJOB_GCS_ATTEMPTS"] = "2"  # fail fast: the restarts are under test
    reset_storage_cache()
    try:
        yield emulator
    finally:
        emulator.cleanup()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        reset_storage_cache()


@pytest.mark.gcs
@pytest.mark.timeout(300)
@pytest.mark.parametrize("backoff_s", [2.0, 0.0])
def test_a_short_storage_outage_does_not_use_up_max_failures(
    tmp_path: Path, private_gcs: GCSEmulator, backoff_s: float
) -> None:
    bucket = private_gcs.new_bucket()
    storage = f"gs://{bucket}/runs"
    outage_s = 4.0

    def outage() -> None:
        _wait_for("the first commit", lambda: (tmp_path / "gcs-data" / bucket).exists())
        time.sleep(0.5)
        private_gcs.stop()
        time.sleep(outage_s)
        private_gcs.start()

    stopper = _in_background(outage)
    trainer = DataParallelTrainer(
        integrity_train,
        train_loop_config={"steps": 12, "files": 2, "size": 4096, "sleep": 0.5},
        scaling_config=ScalingConfig(num_workers=0),
        run_config=RunConfig(
            name="run",
            storage_path=storage,
            failure_config=FailureConfig(max_failures=3, restart_backoff_s=backoff_s),
        ),
    )
    if backoff_s == 0:
        # Without back-off the restarts come faster than the storage comes back.
        with pytest.raises(TrainingFailedError, match="after 4 failure"):
            trainer.fit()
        stopper.join(30)
        result = Result.from_path(f"{storage}/run")
    else:
        result = trainer.fit()
        stopper.join(30)
        assert 1 <= result.restarts <= 3
        assert result.metrics is not None and result.metrics["step"] == 11
    check_run(f"{storage}/run", world_size=1)


def _chattr(flag: str, path: Path) -> None:
    subprocess.run(["chattr", flag, str(path)], check=True, capture_output=True)


@pytest.mark.timeout(120)
def test_a_read_only_run_folder_fails_at_once_and_keeps_what_was_committed(
    tmp_path: Path,
) -> None:
    run = tmp_path / "storage" / "run"
    probe = tmp_path / "probe"
    probe.mkdir()
    try:
        _chattr("+i", probe)  # as root, chmod would not stop writes: make it immutable
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"chattr +i is not supported here: {exc}")
    _chattr("-i", probe)

    def freeze() -> None:
        _wait_for("two commits", lambda: (run / "checkpoint_000001" / COMMIT_MARKER).exists())
        _chattr("+i", run)

    freezer = _in_background(freeze)
    try:
        with pytest.raises(TrainingFailedError) as info:
            DataParallelTrainer(
                integrity_train,
                train_loop_config={"steps": 50, "files": 2, "size": 4096, "sleep": 0.1},
                scaling_config=ScalingConfig(num_workers=0),
                run_config=RunConfig(
                    name="run",
                    storage_path=str(tmp_path / "storage"),
                    failure_config=FailureConfig(max_failures=3, restart_backoff_s=0.1),
                ),
            ).fit()
        freezer.join(10)
    finally:
        _chattr("-i", run)
    message = str(info.value)
    assert "Operation not permitted" in message and str(run) in message, message
    assert "Retrying cannot fix" in message
    assert info.value.result is not None and info.value.result.restarts == 0  # not retried
    result = check_run(str(run), world_size=1)
    assert {"checkpoint_000000", "checkpoint_000001"} <= {r.name for r in result.checkpoints}
