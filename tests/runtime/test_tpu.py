"""The TPU model (table, spellings, ScalingConfig checks) and TPU slice placement.

There are no TPUs here: every TPU in this file is FAKED. The scheduling tests add Ray nodes
(``ray start``, one per fake TPU host) to the local test cluster that advertise TPU
resources, in the two ways a real cluster can end up with them:

* slice ``slice-a`` (v6e 4x4, 4 hosts) and ``single-c`` (v6e 2x4, 1 host): ``--resources
  '{"TPU": N}'`` plus the environment GKE gives a TPU pod (``TPU_NAME``, ``TPU_WORKER_ID``,
  ``TPU_ACCELERATOR_TYPE``, ``TPU_TOPOLOGY``), so Ray's own TPU code
  (``TPUAcceleratorManager``) derives ``{"slice-a": 1}`` on every host, ``TPU-v6e-16-head``
  on worker 0 and the ``ray.io/tpu-*`` labels, as it does on a real TPU host;
* slice ``slice-b`` (v6e 4x4, 4 hosts): the resources declared directly, ``{"TPU": 4,
  "slice-b": 1, "TPU-v6e-16-head": 1}`` on its worker 0 and ``{"TPU": 4, "slice-b": 1}`` on
  the others, with no TPU environment and no labels.

JAX runs on CPU on these nodes (``JAX_PLATFORMS=cpu``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import trainjob_operator.api.tpu as api_tpu
from tests.runtime.jax_workloads import collective_train, worker_probe
from tests.support.ports import own_ray_port_flags
from tests.support.waiting import wait_for
from trainer_runtime import RunConfig, ScalingConfig, TrainingFailedError
from trainer_runtime._tpu_slices import (
    discover_tpu_slices,
    tpu_slice_name_of_node,
    tpu_worker_env,
)
from trainer_runtime.errors import UserConfigError
from trainer_runtime.jax import JaxTrainer
from trainer_runtime.tpu import (
    TPU_GENERATIONS,
    get_generation,
    normalize_accelerator_type,
    slice_shape,
)
from trainer_runtime.worker_group import WorkerGroup

V6E_4X4: dict[str, Any] = {"use_tpu": True, "topology": "4x4", "accelerator_type": "TPU-V6E"}

# ----------------------------------------------------------------------------- the TPU table


@pytest.mark.parametrize(
    ("spelling", "canonical"),
    [
        ("v6e", "v6e"),
        ("TPU-V6E", "v6e"),
        ("V6E", "v6e"),
        ("tpu-v6e-slice", "v6e"),
        ("v5e", "v5e"),
        ("TPU-V5LITEPOD", "v5e"),
        ("v5litepod", "v5e"),
        ("tpu-v5-lite-podslice", "v5e"),
        ("TPU-V5P", "v5p"),
        ("v5p", "v5p"),
        ("TPU-V4", "v4"),
        (" v4 ", "v4"),
    ],
)
def test_accelerator_type_spellings(spelling: str, canonical: str) -> None:
    assert normalize_accelerator_type(spelling) == canonical
    assert get_generation(spelling).name == canonical


def test_unknown_accelerator_type_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown TPU accelerator type 'TPU-V3'") as info:
        normalize_accelerator_type("TPU-V3")
    for name in ("v6e", "v5e", "v5p", "v4", "TPU-V5LITEPOD"):
        assert name in str(info.value)


@pytest.mark.parametrize(
    ("accel", "topology", "hosts", "chips_per_host", "pod_type", "head", "ray_type"),
    [
        ("TPU-V6E", "4x4", 4, 4, "v6e-16", "TPU-v6e-16-head", "TPU-V6E"),
        ("v6e", "2x4", 1, 8, "v6e-8", "TPU-v6e-8-head", "TPU-V6E"),
        ("v6e", "16x16", 64, 4, "v6e-256", "TPU-v6e-256-head", "TPU-V6E"),
        ("TPU-V5LITEPOD", "4x8", 8, 4, "v5litepod-32", "TPU-v5litepod-32-head", "TPU-V5LITEPOD"),
        ("v5e", "1x1", 1, 1, "v5litepod-1", "TPU-v5litepod-1-head", "TPU-V5LITEPOD"),
        ("v5p", "2x2x2", 2, 4, "v5p-16", "TPU-v5p-16-head", "TPU-V5P"),
        ("v4", "2x2x1", 1, 4, "v4-8", "TPU-v4-8-head", "TPU-V4"),
        ("v4", "4x4x4", 16, 4, "v4-128", "TPU-v4-128-head", "TPU-V4"),
    ],
)
def test_slice_shapes_and_ray_names(
    accel: str,
    topology: str,
    hosts: int,
    chips_per_host: int,
    pod_type: str,
    head: str,
    ray_type: str,
) -> None:
    shape = slice_shape(accel, topology)
    assert (shape.hosts, shape.chips_per_host, shape.pod_type) == (hosts, chips_per_host, pod_type)
    assert shape.head_resource == head
    assert shape.ray_accelerator_type == ray_type


def test_table_agrees_with_rays_own_tpu_helpers() -> None:
    """Chips per host and pod types match Ray's (ray/_private/accelerators/tpu.py)."""
    from ray._private.accelerators.tpu import (
        get_chips_per_host,
        infer_tpu_pod_type_from_topology,
    )

    for gen in TPU_GENERATIONS.values():
        for topology in gen.topologies:
            shape = slice_shape(gen.name, topology)
            assert shape.chips_per_host == get_chips_per_host(topology, gen.pod_type_prefix)
            assert shape.pod_type == infer_tpu_pod_type_from_topology(
                topology, gen.ray_accelerator_type
            )


