"""A group of Ray actors that run the train function, one per worker, in a placement group.

TPU groups (``ScalingConfig.use_tpu``) reserve each slice as a unit instead; see
:meth:`WorkerGroup.start` and :func:`discover_tpu_slices`.
"""

from __future__ import annotations

import contextlib
import logging
import os
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
from trainer_runtime._worker import TrainWorker
from trainer_runtime.config import ScalingConfig
from trainer_runtime.errors import UserConfigError
from trainer_runtime.tpu import (
    RAY_TPU_RESOURCE,
    RAY_TPU_SLICE_NAME_LABEL,
    RAY_TPU_WORKER_ID_LABEL,
    TpuSliceShape,
)

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


#: ``MEGASCALE_PORT`` default (``DEFAULT_MEGASCALE_PORT`` in ray/_private/accelerators/tpu.py).
DEFAULT_MEGASCALE_PORT = 8081

#: Ray resources that never name a TPU slice.
_STANDARD_RESOURCES = frozenset({"CPU", "GPU", RAY_TPU_RESOURCE, "memory", "object_store_memory"})


def _is_standard_resource(name: str) -> bool:
    return (
        name in _STANDARD_RESOURCES
        or name.startswith(("node:", "accelerator_type:"))
        or (name.startswith("TPU-") and name.endswith("-head"))
        or "_group_" in name  # placement-group resources
    )


@dataclass(frozen=True)
class TpuSliceInfo:
    """A TPU slice seen in the cluster (see :func:`discover_tpu_slices`).

    Attributes:
        name: the slice's name: its Ray resource ``{name: 1}`` on every host (``TPU_NAME``).
        head_node_id: the node with the ``TPU-<pod type>-head`` resource (worker 0).
        node_ids: alive nodes of the slice with at least the chips per host.
    """

    name: str
    head_node_id: str
    node_ids: tuple[str, ...]


def tpu_slice_name_of_node(
    node: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]]
) -> str | None:
    """The name of the TPU slice ``node`` belongs to, or None.

    Ray labels TPU hosts with ``ray.io/tpu-slice-name`` and gives them a resource of that
    name; this uses the label when the node also has the resource. Without the label (a
    cluster that only declares resources, e.g. ``ray start --resources='{"TPU": 4,
    "my-slice": 1}'``) it is the node's non-standard resource of quantity 1 that the most TPU
    nodes share.
    """
    resources = node.get("Resources", {})
    label = node.get("Labels", {}).get(RAY_TPU_SLICE_NAME_LABEL)
    if label and resources.get(label):
        return str(label)
    candidates = [k for k, v in resources.items() if v == 1 and not _is_standard_resource(k)]
    tpu_nodes = [
        n for n in nodes if n.get("Alive", True) and n.get("Resources", {}).get(RAY_TPU_RESOURCE)
    ]
    counted = [(sum(1 for n in tpu_nodes if n["Resources"].get(c)), c) for c in candidates]
    counted = [(count, c) for count, c in counted if count > 0]
    if not counted:
        return None
    return max(counted, key=lambda item: (item[0], item[1]))[1]


def discover_tpu_slices(
    nodes: Sequence[Mapping[str, Any]], shape: TpuSliceShape
) -> list[TpuSliceInfo]:
    """The slices of ``shape``'s pod type among ``nodes`` (``ray.nodes()``), sorted by name.

    A slice is found through its worker 0 (the node with ``TPU-<pod type>-head``); its hosts
    are the alive nodes with its name resource and at least ``chips_per_host`` TPUs.
    """
    alive = [n for n in nodes if n.get("Alive", True)]
    out: list[TpuSliceInfo] = []
    for head in alive:
        if not head.get("Resources", {}).get(shape.head_resource):
            continue
        name = tpu_slice_name_of_node(head, alive)
        if name is None:
            continue
        members = tuple(
            sorted(
                n["NodeID"]
                for n in alive
                if n.get("Resources", {}).get(name)
                and n["Resources"].get(RAY_TPU_RESOURCE, 0) >= shape.chips_per_host
            )
        )
        out.append(TpuSliceInfo(name, head["NodeID"], members))
    return sorted(out, key=lambda s: s.name)


