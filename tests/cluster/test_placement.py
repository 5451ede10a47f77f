"""GKE placement through the real kube-scheduler (:mod:`tests.support.scheduler`).

A kube-apiserver with kube-scheduler and kube-controller-manager, and Node objects modelling
the GKE cluster of the README's TPU walkthrough: two TPU v6e 4x4 node pools of 4 hosts
(``tpu-v6e-a``, ``tpu-v6e-b``), a CPU pool (``default-pool``) and a spot pool (``val-spot``),
each with GKE's labels, taints and ``google.com/tpu`` capacity. The operator runs in-process
(as in ``tests/k8s/test_operator.py``); the scheduler binds the pods it creates. No kubelet
runs behind the nodes, so no pod ever starts: the tests assert where pods are bound
(``spec.nodeName``) or why they are not (``PodScheduled``).
"""

from __future__ import annotations

import copy
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.k8s import conftest as k8s_conftest
from tests.support import default_cache_dir, ensure_assets
from tests.support.scheduler import (
    GKE_TPU_ACCELERATOR_LABEL,
    GkeCluster,
    force_delete_pods,
    list_pods,
    pod_scheduled,
    wait_for,
    wait_for_bindings,
)
from trainjob_operator.kube import KubeClient, KubeConfig
from trainjob_operator.operator_main import run_operator

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "crds" / "trainjob.dev_trainjobs.yaml"
TPU_EXAMPLE = yaml.safe_load((REPO / "examples" / "tpu-v6e-4x4.yaml").read_text())
TPU_POOLS = ("tpu-v6e-a", "tpu-v6e-b")
CPU_POOL = "default-pool"
SPOT_POOL = "val-spot"
BIND_TIMEOUT = 180.0
"""Seconds to wait for the scheduler to bind a job's pods (generous: a busy 2-core machine)."""


# ------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def gke() -> Iterator[GkeCluster]:
    """The API server with kube-scheduler and the modelled GKE node pools."""
    if os.environ.get(k8s_conftest.SKIP_ENV) == "1":
        pytest.skip(f"{k8s_conftest.SKIP_ENV}=1")
    if k8s_conftest._provision_error is not None:
        pytest.fail(
            f"provisioning the Kubernetes binaries failed:\n{k8s_conftest._provision_error}",
            pytrace=False,
        )
    assets = k8s_conftest._provisioned or ensure_assets()
    needed = ("kube-scheduler", "kube-controller-manager")
    if not all((assets / name).is_file() for name in needed):
        # $KUBEBUILDER_ASSETS (e.g. from setup-envtest) may hold only kube-apiserver and etcd.
        cache = default_cache_dir()
        if not all((cache / name).is_file() for name in (*needed, "kube-apiserver", "etcd")):
            pytest.skip(f"no kube-scheduler and kube-controller-manager in {assets} or {cache}")
        assets = cache
    with GkeCluster(assets) as cluster:
        assert set(cluster.pools_where(GKE_TPU_ACCELERATOR_LABEL, "tpu-v6e-slice")) == set(
            TPU_POOLS
        )
        cluster.env.apply_crd(CRD)
        yield cluster


@pytest.fixture(scope="module")
def kube(gke: GkeCluster) -> KubeClient:
    env = gke.env
    return KubeClient(KubeConfig(host=env.host, token=env.token, ca_file=str(env.ca_file)))


@pytest.fixture(scope="module")
def operator(gke: GkeCluster) -> Iterator[None]:
    """The operator, in-process, watching every namespace of this API server."""
    env = gke.env
    config = KubeConfig(host=env.host, token=env.token, ca_file=str(env.ca_file))
    stop, ready = threading.Event(), threading.Event()
    thread = threading.Thread(
        target=run_operator,
        args=(config, None),
        kwargs={"stop_flag": stop, "ready_flag": ready, "timer_interval": 1.0},
        daemon=True,
    )
    thread.start()
    assert ready.wait(120), "the operator did not become ready within 120s"
    try:
        yield
    finally:
        stop.set()
        thread.join(60)


