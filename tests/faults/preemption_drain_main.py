"""A process for the drain test: ``python -m tests.faults.preemption_drain_main WORKDIR``.

Builds its own multi-node Ray cluster (``ray.cluster_utils.Cluster``: a head without CPUs,
three one-CPU nodes), so it cannot share an interpreter with the session-wide Ray cluster
other tests attach to. Two scenarios, each a two-worker job whose rank 1's node is drained
through the GCS drain API (as a cloud's preemption notice reaches Ray):

- ``in_place``: Ray Train's defaults; the train function checkpoints on the notice and the
  worker group restarts from that checkpoint on the two other nodes, in the same ``fit()``.
- ``deadline``: the train function ignores notices, ``max_preemption_failures=0`` and
  ``preemption_grace_s=1``: ``fit()`` raises ``PreemptionError(drain_timed_out=True)`` once
  the drain's deadline (4 s away) plus the grace passed.

Prints one JSON line (``RESULT {...}``) with what it observed; the test asserts on it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tests.faults.preemption_main import (
    BackgroundFit,
    drain_for_preemption,
    scenario_main,
    spare_node_cluster,
)
from trainer_runtime import FailureConfig

#: How far ahead the ``deadline`` scenario's drain deadline is.
SHORT_DEADLINE_S = 4.0
#: ``FailureConfig.preemption_grace_s`` of the ``deadline`` scenario.
GRACE_S = 1.0


def _drained_run(fit: BackgroundFit, deadline_in_s: float) -> dict[str, Any]:
    node = fit.node_of_rank_1()
    deadline_ms = int((time.time() + deadline_in_s) * 1000)
    drain_for_preemption(node, deadline_ms)
    fit.thread.join()
    return {**fit.describe(), "drained_node": node, "requested_deadline_ms": deadline_ms}


def run(workdir: Path) -> dict[str, Any]:
    """Run both scenarios in ``workdir`` and return what was observed."""
    out: dict[str, Any] = {}
    with spare_node_cluster() as (cluster, nodes):
        out["in_place"] = seen = _drained_run(BackgroundFit(workdir / "in-place"), 600.0)
        if "error" in seen:
            return out
        cluster.remove_node(next(n for n in nodes if n.node_id == seen["drained_node"]))
        failure = FailureConfig(max_preemption_failures=0, preemption_grace_s=GRACE_S)
        fit = BackgroundFit(workdir / "deadline", failure=failure, ignore_notice=True)
        out["deadline"] = _drained_run(fit, SHORT_DEADLINE_S)
        out["grace_s"] = GRACE_S
    return out


if __name__ == "__main__":
    scenario_main(run)