def describe_tpu_cluster(
    nodes: Sequence[Mapping[str, Any]], available: Mapping[str, float], shape: TpuSliceShape
) -> str:
    """What the cluster offers for ``shape``, for error messages."""
    alive = [n for n in nodes if n.get("Alive", True)]
    slices = discover_tpu_slices(alive, shape)
    parts = [
        f"{s.name!r} ({len(s.node_ids)}/{shape.hosts} hosts, {available.get(s.name, 0):g} free)"
        for s in slices
    ]
    total_tpu = sum(n.get("Resources", {}).get(RAY_TPU_RESOURCE, 0) for n in alive)
    heads: dict[str, float] = {}
    for n in alive:
        for k, v in n.get("Resources", {}).items():
            if k.startswith("TPU-") and k.endswith("-head"):
                heads[k] = heads.get(k, 0) + v
    head_text = ", ".join(
        f"{k}: {v:g} ({available.get(k, 0):g} free)" for k, v in sorted(heads.items())
    )
    return (
        f"{len(slices)} {shape.pod_type} slice(s)"
        + (f" [{', '.join(parts)}]" if parts else "")
        + f", TPU heads {{{head_text}}}, TPU chips {total_tpu:g} "
        f"({available.get(RAY_TPU_RESOURCE, 0):g} free) on "
        f"{sum(1 for n in alive if n.get('Resources', {}).get(RAY_TPU_RESOURCE))} TPU node(s)"
    )


@dataclass
class _SliceReservation:
    """One reserved TPU slice: its placement group and the bundles in host order."""

    slice_id: int
    name: str | None
    pg: Any
    bundles: list[dict[str, float]]
    #: Bundle indices in host order (worker 0 first).
    host_order: list[int]
    #: Whether the host order is the TPU worker id order (from Ray's node labels).
    worker_ids_known: bool
    head_pg: Any = None


def tpu_worker_env(
    workers: Sequence[tuple[int, str]],
    slice_names: Sequence[str | None],
    worker_ids_known: Sequence[bool],
    megascale_port: int = DEFAULT_MEGASCALE_PORT,
) -> list[tuple[dict[str, str], dict[str, str]]]:
    """Per-worker TPU environment: ``(always set, set only when absent)``, in rank order.

    ``workers`` are ``(slice id, ip)`` in rank order (slice-major, host order within a slice).

    * Always: ``TRAINJOB_TPU_SLICE_ID``, ``TRAINJOB_TPU_SLICE_NAME``, and with several slices
      ``MEGASCALE_NUM_SLICES``, ``MEGASCALE_SLICE_ID``, ``MEGASCALE_COORDINATOR_ADDRESS``
      (rank 0's IP) and ``MEGASCALE_PORT``. The MEGASCALE values overwrite what the host had,
      as Ray's JaxTrainer does (stale values from an earlier group make libtpu wait for slices
      that are gone).
    * When absent (GKE already sets them on TPU pods): ``TPU_NAME``, and when the host order
      is the TPU worker id order, ``TPU_WORKER_ID`` and ``TPU_WORKER_HOSTNAMES``.
    """
    num_slices = len(slice_names)
    coordinator = workers[0][1] if workers else ""
    hosts: dict[int, list[str]] = {}
    for slice_id, ip in workers:
        hosts.setdefault(slice_id, []).append(ip)
    seen: dict[int, int] = {}
    out: list[tuple[dict[str, str], dict[str, str]]] = []
    for slice_id, _ip in workers:
        host = seen.get(slice_id, 0)
        seen[slice_id] = host + 1
        name = slice_names[slice_id]
        always = {
            "TRAINJOB_TPU_SLICE_ID": str(slice_id),
            "TRAINJOB_TPU_SLICE_NAME": name or "",
        }
        if num_slices > 1:
            always.update(
                {
                    "MEGASCALE_NUM_SLICES": str(num_slices),
                    "MEGASCALE_SLICE_ID": str(slice_id),
                    "MEGASCALE_COORDINATOR_ADDRESS": coordinator,
                    "MEGASCALE_PORT": str(megascale_port),
                }
            )
        defaults: dict[str, str] = {}
        if name:
            defaults["TPU_NAME"] = name
        if worker_ids_known[slice_id]:
            defaults["TPU_WORKER_ID"] = str(host)
            defaults["TPU_WORKER_HOSTNAMES"] = ",".join(hosts[slice_id])
        out.append((always, defaults))
    return out


def _apply_env(always: dict[str, str], defaults: dict[str, str]) -> None:
    """Runs in a worker: set ``always``, and ``defaults`` where not already set."""
    os.environ.update(always)
    for key, value in defaults.items():
        os.environ.setdefault(key, value)