def test_operator_api_reexports_the_one_table() -> None:
    import trainer_runtime.tpu as runtime_tpu

    assert api_tpu.TPU_GENERATIONS is runtime_tpu.TPU_GENERATIONS
    assert api_tpu.slice_shape is runtime_tpu.slice_shape
    assert api_tpu.TpuSliceShape is runtime_tpu.TpuSliceShape
    for name in api_tpu.__all__:
        assert getattr(api_tpu, name) is getattr(runtime_tpu, name)


# ----------------------------------------------------------------------- ScalingConfig checks


def test_tpu_scaling_config_derives_hosts_and_resources() -> None:
    scaling = ScalingConfig(num_workers=4, **V6E_4X4)
    assert scaling.tpu_shape is not None and scaling.tpu_shape.hosts == 4
    assert scaling.worker_resources() == {"TPU": 4.0}
    with_cpu = ScalingConfig(
        num_workers=8, num_slices=2, resources_per_worker={"cpu": 8}, **V6E_4X4
    )
    assert with_cpu.worker_resources() == {"CPU": 8, "TPU": 4.0}
    assert ScalingConfig(
        num_workers=1, use_tpu=True, topology="2x4", accelerator_type="v6e"
    ).worker_resources() == {"TPU": 8.0}
    assert ScalingConfig(num_workers=0, **V6E_4X4).local_mode  # local mode on one TPU VM
    assert ScalingConfig(num_workers=2).tpu_shape is None
    assert ScalingConfig(num_workers=2).worker_resources() == {"CPU": 1.0}  # unchanged


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"num_workers": 3, **V6E_4X4},
            # Ray Train 2.60's sentence first, then ours.
            r"^The configured `num_workers` \(3\) must be a multiple of 4 for the specified "
            r"topology \(4x4\)\. TPU workloads typically require symmetric resource "
            r"distribution across all slices to function correctly\. "
            r"ScalingConfig.num_workers=3 is not a multiple of the 4 host\(s\) of a v6e 4x4 "
            r"slice.*use num_workers=4 for num_slices=1",
        ),
        (
            {"num_workers": 8, "num_slices": 1, **V6E_4X4},
            r"num_workers=8 but 1 slice\(s\) of v6e 4x4 have 4 host\(s\) x 1 = 4.*"
            r"use num_workers=4, or num_slices=2",
        ),
        (
            {"num_workers": 1, "use_tpu": True, "accelerator_type": "v3"},
            r"unknown TPU accelerator type 'v3'; valid types: v6e, v5e, v5p, v4",
        ),
        (
            {"num_workers": 1, "use_tpu": True, "num_slices": 2},
            r"num_slices=2 needs a topology",
        ),
        (
            {"num_workers": 4, "num_slices": 2, **V6E_4X4},
            r"num_workers=4 but 2 slice\(s\).*= 8.*use num_workers=8, or num_slices=1",
        ),
        (
            {"num_workers": 4, "use_tpu": True, "topology": "4x2", "accelerator_type": "v6e"},
            r"topology '4x2' is not a valid v6e topology; valid v6e topologies: "
            r"1x1, 2x2, 2x4, 4x4, 4x8, 8x8, 8x16, 16x16",
        ),
        (
            {"num_workers": 4, "use_tpu": True, "topology": "4x4", "accelerator_type": "v5p"},
            r"valid v5p topologies: 2x2x1, 2x2x2, 2x2x4",
        ),
        (
            {"num_workers": 4, "use_tpu": True, "accelerator_type": "v6e"},
            r"needs topology; valid v6e topologies: 1x1, 2x2, 2x4, 4x4",
        ),
        (
            {"num_workers": 4, "use_tpu": True, "topology": "4x4"},
            r"needs accelerator_type; valid types: v6e, v5e, v5p, v4",
        ),
        (
            {"num_workers": 4, "use_tpu": True, "topology": "4x4", "accelerator_type": "v3"},
            r"unknown TPU accelerator type 'v3'; valid types: v6e, v5e, v5p, v4",
        ),
        ({"num_workers": 4, "use_gpu": True, **V6E_4X4}, r"use_gpu and use_tpu are mutually"),
        (
            {"num_workers": 4, "resources_per_worker": {"TPU": 8}, **V6E_4X4},
            r"resources_per_worker\['TPU'\]=8 but each v6e 4x4 host has 4 chip\(s\).*use 4",
        ),
        ({"num_workers": 4, "topology": "4x4"}, r"topology only apply to TPUs; set use_tpu=True"),
        ({"num_workers": 4, "num_slices": 2}, r"num_slices only apply to TPUs"),
    ],
)
def test_inconsistent_tpu_requests_are_rejected(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ScalingConfig(**kwargs)


# ------------------------------------------------------------------ pure placement helpers


def _node(node_id: str, resources: dict[str, float], labels: dict[str, str] | None = None) -> Any:
    return {"NodeID": node_id, "Alive": True, "Resources": resources, "Labels": labels or {}}


def test_slice_discovery_from_labels_and_from_resources_alone() -> None:
    shape = slice_shape("v6e", "4x4")
    nodes = [
        _node("h", {"CPU": 6, "memory": 1, "node:__internal_head__": 1}),
        _node(
            "a0",
            {"CPU": 1, "TPU": 4, "a": 1, "TPU-v6e-16-head": 1, "accelerator_type:TPU-V6E": 1},
            {"ray.io/tpu-slice-name": "a", "ray.io/tpu-worker-id": "0"},
        ),
        *[_node(f"a{i}", {"TPU": 4, "a": 1}, {"ray.io/tpu-slice-name": "a"}) for i in (1, 2, 3)],
        _node("b0", {"TPU": 4, "b": 1, "TPU-v6e-16-head": 1, "validation": 1, "node:x": 1}),
        _node("b1", {"TPU": 4, "b": 1}),
        _node("b2", {"TPU": 2, "b": 1}),  # too few chips for a 4x4 host
        _node("c0", {"TPU": 8, "c": 1, "TPU-v6e-8-head": 1}),  # another pod type
    ]
    slices = discover_tpu_slices(nodes, shape)
    assert [(s.name, s.head_node_id, s.node_ids) for s in slices] == [
        ("a", "a0", ("a0", "a1", "a2", "a3")),
        ("b", "b0", ("b0", "b1")),
    ]
    assert tpu_slice_name_of_node(nodes[-1], nodes) == "c"
    assert tpu_slice_name_of_node(nodes[0], nodes) is None


def test_tpu_worker_env_for_two_slices() -> None:
    workers = [(0, "10.0.0.1"), (0, "10.0.0.2"), (1, "10.0.1.1"), (1, "10.0.1.2")]
    envs = tpu_worker_env(workers, ["a", "b"], [True, False])
    always, defaults = envs[3]
    assert always == {
        "TRAINJOB_TPU_SLICE_ID": "1",
        "TRAINJOB_TPU_SLICE_NAME": "b",
        "MEGASCALE_NUM_SLICES": "2",
        "MEGASCALE_SLICE_ID": "1",
        "MEGASCALE_COORDINATOR_ADDRESS": "10.0.0.1",
        "MEGASCALE_PORT": "8081",
    }
    assert defaults == {"TPU_NAME": "b"}  # slice b's worker ids are unknown: not guessed
    assert envs[1][1] == {
        "TPU_NAME": "a",
        "TPU_WORKER_ID": "1",
        "TPU_WORKER_HOSTNAMES": "10.0.0.1,10.0.0.2",
    }
    single = tpu_worker_env([(0, "10.0.0.1")], [None], [False])
    assert single == [({"TRAINJOB_TPU_SLICE_ID": "0", "TRAINJOB_TPU_SLICE_NAME": ""}, {})]


# ------------------------------------------------------------ placement on fake TPU nodes


@dataclass
class FakeTpuCluster:
    """The fake TPU hosts' node ids, by slice name, worker 0 first."""

    slices: dict[str, list[str]]

    def slice_of(self, node_id: str) -> str:
        return next(name for name, nodes in self.slices.items() if node_id in nodes)


def _start_fake_host(
    address: str, resources: dict[str, float], env: dict[str, str], log: Path
) -> tuple[Any, int]:
    """The ``ray start --block`` process of a fake TPU host, and its node manager port (how
    ``ray.nodes()`` tells its node from the others)."""
    ray_bin = Path(sys.executable).with_name("ray")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("TPU_", "MEGASCALE_"))}
    ports = own_ray_port_flags()
    [node_manager_port] = [
        int(flag.split("=", 1)[1]) for flag in ports if flag.startswith("--node-manager-port=")
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                str(ray_bin),
                "start",
                f"--address={address}",
                "--num-cpus=0",  # TPU workers ask for no CPU; other tests' tasks stay away
                f"--resources={json.dumps(resources)}",
                "--block",
                "--disable-usage-stats",
                *ports,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**clean, **env},
        )
    return proc, node_manager_port


