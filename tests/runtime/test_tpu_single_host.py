"""A single-host TPU run through Ray, side by side with Ray Train's JaxTrainer.

There is no TPU here: one FAKE TPU host joins the local test cluster, advertising what Ray's
own TPU tests give a fake TPU node (``ray start --resources='{"TPU": 4,
"accelerator_type:TPU-V6E": 1}'``). ``ScalingConfig(num_workers=1, use_tpu=True,
accelerator_type="TPU-V6E")`` without a topology must land its one worker there asking for
what Ray Train asks (``{"TPU": 1}``: Ray Train 2.60 adds no ``accelerator_type:`` resource for
TPU workers), with the TPU environment Ray sets for it. JAX runs on CPU (``JAX_PLATFORMS=cpu``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.runtime.api_workloads import placement_probe

pytestmark = pytest.mark.ray

FAKE_TPU_HOST = {"TPU": 4, "accelerator_type:TPU-V6E": 1}


@pytest.fixture(scope="module")
def fake_tpu_host(ray_cluster: Any) -> Iterator[str]:
    """One FAKE single-host TPU node (no CPUs: only TPU work lands there); its node id."""
    ray = ray_cluster
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("TPU_", "MEGASCALE_"))}
    proc = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("ray")),
            "start",
            f"--address={ray.get_runtime_context().gcs_address}",
            "--num-cpus=0",
            f"--resources={json.dumps(FAKE_TPU_HOST)}",
            "--block",
            "--disable-usage-stats",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env=clean,
    )
    deadline = time.monotonic() + 120
    node_id = None
    while node_id is None:
        for node in ray.nodes():
            resources = node["Resources"]
            if node["Alive"] and all(resources.get(k) == v for k, v in FAKE_TPU_HOST.items()):
                node_id = node["NodeID"]
        if node_id is None:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("the fake TPU host did not join the cluster")
            time.sleep(0.2)
    try:
        yield node_id
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)


def _ours(out: Path, tmp_path: Path) -> dict[str, Any]:
    from trainer_runtime import RunConfig, ScalingConfig
    from trainer_runtime.jax import JaxTrainer

    JaxTrainer(
        placement_probe,
        train_loop_config={"out": str(out)},
        scaling_config=ScalingConfig(num_workers=1, use_tpu=True, accelerator_type="TPU-V6E"),
        run_config=RunConfig(
            name="single-host",
            storage_path=str(tmp_path / "ours"),
            worker_runtime_env={"env_vars": {"JAX_PLATFORMS": "cpu"}},
        ),
    ).fit()
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def _rays(out: Path, tmp_path: Path) -> dict[str, Any]:
    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    import ray.train
    from ray.train.v2.jax import JaxTrainer

    JaxTrainer(
        placement_probe,
        train_loop_config={"out": str(out)},
        scaling_config=ray.train.ScalingConfig(
            num_workers=1, use_tpu=True, accelerator_type="TPU-V6E"
        ),
        run_config=ray.train.RunConfig(
            name="single-host",
            storage_path=str(tmp_path / "ray"),
            worker_runtime_env={"env_vars": {"JAX_PLATFORMS": "cpu"}},
        ),
    ).fit()
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def test_single_host_tpu_lands_on_the_tpu_host_as_with_ray_train(
    fake_tpu_host: str, tmp_path: Path
) -> None:
    ours = _ours(tmp_path / "ours.json", tmp_path)
    assert ours["node_id"] == fake_tpu_host
    assert ours["resources"] == {"TPU": 1.0}
    assert ours["env"]["JAX_PLATFORMS"] == "cpu"  # worker_runtime_env wins over use_tpu's "tpu"
    assert ours["env"]["TPU_VISIBLE_CHIPS"] == "0"  # Ray's TPU manager: the chip it holds
    assert (ours["env"]["RANK"], ours["env"]["WORLD_SIZE"]) == ("0", "1")

    rays = _rays(tmp_path / "ray.json", tmp_path)
    assert rays["node_id"] == ours["node_id"]
    assert rays["resources"] == ours["resources"]
    tpu_env = {k: v for k, v in ours["env"].items() if k.startswith("TPU_") or k == "JAX_PLATFORMS"}
    assert {k: rays["env"].get(k) for k in tpu_env} == tpu_env
