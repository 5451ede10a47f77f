"""A group of Ray actors that run the train function, one per worker, in a placement group.

TPU groups (``ScalingConfig.use_tpu``) reserve each slice as a unit instead; see
:meth:`WorkerGroup.start` and :mod:`trainer_runtime._tpu_slices`, which finds and reserves
the slices.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trainer_runtime._raylet import (
    idle_worker_requests,
    prestart_keep_alive_s,
    send_idle_worker_requests,
)
from trainer_runtime._tpu_slices import (
    DEFAULT_MEGASCALE_PORT,
    SliceReservation,
    apply_env,
    reserve_slice,
    tpu_worker_env,
)
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
    #: TPU groups: index of the worker's slice (0 .. num_slices-1) and the slice's name
    #: (its Ray resource / ``TPU_NAME``; None when unknown, e.g. a single-host slice).
    slice_id: int | None = None
    slice_name: str | None = None


def assign_ranks(infos: list[dict[str, Any]]) -> list[tuple[int, int, int, int]]:
    """Give each worker (by position in ``infos``) its (world, local, local size, node) ranks.

    Workers on one node get consecutive world ranks; nodes are ordered by the
    first worker placed on them. Returns a list indexed like ``infos``.
    """
    node_order: dict[str, int] = {}  # node id -> its position (first placement first)
    for info in infos:
        node_order.setdefault(info["node_id"], len(node_order))
    order = sorted(range(len(infos)), key=lambda i: (node_order[infos[i]["node_id"]], i))
    per_node = Counter(info["node_id"] for info in infos)
    local_seen: dict[str, int] = {}
    out: list[tuple[int, int, int, int]] = [(0, 0, 0, 0)] * len(infos)
    for world_rank, i in enumerate(order):
        node = infos[i]["node_id"]
        local = local_seen.get(node, 0)
        local_seen[node] = local + 1
        out[i] = (world_rank, local, per_node[node], node_order[node])
    return out


def _local_ranks(node_ids: Sequence[str]) -> list[tuple[int, int, int]]:
    """``(local rank, local world size, node rank)`` of workers given in rank order."""
    order: dict[str, int] = {}
    for node in node_ids:
        order.setdefault(node, len(order))
    counts = Counter(node_ids)
    seen: dict[str, int] = {}
    out = []
    for node in node_ids:
        out.append((seen.get(node, 0), counts[node], order[node]))
        seen[node] = seen.get(node, 0) + 1
    return out


def _node_labels() -> str:
    """The labels of the alive nodes, for error messages."""
    import ray

    labels = [
        {k: v for k, v in (n.get("Labels") or {}).items() if k != "ray.io/node-id"}
        for n in ray.nodes()
        if n.get("Alive", True)
    ]
    return ", ".join(str(dict(sorted(x.items()))) for x in labels) or "none"


def prestarted_count(infos: Sequence[Mapping[str, Any]], requested: float) -> int:
    """How many workers (:meth:`TrainWorker.node_info` answers) run in a process Ray had
    started before they were asked for: one its raylet prestarted (``raylet_prestarted``;
    that includes a node that joined after ``requested``, whose raylet prestarted its
    processes then) or one that started before ``requested`` (epoch seconds; the nodes'
    clocks are assumed in step to well under the seconds a process takes to start)."""
    return sum(
        1
        for info in infos
        if info.get("raylet_prestarted") or (info.get("process_started") or requested) < requested
    )


START_CHECK_S = 1.0
"""How often :meth:`WorkerGroup.start` calls its ``check_while_starting`` while it waits."""


class WorkerGroup:
    """Creates, addresses and tears down the worker actors of one attempt."""

    def __init__(
        self,
        scaling: ScalingConfig,
        env: dict[str, str] | None = None,
        bundles: list[dict[str, float]] | None = None,
        placement_strategy: str | None = None,
        runtime_env: dict[str, Any] | None = None,
        preload: Sequence[str] = (),
    ) -> None:
        self.scaling = scaling
        self.env = dict(env or {})
        #: Modules each worker imports in the background from its start (``Backend.preload``).
        self.preload = tuple(preload)
        #: Ray ``runtime_env`` of the worker actors (``RunConfig.worker_runtime_env``); ``env``
        #: is merged into its ``env_vars``.
        self.runtime_env = dict(runtime_env or {})
        # One group has a fixed size (an elastic config's size comes through for_group).
        self.bundles = bundles or [scaling.worker_resources()] * scaling.max_workers
        self.placement_strategy = placement_strategy or scaling.placement_strategy
        self.workers: list[WorkerHandle] = []
        #: Every actor created, ranked or not yet (what :meth:`shutdown` kills).
        self._actors: list[Any] = []
        self._pg: Any = None
        #: TPU groups: the reserved slices (in slice order) and all their placement groups.
        self.tpu_slices: list[SliceReservation] = []
        self._pgs: list[Any] = []
        #: ``MEGASCALE_PORT`` of multi-slice TPU groups (Ray's default, 8081).
        self.megascale_port = DEFAULT_MEGASCALE_PORT
        #: Seconds the raylets keep the idle processes :meth:`shutdown` asks for the next
        #: group (``TRAINJOB_PRESTART_KEEP_ALIVE_S``; read here so a bad value fails early).
        self.prestart_keep_alive_s = prestart_keep_alive_s()
        #: Called about every :data:`START_CHECK_S` while :meth:`start` waits (for the
        #: reservation, for the actors): raising from it abandons the start (the group is shut
        #: down, the error goes on). The controller stops there on its driver's own notice.
        self.check_while_starting: Callable[[], None] | None = None

    @property
    def world_size(self) -> int:
        """Number of workers."""
        return len(self.bundles)

    def start(self) -> None:
        """Reserve the resources as one placement group, start the actors, assign ranks.

        The actors are created together with the placement group: Ray starts them as soon as
        their bundles are reserved, so the reservation and the actors' start overlap (a group
        that cannot be reserved in time is shut down, actors included).

        TPU groups reserve one placement group per slice first (see
        :func:`~trainer_runtime._tpu_slices.reserve_slice`); no actor starts before every slice
        is reserved.
        """
        if self.scaling.tpu_shape is not None:  # TPU slices (a single host needs none)
            try:
                self._start_tpu()
            except BaseException:
                self.shutdown()  # no half-started slice keeps its reservation
                raise
            return
        import ray
        from ray.util.placement_group import placement_group

        selectors = self.scaling.label_selector_per_worker()
        self._pg = placement_group(
            self.bundles, strategy=self.placement_strategy, bundle_label_selector=selectors
        )
        timeout = self.scaling.placement_timeout_s
        start = time.monotonic()
        requested = time.time()
        actors = self._create_actors([(self._pg, i, b) for i, b in enumerate(self.bundles)])
        try:
            ready = self._wait_checking([self._pg.ready()], timeout)
        except BaseException:
            self.shutdown()
            raise
        if not ready:
            available = ray.available_resources()
            self.shutdown()
            labels = ""
            if selectors is not None:
                seen = sorted({str(sorted(s.items())) for s in selectors})
                labels = (
                    f" on nodes with the labels of ScalingConfig.label_selector ({', '.join(seen)};"
                    f" the alive nodes have {_node_labels()})"
                )
            raise UserConfigError(
                f"could not reserve {self.world_size} workers with {self.bundles[0]} each "
                f"(strategy {self.placement_strategy}){labels} within {timeout:.0f}s; the "
                "cluster has "
                f"{ {k: v for k, v in sorted(available.items()) if not k.startswith('node:')} } "
                "available. Lower ScalingConfig.num_workers/resources_per_worker, change "
                "label_selector, or add nodes"
            )
        logger.info("Reserved %d worker slots in %.1fs", self.world_size, time.monotonic() - start)
        infos_refs = [a.node_info.remote() for a in actors]
        try:
            self._wait_checking(infos_refs, None)
        except BaseException:
            self.shutdown()
            raise
        infos = ray.get(infos_refs)
        logger.info(
            "Started %d worker actors in %.1fs, %d in Ray worker processes started before "
            "they were asked for (prestarted)",
            len(infos),
            time.monotonic() - start,
            prestarted_count(infos, requested),
        )
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
        self._set_rank_env()

    def _create_actors(self, placements: list[tuple[Any, int, dict[str, float]]]) -> list[Any]:
        """One worker actor per ``(placement group, bundle index, bundle)``, in that order."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        remote_cls: Any = ray.remote(TrainWorker)
        actors = []
        for pg, index, bundle in placements:
            custom = {k: v for k, v in bundle.items() if k not in ("CPU", "GPU", "memory")}
            actors.append(
                remote_cls.options(
                    num_cpus=bundle.get("CPU", 0),
                    num_gpus=bundle.get("GPU", 0),
                    resources=custom or None,
                    max_concurrency=8,
                    runtime_env=self._actor_runtime_env(),
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        placement_group=pg, placement_group_bundle_index=index
                    ),
                ).remote(self.preload)
            )
        self._actors.extend(actors)
        return actors

    def _actor_runtime_env(self) -> dict[str, Any] | None:
        """``runtime_env`` with ``env`` merged into its ``env_vars`` (None when empty)."""
        runtime_env = dict(self.runtime_env)
        env_vars = {**dict(runtime_env.get("env_vars") or {}), **self.env}
        if env_vars:
            runtime_env["env_vars"] = env_vars
        return runtime_env or None

    def _set_rank_env(self) -> None:
        import ray

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

    def _wait_pg_checking(self, pg: Any, deadline: float) -> bool:
        """:meth:`_wait_checking` for one placement group, up to ``deadline`` (monotonic)."""
        return self._wait_checking([pg.ready()], max(0.0, deadline - time.monotonic()))

    def _wait_checking(self, refs: list[Any], timeout: float | None) -> bool:
        """``ray.wait`` for every one of ``refs`` (up to ``timeout`` seconds; None: no limit),
        calling :attr:`check_while_starting` about every :data:`START_CHECK_S`; whether all
        are ready."""
        import ray

        deadline = None if timeout is None else time.monotonic() + timeout
        pending = list(refs)
        while pending:
            if self.check_while_starting is not None:
                self.check_while_starting()
            step = START_CHECK_S
            if deadline is not None:
                step = min(step, deadline - time.monotonic())
                if step <= 0:
                    return False
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=step)
        return True

    # -- TPU slices -------------------------------------------------------------------------
    def _start_tpu(self) -> None:
        """Reserve every slice (all or nothing), then start one actor per TPU host.

        World ranks are slice-major: slice 0's hosts first, each slice in its hosts' TPU worker
        id order when Ray's ``ray.io/tpu-worker-id`` labels give it, else worker 0 (the host
        with the head resource) first.
        """
        import ray

        shape = self.scaling.tpu_shape
        assert shape is not None
        start = time.monotonic()
        deadline = start + self.scaling.placement_timeout_s
        self.tpu_slices = []
        for slice_id in range(self.scaling.num_slices):
            taken = [r.name for r in self.tpu_slices]
            self.tpu_slices.append(
                reserve_slice(
                    self.scaling,
                    shape,
                    slice_id,
                    deadline,
                    taken,
                    self._track,
                    wait_ready=self._wait_pg_checking,
                )
            )
        logger.info(
            "Reserved %d TPU slice(s) of %s (%s) in %.1fs: %s",
            len(self.tpu_slices),
            shape.pod_type,
            shape.topology,
            time.monotonic() - start,
            ", ".join(r.name or "?" for r in self.tpu_slices),
        )
        placements = [
            (r.pg, index, r.bundles[index]) for r in self.tpu_slices for index in r.host_order
        ]
        actors = self._create_actors(placements)
        infos_refs = [a.node_info.remote() for a in actors]
        self._wait_checking(infos_refs, None)
        infos = ray.get(infos_refs)
        local = _local_ranks([info["node_id"] for info in infos])
        slice_of = [r for r in self.tpu_slices for _ in r.host_order]
        self.workers = [
            WorkerHandle(
                actor,
                rank,
                info["node_id"],
                info["ip"],
                info["pid"],
                local_rank,
                local_size,
                node_rank,
                slice_id=reservation.slice_id,
                slice_name=reservation.name,
            )
            for rank, (actor, info, (local_rank, local_size, node_rank), reservation) in enumerate(
                zip(actors, infos, local, slice_of, strict=True)
            )
        ]
        self._set_rank_env()
        envs = tpu_worker_env(
            [(w.slice_id or 0, w.ip) for w in self.workers],
            [r.name for r in self.tpu_slices],
            [r.worker_ids_known for r in self.tpu_slices],
            megascale_port=self.megascale_port,
        )
        ray.get(
            [
                w.actor.execute.remote(apply_env, override, defaults)
                for w, (override, defaults) in zip(self.workers, envs, strict=True)
            ]
        )

    def _track(self, pg: Any) -> Any:
        self._pgs.append(pg)
        return pg

    def execute(
        self, fn: Callable[..., Any], *args: Any, timeout: float | None = None
    ) -> list[Any]:
        """Run ``fn(*args)`` on every worker concurrently; results in rank order."""
        import ray

        return list(
            ray.get([w.actor.execute.remote(fn, *args) for w in self.workers], timeout=timeout)
        )

    def shutdown(self, *, prestart_successor: bool = False) -> None:
        """Kill the actors and release the placement group.

        ``prestart_successor``: then ask the raylets of the nodes the workers ran on for as
        many idle Ray worker processes as the group had there, for a next group of this
        driver (a restart, or the next ``fit()``) to start in (see :mod:`trainer_runtime._raylet`).
        Asked in the background, only where such a group could use them (see
        :meth:`successor_processes`).
        """
        import ray
        from ray.util.placement_group import remove_placement_group

        successor = (
            idle_worker_requests(self.successor_processes(), self.prestart_keep_alive_s)
            if prestart_successor
            else []
        )
        for actor in self._actors:
            with contextlib.suppress(Exception):  # already dead is fine
                ray.kill(actor, no_restart=True)
        self._actors = []
        self.workers = []
        if self._pg is not None:
            with contextlib.suppress(Exception):
                remove_placement_group(self._pg)
            self._pg = None
        for pg in self._pgs:
            with contextlib.suppress(Exception):
                remove_placement_group(pg)
        self._pgs = []
        self.tpu_slices = []
        if successor:
            threading.Thread(  # the raylets only: no call into this process's Ray worker
                target=send_idle_worker_requests,
                args=(successor,),
                name="prestart-successor",
                daemon=True,
            ).start()

    def successor_processes(self) -> dict[str, int]:
        """Idle processes worth asking for a next group: Ray node id -> this group's ranked
        workers there. None (empty) when the actors run with their own ``runtime_env``
        (``worker_runtime_env``, or TPU hosts' per-host variables): Ray starts a new process
        for a ``runtime_env`` that an idle process lacks (the job's own is checked by
        :func:`~trainer_runtime._raylet.idle_worker_requests`)."""
        if self.tpu_slices or self._actor_runtime_env():
            return {}
        return dict(Counter(worker.node_id for worker in self.workers))
