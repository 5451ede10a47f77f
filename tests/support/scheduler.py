"""A modelled GKE cluster for the real kube-scheduler: Node objects without kubelets.

:class:`GkeCluster` starts an :class:`~tests.support.envtest.EnvTest` with kube-scheduler
(``scheduler=True``) and kube-controller-manager, and registers Node objects that look like
the nodes of a GKE cluster (:data:`GKE_POOLS`):

* two TPU v6e node pools with a 4x4 topology, ``tpu-v6e-a`` and ``tpu-v6e-b``: 4 nodes each
  (``ct6e-standard-4t``: 4 chips per host, so one pool is one multi-host slice), labelled
  ``cloud.google.com/gke-nodepool``, ``cloud.google.com/gke-tpu-accelerator: tpu-v6e-slice``
  and ``cloud.google.com/gke-tpu-topology: 4x4``, with ``google.com/tpu: 4`` in capacity and
  allocatable and the taint ``google.com/tpu=present:NoSchedule`` that GKE puts on TPU nodes;
* a CPU pool ``default-pool`` (untainted: where pods without a node selector go);
* a spot pool ``val-spot`` labelled ``cloud.google.com/gke-spot: "true"`` (and
  ``cloud.google.com/gke-provisioning: spot``) with the taint
  ``cloud.google.com/gke-spot=true:NoSchedule``.

The label values are GKE's documented ones written out here, not imported from the operator,
so a wrong constant in the renderers shows up as a pod that does not schedule.

No kubelet runs behind these nodes: their status (capacity, allocatable, ``Ready``) is written
once through the ``status`` subresource and nothing updates it. The envtest's
kube-controller-manager runs without the node-lifecycle controller (see
:data:`tests.support.envtest.KCM_CONTROLLERS`), so the missing heartbeats never taint them
``node.kubernetes.io/unreachable``. The scheduler binds pods (``spec.nodeName``) and nothing
starts them: they stay ``Pending``. A bound pod is never really deleted either (the API server
waits for a kubelet to confirm), so tests free the nodes with :func:`force_delete_pods`.

Example::

    with GkeCluster() as gke:
        ...create pods or TrainJobs in gke.env...
        nodes = wait_for_bindings(gke.env, "ns", "trainjob.dev/name=job", count=4)
        assert {gke.pool_of(n) for n in nodes.values()} == {"tpu-v6e-a"}
"""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from tests.support.envtest import EnvTest, EnvTestError, ensure_assets
from tests.support.lifecycle import StartStop
from tests.support.waiting import wait_for

__all__ = [
    "GKE_NODEPOOL_LABEL",
    "GKE_POOLS",
    "GKE_SPOT_LABEL",
    "GKE_TPU_ACCELERATOR_LABEL",
    "GKE_TPU_TOPOLOGY_LABEL",
    "GkeCluster",
    "NodePool",
    "bindings",
    "cpu_pool",
    "force_delete_pods",
    "list_pods",
    "pod_scheduled",
    "register_nodes",
    "tpu_pool",
    "wait_for",
    "wait_for_bindings",
]

GKE_NODEPOOL_LABEL = "cloud.google.com/gke-nodepool"
GKE_TPU_ACCELERATOR_LABEL = "cloud.google.com/gke-tpu-accelerator"
GKE_TPU_TOPOLOGY_LABEL = "cloud.google.com/gke-tpu-topology"
GKE_SPOT_LABEL = "cloud.google.com/gke-spot"
GKE_PROVISIONING_LABEL = "cloud.google.com/gke-provisioning"
TPU_RESOURCE = "google.com/tpu"
ZONE = "us-east5-b"
REGION = "us-east5"

T = TypeVar("T")


@dataclass(frozen=True)
class NodePool:
    """A GKE node pool: ``size`` identical nodes ``gke-test-<name>-<i>``."""

    name: str
    size: int
    machine_type: str
    allocatable: Mapping[str, str]
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: Sequence[Mapping[str, str]] = ()

    def node_names(self) -> list[str]:
        return [f"gke-test-{self.name}-{i}" for i in range(self.size)]

    def node(self, index: int) -> dict[str, Any]:
        """The Node object (metadata and spec; the status is written separately)."""
        name = self.node_names()[index]
        labels = {
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "node.kubernetes.io/instance-type": self.machine_type,
            "topology.kubernetes.io/zone": ZONE,
            "topology.kubernetes.io/region": REGION,
            "cloud.google.com/machine-family": self.machine_type.split("-", 1)[0],
            GKE_NODEPOOL_LABEL: self.name,
            **self.labels,
        }
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": labels},
            "spec": {"taints": [dict(t) for t in self.taints]},
        }

    def node_status(self, index: int, address: str) -> dict[str, Any]:
        """A Ready status with this pool's capacity (= allocatable) and ``address``."""
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

        def condition(type_: str, status: str, reason: str) -> dict[str, str]:
            return {
                "type": type_,
                "status": status,
                "reason": reason,
                "message": "modelled node (no kubelet)",
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
            }

        return {
            "capacity": dict(self.allocatable),
            "allocatable": dict(self.allocatable),
            "conditions": [
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID"),
                condition("Ready", "True", "KubeletReady"),
            ],
            "addresses": [
                {"type": "InternalIP", "address": address},
                {"type": "Hostname", "address": self.node_names()[index]},
            ],
        }


