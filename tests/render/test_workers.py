"""Worker pods: TPU slices (single host, multi-host, multislice), GPU and CPU workers."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.render.helpers import (
    UID,
    container,
    env,
    example,
    labels,
    make_job,
    ray_auth_env,
    ray_start_args,
    tpu_job,
)
from trainjob_operator.render import render_worker_pods
from trainjob_operator.render.ray import WORKER_PRESTART_ENV_NAMES

REPO = Path(__file__).resolve().parents[2]
TPU_TOLERATION = {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}
V6E_SELECTOR = {
    "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
    "cloud.google.com/gke-tpu-topology": "4x4",
}


def _ray_start_args(pod: dict[str, Any]) -> list[str]:
    """Arguments the pod's node process passes to ``ray start``."""
    return ray_start_args(pod)


# --------------------------------------------------------------------------- TPU v6e 4x4


def test_tpu_v6e_4x4_one_pod_per_host_with_chips_selectors_and_toleration() -> None:
    pods = render_worker_pods(tpu_job("4x4"), uid=UID)
    assert [p["metadata"]["name"] for p in pods] == [f"tpu-s0-h{i}" for i in range(4)]
    for pod in pods:
        spec = pod["spec"]
        assert container(pod)["resources"] == {
            "requests": {"cpu": "8", "memory": "32Gi", "google.com/tpu": "4"},
            "limits": {"cpu": "8", "memory": "32Gi", "google.com/tpu": "4"},
        }
        assert spec["nodeSelector"] == V6E_SELECTOR
        assert spec["tolerations"] == [TPU_TOLERATION]
        assert spec["subdomain"] == "tpu-headless"
        assert spec["hostname"] == pod["metadata"]["name"]
        assert labels(pod)["trainjob.dev/role"] == "worker"
        assert labels(pod)["trainjob.dev/slice"] == "0"


def test_tpu_v6e_4x4_env_worker_ids_and_hostnames() -> None:
    pods = render_worker_pods(tpu_job("4x4"), uid=UID)
    hostnames = ",".join(f"tpu-s0-h{i}.tpu-headless" for i in range(4))
    assert hostnames == (
        "tpu-s0-h0.tpu-headless,tpu-s0-h1.tpu-headless,tpu-s0-h2.tpu-headless,"
        "tpu-s0-h3.tpu-headless"
    )
    for host, pod in enumerate(pods):
        assert env(pod) == {
            "TRAINJOB_NAME": "tpu",
            "TRAINJOB_NAMESPACE": "ns",
            "TRAINJOB_ATTEMPT": "0",
            "TRAINJOB_TERMINATION_GRACE_PERIOD_S": "30",
            "TPU_WORKER_ID": str(host),
            "TPU_WORKER_HOSTNAMES": hostnames,
            "TPU_NAME": "tpu-s0",
            "TPU_ACCELERATOR_TYPE": "v6e-16",
            "TPU_TOPOLOGY": "4x4",
            **ray_auth_env("tpu"),
        }
    assert [env(p)["TPU_WORKER_ID"] for p in pods] == ["0", "1", "2", "3"]


def _exclusive_pool_affinity(slice_id: str) -> dict[str, Any]:
    """JobSet's exclusive placement on ``cloud.google.com/gke-nodepool`` for one slice."""
    return {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {
                        "matchExpressions": [
                            {"key": "trainjob.dev/slice-id", "operator": "In", "values": [slice_id]}
                        ]
                    },
                    "topologyKey": "cloud.google.com/gke-nodepool",
                }
            ]
        },
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {
                        "matchExpressions": [
                            {"key": "trainjob.dev/slice-id", "operator": "Exists"},
                            {
                                "key": "trainjob.dev/slice-id",
                                "operator": "NotIn",
                                "values": [slice_id],
                            },
                        ]
                    },
                    "namespaceSelector": {},
                    "topologyKey": "cloud.google.com/gke-nodepool",
                }
            ]
        },
    }


def test_tpu_v6e_4x4_slice_has_a_node_pool_to_itself() -> None:
    """One node pool for the slice's hosts, and no other slice (of any TrainJob, in any
    namespace) in it: tests/cluster/test_placement.py runs this through kube-scheduler."""
    for pod in render_worker_pods(tpu_job("4x4"), uid=UID):
        assert labels(pod)["trainjob.dev/slice-id"] == f"{UID}-a0-s0"
        assert pod["spec"]["affinity"] == _exclusive_pool_affinity(f"{UID}-a0-s0")