@pytest.fixture
def namespace(
    request: pytest.FixtureRequest, gke: GkeCluster, kube: KubeClient, operator: None
) -> Iterator[str]:
    """A namespace of its own; afterwards its TrainJobs are deleted and its pods
    force-deleted, freeing the nodes: without a
    kubelet, a bound pod would otherwise stay Terminating and keep its node's TPUs."""
    name = k8s_conftest._namespace_name(request.node.name)
    namespace_body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    status, result = gke.env.request("POST", "/api/v1/namespaces", namespace_body)
    assert status == 201, result
    try:
        yield name
    finally:
        for job in kube.list("TrainJob", name):
            kube.delete("TrainJob", name, job["metadata"]["name"])
        wait_for("the TrainJobs deleted", lambda: not kube.list("TrainJob", name), timeout=120)
        force_delete_pods(gke.env, name)
        gke.env.request("DELETE", f"/api/v1/namespaces/{name}")


# ------------------------------------------------------------------------------- helpers


def tpu_job(
    name: str,
    *,
    topology: str = "4x4",
    num_slices: int = 1,
    validation_replicas: int | None = None,
    startup_deadline: int | None = None,
) -> dict[str, Any]:
    """The README's v6e 4x4 example, renamed; ``validation_replicas``: that many validation
    pods from the start (``pool.minReplicas``), None: no validation."""
    body = copy.deepcopy(TPU_EXAMPLE)
    body["metadata"] = {"name": name}
    spec = body["spec"]
    spec["scaling"].pop("numWorkers")  # derived from the topology and numSlices
    spec["scaling"]["tpu"].update(topology=topology, numSlices=num_slices)
    if validation_replicas is None:
        spec.pop("validation")
    else:
        spec["validation"]["pool"].update(
            minReplicas=validation_replicas, maxReplicas=max(validation_replicas, 1)
        )
    if startup_deadline is not None:
        spec["failure"]["startupDeadlineSeconds"] = startup_deadline
    return body


def create(kube: KubeClient, namespace: str, body: dict[str, Any]) -> None:
    assert kube.create(body, namespace) is not None


def job_selector(job: str, role: str | None = None) -> str:
    selector = f"trainjob.dev/name={job}"
    return f"{selector},trainjob.dev/role={role}" if role else selector


def pools_of(gke: GkeCluster, placed: dict[str, str]) -> set[str | None]:
    return {gke.pool_of(node) for node in placed.values()}


def assert_whole_pool(gke: GkeCluster, placed: dict[str, str], what: str) -> str:
    """The pods in ``placed`` occupy every node of exactly one TPU pool, one pod per node;
    returns the pool."""
    pools = pools_of(gke, placed)
    assert len(pools) == 1, f"{what} is spread over node pools {pools}: {placed}"
    pool = pools.pop()
    assert pool in TPU_POOLS, f"{what} is on {pool}, not a TPU pool: {placed}"
    assert sorted(placed.values()) == sorted(gke.pool(pool).node_names()), (
        f"{what} does not have one host on each node of {pool}: {placed}"
    )
    return pool


def slice_of(pod_name: str) -> str:
    """``<job>-s<k>-h<i>`` -> ``s<k>``."""
    return pod_name.rsplit("-", 2)[-2]


def job_status(kube: KubeClient, namespace: str, name: str) -> dict[str, Any]:
    obj = kube.get("TrainJob", namespace, name)
    assert obj is not None, f"TrainJob {namespace}/{name} is gone"
    return dict(obj.get("status") or {})