def tpu_pool(
    name: str,
    topology: str = "4x4",
    accelerator: str = "tpu-v6e-slice",
    size: int = 4,
    chips_per_host: int = 4,
    machine_type: str = "ct6e-standard-4t",
) -> NodePool:
    """A TPU slice node pool: GKE's TPU labels, ``google.com/tpu`` and the TPU taint."""
    return NodePool(
        name=name,
        size=size,
        machine_type=machine_type,
        allocatable={
            "cpu": "180",
            "memory": "720Gi",
            "ephemeral-storage": "100Gi",
            "pods": "110",
            TPU_RESOURCE: str(chips_per_host),
        },
        labels={GKE_TPU_ACCELERATOR_LABEL: accelerator, GKE_TPU_TOPOLOGY_LABEL: topology},
        taints=({"key": TPU_RESOURCE, "value": "present", "effect": "NoSchedule"},),
    )


def cpu_pool(
    name: str, size: int, cpu: str = "16", memory: str = "64Gi", spot: bool = False
) -> NodePool:
    """A CPU node pool; ``spot``: GKE's spot label and the spot taint."""
    labels: dict[str, str] = {}
    taints: tuple[dict[str, str], ...] = ()
    if spot:
        labels = {GKE_SPOT_LABEL: "true", GKE_PROVISIONING_LABEL: "spot"}
        taints = ({"key": GKE_SPOT_LABEL, "value": "true", "effect": "NoSchedule"},)
    return NodePool(
        name=name,
        size=size,
        machine_type="n2-standard-16" if not spot else "n2-standard-8",
        allocatable={"cpu": cpu, "memory": memory, "ephemeral-storage": "100Gi", "pods": "110"},
        labels=labels,
        taints=taints,
    )


GKE_POOLS: tuple[NodePool, ...] = (
    tpu_pool("tpu-v6e-a"),
    tpu_pool("tpu-v6e-b"),
    cpu_pool("default-pool", 2, cpu="16", memory="64Gi"),
    cpu_pool("val-spot", 2, cpu="8", memory="32Gi", spot=True),
)
"""The modelled cluster: two v6e 4x4 slice pools, a CPU pool and a spot CPU pool (the
README's TPU walkthrough)."""


def _check(status: int, result: Any, what: str) -> Any:
    if status not in (200, 201):
        message = result.get("message", result) if isinstance(result, dict) else result
        raise EnvTestError(f"{what} failed ({status}): {message}")
    return result


def register_nodes(env: EnvTest, pools: Iterable[NodePool]) -> list[str]:
    """Create the pools' Node objects, mark them Ready (``status`` subresource) and leave them
    only their pool's taints (the API server adds ``node.kubernetes.io/not-ready`` to a new
    Node, which only the node-lifecycle controller would remove)."""
    names: list[str] = []
    for pool in pools:
        for index, name in enumerate(pool.node_names()):
            address = f"10.128.0.{len(names) + 10}"
            _check(*env.request("POST", "/api/v1/nodes", pool.node(index)), f"creating {name}")
            status = {"status": pool.node_status(index, address)}
            _check(
                *env.request("PATCH", f"/api/v1/nodes/{name}/status", status),
                f"marking {name} Ready",
            )
            # The TaintNodesByCondition admission plugin adds node.kubernetes.io/not-ready to
            # every new Node; the node-lifecycle controller (not running) would remove it once
            # the node is Ready. Put back the pool's own taints.
            _check(
                *env.request("PATCH", f"/api/v1/nodes/{name}", {"spec": pool.node(index)["spec"]}),
                f"removing the not-ready taint of {name}",
            )
            names.append(name)
    return names


# -------------------------------------------------------------------------------------------
# Pods
# -------------------------------------------------------------------------------------------