def test_tpu_ray_start_advertises_chips_and_cpus() -> None:
    [pod, *_] = render_worker_pods(tpu_job("4x4"), uid=UID)
    assert _ray_start_args(pod) == [
        "--address=tpu-head.tpu-headless:6379",
        "--block",
        "--metrics-export-port=8080",
        "--disable-usage-stats",
        "--num-cpus=8",
        "--num-gpus=0",
        '--resources={"TPU":4}',
        "--labels=trainjob.dev/pool=train",
    ]


def test_tpu_example_manifest() -> None:
    pods = render_worker_pods(example("tpu-v6e-4x4.yaml"), uid=UID)
    assert [p["metadata"]["name"] for p in pods] == [f"llm-v6e-4x4-s0-h{i}" for i in range(4)]
    for pod in pods:
        assert pod["metadata"]["namespace"] == "training"
        assert pod["spec"]["serviceAccountName"] == "trainjob-gcs"
        # Workers do not call the API server: no token (Workload Identity needs none).
        assert pod["spec"]["automountServiceAccountToken"] is False
        assert env(pod)["TPU_WORKER_HOSTNAMES"].split(",") == [
            f"llm-v6e-4x4-s0-h{i}.llm-v6e-4x4-headless" for i in range(4)
        ]
        assert container(pod)["resources"]["limits"] == {
            "cpu": "8",
            "memory": "64Gi",
            "google.com/tpu": "4",
        }


# --------------------------------------------------------------------------- single host


def test_tpu_v6e_2x4_single_host() -> None:
    [pod] = render_worker_pods(tpu_job("2x4"), uid=UID)
    assert pod["metadata"]["name"] == "tpu-s0-h0"
    assert container(pod)["resources"]["limits"]["google.com/tpu"] == "8"
    assert container(pod)["resources"]["requests"]["google.com/tpu"] == "8"
    assert pod["spec"]["nodeSelector"] == {
        "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
        "cloud.google.com/gke-tpu-topology": "2x4",
    }
    values = env(pod)
    assert values["TPU_WORKER_ID"] == "0"
    assert values["TPU_WORKER_HOSTNAMES"] == "tpu-s0-h0.tpu-headless"
    assert values["TPU_ACCELERATOR_TYPE"] == "v6e-8"
    assert not any(name.startswith("MEGASCALE_") for name in values)
    assert "affinity" not in pod["spec"]  # one host: nothing to keep together
    assert '--resources={"TPU":8}' in _ray_start_args(pod)


def test_tpu_v5e_and_v5p_selectors() -> None:
    job = make_job(scaling={"tpu": {"acceleratorType": "v5p", "topology": "2x2x2"}})
    pods = render_worker_pods(job, uid=UID)
    assert len(pods) == 2
    assert pods[0]["spec"]["nodeSelector"] == {
        "cloud.google.com/gke-tpu-accelerator": "tpu-v5p-slice",
        "cloud.google.com/gke-tpu-topology": "2x2x2",
    }
    assert env(pods[0])["TPU_ACCELERATOR_TYPE"] == "v5p-16"
    job = make_job(scaling={"tpu": {"acceleratorType": "v5e", "topology": "2x2"}})
    [pod] = render_worker_pods(job, uid=UID)
    assert pod["spec"]["nodeSelector"]["cloud.google.com/gke-tpu-accelerator"] == (
        "tpu-v5-lite-podslice"
    )
    assert container(pod)["resources"]["limits"] == {"google.com/tpu": "4"}


# --------------------------------------------------------------------------- multislice