def _local_ranks(node_ids: Sequence[str]) -> list[tuple[int, int, int]]:
    """``(local rank, local world size, node rank)`` of workers given in rank order."""
    order: list[str] = []
    for node in node_ids:
        if node not in order:
            order.append(node)
    seen: dict[str, int] = {}
    out = []
    for node in node_ids:
        out.append((seen.get(node, 0), node_ids.count(node), order.index(node)))
        seen[node] = seen.get(node, 0) + 1
    return out


def _wait_pg(pg: Any, deadline: float) -> bool:
    import ray

    ready, _ = ray.wait([pg.ready()], timeout=max(0.0, deadline - time.monotonic()))
    return bool(ready)


def _bundle_nodes(pg: Any) -> dict[int, str]:
    from ray.util.placement_group import placement_group_table

    table = placement_group_table(pg)
    return {int(k): str(v) for k, v in table["bundles_to_node_id"].items()}


def _node_labels() -> str:
    """The labels of the alive nodes, for error messages."""
    import ray

    labels = [
        {k: v for k, v in (n.get("Labels") or {}).items() if k != "ray.io/node-id"}
        for n in ray.nodes()
        if n.get("Alive", True)
    ]
    return ", ".join(str(dict(sorted(x.items()))) for x in labels) or "none"