FAKE_HOST_STARTS = 4
"""How many times a fake TPU host that exits before its node joined is started (each time with
new ports) before the fixture gives up, showing its output."""


def _fake_hosts() -> list[tuple[dict[str, float], dict[str, str]]]:
    """(resources, environment) of each fake TPU host."""
    hosts: list[tuple[dict[str, float], dict[str, str]]] = []
    for worker_id in range(4):  # Ray derives the slice resources from the GKE-style env
        env = {
            "TPU_NAME": "slice-a",
            "TPU_WORKER_ID": str(worker_id),
            "TPU_ACCELERATOR_TYPE": "v6e-16",
            "TPU_TOPOLOGY": "4x4",
        }
        hosts.append(({"TPU": 4}, env))
    hosts.append(({"TPU": 4, "slice-b": 1, "TPU-v6e-16-head": 1}, {}))
    hosts += [({"TPU": 4, "slice-b": 1}, {}) for _ in range(3)]
    single = {
        "TPU_NAME": "single-c",
        "TPU_WORKER_ID": "0",
        "TPU_ACCELERATOR_TYPE": "v6e-8",
        "TPU_TOPOLOGY": "2x4",
    }
    hosts.append(({"TPU": 8}, single))
    return hosts


@pytest.fixture(scope="module")
def fake_tpu_cluster(ray_cluster: Any) -> Iterator[FakeTpuCluster]:
    """Nine FAKE TPU hosts joined to the test cluster: slices slice-a, slice-b and single-c.

    Each has ports of its own, and each starts once the one before has joined (Ray names a
    node's sockets in the session folder by the first free index, so two ``ray start`` at the
    same moment take the same name and one crashes; and registrations at once overload the
    GCS under load).
    """
    ray = ray_cluster
    address = ray.get_runtime_context().gcs_address

    def members() -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for name in ("slice-a", "slice-b", "single-c"):
            nodes = [n for n in ray.nodes() if n["Alive"] and n["Resources"].get(name)]
            heads = [n for n in nodes if any(k.endswith("-head") for k in n["Resources"])]
            out[name] = [n["NodeID"] for n in heads + [n for n in nodes if n not in heads]]
        return out

    hosts = _fake_hosts()
    logs = Path(tempfile.mkdtemp(prefix="fake-tpu-hosts-"))
    procs: dict[int, Any] = {}  # host index -> its latest process
    node_manager_ports: dict[int, int] = {}  # host index -> its latest node's port
    starts = [0] * len(hosts)

    def joined(port: int) -> bool:
        return any(n["Alive"] and n["NodeManagerPort"] == port for n in ray.nodes())

    def start(index: int) -> None:
        """Start host ``index`` and wait until its node joined the cluster, so that the
        next host starts only then: under load (the empty-cache run's builds beside it) nine
        registrations at once overloaded the GCS, and Ray gives a node 30 s to register
        before its ``ray start`` exits ("The current node timed out during startup"). A host
        that exits first (that timeout, or a port another process took between our pick and
        its bind) is started again, with new ports, up to :data:`FAKE_HOST_STARTS` times."""
        while True:
            starts[index] += 1
            log = logs / f"host-{index}-start-{starts[index]}.log"
            proc, port = _start_fake_host(address, *hosts[index], log)
            procs[index], node_manager_ports[index] = proc, port

            def joined_or_exited(proc: Any = proc, port: int = port) -> bool:
                return proc.poll() is not None or joined(port)

            wait_for(
                f"fake TPU host {hosts[index][0]} joined",
                joined_or_exited,
                timeout=120,
                every=0.2,
            )
            if proc.poll() is None:
                return
            if starts[index] >= FAKE_HOST_STARTS:
                raise RuntimeError(
                    f"fake TPU host {index} exited before joining, {starts[index]} times; its "
                    f"output: {log.read_text(errors='replace')[-3000:]}"
                )

    def all_joined() -> bool:
        # A host is started again when its process exited, and also when the GCS declared
        # its node dead while ``ray start --block`` still runs (under load a raylet can miss
        # its health checks; its process notices only later).
        dead_ports = {n["NodeManagerPort"] for n in ray.nodes() if not n["Alive"]}
        for index, proc in list(procs.items()):
            if proc.poll() is None and node_manager_ports[index] in dead_ports:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            if proc.poll() is not None:
                start(index)
        return [len(v) for v in members().values()] == [4, 4, 1]

    try:
        for index in range(len(hosts)):
            start(index)
        wait_for("the nine fake TPU hosts joined", all_joined, timeout=180, every=0.5)
        found = members()
        assert [len(v) for v in found.values()] == [4, 4, 1], found
        yield FakeTpuCluster(found)
    finally:
        for proc in procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)


