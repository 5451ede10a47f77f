"""Preemption notices with real processes: SIGTERM to the process running a worker (local
mode, or a Ray worker actor's process) mid-run -> the train function sees
``get_preemption_info()``, reports a final checkpoint and the runtime commits it. In local
mode, and with Ray workers when ``FailureConfig.max_preemption_failures`` is spent, ``fit()``
then raises ``PreemptionError`` and a new run with the same storage and name resumes from
that checkpoint; with Ray workers and Ray Train's default (-1) the worker group restarts in
place from it and ``fit()`` succeeds."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO_ROOT
from tests.support.waiting import wait_for
from trainer_runtime import Result
from trainjob_operator.constants import DRIVER_PREEMPTED_EXIT_CODE

pytestmark = pytest.mark.ray  # real Ray clusters in child processes


def _start(
    storage: Path,
    num_workers: int,
    config: dict[str, Any],
    failure: dict[str, Any] | None = None,
) -> subprocess.Popen[str]:
    spec = {
        "storage": str(storage),
        "num_workers": num_workers,
        "config": config,
        "failure": failure or {},
    }
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "TRAINJOB_TERMINATION_GRACE_PERIOD_S": "600"}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.faults.preemption_main", json.dumps(spec)],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _result(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-4000:]
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert lines, (out[-2000:], err[-4000:])
    result: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
    return result


def _wait_for_pid(ready: Path, proc: subprocess.Popen[str]) -> int:
    while not ready.exists() or not ready.read_text():
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before it was ready: {proc.communicate()}")
        time.sleep(0.05)
    return int(json.loads(ready.read_text())["pid"])


@pytest.mark.parametrize(
    ("num_workers", "failure"),
    [(0, {}), (2, {"max_preemption_failures": 0})],
    ids=["local", "ray-workers-no-preemption-retries"],
)
def test_sigterm_mid_run_commits_a_final_checkpoint_and_the_next_run_resumes_from_it(
    tmp_path: Path, num_workers: int, failure: dict[str, Any]
) -> None:
    storage = tmp_path / "runs"
    ready = tmp_path / "ready"
    signal_rank = 1 if num_workers else 0
    config = {"ready_file": str(ready), "signal_rank": signal_rank}
    proc = _start(storage, num_workers, config, failure)
    pid = _wait_for_pid(ready, proc)
    if num_workers:
        assert pid != proc.pid  # the Ray worker's process, not the driver
    os.kill(pid, signal.SIGTERM)
    preempted = _result(proc)

    # Every rank saw the same notice: the ranks of the signalled process's node.
    assert preempted["preempted_ranks"] == ([0, 1] if num_workers else [0])
    assert preempted["deadline_ms"] is not None
    assert preempted["metrics"]["final"] is True
    final_step = preempted["metrics"]["step"]
    assert final_step >= 2
    # The final checkpoint is committed (Result.from_path verifies markers and files).
    stored = Result.from_path(storage / "run")
    assert stored.checkpoint is not None
    assert stored.checkpoint.path == preempted["checkpoint"]
    assert stored.metrics["final"] is True
    folder = Path(stored.checkpoint.path)
    assert json.loads((folder / "state.json").read_text()) == {"step": final_step}
    for rank in range(max(num_workers, 1)):
        assert (folder / f"rank{rank}.txt").exists()

    resumed = _result(_start(storage, num_workers, {"signal_rank": 0}))
    assert resumed["metrics"] == {"start": final_step + 1}  # its last report
    # Its Result.metrics, as in Ray Train 2.60: with workers, the latest checkpoint's (the
    # final one); in local mode, the last report's (Ray's local mode keeps the last report).
    expected = preempted["metrics"] if num_workers else resumed["metrics"]
    assert resumed["result_metrics"] == expected


def test_sigterm_to_a_ray_worker_restarts_the_worker_group_in_place_from_the_final_checkpoint(
    tmp_path: Path,
) -> None:
    """Ray Train's default (``max_preemption_failures=-1``): the same ``fit()`` goes on."""
    storage = tmp_path / "runs"
    ready = tmp_path / "ready"
    proc = _start(storage, 2, {"ready_file": str(ready), "signal_rank": 1})
    os.kill(_wait_for_pid(ready, proc), signal.SIGTERM)
    finished = _result(proc)

    stored = Result.from_path(storage / "run")
    assert stored.checkpoint is not None and stored.metrics["final"] is True
    assert stored.metrics["preempted_ranks"] == [0, 1]  # one node: both ranks on it
    # fit() returned: the restarted group started from the final checkpoint's next step
    # (its last report); Result.metrics is the final checkpoint's, as in Ray Train 2.60.
    assert finished["metrics"] == {"start": stored.metrics["step"] + 1}
    assert finished["result_metrics"] == stored.metrics
    assert "checkpoint" not in finished  # no PreemptionError