def test_multislice_megascale_env_and_per_slice_hostnames() -> None:
    pods = render_worker_pods(tpu_job("4x4", num_slices=2), uid=UID)
    assert [p["metadata"]["name"] for p in pods] == [
        f"tpu-s{k}-h{i}" for k in range(2) for i in range(4)
    ]
    for index, pod in enumerate(pods):
        slice_index, host = divmod(index, 4)
        values = env(pod)
        assert values["TPU_WORKER_ID"] == str(host)
        assert values["TPU_NAME"] == f"tpu-s{slice_index}"
        assert values["TPU_WORKER_HOSTNAMES"] == ",".join(
            f"tpu-s{slice_index}-h{i}.tpu-headless" for i in range(4)
        )
        assert {k: v for k, v in values.items() if k.startswith("MEGASCALE_")} == {
            "MEGASCALE_NUM_SLICES": "2",
            "MEGASCALE_SLICE_ID": str(slice_index),
            "MEGASCALE_COORDINATOR_ADDRESS": "tpu-s0-h0.tpu-headless",
            "MEGASCALE_PORT": "8081",
        }
        assert labels(pod)["trainjob.dev/slice"] == str(slice_index)
        assert {"name": "megascale", "containerPort": 8081, "protocol": "TCP"} in container(pod)[
            "ports"
        ]


def test_multislice_each_slice_has_a_node_pool_to_itself() -> None:
    pods = render_worker_pods(tpu_job("4x4", num_slices=2), uid=UID)
    for index, pod in enumerate(pods):
        slice_id = f"{UID}-a0-s{index // 4}"
        assert labels(pod)["trainjob.dev/slice-id"] == slice_id
        assert pod["spec"]["affinity"] == _exclusive_pool_affinity(slice_id)


def test_multislice_single_host_slices_have_megascale_but_no_node_pool_affinity() -> None:
    pods = render_worker_pods(tpu_job("2x4", num_slices=2), uid=UID)
    assert [p["metadata"]["name"] for p in pods] == ["tpu-s0-h0", "tpu-s1-h0"]
    for pod in pods:
        assert "affinity" not in pod["spec"]
        assert "trainjob.dev/slice-id" not in labels(pod)
        assert env(pod)["MEGASCALE_NUM_SLICES"] == "2"


def test_slice_id_follows_uid_and_attempt() -> None:
    """A restart's slice is a new slice: the previous attempt's hosts, still shutting down,
    neither pull it into their pool nor share one with it. Another TrainJob (another uid)
    with the same name and slice index is another slice too."""
    [pod, *_] = render_worker_pods(tpu_job("4x4", num_slices=2), uid=UID, attempt=3)
    assert labels(pod)["trainjob.dev/attempt"] == "3"
    assert labels(pod)["trainjob.dev/slice-id"] == f"{UID}-a3-s0"
    assert pod["spec"]["affinity"] == _exclusive_pool_affinity(f"{UID}-a3-s0")
    [other, *_] = render_worker_pods(tpu_job("4x4", num_slices=2), uid="another-uid")
    assert labels(other)["trainjob.dev/slice-id"] == "another-uid-a0-s0"


# --------------------------------------------------------------------------- GPU / CPU


def test_gpu_workers_get_one_gpu_each() -> None:
    job = make_job(
        name="gpu",
        scaling={"numWorkers": 2, "useGpu": True, "resourcesPerWorker": {"cpu": 4}},
    )
    pods = render_worker_pods(job, uid=UID)
    assert [p["metadata"]["name"] for p in pods] == ["gpu-w0", "gpu-w1"]
    for pod in pods:
        assert container(pod)["resources"] == {
            "requests": {"cpu": "4", "nvidia.com/gpu": "1"},
            "limits": {"cpu": "4", "nvidia.com/gpu": "1"},
        }
        assert _ray_start_args(pod)[-3:-1] == ["--num-cpus=4", "--num-gpus=1"]
        assert "nodeSelector" not in pod["spec"]
        assert "tolerations" not in pod["spec"]
        assert "affinity" not in pod["spec"]
        assert "trainjob.dev/slice" not in labels(pod)


def test_gpu_count_from_resources_per_worker() -> None:
    job = make_job(
        scaling={"numWorkers": 1, "useGpu": True, "resourcesPerWorker": {"nvidia.com/gpu": 2}}
    )
    [pod] = render_worker_pods(job, uid=UID)
    assert container(pod)["resources"]["limits"] == {"nvidia.com/gpu": "2"}
    assert _ray_start_args(pod)[-3:-1] == ["--num-cpus=1", "--num-gpus=2"]


def test_fractional_gpu_is_rejected() -> None:
    job = make_job(scaling={"numWorkers": 1, "resourcesPerWorker": {"nvidia.com/gpu": "500m"}})
    with pytest.raises(ValueError, match=r'resourcesPerWorker\["nvidia.com/gpu"\]'):
        render_worker_pods(job, uid=UID)