def unschedulable(gke: GkeCluster, namespace: str, selector: str, count: int) -> dict[str, str]:
    """Wait until ``count`` pods match and the scheduler has judged each unschedulable;
    returns pod name -> its ``PodScheduled`` message. Fails at once when one gets bound."""

    def check() -> dict[str, str] | None:
        pods = [
            p
            for p in list_pods(gke.env, namespace, selector)
            if not p["metadata"].get("deletionTimestamp")
        ]
        bound = {
            p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods if p["spec"].get("nodeName")
        }
        assert not bound, f"pods {selector!r} were bound: {bound}"
        judged = {p["metadata"]["name"]: pod_scheduled(p) or {} for p in pods}
        if len(judged) == count and all(
            c.get("status") == "False" and c.get("reason") == "Unschedulable"
            for c in judged.values()
        ):
            return {name: str(c.get("message", "")) for name, c in judged.items()}
        return None

    return wait_for(f"{count} pods {selector!r} judged Unschedulable", check, BIND_TIMEOUT)


# ------------------------------------------------------------------------------- tests


def test_each_role_lands_on_its_node_pool(
    gke: GkeCluster, kube: KubeClient, namespace: str
) -> None:
    """The README walkthrough's job: the slice's 4 hosts on the 4 nodes of one v6e 4x4 pool,
    the validation pods on the spot pool, the Ray head and the driver on the CPU pool (the
    only untainted one: they ask for no accelerator and tolerate no taint)."""
    create(kube, namespace, tpu_job("llm", validation_replicas=2))
    placed = wait_for_bindings(gke.env, namespace, job_selector("llm"), 8, BIND_TIMEOUT)

    role = {
        p["metadata"]["name"]: p["metadata"]["labels"]["trainjob.dev/role"]
        for p in list_pods(gke.env, namespace, job_selector("llm"))
    }
    workers = {n: node for n, node in placed.items() if role[n] == "worker"}
    assert len(workers) == 4, placed
    assert_whole_pool(gke, workers, "the slice")
    pools: dict[str, set[str | None]] = {}
    for name, node in placed.items():
        pools.setdefault(role[name], set()).add(gke.pool_of(node))
    assert pools == {
        "worker": pools["worker"],
        "validation": {SPOT_POOL},
        "head": {CPU_POOL},
        "driver": {CPU_POOL},
    }, placed
    # Bound but never started (no kubelet): the job waits in Starting.
    assert job_status(kube, namespace, "llm").get("phase") in ("Pending", "Starting")


def test_two_slices_land_on_two_pools(gke: GkeCluster, kube: KubeClient, namespace: str) -> None:
    """``numSlices: 2``: each slice whole on one pool, the two slices on different pools."""
    create(kube, namespace, tpu_job("multi", num_slices=2))
    workers = wait_for_bindings(
        gke.env, namespace, job_selector("multi", "worker"), 8, BIND_TIMEOUT
    )
    slices: dict[str, dict[str, str]] = {}
    for name, node in workers.items():
        slices.setdefault(slice_of(name), {})[name] = node
    assert sorted(slices) == ["s0", "s1"], workers
    pools = {s: assert_whole_pool(gke, placed, f"slice {s}") for s, placed in slices.items()}
    assert pools["s0"] != pools["s1"], f"both slices on {pools['s0']}: {workers}"


def test_two_trainjobs_created_together_get_a_pool_each(
    gke: GkeCluster, kube: KubeClient, namespace: str
) -> None:
    """Two one-slice jobs at once, their hosts in the scheduling queue together: each slice
    takes one pool whole (they never split one pool between them, neither slice fitting)."""
    create(kube, namespace, tpu_job("left"))
    create(kube, namespace, tpu_job("right"))
    pools = {
        job: assert_whole_pool(
            gke,
            wait_for_bindings(gke.env, namespace, job_selector(job, "worker"), 4, BIND_TIMEOUT),
            f"the slice of {job}",
        )
        for job in ("left", "right")
    }
    assert pools["left"] != pools["right"], pools