def _start_driver(
    manifest: dict[str, Any], ray_cluster: Any, grace_s: int, out: Any
) -> subprocess.Popen[bytes]:
    """``python -m trainjob_operator.launcher.driver`` for ``manifest`` on the session's Ray
    cluster, as in its pod (the grace period the operator sets), its output to ``out``; no
    API server, so its status goes nowhere."""
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        "RAY_ADDRESS": ray_cluster.get_runtime_context().gcs_address,
        "TRAINJOB_MANIFEST": json.dumps(manifest),
        "TRAINJOB_TERMINATION_GRACE_PERIOD_S": str(grace_s),
    }
    env.pop("TRAINJOB_NAME", None)
    return subprocess.Popen(
        [sys.executable, "-m", "trainjob_operator.launcher.driver"],
        cwd=REPO_ROOT,
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
    )


@pytest.mark.timeout(240)
def test_sigterm_to_the_trainjob_driver_commits_a_last_checkpoint_and_exits_preempted(
    tmp_path: Path, ray_cluster: Any
) -> None:
    """The in-cluster driver (``python -m trainjob_operator.launcher.driver``) whose pod is
    deleted or evicted gets SIGTERM: every rank sees ``get_preemption_info()`` name it, the
    last checkpoint is committed whole before the grace period ends, and the driver exits 3
    (preempted), which the operator restarts from, not counted (before, Ray's handler made
    it exit 15 with the round in flight lost)."""
    storage = tmp_path / "runs"
    ready = tmp_path / "ready"
    grace_s = 60
    manifest = {
        "apiVersion": "trainjob.dev/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "run", "namespace": "ns"},
        "spec": {
            "entrypoint": "tests.faults.preemption_main:preemptible_train",
            "config": {"ready_file": str(ready), "signal_rank": 1},
            "scaling": {"numWorkers": 2, "resourcesPerWorker": {"cpu": 1}},
            "storage": {"path": str(storage)},
        },
    }
    log = tmp_path / "driver.log"
    with log.open("w") as out:
        driver = _start_driver(manifest, ray_cluster, grace_s, out)
        try:
            while not ready.exists() or not ready.read_text():
                assert driver.poll() is None, log.read_text()[-4000:]
                time.sleep(0.05)
            noticed_at = time.time()
            driver.send_signal(signal.SIGTERM)
            code = driver.wait(120)
        finally:
            if driver.poll() is None:
                driver.kill()
    text = log.read_text()
    assert code == DRIVER_PREEMPTED_EXIT_CODE, text[-4000:]
    assert "Termination notice to the driver" in text and "TrainJob run preempted" in text
    stored = Result.from_path(storage / "run")  # markers and file lists verified
    assert stored.checkpoint is not None and stored.metrics["final"] is True
    assert stored.metrics["preempted_ranks"] == [0, 1]  # every rank: the driver is going
    # The deadline the train function was given leaves time to shut down before SIGKILL.
    deadline_s = stored.metrics["deadline_ms"] / 1000
    assert noticed_at < deadline_s < noticed_at + grace_s - 5
    folder = Path(stored.checkpoint.path)
    assert {p.name for p in folder.iterdir()} >= {"state.json", "rank0.txt", "rank1.txt"}


@pytest.mark.timeout(180)
def test_sigterm_to_a_driver_whose_workers_are_not_placed_yet_stops_it_at_once(
    tmp_path: Path, ray_cluster: Any
) -> None:
    """The driver's pod deleted while its worker group waits for resources (a suspension or
    a restart right after the driver started, the workers' pods not up yet): nothing trained
    since the latest checkpoint, so the driver exits 3 at once, its reservation released,
    instead of holding on until its grace period ends (or the workers come, only to save
    that checkpoint again)."""
    import ray

    grace_s = 60
    manifest = {
        "apiVersion": "trainjob.dev/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "unplaced", "namespace": "ns"},
        "spec": {
            "entrypoint": "tests.faults.preemption_main:preemptible_train",
            # More CPUs than the cluster has: the placement group stays pending.
            "scaling": {
                "numWorkers": 2,
                "resourcesPerWorker": {"cpu": 64},
                "placementTimeoutSeconds": 600,
            },
            "storage": {"path": str(tmp_path / "runs")},
        },
    }
    log = tmp_path / "driver.log"

    def pending_groups() -> list[str]:
        table = ray.util.placement_group_table()
        return [pg for pg, info in table.items() if info["state"] == "PENDING"]

    before = set(pending_groups())
    with log.open("w") as out:
        driver = _start_driver(manifest, ray_cluster, grace_s, out)
        try:
            waiting = wait_for(
                "the driver's worker group waiting for its resources",
                lambda: (set(pending_groups()) - before) or driver.poll() is not None,
                timeout=120,
            )
            assert driver.poll() is None, log.read_text()[-4000:]
            sent = time.monotonic()
            driver.send_signal(signal.SIGTERM)
            code = driver.wait(60)
            stopped_in = time.monotonic() - sent
        finally:
            if driver.poll() is None:
                driver.kill()
    text = log.read_text()
    assert code == DRIVER_PREEMPTED_EXIT_CODE, text[-4000:]
    assert "before the worker group runs" in text, text[-4000:]
    assert stopped_in < 15, (stopped_in, text[-4000:])  # not the grace period's 50 s
    # Its reservation was given back (the group was shut down, not left pending).
    assert not set(pending_groups()) & set(waiting), ray.util.placement_group_table()
