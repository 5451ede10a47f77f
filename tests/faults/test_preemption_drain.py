"""A Ray node drained for preemption (the GCS drain API, as a cloud's preemption notice
reaches Ray Train 2.60): the controller sees it through ``get_draining_nodes()``, every
rank's ``get_preemption_info()`` names the ranks on that node, the final checkpoint is
committed, and a new run resumes from it on the remaining nodes (the drained one removed).

The scenario needs a multi-node Ray cluster of its own, so it runs in a separate process
(``tests/faults/preemption_drain_main.py``): this interpreter may already be attached to the
session's Ray cluster, and one process can be a driver of one cluster only.
"""

from __future__ import annotations

from pathlib import Path

from tests.faults.preemption_main import run_scenario

REPO = Path(__file__).resolve().parents[2]


def test_a_drained_ray_node_is_a_preemption_notice_for_its_ranks(tmp_path: Path) -> None:
    seen = run_scenario("tests.faults.preemption_drain_main", tmp_path)

    assert seen["outcomes"] == ["PreemptionError"], seen
    assert seen["preempted_node_ids"] == [seen["drained_node"]]
    assert 1 in seen["preempted_ranks"]
    assert seen["deadline_ms"] == seen["requested_deadline_ms"]
    assert seen["checkpoint"] is not None
    assert seen["metrics"]["final"] is True
    assert seen["resumed_metrics"] == {"start": seen["metrics"]["step"] + 1}
