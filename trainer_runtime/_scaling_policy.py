"""How many workers a worker group gets: Ray Train V2's scaling policies.

:class:`FixedScalingPolicy` (``ScalingConfig(num_workers=N)``) always answers ``N``.
:class:`ElasticScalingPolicy` (``num_workers=(min_workers, max_workers)``), as Ray Train
2.60's of the same name:

* for a group to start (the first, or one after a failure): as many workers as the
  cluster can place, at most ``max_workers``; none (wait) while fewer than ``min_workers``
  fit;
* for a running group, at most every ``ScalingConfig.elastic_resize_monitor_interval_s``
  seconds after its start or the last look: a different size that fits (and is at least
  ``min_workers``), for which the controller restarts the group (``RESIZING``).

What fits is counted by :func:`count_possible_workers` from what each alive, undrained Ray
node could give a worker (:func:`ray_node_capacity`): its available resources plus what
the running group itself holds there. Ray Train asks Ray Data's autoscaling coordinator for
the resources it reserved for the run instead (alive nodes' total resources, shared out by
priority); both count the same on a cluster that runs nothing else, and here a node's
resources held by other work (validation tasks, another run) are not counted as free.

The counting is pure (node resources in, a number out); only :func:`ray_node_capacity`
reads Ray's state.
"""

from __future__ import annotations

import abc
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence

from trainer_runtime.config import ScalingConfig

logger = logging.getLogger("trainer_runtime")

#: Resources per Ray node id (``{"CPU": 4.0, ...}``).
NodeResources = Mapping[str, Mapping[str, float]]
#: What each node can give this run's workers, given what the running group holds per node
#: (node id -> that group's worker bundles there; empty when no group runs).
CapacityFn = Callable[[Mapping[str, Sequence[Mapping[str, float]]]], NodeResources]
#: Ray node labels per node id (for ``ScalingConfig.label_selector``).
LabelsFn = Callable[[], Mapping[str, Mapping[str, str]]]

_EPSILON = 1e-9


def count_possible_workers(
    scaling: ScalingConfig,
    nodes: NodeResources,
    node_labels: Mapping[str, Mapping[str, str]] | None = None,
) -> int:
    """How many of ``scaling``'s workers (at most ``max_workers``) ``nodes`` can hold.

    Each worker needs ``scaling.worker_resources()``; a worker that needs nothing fits
    ``max_workers`` times (as Ray Train). ``placement_strategy`` is honoured where it limits
    the count: ``STRICT_SPREAD`` one worker per node, ``STRICT_PACK`` all on one node.
    With ``label_selector`` worker ``i`` only fits on a node whose labels match its selector
    (workers are placed in rank order; the count is the first that does not fit). With
    TPUs the count is rounded down to whole slices (hosts per slice).
    """
    need = {k: float(v) for k, v in scaling.worker_resources().items() if v > 0}
    max_workers = scaling.max_workers
    if not need:
        return max_workers
    selectors = scaling.label_selector_per_worker()
    labels = node_labels or {}

    def fits(resources: Mapping[str, float]) -> int:
        return min(
            math.floor((float(resources.get(k, 0.0)) + _EPSILON) / v) for k, v in need.items()
        )

    per_node = {node: fits(resources) for node, resources in nodes.items()}
    strategy = scaling.placement_strategy
    if strategy == "STRICT_PACK":
        count = (
            max(
                (_prefix_fitting({node: n}, selectors, labels, max_workers, spread=False))
                for node, n in per_node.items()
            )
            if per_node
            else 0
        )
    else:
        count = _prefix_fitting(
            per_node, selectors, labels, max_workers, spread=strategy == "STRICT_SPREAD"
        )
    shape = scaling.tpu_shape
    if shape is not None:
        count -= count % shape.hosts
    return min(count, max_workers)


def _prefix_fitting(
    per_node: Mapping[str, int],
    selectors: list[dict[str, str]] | None,
    labels: Mapping[str, Mapping[str, str]],
    max_workers: int,
    *,
    spread: bool,
) -> int:
    """How many workers, in rank order, fit on nodes holding ``per_node`` workers each."""
    if selectors is None and not spread:
        return min(sum(per_node.values()), max_workers)
    left = dict(per_node)
    placed = 0
    for rank in range(max_workers):
        selector = selectors[rank] if selectors is not None else None
        node = next(
            (
                n
                for n in sorted(left)
                if left[n] > 0
                and (
                    selector is None
                    or all((labels.get(n) or {}).get(k) == v for k, v in selector.items())
                )
            ),
            None,
        )
        if node is None:
            break
        left[node] = 0 if spread else left[node] - 1
        placed += 1
    return placed


class ScalingPolicy(abc.ABC):
    """Decides the size of the worker groups of one run (Ray Train V2's ``ScalingPolicy``)."""

    def __init__(self, scaling: ScalingConfig) -> None:
        self.scaling = scaling

    @abc.abstractmethod
    def decide_for_new_group(self) -> int | None:
        """The size of a group about to start, or None to wait (fewer than the minimum fit)."""

    @abc.abstractmethod
    def decide_for_running_group(
        self,
        num_workers: int,
        started_at: float,
        held: Mapping[str, Sequence[Mapping[str, float]]],
    ) -> int | None:
        """A new size for the running group of ``num_workers`` (started at ``started_at``,
        ``time.monotonic()``; holding ``held`` per node), or None to keep it."""


