"""A Ray node drained for preemption (the GCS drain API, as a cloud's preemption notice
reaches Ray Train 2.60): the controller sees it through ``get_draining_nodes()`` and every
rank's ``get_preemption_info()`` names the ranks on that node.

- With Ray Train's defaults the train function's final checkpoint is committed and the
  worker group restarts from it in the same ``fit()``, on nodes other than the drained one
  (Ray schedules nothing new on a draining node).
- A train function that ignores the notice is stopped at the drain's deadline plus
  ``FailureConfig.preemption_grace_s`` (``drain_timed_out``); with
  ``max_preemption_failures=0`` ``fit()`` raises ``PreemptionError``.

The scenarios need a multi-node Ray cluster of their own, so they run in a separate process
(``tests/faults/preemption_drain_main.py``): this interpreter may already be attached to the
session's Ray cluster, and one process can be a driver of one cluster only.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.faults.preemption_main import run_scenario

pytestmark = pytest.mark.ray  # a real multi-node Ray cluster


def test_a_drained_ray_node_is_a_preemption_notice_and_the_group_restarts_elsewhere(
    tmp_path: Path,
) -> None:
    seen = run_scenario("tests.faults.preemption_drain_main", tmp_path)
    in_place, deadline = seen["in_place"], seen.get("deadline")

    # Ray Train's defaults: no PreemptionError, the same fit() resumed from the final
    # checkpoint, which named the drained node's rank.
    assert in_place["outcomes"] == [], in_place
    final = in_place["committed"][-1]
    assert final["final"] is True and 1 in final["preempted_ranks"], in_place
    assert in_place["metrics"] == {"start": final["step"] + 1}  # the last report
    assert in_place["result_metrics"] == final  # the latest checkpoint's, as Ray Train
    resumed = in_place["resumed_nodes"]
    assert sorted(resumed) == ["0", "1"]  # JSON keys
    assert in_place["drained_node"] not in resumed.values(), in_place
    assert len(set(resumed.values())) == 2  # SPREAD over the two nodes left

    # Ignored notice, no retries: stopped at the deadline + grace, with the checkpoint of step 1.
    assert deadline is not None, seen
    assert deadline["outcomes"] == ["PreemptionError"], deadline
    assert deadline["drain_timed_out"] is True
    assert deadline["preempted_node_ids"] == [deadline["drained_node"]]
    assert deadline["deadline_ms"] == deadline["requested_deadline_ms"]
    assert deadline["ended_at_ms"] >= deadline["deadline_ms"] + seen["grace_s"] * 1000
    assert deadline["committed"] == [{"step": 1}]
    assert deadline["checkpoint"] is not None
