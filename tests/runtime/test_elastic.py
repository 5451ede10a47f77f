"""Elastic training (``ScalingConfig(num_workers=(min, max))``), as Ray Train 2.60 has it.

The counting and the policies are checked on given node resources; the run itself on the
session's real Ray cluster, whose free CPUs the test takes and gives back with placement
groups of its own (capacity that other work holds, then releases).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

import trainer_runtime as tr
from tests.runtime.elastic_workloads import elastic_train
from trainer_runtime._controller import ControllerState
from trainer_runtime._scaling_policy import (
    ElasticScalingPolicy,
    FixedScalingPolicy,
    count_possible_workers,
    make_scaling_policy,
)
from trainer_runtime.callbacks import Callback


def test_num_workers_tuple_is_validated_with_ray_trains_sentences() -> None:
    elastic = tr.ScalingConfig(num_workers=(2, 4))
    assert (elastic.elasticity_enabled, elastic.min_workers, elastic.max_workers) == (True, 2, 4)
    assert not elastic.local_mode
    assert elastic.total_resources == {"CPU": 4.0}  # an upper bound, as Ray's
    assert elastic.for_group(3).num_workers == 3
    fixed = tr.ScalingConfig(num_workers=3)
    assert (fixed.elasticity_enabled, fixed.min_workers, fixed.max_workers) == (False, 3, 3)
    cases = {
        (3, 2): r"Invalid ScalingConfig\(num_workers=\(3, 2\)\): min_workers=3 must be <= "
        r"max_workers=2\.",
        (-1, 2): r"Invalid ScalingConfig\(num_workers=\(-1, 2\)\): Number of workers cannot "
        r"be negative\.",
        (1, 2, 3): r"ScalingConfig\(num_workers\) must be an int or a tuple of two ints\.",
        (1.0, 2): r"ScalingConfig\(num_workers\) must be an int or a tuple of two ints\.",
        (0, 0): r"max_workers must be >= 1",
    }
    for value, message in cases.items():
        with pytest.raises(ValueError, match=message):
            tr.ScalingConfig(num_workers=value)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"elastic_resize_monitor_interval_s\) must be non-neg"):
        tr.ScalingConfig(num_workers=(1, 2), elastic_resize_monitor_interval_s=-1)
    with pytest.raises(ValueError, match="same length as `max_workers`"):
        tr.ScalingConfig(num_workers=(1, 3), label_selector=[{"a": "b"}] * 2)
    per_worker = tr.ScalingConfig(num_workers=(1, 3), label_selector=[{"i": str(i)} for i in "012"])
    assert per_worker.for_group(2).label_selector == [{"i": "0"}, {"i": "1"}]
    with pytest.raises(ValueError, match=r"The configured `min_workers` \(2\) must be a multiple"):
        tr.ScalingConfig(
            num_workers=(2, 8), use_tpu=True, topology="4x4", accelerator_type="TPU-V6E"
        )
    tpu = tr.ScalingConfig(
        num_workers=(4, 8), use_tpu=True, topology="4x4", accelerator_type="TPU-V6E"
    )
    assert tpu.num_slices == 2 and tpu.for_group(4).num_slices == 1


def test_the_count_is_what_the_nodes_hold_within_max_workers() -> None:
    cpus = tr.ScalingConfig(num_workers=(1, 4), resources_per_worker={"CPU": 2})
    assert count_possible_workers(cpus, {"a": {"CPU": 5.0}, "b": {"CPU": 2.0}}) == 3
    assert count_possible_workers(cpus, {"a": {"CPU": 40.0}}) == 4  # never past max_workers
    assert count_possible_workers(cpus, {}) == 0
    spread = tr.ScalingConfig(num_workers=(1, 4), placement_strategy="STRICT_SPREAD")
    assert count_possible_workers(spread, {"a": {"CPU": 3.0}, "b": {"CPU": 1.0}}) == 2
    pack = tr.ScalingConfig(num_workers=(1, 4), placement_strategy="STRICT_PACK")
    assert count_possible_workers(pack, {"a": {"CPU": 3.0}, "b": {"CPU": 2.0}}) == 3
    gpus = tr.ScalingConfig(num_workers=(1, 8), use_gpu=True)  # 1 CPU + 1 GPU each
    assert count_possible_workers(gpus, {"a": {"CPU": 8.0, "GPU": 2.0}, "b": {"CPU": 8}}) == 2
    labelled = tr.ScalingConfig(num_workers=(1, 4), label_selector={"pool": "train"})
    nodes = {"a": {"CPU": 2.0}, "b": {"CPU": 8.0}}
    assert count_possible_workers(labelled, nodes, {"a": {"pool": "train"}, "b": {}}) == 2
    nothing = tr.ScalingConfig(num_workers=(1, 5), resources_per_worker={"CPU": 0})
    assert count_possible_workers(nothing, {}) == 5  # needs nothing: max_workers, as Ray
    tpu = tr.ScalingConfig(
        num_workers=(4, 8), use_tpu=True, topology="4x4", accelerator_type="TPU-V6E"
    )
    hosts = {f"h{i}": {"TPU": 4.0} for i in range(7)}  # 7 hosts: one whole slice of 4
    assert count_possible_workers(tpu, hosts) == 4


def test_the_elastic_policy_waits_below_min_and_resizes_only_after_the_interval() -> None:
    scaling = tr.ScalingConfig(num_workers=(2, 4), elastic_resize_monitor_interval_s=0)
    free = {"n": {"CPU": 1.0}}

    def capacity(held: Any) -> Any:
        extra = sum(b["CPU"] for bundles in held.values() for b in bundles)
        return {n: {"CPU": r["CPU"] + extra} for n, r in free.items()}

    policy = make_scaling_policy(scaling, capacity)
    assert isinstance(policy, ElasticScalingPolicy)
    assert policy.decide_for_new_group() is None  # 1 fits, min_workers is 2
    free["n"] = {"CPU": 3.0}
    assert policy.decide_for_new_group() == 3
    held = {"n": [{"CPU": 1.0}] * 3}
    free["n"] = {"CPU": 0.0}
    assert policy.decide_for_running_group(3, 0.0, held) is None  # unchanged
    free["n"] = {"CPU": 5.0}
    assert policy.decide_for_running_group(3, 0.0, held) == 4
    slow = make_scaling_policy(
        tr.ScalingConfig(num_workers=(2, 4), elastic_resize_monitor_interval_s=3600), capacity
    )
    assert slow.decide_for_running_group(3, time.monotonic(), held) is None  # too soon
    fixed = make_scaling_policy(tr.ScalingConfig(num_workers=3))
    assert isinstance(fixed, FixedScalingPolicy) and fixed.decide_for_new_group() == 3


class _Capacity(Callback):
    """Holds the cluster's free CPUs but ``free`` with a placement group; takes one more
    CPU once a worker is lost (after the group released its own), and gives everything back
    when the second group starts."""

    def __init__(self, ray: Any, free: int) -> None:
        from ray.util.placement_group import placement_group

        self.ray = ray
        hold = int(ray.available_resources().get("CPU", 0)) - free
        assert hold >= 1, ray.available_resources()
        self.groups = [placement_group([{"CPU": hold}])]
        ray.get(self.groups[0].ready(), timeout=60)
        self.sizes: list[tuple[int, int]] = []

    def on_failure(self, error: BaseException, failures: int, will_restart: bool) -> None:
        from ray.util.placement_group import placement_group

        taken = placement_group([{"CPU": 1}])
        self.ray.get(taken.ready(), timeout=60)
        self.groups.append(taken)

    def on_run_start(self, run_path: str, world_size: int, attempt: int) -> None:
        self.sizes.append((attempt, world_size))
        if attempt == 1:
            self.release()

    def release(self) -> None:
        from ray.util.placement_group import remove_placement_group

        for group in self.groups:
            remove_placement_group(group)
        self.groups = []


class _Trainer(tr.DataParallelTrainer):
    """Keeps its controller, for the states it went through."""

    controller: Any = None

    def _ray_controller(self, spec: Any) -> Any:
        self.controller = super()._ray_controller(spec)
        return self.controller


def test_a_run_starts_at_the_size_that_fits_shrinks_on_a_lost_worker_and_grows_back(
    tmp_path: Path, ray_cluster: Any
) -> None:
    capacity = _Capacity(ray_cluster, free=3)
    log = tmp_path / "starts.log"
    trainer = _Trainer(
        elastic_train,
        train_loop_config={
            "log": str(log),
            "die_world": 3,
            "die_rank": 2,
            "die_step": 2,
            "final_world": 4,
            "max_steps": 200,
            "step_s": 0.1,
        },
        scaling_config=tr.ScalingConfig(num_workers=(2, 4), elastic_resize_monitor_interval_s=0.5),
        run_config=tr.RunConfig(
            name="elastic",
            storage_path=str(tmp_path / "storage"),
            failure_config=tr.FailureConfig(max_failures=1, restart_backoff_s=0),
            callbacks=[capacity],
        ),
    )
    try:
        result = trainer.fit()
    finally:
        capacity.release()
    starts = [json.loads(line) for line in log.read_text().splitlines()]
    # 3 of max 4 fit; the lost rank's CPU was taken, so 2 (>= min 2) carried on from the
    # latest checkpoint (step 0 or 1: the lost rank's last report may have died with it);
    # the CPUs came back and the group grew to 4 from a later checkpoint.
    assert [s["world"] for s in starts] == [3, 2, 4], starts
    assert starts[0]["start"] == 0 and starts[1]["start"] in (1, 2)
    assert starts[2]["start"] > starts[1]["start"]
    assert result.world_sizes == [3, 2, 4]
    assert (result.restarts, result.resizes) == (1, 1)  # the resize is no failure
    assert result.metrics is not None and result.metrics["world"] == 4
    assert capacity.sizes == [(0, 3), (1, 2), (2, 4)]
    states = trainer.controller.state_history
    assert ControllerState.RESIZING in states
    assert states.index(ControllerState.RESTARTING) < states.index(ControllerState.RESIZING)


def test_fewer_than_min_workers_fail_after_the_placement_timeout(
    tmp_path: Path, ray_cluster: Any
) -> None:
    trainer = tr.DataParallelTrainer(
        elastic_train,
        train_loop_config={},
        scaling_config=tr.ScalingConfig(num_workers=(50, 60), placement_timeout_s=1),
        run_config=tr.RunConfig(name="too-big", storage_path=str(tmp_path)),
    )
    with pytest.raises(tr.ControllerError, match=r"could not place min_workers=50 workers"):
        trainer.fit()