class FixedScalingPolicy(ScalingPolicy):
    """``ScalingConfig(num_workers=N)``: always ``N`` workers; the group is never resized."""

    def decide_for_new_group(self) -> int | None:
        return self.scaling.max_workers

    def decide_for_running_group(
        self,
        num_workers: int,
        started_at: float,
        held: Mapping[str, Sequence[Mapping[str, float]]],
    ) -> int | None:
        return None


class ElasticScalingPolicy(ScalingPolicy):
    """``ScalingConfig(num_workers=(min_workers, max_workers))``: as many workers as fit.

    ``capacity``: what each node can give (see :func:`ray_node_capacity`); ``node_labels``:
    the nodes' Ray labels, read only with a ``label_selector``. Ray Train's log sentences.
    """

    #: Least seconds between two logs that fewer than ``min_workers`` fit (Ray Train's).
    INSUFFICIENT_WORKERS_WARNING_INTERVAL_S = 30.0

    def __init__(
        self,
        scaling: ScalingConfig,
        capacity: CapacityFn,
        node_labels: LabelsFn | None = None,
    ) -> None:
        super().__init__(scaling)
        self._capacity = capacity
        self._node_labels = node_labels
        self._latest_monitor_time = float("-inf")
        self._latest_insufficient_warning = float("-inf")
        self._latest_start_count: int | None = None

    def count(self, held: Mapping[str, Sequence[Mapping[str, float]]]) -> int:
        """How many workers fit now (a running group's ``held`` resources counted as free)."""
        labels = (
            self._node_labels()
            if self._node_labels is not None and self.scaling.label_selector is not None
            else None
        )
        return count_possible_workers(self.scaling, self._capacity(held), labels)

    @property
    def _min_workers(self) -> int:
        # A group of no workers trains nothing: (0, n) starts once one worker fits.
        return max(1, self.scaling.min_workers)

    def decide_for_new_group(self) -> int | None:
        num_workers = self.count({})
        if num_workers < self._min_workers:
            now = time.monotonic()
            if (
                now - self._latest_insufficient_warning
                >= self.INSUFFICIENT_WORKERS_WARNING_INTERVAL_S
            ):
                logger.info(
                    "Detected ready resources for %d workers in the cluster. Deciding NOT to "
                    "start/restart training due to the number of workers falling below the "
                    "minimum (min_workers=%d).",
                    num_workers,
                    self.scaling.min_workers,
                )
                self._latest_insufficient_warning = now
            return None
        if num_workers != self._latest_start_count:  # once per count, not once per look
            logger.info(
                "Detected ready resources for %d workers in the cluster. Deciding to "
                "start/restart training with this worker group size.",
                num_workers,
            )
            self._latest_start_count = num_workers
        return num_workers

    def decide_for_running_group(
        self,
        num_workers: int,
        started_at: float,
        held: Mapping[str, Sequence[Mapping[str, float]]],
    ) -> int | None:
        self._latest_start_count = None  # the next group's start is logged again
        now = time.monotonic()
        latest = max(started_at, self._latest_monitor_time)
        if now - latest < self.scaling.elastic_resize_monitor_interval_s:
            return None
        self._latest_monitor_time = now
        possible = self.count(held)
        if possible == num_workers:
            logger.info(
                "Did not detect any changes in the cluster resources. Training will continue "
                "with the same worker group size (%d).",
                num_workers,
            )
            return None
        if possible < self._min_workers:
            return None
        logger.info(
            "Detected changes in the cluster resources. Deciding to resize the worker group "
            "from %d -> %d workers.",
            num_workers,
            possible,
        )
        return possible


def make_scaling_policy(
    scaling: ScalingConfig,
    capacity: CapacityFn | None = None,
    node_labels: LabelsFn | None = None,
) -> ScalingPolicy:
    """Ray Train's ``create_scaling_policy``: elastic for a ``(min, max)`` tuple (reading
    the Ray cluster unless ``capacity``/``node_labels`` are given), else fixed."""
    if scaling.elasticity_enabled:
        return ElasticScalingPolicy(
            scaling,
            capacity or ray_node_capacity,
            node_labels or (ray_node_labels if capacity is None else None),
        )
    return FixedScalingPolicy(scaling)


def ray_node_capacity(held: Mapping[str, Sequence[Mapping[str, float]]]) -> NodeResources:
    """What each alive Ray node that is not draining can give this run's workers: its
    available resources plus ``held`` (the running group's worker bundles on it)."""
    import ray._private.state

    state = ray._private.state.state
    alive = set(state.total_resources_per_node())
    draining = set(state.get_draining_nodes())
    out: dict[str, dict[str, float]] = {}
    for node, available in state.available_resources_per_node().items():
        if node not in alive or node in draining:
            continue
        resources = {k: float(v) for k, v in available.items()}
        for bundle in held.get(node, ()):
            for key, value in bundle.items():
                resources[key] = resources.get(key, 0.0) + float(value)
        out[node] = resources
    return out


def ray_node_labels() -> dict[str, dict[str, str]]:
    """The Ray labels of each alive node."""
    import ray

    return {n["NodeID"]: dict(n.get("Labels") or {}) for n in ray.nodes() if n.get("Alive", True)}