def test_cpu_quickstart_workers() -> None:
    pods = render_worker_pods(example("quickstart.yaml"), uid=UID)
    assert [p["metadata"]["name"] for p in pods] == ["quickstart-w0", "quickstart-w1"]
    for pod in pods:
        assert container(pod)["resources"] == {
            "requests": {"cpu": "1"},
            "limits": {"cpu": "1"},
        }
        assert _ray_start_args(pod)[-3:] == [
            "--num-cpus=1",
            "--num-gpus=0",
            "--labels=trainjob.dev/pool=train",  # the driver's workers select it
        ]
        assert pod["metadata"]["namespace"] == "default"  # the manifest has none
        assert pod["spec"]["automountServiceAccountToken"] is False
        assert "serviceAccountName" not in pod["spec"]


@pytest.mark.parametrize(
    ("cpu", "expected"), [("500m", 1), ("2500m", 3), (3, 3), ("2", 2), ("1.5", 2)]
)
def test_logical_cpus_round_up_and_each_worker_actor_asks_for_a_whole_pod(
    cpu: int | str, expected: int
) -> None:
    """The worker pod's Ray node and the driver's worker actors agree on the CPU count, so
    one worker runs on each worker pod (a fractional request packed several on one pod)."""
    from trainjob_operator.launcher.trainer import build_trainer, plan_run

    job = make_job(
        scaling={"numWorkers": 2, "resourcesPerWorker": {"cpu": cpu}},
        entrypoint="examples.quickstart.train:train_func",
    )
    pods = render_worker_pods(job, uid=UID)
    assert [f"--num-cpus={expected}" in _ray_start_args(pod) for pod in pods] == [True, True]
    assert job.spec.scaling.cpus_per_worker() == expected
    trainer = build_trainer(plan_run(job, storage_path="/tmp/unused"), [])
    assert trainer.scaling_config.resources_per_worker["CPU"] == expected


def test_an_elastic_job_renders_its_maximum_and_the_driver_asks_ray_for_min_and_max() -> None:
    """spec.scaling.minWorkers: the operator keeps numWorkers pods requested, and the driver's
    trainer gets Ray Train's (min, max) with the resize interval of the spec."""
    from trainjob_operator.launcher.trainer import build_trainer, plan_run

    job = make_job(
        scaling={"numWorkers": 3, "minWorkers": 1, "elasticResizeIntervalSeconds": 5},
        entrypoint="examples.quickstart.train:train_func",
    )
    assert len(render_worker_pods(job, uid=UID)) == 3
    scaling = build_trainer(plan_run(job, storage_path="/tmp/unused"), []).scaling_config
    assert scaling.num_workers == (1, 3) and scaling.elasticity_enabled
    assert scaling.elastic_resize_monitor_interval_s == 5.0
    # `trainjob run --workers 2` caps both ends; a fixed-size job keeps Ray's default interval.
    capped = build_trainer(plan_run(job, num_workers=2, storage_path="/tmp/unused"), [])
    assert capped.scaling_config.num_workers == (1, 2)
    fixed = make_job(scaling={"numWorkers": 2}, entrypoint="examples.quickstart.train:train_func")
    fixed_scaling = build_trainer(plan_run(fixed, storage_path="/tmp/unused"), []).scaling_config
    assert fixed_scaling.num_workers == 2 and fixed_scaling.elastic_resize_monitor_interval_s == 60


def test_local_mode_has_no_workers() -> None:
    assert render_worker_pods(make_job(scaling={"numWorkers": 0}), uid=UID) == []


def test_kueue_gang_metadata_on_workers() -> None:
    job = tpu_job("4x4", num_slices=2, queueName="team-a")
    for pod in render_worker_pods(job, uid=UID, attempt=1):
        assert labels(pod)["kueue.x-k8s.io/queue-name"] == "team-a"
        assert labels(pod)["kueue.x-k8s.io/pod-group-name"] == "tpu-attempt-1"
        annotations = pod["metadata"]["annotations"]
        assert annotations["kueue.x-k8s.io/pod-group-name"] == "tpu-attempt-1"
        assert annotations["kueue.x-k8s.io/pod-group-total-count"] == "9"  # head + 8 hosts


