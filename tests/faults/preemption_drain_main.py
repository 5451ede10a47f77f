"""A process for the drain test: ``python -m tests.faults.preemption_drain_main WORKDIR``.

Builds its own multi-node Ray cluster (``ray.cluster_utils.Cluster``: a head without CPUs,
three one-CPU nodes), so it cannot share an interpreter with the session-wide Ray cluster
other tests attach to. Starts a two-worker job, drains the node of rank 1 through the GCS
drain API (as a cloud's preemption notice reaches Ray), removes that node, resumes, and
prints one JSON line (``RESULT {...}``) with what it observed; the test asserts on it.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from tests.faults.preemption_main import BackgroundFit, resumed_metrics


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
    if not accepted:
        raise RuntimeError(f"drain_node refused: {why}")


def run(workdir: Path) -> dict[str, Any]:
    """Run the scenario in ``workdir`` and return what was observed."""
    import ray
    from ray.cluster_utils import Cluster

    storage, ready = workdir / "runs", workdir / "ready"
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False}
    )
    nodes = [cluster.add_node(num_cpus=1) for _ in range(3)]  # 2 workers, 1 spare
    ray.init(address=cluster.address)
    cluster.wait_for_nodes()
    out: dict[str, Any] = {}
    try:
        fit = BackgroundFit(storage, ready)
        node = fit.node_of_rank_1()
        deadline_ms = int(time.time() * 1000) + 600_000
        _drain(node, deadline_ms)
        fit.thread.join()
        out.update(fit.describe(), drained_node=node, requested_deadline_ms=deadline_ms)
        if "error" not in out:
            cluster.remove_node(next(n for n in nodes if n.node_id == node))
            out["resumed_metrics"] = resumed_metrics(storage)
    finally:
        ray.shutdown()
        cluster.shutdown()
    return out


def main() -> None:
    """Run the scenario in the directory argv[1] and print ``RESULT`` and its JSON."""
    print("RESULT " + json.dumps(run(Path(sys.argv[1]))), flush=True)


if __name__ == "__main__":
    main()