def list_pods(env: EnvTest, namespace: str, selector: str = "") -> list[dict[str, Any]]:
    """The pods of ``namespace`` matching the label ``selector`` (terminating ones too)."""
    query = f"?labelSelector={urllib.parse.quote(selector)}" if selector else ""
    result = _check(
        *env.request("GET", f"/api/v1/namespaces/{namespace}/pods{query}"), "listing pods"
    )
    return list(result.get("items") or [])


def pod_scheduled(pod: Mapping[str, Any]) -> dict[str, Any] | None:
    """The pod's ``PodScheduled`` condition (None before the scheduler has looked at it)."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled":
            return dict(condition)
    return None


def bindings(
    env: EnvTest, namespace: str, selector: str = "", include_terminating: bool = False
) -> dict[str, str | None]:
    """Pod name -> the node it is bound to (None: not bound yet)."""
    return {
        p["metadata"]["name"]: (p.get("spec") or {}).get("nodeName")
        for p in list_pods(env, namespace, selector)
        if include_terminating or not p["metadata"].get("deletionTimestamp")
    }


def _describe(pods: Iterable[Mapping[str, Any]]) -> str:
    lines = []
    for p in pods:
        scheduled = pod_scheduled(p) or {}
        lines.append(
            f"  {p['metadata']['name']}: node={(p.get('spec') or {}).get('nodeName')} "
            f"PodScheduled={scheduled.get('status')} {scheduled.get('reason', '')} "
            f"{scheduled.get('message', '')}".rstrip()
        )
    return "\n".join(lines) or "  (no pods)"


def wait_for_bindings(
    env: EnvTest, namespace: str, selector: str, count: int, timeout: float = 120.0
) -> dict[str, str]:
    """Wait until exactly ``count`` live pods match ``selector`` and all are bound; returns
    pod name -> node. The failure message lists each pod's node and ``PodScheduled``."""
    deadline = time.monotonic() + timeout
    while True:
        pods = [
            p
            for p in list_pods(env, namespace, selector)
            if not p["metadata"].get("deletionTimestamp")
        ]
        bound = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in pods}
        if len(bound) == count and all(bound.values()):
            return {name: str(node) for name, node in bound.items()}
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout:.0f}s waiting for {count} pods {selector!r} in "
                f"{namespace} to be bound; {len(bound)} pods:\n{_describe(pods)}"
            )
        time.sleep(0.5)


def force_delete_pods(env: EnvTest, namespace: str, timeout: float = 60.0) -> None:
    """Delete every pod of ``namespace`` at once (``gracePeriodSeconds=0``): a pod bound to a
    node without a kubelet is otherwise never removed and keeps holding the node's resources.
    Repeats until none is left (a controller may still be deleting or creating some)."""
    deadline = time.monotonic() + timeout
    while True:
        pods = list_pods(env, namespace)
        if not pods:
            return
        for pod in pods:
            env.request(
                "DELETE",
                f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}",
                {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0},
            )
        if time.monotonic() > deadline:
            raise AssertionError(
                f"pods of {namespace} still there after {timeout:.0f}s:\n{_describe(pods)}"
            )
        time.sleep(0.2)


# -------------------------------------------------------------------------------------------
# The cluster
# -------------------------------------------------------------------------------------------


class GkeCluster(StartStop):
    """An envtest API server with kube-scheduler and the Node objects of ``pools``.

    Args:
        assets: the Kubernetes binaries (default :func:`ensure_assets`); kube-scheduler and
            kube-controller-manager must be among them.
        pools: the node pools to register (default :data:`GKE_POOLS`).
    """

    def __init__(
        self, assets: Path | str | None = None, pools: Sequence[NodePool] = GKE_POOLS
    ) -> None:
        self.assets = Path(assets) if assets is not None else None
        self.pools = tuple(pools)
        self._pool_of = {name: pool.name for pool in self.pools for name in pool.node_names()}
        self._env: EnvTest | None = None

    @property
    def env(self) -> EnvTest:
        if self._env is None:
            raise EnvTestError("GkeCluster is not started")
        return self._env

    def pool(self, name: str) -> NodePool:
        return next(p for p in self.pools if p.name == name)

    def pool_of(self, node: str | None) -> str | None:
        """The node pool of ``node`` (None for None or an unknown node)."""
        return self._pool_of.get(node) if node else None

    def pools_where(self, label: str, value: str) -> list[str]:
        """Names of the pools whose nodes carry ``label: value``."""
        return [p.name for p in self.pools if p.labels.get(label) == value]

    def start(self) -> GkeCluster:
        assets = self.assets or ensure_assets()
        env = EnvTest(assets, controller_manager=True, scheduler=True)
        env.start()
        self._env = env
        try:
            register_nodes(env, self.pools)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self._env is not None:
            self._env.stop()
            self._env = None