def test_no_kueue_metadata_without_queue_name() -> None:
    for pod in render_worker_pods(tpu_job("4x4"), uid=UID):
        keys = set(labels(pod)) | set(pod["metadata"]["annotations"])
        assert not any(k.startswith("kueue.x-k8s.io/") for k in keys)


def test_spec_env_follows_operator_env_and_cannot_override_it() -> None:
    job = tpu_job("2x4", env=[{"name": "XLA_FLAGS", "value": "--xla_dump_to=/tmp"}])
    [pod] = render_worker_pods(job, uid=UID)
    assert container(pod)["env"][-1] == {"name": "XLA_FLAGS", "value": "--xla_dump_to=/tmp"}
    job = tpu_job("2x4", env=[{"name": "A", "value": "1"}, {"name": "TPU_WORKER_ID", "value": "7"}])
    with pytest.raises(ValueError, match=r"spec\.env\[1\]\.name: 'TPU_WORKER_ID'"):
        render_worker_pods(job, uid=UID)


# --------------------------------------------------------------------------- the script runs


def _stub(directory: Path, name: str, body: str) -> None:
    path = directory / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_worker_command_waits_for_the_head_then_runs_ray_start(tmp_path: Path) -> None:
    """Run the rendered command with a stub ``ray`` (and this interpreter as ``python``):
    it waits for the head, then starts the Ray node, and exits with its status."""
    calls = tmp_path / "calls"
    _stub(
        tmp_path,
        "ray",
        f"""{sys.executable} -c 'import json,sys; print(json.dumps(sys.argv[1:]))' "$@" >> {calls}
if [ "$1" = health-check ]; then
  n=$(cat {tmp_path}/n 2>/dev/null || echo 0); echo $((n + 1)) > {tmp_path}/n
  [ "$n" -ge 1 ]; exit $?
fi
""",
    )
    [pod] = render_worker_pods(tpu_job("2x4"), uid=UID)
    command = container(pod)["command"]
    assert command[:3] == ["python", "-m", "trainjob_operator.launcher.ray_node"]
    head = "tpu-head.tpu-headless:6379"
    assert f"--wait-for-head={head}" in command
    path = os.pathsep.join([str(tmp_path), str(Path(sys.executable).parent), os.environ["PATH"]])
    env_vars = {**os.environ, "PATH": path, "PYTHONPATH": str(REPO)}
    # The head's GCS port, here a local listener (the Service name does not resolve here):
    # the launcher connects to it before it runs `ray health-check`.
    with socket.socket() as gcs:
        gcs.bind(("127.0.0.1", 0))
        gcs.listen()
        local = f"127.0.0.1:{gcs.getsockname()[1]}"
        command = [arg.replace(head, local) for arg in command]
        subprocess.run(command, env=env_vars, check=True, timeout=60, capture_output=True)
    lines = [json.loads(line) for line in calls.read_text().splitlines()]
    health = ["health-check", f"--address={local}"]
    assert lines[:2] == [health, health]  # the first check failed: it waited and retried
    assert lines[2] == ["start", *[a.replace(head, local) for a in _ray_start_args(pod)]]
    assert '--resources={"TPU":8}' in lines[2]


def test_the_launcher_waits_for_the_heads_port_before_asking_ray() -> None:
    """Where nothing listens (the head's pod not up, its Service name not resolving yet) the
    launcher does not run ``ray health-check``, which takes about 40 s to fail there."""
    from trainjob_operator.launcher.ray_node import head_reachable

    with socket.socket() as gcs:
        gcs.bind(("127.0.0.1", 0))
        gcs.listen()
        port = gcs.getsockname()[1]
        assert head_reachable(f"127.0.0.1:{port}")
    assert not head_reachable(f"127.0.0.1:{port}", timeout_s=1)  # closed now
    assert not head_reachable("no-such-head.invalid:6379", timeout_s=1)
    assert not head_reachable("no-port", timeout_s=1)


