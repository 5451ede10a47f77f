"""A Ray node drained for preemption (the GCS drain API, as a cloud's preemption notice
reaches Ray Train 2.60): the controller sees it through ``get_draining_nodes()``, every
rank's ``get_preemption_info()`` names the ranks on that node, the final checkpoint is
committed, and a new run resumes from it on the remaining nodes (the drained one removed)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.faults.preemption_main import preemptible_train
from trainer_runtime import DataParallelTrainer, PreemptionError, RunConfig, ScalingConfig


@pytest.fixture
def cluster() -> Iterator[Any]:
    import ray
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    nodes = [c.add_node(num_cpus=1) for _ in range(3)]  # 2 workers, 1 spare
    ray.init(address=c.address)
    c.wait_for_nodes()
    try:
        yield c, nodes
    finally:
        ray.shutdown()
        c.shutdown()


def _drain(node_id: str, deadline_ms: int) -> None:
    import ray
    from ray._raylet import GcsClient
    from ray.core.generated.autoscaler_pb2 import DrainNodeReason

    gcs = GcsClient(address=ray.get_runtime_context().gcs_address)
    accepted, why = gcs.drain_node(
        node_id=node_id,  # hex, as get_draining_nodes() names it
        reason=DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"),
        reason_message="spot reclaim (test)",
        deadline_timestamp_ms=deadline_ms,
    )
    assert accepted, why


def _trainer(storage: Path, config: dict[str, Any]) -> DataParallelTrainer:
    return DataParallelTrainer(
        preemptible_train,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=2, placement_strategy="SPREAD"),
        run_config=RunConfig(name="run", storage_path=str(storage)),
    )


def test_a_drained_ray_node_is_a_preemption_notice_for_its_ranks(
    tmp_path: Path, cluster: Any
) -> None:
    storage, ready = tmp_path / "runs", tmp_path / "ready"
    outcome: list[BaseException] = []

    def fit() -> None:
        try:
            _trainer(storage, {"ready_file": str(ready), "signal_rank": 1}).fit()
        except BaseException as exc:  # noqa: BLE001 - checked below
            outcome.append(exc)

    thread = threading.Thread(target=fit)
    thread.start()
    while not ready.exists() or not ready.read_text():
        assert thread.is_alive(), outcome
        time.sleep(0.05)
    node = json.loads(ready.read_text())["node"]
    deadline_ms = int(time.time() * 1000) + 600_000
    _drain(node, deadline_ms)
    thread.join()

    assert len(outcome) == 1 and isinstance(outcome[0], PreemptionError), outcome
    error = outcome[0]
    assert error.preemption_info.preempted_node_ids == [node]
    assert 1 in error.preemption_info.preempted_ranks
    assert error.preemption_info.deadline_ms == deadline_ms
    assert error.result is not None and error.result.checkpoint is not None
    assert error.result.metrics["final"] is True
    final_step = error.result.metrics["step"]

    c, nodes = cluster
    c.remove_node(next(n for n in nodes if n.node_id == node))
    resumed = _trainer(storage, {"resume": True, "signal_rank": 0}).fit()
    assert resumed.metrics == {"start": final_step + 1}
