"""A group of Ray actors that run the train function, one per worker, in a placement group."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainer_runtime._worker import TrainWorker
from trainer_runtime.config import ScalingConfig
from trainer_runtime.errors import UserConfigError

logger = logging.getLogger(__name__)


@dataclass
class WorkerHandle:
    """One worker actor and where it runs."""

    actor: Any
    rank: int
    node_id: str
    ip: str
    pid: int
    local_rank: int = 0
    local_world_size: int = 1
    node_rank: int = 0


def assign_ranks(infos: list[dict[str, Any]]) -> list[tuple[int, int, int, int]]:
    """Give each worker (by position in ``infos``) its (world, local, local size, node) ranks.

    Workers on one node get consecutive world ranks; nodes are ordered by the
    first worker placed on them. Returns a list indexed like ``infos``.
    """
    node_order: list[str] = []
    for info in infos:
        if info["node_id"] not in node_order:
            node_order.append(info["node_id"])
    order = sorted(range(len(infos)), key=lambda i: (node_order.index(infos[i]["node_id"]), i))
    per_node = {n: sum(1 for i in infos if i["node_id"] == n) for n in node_order}
    local_seen: dict[str, int] = {}
    out: list[tuple[int, int, int, int]] = [(0, 0, 0, 0)] * len(infos)
    for world_rank, i in enumerate(order):
        node = infos[i]["node_id"]
        local = local_seen.get(node, 0)
        local_seen[node] = local + 1
        out[i] = (world_rank, local, per_node[node], node_order.index(node))
    return out


class WorkerGroup:
    """Creates, addresses and tears down the worker actors of one attempt."""

    def __init__(
        self,
        scaling: ScalingConfig,
        env: dict[str, str] | None = None,
        bundles: list[dict[str, float]] | None = None,
        placement_strategy: str | None = None,
    ) -> None:
        self.scaling = scaling
        self.env = dict(env or {})
        self.bundles = bundles or [scaling.worker_resources()] * scaling.num_workers
        self.placement_strategy = placement_strategy or scaling.placement_strategy
        self.workers: list[WorkerHandle] = []
        self._pg: Any = None

    @property
    def world_size(self) -> int:
        """Number of workers."""
        return len(self.bundles)

    def start(self) -> None:
        """Reserve the resources as one placement group, start the actors, assign ranks."""
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self._pg = placement_group(self.bundles, strategy=self.placement_strategy)
        timeout = self.scaling.placement_timeout_s
        start = time.monotonic()
        ready, _ = ray.wait([self._pg.ready()], timeout=timeout)
        if not ready:
            available = ray.available_resources()
            self.shutdown()
            raise UserConfigError(
                f"could not reserve {self.world_size} workers with {self.bundles[0]} each "
                f"(strategy {self.placement_strategy}) within {timeout:.0f}s; the cluster has "
                f"{ {k: v for k, v in sorted(available.items()) if not k.startswith('node:')} } "
                "available. Lower ScalingConfig.num_workers/resources_per_worker or add nodes"
            )
        logger.info("Reserved %d worker slots in %.1fs", self.world_size, time.monotonic() - start)
        remote_cls: Any = ray.remote(TrainWorker)
        actors = []
        for index, bundle in enumerate(self.bundles):
            custom = {k: v for k, v in bundle.items() if k not in ("CPU", "GPU", "memory")}
            actors.append(
                remote_cls.options(
                    num_cpus=bundle.get("CPU", 0),
                    num_gpus=bundle.get("GPU", 0),
                    resources=custom or None,
                    max_concurrency=8,
                    runtime_env={"env_vars": self.env} if self.env else None,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        placement_group=self._pg, placement_group_bundle_index=index
                    ),
                ).remote()
            )
        infos = ray.get([a.node_info.remote() for a in actors])
        ranks = assign_ranks(infos)
        handles = []
        for actor, info, (world, local, local_size, node_rank) in zip(
            actors, infos, ranks, strict=True
        ):
            handles.append(
                WorkerHandle(
                    actor,
                    world,
                    info["node_id"],
                    info["ip"],
                    info["pid"],
                    local,
                    local_size,
                    node_rank,
                )
            )
        self.workers = sorted(handles, key=lambda h: h.rank)
        ray.get(
            [
                w.actor.set_env.remote(
                    {
                        "RANK": str(w.rank),
                        "WORLD_SIZE": str(self.world_size),
                        "LOCAL_RANK": str(w.local_rank),
                        "LOCAL_WORLD_SIZE": str(w.local_world_size),
                        "NODE_RANK": str(w.node_rank),
                        "GROUP_RANK": str(w.node_rank),
                    }
                )
                for w in self.workers
            ]
        )

    def execute(
        self, fn: Callable[..., Any], *args: Any, timeout: float | None = None
    ) -> list[Any]:
        """Run ``fn(*args)`` on every worker concurrently; results in rank order."""
        import ray

        return list(
            ray.get([w.actor.execute.remote(fn, *args) for w in self.workers], timeout=timeout)
        )

    def shutdown(self) -> None:
        """Kill the actors and release the placement group."""
        import ray
        from ray.util.placement_group import remove_placement_group

        for w in self.workers:
            with contextlib.suppress(Exception):  # already dead is fine
                ray.kill(w.actor, no_restart=True)
        self.workers = []
        if self._pg is not None:
            with contextlib.suppress(Exception):
                remove_placement_group(self._pg)
            self._pg = None