@pytest.mark.parametrize("head_up", [True, False], ids=["head-up", "head-gone"])
def test_a_draining_node_stops_waiting_for_its_busy_workers_once_its_head_is_gone(
    monkeypatch: pytest.MonkeyPatch, head_up: bool
) -> None:
    """A drained node waits for its busy Ray workers (here a process titled like an actor)
    until its deadline while its head answers; once the head has not answered for
    HEAD_GONE_S (the cluster is being torn down), it stops waiting: nothing can be committed,
    and the grace period would only hold the node."""
    import time

    from trainjob_operator.launcher import ray_node

    monkeypatch.setattr(ray_node, "HEAD_GONE_S", 0.5)
    monkeypatch.setattr(ray_node, "HEAD_POLL_S", 0.1)
    monkeypatch.setattr(ray_node, "POLL_S", 0.05)
    with socket.socket() as gcs:
        gcs.bind(("127.0.0.1", 0))
        gcs.listen()
        address = f"127.0.0.1:{gcs.getsockname()[1]}"
        if not head_up:
            gcs.close()
        # `ray start --address=... --block` standing in: a shell with a busy "actor" below it.
        argv = [
            "bash",
            "-c",
            "(exec -a ray::TrainWorker sleep 600) & wait",
            "--",
            f"--address={address}",
        ]
        node = ray_node.RayNode(argv, grace_s=60)
        node._proc = subprocess.Popen(argv, start_new_session=True)
        try:
            wait = 4.0
            started = time.monotonic()
            while not ray_node.busy_ray_workers(node._proc.pid):
                assert time.monotonic() - started < 30, "the busy worker did not start"
                time.sleep(0.05)
            started = time.monotonic()
            node._wait_until_idle(stop_at=time.time() + wait)
            waited = time.monotonic() - started
        finally:
            os.killpg(node._proc.pid, signal.SIGKILL)
            node._proc.wait()
    if head_up:
        assert waited >= wait - 0.5  # until the deadline: its worker may still commit
    else:
        assert waited < wait - 1.0  # the head gone: stopped without waiting out the grace


# --------------------------------------------------------------------------- prestarted workers

PRESTART = {"RAY_enable_worker_prestart": "1", "RAY_num_workers_soft_limit": "1"}
TORCH_PRELOAD = {"RAY_preload_python_modules": "torch.distributed,torch._dynamo"}


def _prestart_env(pod: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in env(pod).items() if k in WORKER_PRESTART_ENV_NAMES}


def test_torch_cpu_workers_prestart_one_worker_with_torch_imported() -> None:
    pods = render_worker_pods(example("quickstart.yaml"), uid=UID)
    assert example("quickstart.yaml").spec.framework == "torch"
    assert [_prestart_env(pod) for pod in pods] == [PRESTART | TORCH_PRELOAD] * 2


@pytest.mark.parametrize(
    ("scaling", "framework"),
    [
        ({"numWorkers": 1, "useGpu": True}, "torch"),  # an early import could pin CUDA devices
        ({"numWorkers": 1}, "jax"),  # JAX reads its platform settings on import
        ({"numWorkers": 1, "resourcesPerWorker": {"cpu": 4, "memory": "1Gi"}}, "torch"),
    ],
    ids=["gpu", "jax", "memory-below-512Mi-per-cpu"],
)
def test_prestart_without_imports(scaling: dict[str, Any], framework: str) -> None:
    [pod] = render_worker_pods(make_job(framework=framework, scaling=scaling), uid=UID)
    assert _prestart_env(pod) == PRESTART


def test_preload_when_memory_covers_every_prestarted_worker() -> None:
    job = make_job(scaling={"numWorkers": 1, "resourcesPerWorker": {"cpu": 4, "memory": "2Gi"}})
    [pod] = render_worker_pods(job, uid=UID)
    assert _prestart_env(pod) == PRESTART | TORCH_PRELOAD


def test_tpu_hosts_get_no_prestart() -> None:
    """Their actors carry a runtime_env, for which Ray starts a new process anyway."""
    for pod in render_worker_pods(tpu_job("4x4"), uid=UID):
        assert _prestart_env(pod) == {}


def test_spec_env_replaces_a_prestart_setting() -> None:
    job = make_job(
        scaling={"numWorkers": 1},
        env=[
            {"name": "RAY_enable_worker_prestart", "value": "0"},
            {"name": "RAY_preload_python_modules", "value": "numpy"},
        ],
    )
    [pod] = render_worker_pods(job, uid=UID)  # env() also asserts the names are unique
    assert _prestart_env(pod) == {
        "RAY_enable_worker_prestart": "0",
        "RAY_num_workers_soft_limit": "1",
        "RAY_preload_python_modules": "numpy",
    }