def _node_by_id(nodes: Sequence[Mapping[str, Any]], node_id: str) -> Mapping[str, Any]:
    for node in nodes:
        if node.get("NodeID") == node_id:
            return node
    return {"NodeID": node_id}


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
        self.bundles = bundles or [scaling.worker_resources()] * scaling.num_workers
        self.placement_strategy = placement_strategy or scaling.placement_strategy
        self.workers: list[WorkerHandle] = []
        #: Every actor created, ranked or not yet (what :meth:`shutdown` kills).
        self._actors: list[Any] = []
        self._pg: Any = None
        #: TPU groups: the reserved slices (in slice order) and all their placement groups.
        self.tpu_slices: list[_SliceReservation] = []
        self._pgs: list[Any] = []
        #: ``MEGASCALE_PORT`` of multi-slice TPU groups (Ray's default, 8081).
        self.megascale_port = DEFAULT_MEGASCALE_PORT
        #: Seconds the raylets keep the idle processes :meth:`shutdown` asks for the next
        #: group (``TRAINJOB_PRESTART_KEEP_ALIVE_S``; read here so a bad value fails early).
        self.prestart_keep_alive_s = prestart_keep_alive_s()

    @property
    def world_size(self) -> int:
        """Number of workers."""
        return len(self.bundles)

    def start(self) -> None:
        """Reserve the resources as one placement group, start the actors, assign ranks.

        The actors are created together with the placement group: Ray starts them as soon as
        their bundles are reserved, so the reservation and the actors' start overlap (a group
        that cannot be reserved in time is shut down, actors included).

        TPU groups reserve one placement group per slice first (see :meth:`_reserve_tpu`);
        no actor starts before every slice is reserved.
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
        ready, _ = ray.wait([self._pg.ready()], timeout=timeout)
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
        infos = ray.get([a.node_info.remote() for a in actors])
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
            self.tpu_slices.append(self._reserve_tpu(shape, slice_id, deadline))
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
        infos = ray.get([a.node_info.remote() for a in actors])
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
                w.actor.execute.remote(_apply_env, override, defaults)
                for w, (override, defaults) in zip(self.workers, envs, strict=True)
            ]
        )

    def _reserve_tpu(
        self, shape: TpuSliceShape, slice_id: int, deadline: float
    ) -> _SliceReservation:
        """Reserve one slice as one placement group of one bundle per host.

        Multi-host slices follow Ray's own TPU utilities (``ray/util/tpu.py``,
        ``SlicePlacementGroup`` / ``reserve_tpu_slice``, and the resources
        ``TPUAcceleratorManager.get_current_node_additional_resources`` advertises in
        ``ray/_private/accelerators/tpu.py``): the ``TPU-<pod type>-head`` resource picks a
        slice (it exists once per slice, on worker 0), and the slice's name resource
        ``{TPU_NAME: 1}``, on every host of that slice, pins the other hosts to it.

        * A slice already visible in the cluster whose name resource is free on all its hosts
          is reserved directly, in one placement group: bundle 0 asks for the head resource
          and the slice name, the others for the slice name.
        * Otherwise (no free slice yet: busy, or still being created by an autoscaler) a
          placement group asking for the head resource alone waits for any free slice's
          worker 0, as Ray's ``reserve_tpu_slice`` does; once granted, its node's slice name
          pins a second placement group of all hosts. The head reservation is held while the
          group lives, so no other reservation picks this slice's head.

        Single-host slices need no pinning: one bundle ``{"TPU": chips,
        "accelerator_type:TPU-V6E": 0.001}`` (Ray's accelerator-type resource keeps the
        generation right).
        """
        import ray
        from ray.util.placement_group import placement_group

        bundle = self.scaling.worker_resources()
        what = (
            f"TPU slice {slice_id + 1} of {self.scaling.num_slices} ({shape.generation} "
            f"{shape.topology}: pod type {shape.pod_type}, {shape.hosts} host(s) with {bundle} "
            "each)"
        )
        if not shape.multi_host:
            single = {**bundle, f"accelerator_type:{shape.ray_accelerator_type}": 0.001}
            pg = self._track(placement_group([single], strategy="STRICT_PACK"))
            if not _wait_pg(pg, deadline):
                raise self._tpu_timeout(
                    shape, what, f"no node with {single} free (a {shape.pod_type} TPU VM)"
                )
            nodes = ray.nodes()
            name = tpu_slice_name_of_node(_node_by_id(nodes, _bundle_nodes(pg)[0]), nodes)
            return _SliceReservation(slice_id, name, pg, [single], [0], False)

        used = {r.name for r in self.tpu_slices}
        nodes = ray.nodes()
        available = ray.available_resources()
        free = [
            s
            for s in discover_tpu_slices(nodes, shape)
            if s.name not in used
            and len(s.node_ids) >= shape.hosts
            and available.get(s.name, 0) >= shape.hosts
        ]
        head_pg = None
        if free:
            # The freest slice; ties by name, so placement is predictable.
            target = min(free, key=lambda s: (-available.get(s.name, 0), s.name))
            name = target.name
            bundles = [{**bundle, name: 1.0, shape.head_resource: 1.0}] + [
                {**bundle, name: 1.0} for _ in range(shape.hosts - 1)
            ]
        else:
            head_pg = self._track(placement_group([{shape.head_resource: 1.0}]))
            if not _wait_pg(head_pg, deadline):
                raise self._tpu_timeout(
                    shape,
                    what,
                    f"no free {shape.head_resource!r} resource (worker 0 of a free "
                    f"{shape.pod_type} slice) appeared",
                )
            nodes = ray.nodes()
            head_node = _node_by_id(nodes, _bundle_nodes(head_pg)[0])
            found = tpu_slice_name_of_node(head_node, nodes)
            if found is None:
                raise UserConfigError(
                    f"could not reserve {what}: node {head_node.get('NodeID')} has "
                    f"{shape.head_resource!r} but no slice-name resource (Ray advertises "
                    "{TPU_NAME: 1} on every host of a slice); set TPU_NAME on the slice's hosts"
                )
            name = found
            bundles = [{**bundle, name: 1.0} for _ in range(shape.hosts)]
        pg = self._track(placement_group(bundles, strategy="STRICT_SPREAD"))
        if not _wait_pg(pg, deadline):
            raise self._tpu_timeout(
                shape, what, f"slice {name!r} did not have {shape.hosts} free host(s)"
            )
        placed = _bundle_nodes(pg)
        nodes = ray.nodes()
        head_nodes = {n["NodeID"] for n in nodes if n.get("Resources", {}).get(shape.head_resource)}
        worker_ids: dict[int, int] = {}
        for index, node_id in placed.items():
            label = _node_by_id(nodes, node_id).get("Labels", {}).get(RAY_TPU_WORKER_ID_LABEL)
            if label is not None and str(label).isdigit():
                worker_ids[index] = int(label)
        known = len(worker_ids) == shape.hosts and len(set(worker_ids.values())) == shape.hosts
        if known:
            order = sorted(placed, key=lambda i: worker_ids[i])
        else:
            order = sorted(placed, key=lambda i: (placed[i] not in head_nodes, i))
        return _SliceReservation(slice_id, name, pg, bundles, order, known, head_pg)

    def _track(self, pg: Any) -> Any:
        self._pgs.append(pg)
        return pg

    def _tpu_timeout(self, shape: TpuSliceShape, what: str, why: str) -> UserConfigError:
        import ray

        timeout = self.scaling.placement_timeout_s
        summary = describe_tpu_cluster(ray.nodes(), ray.available_resources(), shape)
        return UserConfigError(
            f"could not reserve {what} within {timeout:.0f}s: {why}. The cluster has {summary}. "
            f"Add {shape.pod_type} slices (GKE: a node pool with {shape.node_selector()}), "
            "lower ScalingConfig.num_slices, or raise ScalingConfig.placement_timeout_s"
        )

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