def test_fake_hosts_advertise_what_ray_advertises_on_tpu_hosts(
    fake_tpu_cluster: FakeTpuCluster,
) -> None:
    """Ray's TPU code turned the GKE-style env of slice-a into the resources and labels."""
    import ray

    by_id = {n["NodeID"]: n for n in ray.nodes()}
    head = by_id[fake_tpu_cluster.slices["slice-a"][0]]
    assert head["Resources"]["TPU-v6e-16-head"] == 1 and head["Resources"]["slice-a"] == 1
    assert head["Labels"]["ray.io/tpu-slice-name"] == "slice-a"
    assert head["Labels"]["ray.io/tpu-worker-id"] == "0"
    others = [by_id[n] for n in fake_tpu_cluster.slices["slice-a"][1:]]
    assert all("TPU-v6e-16-head" not in n["Resources"] for n in others)
    assert sorted(n["Labels"]["ray.io/tpu-worker-id"] for n in others) == ["1", "2", "3"]


def _group_probe(scaling: ScalingConfig) -> tuple[WorkerGroup, list[dict[str, Any]]]:
    group = WorkerGroup(scaling, env={"JAX_PLATFORMS": "cpu"})
    group.start()
    return group, group.execute(worker_probe, timeout=60)


def test_one_slice_group_lands_on_one_slice_in_worker_id_order(
    fake_tpu_cluster: FakeTpuCluster,
) -> None:
    """A 4-host v6e 4x4 group on the FAKE TPU hosts: all 4 workers on one slice."""
    group, probes = _group_probe(ScalingConfig(num_workers=4, **V6E_4X4))
    try:
        nodes = [p["node_id"] for p in probes]
        assert nodes == [w.node_id for w in group.workers]
        assert len(set(nodes)) == 4
        [name] = {fake_tpu_cluster.slice_of(n) for n in nodes}  # ONE slice
        assert name == "slice-a"  # both slices are free: the first by name
        assert nodes[0] == fake_tpu_cluster.slices[name][0]  # rank 0 on the slice's worker 0
        for rank, probe in enumerate(probes):
            env = probe["env"]
            assert env["RANK"] == str(rank) and env["WORLD_SIZE"] == "4"
            assert env["TPU_WORKER_ID"] == str(rank)  # ranks follow the TPU worker ids
            assert env["TPU_NAME"] == env["TRAINJOB_TPU_SLICE_NAME"] == "slice-a"
            assert env["TRAINJOB_TPU_SLICE_ID"] == "0"
            assert env["MEGASCALE_NUM_SLICES"] is None  # one slice: no megascale
        assert [w.slice_id for w in group.workers] == [0, 0, 0, 0]
    finally:
        group.shutdown()