def test_a_slice_never_shares_a_pool_with_another_jobs_slice(
    gke: GkeCluster, kube: KubeClient, namespace: str
) -> None:
    """Slices of different TrainJobs never share a node pool (JobSet's exclusive placement).

    ``first`` fills one pool. ``second`` fills the other and is deleted; one of its hosts is
    left Terminating (its TPUs busy, as while a real pod shuts down), so 3 nodes of that pool
    are free. ``third`` must not start its slice there, next to another slice, where its
    fourth host cannot fit: it waits, and takes the pool of ``first``, whole, once that job
    is deleted.
    """
    env = gke.env
    create(kube, namespace, tpu_job("first"))
    first = wait_for_bindings(env, namespace, job_selector("first", "worker"), 4, BIND_TIMEOUT)
    first_pool = assert_whole_pool(gke, first, "the slice of first")
    create(kube, namespace, tpu_job("second"))
    second = wait_for_bindings(env, namespace, job_selector("second", "worker"), 4, BIND_TIMEOUT)
    second_pool = assert_whole_pool(gke, second, "the slice of second")
    assert second_pool != first_pool

    kube.delete("TrainJob", namespace, "second")
    wait_for("second deleted", lambda: kube.get("TrainJob", namespace, "second") is None, 120)
    # Its pods go (as the garbage collector would delete them, without waiting for it): one
    # host is left shutting down, Terminating (bound to a node without a kubelet, it stays).
    leftover = sorted(second)[0]
    for pod in list_pods(env, namespace, job_selector("second")):
        name = pod["metadata"]["name"]
        grace = {} if name == leftover else {"gracePeriodSeconds": 0}
        env.request(
            "DELETE",
            f"/api/v1/namespaces/{namespace}/pods/{name}",
            {"kind": "DeleteOptions", "apiVersion": "v1", **grace},
        )
    left = list_pods(env, namespace, job_selector("second"))
    assert [(p["metadata"]["name"], p["spec"]["nodeName"]) for p in left] == [
        (leftover, second[leftover])
    ], left
    assert left[0]["metadata"].get("deletionTimestamp"), left

    create(kube, namespace, tpu_job("third"))
    messages = unschedulable(gke, namespace, job_selector("third", "worker"), 4)
    assert all("anti-affinity" in m for m in messages.values()), messages

    kube.delete("TrainJob", namespace, "first")
    wait_for("first deleted", lambda: kube.get("TrainJob", namespace, "first") is None, 120)
    for pod in list_pods(env, namespace, job_selector("first")):
        env.request(
            "DELETE",
            f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}",
            {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0},
        )
    third = wait_for_bindings(env, namespace, job_selector("third", "worker"), 4, BIND_TIMEOUT)
    assert assert_whole_pool(gke, third, "the slice of third") == first_pool


def test_unavailable_topology_stays_pending_and_fails_at_the_startup_deadline(
    gke: GkeCluster, kube: KubeClient, namespace: str
) -> None:
    """A v6e 4x8 slice (8 hosts): no pool has that topology. The hosts stay Pending with
    ``PodScheduled=False`` (``Unschedulable``); at ``startupDeadlineSeconds`` the job fails
    with ``StartupDeadlineExceeded`` and a message carrying the scheduler's reason."""
    deadline = 40  # long enough to see the pods judged Unschedulable first
    create(kube, namespace, tpu_job("big", topology="4x8", startup_deadline=deadline))
    messages = unschedulable(gke, namespace, job_selector("big", "worker"), 8)
    assert all("node affinity" in m or "node selector" in m for m in messages.values()), messages
    status = job_status(kube, namespace, "big")
    assert status.get("phase") in ("Pending", "Starting"), status

    def failed_status() -> dict[str, Any] | None:
        current = job_status(kube, namespace, "big")
        return current if current.get("phase") == "Failed" else None

    status = wait_for("the job Failed", failed_status, timeout=deadline + BIND_TIMEOUT)
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "StartupDeadlineExceeded", failed
    assert f"startupDeadlineSeconds={deadline}" in failed["message"], failed
    assert "Unschedulable" in failed["message"], failed
    assert any(m in failed["message"] for m in messages.values()), (failed, messages)
    assert any(name in failed["message"] for name in messages), (failed, messages)
    assert status["message"] == failed["message"]
