"""TPU slices in a Ray cluster: finding them, reserving one, and their hosts' environment.

Ray (``ray/_private/accelerators/tpu.py``) advertises on every TPU host the chips (``TPU``),
a resource named after the slice (``{TPU_NAME: 1}``), on the slice's worker 0 a
``TPU-<pod type>-head`` resource, and node labels with the slice name and the worker id
(see :mod:`trainer_runtime.tpu`). From these, this module finds the slices of a shape
(:func:`discover_tpu_slices`), reserves one as a placement group of one bundle per host
(:func:`reserve_slice`) and computes each worker's TPU environment
(:func:`tpu_worker_env`). :class:`~trainer_runtime.worker_group.WorkerGroup` starts the
actors in the reserved bundles.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trainer_runtime.config import ScalingConfig
from trainer_runtime.errors import UserConfigError
from trainer_runtime.tpu import (
    RAY_TPU_RESOURCE,
    RAY_TPU_SLICE_NAME_LABEL,
    RAY_TPU_WORKER_ID_LABEL,
    TpuSliceShape,
)

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
class SliceReservation:
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


def apply_env(always: dict[str, str], defaults: dict[str, str]) -> None:
    """Runs in a worker: set ``always``, and ``defaults`` where not already set."""
    os.environ.update(always)
    for key, value in defaults.items():
        os.environ.setdefault(key, value)


def wait_pg_ready(pg: Any, deadline: float) -> bool:
    """Wait until ``pg`` is reserved or ``deadline`` (``time.monotonic()``) passes; whether it
    is reserved. The default ``wait_ready`` of :func:`reserve_slice`."""
    import ray

    ready, _ = ray.wait([pg.ready()], timeout=max(0.0, deadline - time.monotonic()))
    return bool(ready)


def _bundle_nodes(pg: Any) -> dict[int, str]:
    from ray.util.placement_group import placement_group_table

    table = placement_group_table(pg)
    return {int(k): str(v) for k, v in table["bundles_to_node_id"].items()}


def _node_by_id(nodes: Sequence[Mapping[str, Any]], node_id: str) -> Mapping[str, Any]:
    for node in nodes:
        if node.get("NodeID") == node_id:
            return node
    return {"NodeID": node_id}


def reserve_slice(
    scaling: ScalingConfig,
    shape: TpuSliceShape,
    slice_id: int,
    deadline: float,
    taken: Collection[str | None],
    track: Callable[[Any], Any],
    wait_ready: Callable[[Any, float], bool] = wait_pg_ready,
) -> SliceReservation:
    """Reserve one slice as one placement group of one bundle per host.

    ``taken``: the names of the slices this group reserved already; ``track`` is called
    with every placement group created, before it is waited for, so that the group can
    remove it whatever happens next; ``wait_ready(pg, deadline)`` waits for a placement group
    (the worker group passes one that also looks for its driver's stop notice every second,
    so a driver told to stop does not sit out the placement timeout).

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

    bundle = scaling.worker_resources()
    what = (
        f"TPU slice {slice_id + 1} of {scaling.num_slices} ({shape.generation} "
        f"{shape.topology}: pod type {shape.pod_type}, {shape.hosts} host(s) with {bundle} "
        "each)"
    )
    if not shape.multi_host:
        single = {**bundle, f"accelerator_type:{shape.ray_accelerator_type}": 0.001}
        pg = track(placement_group([single], strategy="STRICT_PACK"))
        if not wait_ready(pg, deadline):
            raise _timeout(
                scaling, shape, what, f"no node with {single} free (a {shape.pod_type} TPU VM)"
            )
        nodes = ray.nodes()
        name = tpu_slice_name_of_node(_node_by_id(nodes, _bundle_nodes(pg)[0]), nodes)
        return SliceReservation(slice_id, name, pg, [single], [0], False)

    nodes = ray.nodes()
    available = ray.available_resources()
    free = [
        s
        for s in discover_tpu_slices(nodes, shape)
        if s.name not in taken
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
        head_pg = track(placement_group([{shape.head_resource: 1.0}]))
        if not wait_ready(head_pg, deadline):
            raise _timeout(
                scaling,
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
    pg = track(placement_group(bundles, strategy="STRICT_SPREAD"))
    if not wait_ready(pg, deadline):
        raise _timeout(
            scaling, shape, what, f"slice {name!r} did not have {shape.hosts} free host(s)"
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
    return SliceReservation(slice_id, name, pg, bundles, order, known, head_pg)


def _timeout(scaling: ScalingConfig, shape: TpuSliceShape, what: str, why: str) -> UserConfigError:
    """The error of a slice not reserved in time, with what the cluster offers."""
    import ray

    timeout = scaling.placement_timeout_s
    summary = describe_tpu_cluster(ray.nodes(), ray.available_resources(), shape)
    return UserConfigError(
        f"could not reserve {what} within {timeout:.0f}s: {why}. The cluster has {summary}. "
        f"Add {shape.pod_type} slices (GKE: a node pool with {shape.node_selector()}), "
        "lower ScalingConfig.num_slices, or raise ScalingConfig.placement_timeout_s"
    )