def test_a_busy_slice_is_skipped_and_a_declared_one_is_used(
    fake_tpu_cluster: FakeTpuCluster,
) -> None:
    """One host of slice-a is taken: the whole group goes to slice-b (declared resources)."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    blocker = placement_group([{"TPU": 4, "slice-a": 1}])
    ray.get(blocker.ready(), timeout=60)
    try:
        group, probes = _group_probe(ScalingConfig(num_workers=4, **V6E_4X4))
        try:
            nodes = [p["node_id"] for p in probes]
            assert {fake_tpu_cluster.slice_of(n) for n in nodes} == {"slice-b"}
            assert sorted(nodes) == sorted(fake_tpu_cluster.slices["slice-b"])
            assert nodes[0] == fake_tpu_cluster.slices["slice-b"][0]  # the head host first
            for probe in probes:
                env = probe["env"]
                assert env["TPU_NAME"] == env["TRAINJOB_TPU_SLICE_NAME"] == "slice-b"
                assert env["TPU_WORKER_ID"] is None  # unknown without Ray's labels: not guessed
        finally:
            group.shutdown()
    finally:
        remove_placement_group(blocker)


def test_head_reservation_first_when_no_free_slice_is_known(
    fake_tpu_cluster: FakeTpuCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As when an autoscaler is still adding the slice (FAKE TPU hosts): head first, then slice."""
    from trainer_runtime import _tpu_slices

    monkeypatch.setattr(_tpu_slices, "discover_tpu_slices", lambda nodes, shape: [])
    group, probes = _group_probe(ScalingConfig(num_workers=4, **V6E_4X4))
    try:
        nodes = [p["node_id"] for p in probes]
        [name] = {fake_tpu_cluster.slice_of(n) for n in nodes}
        assert sorted(nodes) == sorted(fake_tpu_cluster.slices[name])
        assert nodes[0] == fake_tpu_cluster.slices[name][0]  # rank 0 on the head host
        assert group.tpu_slices[0].head_pg is not None  # the head stays reserved meanwhile
        assert {p["env"]["TRAINJOB_TPU_SLICE_NAME"] for p in probes} == {name}
    finally:
        group.shutdown()


def test_two_slices_get_megascale_env(fake_tpu_cluster: FakeTpuCluster) -> None:
    """num_slices=2 on the two FAKE v6e 4x4 slices: slice-major ranks, MEGASCALE_* per worker."""
    group, probes = _group_probe(ScalingConfig(num_workers=8, num_slices=2, **V6E_4X4))
    try:
        slices = [fake_tpu_cluster.slice_of(p["node_id"]) for p in probes]
        assert slices[:4] == [slices[0]] * 4 and slices[4:] == [slices[4]] * 4
        assert {slices[0], slices[4]} == {"slice-a", "slice-b"}
        rank0_ip = group.workers[0].ip
        for rank, probe in enumerate(probes):
            env = probe["env"]
            assert env["MEGASCALE_NUM_SLICES"] == "2"
            assert env["MEGASCALE_SLICE_ID"] == env["TRAINJOB_TPU_SLICE_ID"] == str(rank // 4)
            assert env["MEGASCALE_COORDINATOR_ADDRESS"] == rank0_ip
            assert env["MEGASCALE_PORT"] == "8081"
            assert env["TRAINJOB_TPU_SLICE_NAME"] == slices[rank]
        assert [w.slice_id for w in group.workers] == [0] * 4 + [1] * 4
    finally:
        group.shutdown()


def test_single_host_slice(fake_tpu_cluster: FakeTpuCluster) -> None:
    """A v6e 2x4 (one 8-chip host) lands on the FAKE 8-chip host."""
    scaling = ScalingConfig(num_workers=1, use_tpu=True, topology="2x4", accelerator_type="v6e")
    group, [probe] = _group_probe(scaling)
    try:
        assert probe["node_id"] == fake_tpu_cluster.slices["single-c"][0]
        assert probe["env"]["TRAINJOB_TPU_SLICE_NAME"] == "single-c"
    finally:
        group.shutdown()


def test_jax_on_a_fake_v6e_4x4_slice(fake_tpu_cluster: FakeTpuCluster, tmp_path: Path) -> None:
    """JaxTrainer with use_tpu: 4 JAX processes (CPU) on the 4 hosts of one fake slice."""
    out = tmp_path / "out"
    out.mkdir()
    result = JaxTrainer(
        collective_train,
        train_loop_config={"out_dir": str(out)},
        scaling_config=ScalingConfig(num_workers=4, **V6E_4X4),
        run_config=RunConfig(
            name="fake-tpu",
            storage_path=str(tmp_path / "s"),
            worker_env={"JAX_PLATFORMS": "cpu"},  # no real TPU: JAX runs on CPU
        ),
    ).fit()
    records = [json.loads(p.read_text()) for p in sorted(out.glob("rank_*.json"))]
    assert [r["rank"] for r in records] == [0, 1, 2, 3]
    assert len({fake_tpu_cluster.slice_of(r["node_id"]) for r in records}) == 1
    assert len({r["node_id"] for r in records}) == 4
    for r in records:
        assert r["process_count"] == 4 and r["platform"] == "cpu"
        assert r["gathered"] == [1.0, 2.0, 3.0, 4.0] and r["psum"] == 10.0
        assert r["env"]["JAX_PLATFORMS"] == "cpu"
    assert result.metrics is not None and result.metrics["psum"] == 10.0


def test_impossible_requests_fail_with_a_clear_timeout_error(
    fake_tpu_cluster: FakeTpuCluster, tmp_path: Path
) -> None:
    """3 slices when the FAKE cluster has 2, or a shape it lacks: a timeout naming both sides."""
    import ray

    with pytest.raises(UserConfigError) as info:
        WorkerGroup(
            ScalingConfig(num_workers=12, num_slices=3, placement_timeout_s=3, **V6E_4X4)
        ).start()
    text = str(info.value)
    assert "could not reserve TPU slice 3 of 3 (v6e 4x4: pod type v6e-16, 4 host(s)" in text
    assert "within 3s: no free 'TPU-v6e-16-head' resource" in text
    assert (
        "2 v6e-16 slice(s) ['slice-a' (4/4 hosts, 0 free), 'slice-b' (4/4 hosts, 0 free)]" in text
    )
    assert "raise ScalingConfig.placement_timeout_s" in text
    # Nothing stays reserved: both slices are free again.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        available = ray.available_resources()
        if available.get("slice-a") == 4 and available.get("slice-b") == 4:
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"slices still reserved: {ray.available_resources()}")

    with pytest.raises(TrainingFailedError) as failed:
        JaxTrainer(
            collective_train,
            scaling_config=ScalingConfig(
                num_workers=16,
                use_tpu=True,
                topology="8x8",
                accelerator_type="v6e",
                placement_timeout_s=2,
            ),
            run_config=RunConfig(name="too-big", storage_path=str(tmp_path)),
        ).fit()
    text = str(failed.value)
    assert "could not reserve TPU slice 1 of 1 (v6e 8x8: pod type v6e-64, 16 host(s)" in text
    assert "no free 'TPU-v6e-64-head' resource" in text
    assert "0 v6e-64 slice(s), TPU heads {TPU-v6e-16-head: 2 (2 free), TPU-v6e-8-head: 1" in text


def test_a_stop_while_waiting_for_a_slice_ends_the_wait_at_once(
    fake_tpu_cluster: FakeTpuCluster,
) -> None:
    """A third slice the FAKE cluster lacks, with a long placement timeout: the group's
    ``check_while_starting`` (the driver's stop notice) is called every second while it waits
    for the slice, and raising from it ends the start within seconds, every slice released."""
    import ray

    class Stop(Exception):
        pass

    calls: list[float] = []

    def stop_on_the_sixth_call() -> None:
        calls.append(time.monotonic())
        if len(calls) >= 6:
            raise Stop

    group = WorkerGroup(
        ScalingConfig(num_workers=12, num_slices=3, placement_timeout_s=120, **V6E_4X4)
    )
    group.check_while_starting = stop_on_the_sixth_call
    started = time.monotonic()
    with pytest.raises(Stop):
        group.start()
    assert time.monotonic() - started < 30  # not the 120 s placement timeout
    # Called again and again while the third slice is waited for (about once a second).
    assert len(calls) == 6 and calls[-1] - calls[0] >= 2.0, calls
    wait_for(
        "both slices free again",
        lambda: (
            ray.available_resources().get("slice-a") == 4
            and ray.available_resources().get("slice-b") == 4
        ),
        timeout=30,
    )


def test_the_slice_count_is_inferred_from_the_workers_as_ray_does() -> None:
    assert ScalingConfig(num_workers=8, **V6E_4X4).num_slices == 2
    assert ScalingConfig(num_workers=4, **V6E_4X4).num_slices == 1
    assert ScalingConfig(num_workers=8, num_slices=2, **V6E_4X4).num_slices == 2  # still accepted
    assert ScalingConfig(num_workers=2).num_slices == 1


def test_one_worker_on_a_single_tpu_host_needs_no_topology() -> None:
    single = ScalingConfig(num_workers=1, use_tpu=True)  # as in Ray Train
    assert single.tpu_shape is None and single.num_slices == 1
    assert single.worker_resources() == {"TPU": 1.0}
    typed = ScalingConfig(num_workers=1, use_tpu=True, accelerator_type="TPU-V6E")
    assert typed.worker_resources() == {"TPU": 1.0}  # as Ray Train: no accelerator_type resource
    custom = ScalingConfig(num_workers=1, use_tpu=True, resources_per_worker={"TPU": 4, "CPU": 2})
    assert custom.worker_resources() == {"CPU": 2, "TPU": 4.0}
