"""The quickstart TrainJob, end to end: kube-apiserver -> operator -> pods -> Ray -> training.

Everything is real except the kubelet: etcd + kube-apiserver (+ kube-controller-manager for
garbage collection and ServiceAccounts), the CRD, the operator (kopf, in this process), the
pods' commands (``ray start`` on the head, worker and validation pods; the driver's
``python -m trainjob_operator.launcher.driver``), a Ray cluster made of those processes, torch
gloo DDP on CPU, checkpoints in fake-gcs-server, and the driver's status patches with the token of
the job's own ServiceAccount. :class:`~tests.support.pod_runner.PodRunner` plays the
kubelet: it runs each pod's command here and reports the pod's status.
"""

from __future__ import annotations

import copy
import json
import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.gcs import GCSEmulator
from tests.k8s.test_operator import RunningOperator, remove_trainjobs, wait_for
from tests.support import EnvTest
from tests.support.pod_runner import (
    PodRunner,
    default_image_env,
    namespaces_available,
)
from trainer_runtime.checkpoint import COMMIT_MARKER
from trainjob_operator.kube import KubeClient, KubeConfig

pytestmark = [pytest.mark.k8s, pytest.mark.ray, pytest.mark.gcs]

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "crds" / "trainjob.dev_trainjobs.yaml"
QUICKSTART = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
JOB = "quickstart"
CLUSTER_PODS = {f"{JOB}-head", f"{JOB}-w0", f"{JOB}-w1", f"{JOB}-val-0"}


class Cluster:
    """The operator and the pod runner watching one namespace."""

    def __init__(self, kube: KubeClient, runner: PodRunner, namespace: str, bucket: str) -> None:
        self.kube = kube
        self.runner = runner
        self.namespace = namespace
        self.bucket = bucket

    def status(self) -> dict[str, Any]:
        obj = self.kube.get("TrainJob", self.namespace, JOB)
        assert obj is not None
        return dict(obj.get("status") or {})

    def wait_phase(self, phase: str, timeout: float) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            status = self.status()
            if status.get("phase") == "Failed" and phase != "Failed":
                raise AssertionError(f"the TrainJob failed: {status.get('message')}")
            return status if status.get("phase") == phase else None

        return dict(wait_for(f"phase {phase}", reached, timeout=timeout))

    def pods(self) -> dict[str, dict[str, Any]]:
        return {
            p["metadata"]["name"]: p
            for p in self.kube.list("Pod", self.namespace, f"trainjob.dev/name={JOB}")
        }

    def events(self) -> list[dict[str, Any]]:
        return [
            e for e in self.kube.list("Event", self.namespace) if e["involvedObject"]["name"] == JOB
        ]

    def dump(self) -> None:
        """Print the status, events and the tail of every pod's log (shown when a test fails)."""
        print("status:", json.dumps(self.status(), indent=1))
        for event in self.events():
            print("event:", event["type"], event["reason"], event["message"])
        for name in sorted(CLUSTER_PODS | {f"{JOB}-driver"}):
            for previous in (True, False):
                try:
                    text = self.runner.logs(name, previous=previous)
                except KeyError:
                    continue
                tail = "\n".join(text.splitlines()[-60:])
                print(f"----- {name}{' (previous)' if previous else ''} -----\n{tail}")
        print("runner errors:", self.runner.errors, "files:", self.runner.root)


@pytest.fixture(scope="module")
def crd(envtest: EnvTest) -> None:
    envtest.apply_crd(CRD)


@pytest.fixture
def cluster(
    envtest: EnvTest, crd: None, k8s_namespace: str, gcs_emulator: GCSEmulator
) -> Iterator[Cluster]:
    """Operator + pod runner on a fresh namespace; afterwards nothing they started is left."""
    if not namespaces_available():
        pytest.skip(
            "PodRunner needs Linux PID and mount namespaces (util-linux unshare; root or "
            "unprivileged user namespaces) to give each pod its own /tmp and process table"
        )
    config = KubeConfig(host=envtest.host, token=envtest.token, ca_file=str(envtest.ca_file))
    image_env = default_image_env() | {
        # The "image": this checkout on PYTHONPATH (examples/, tests/e2e/workload.py).
        "PYTHONPATH": str(REPO),
        "RAY_USAGE_STATS_ENABLED": "0",
        "PYTHONUNBUFFERED": "1",
    }
    runner = PodRunner(
        config, k8s_namespace, image_env=image_env, workdir=REPO, isolate=True
    ).start()
    operator = RunningOperator(envtest, k8s_namespace)
    kube = KubeClient(config)
    env = Cluster(kube, runner, k8s_namespace, gcs_emulator.new_bucket("e2e"))
    try:
        operator.start()
        yield env
    finally:
        try:
            env.dump()
            remove_trainjobs(envtest, k8s_namespace)  # while the operator runs (finalizer)
        finally:
            operator.stop()
            runner.stop(remove_files=os.environ.get("TRAINJOB_E2E_KEEP") != "1")
        assert runner.all_processes() == []


def make_job(
    env: Cluster, emulator: GCSEmulator, config: dict[str, Any], **spec: Any
) -> dict[str, Any]:
    """The quickstart TrainJob with GCS storage on fake-gcs-server, ``config`` merged into its
    (smaller training) and ``spec`` fields replaced."""
    body = copy.deepcopy(QUICKSTART)
    body["metadata"] = {"name": JOB, "namespace": env.namespace}
    body["spec"]["config"].update(config)
    body["spec"].update(spec)
    body["spec"]["storage"] = {"path": f"gs://{env.bucket}/runs"}
    body["spec"]["env"] = [{"name": "STORAGE_EMULATOR_HOST", "value": emulator.url}]
    # The quickstart's validation, reporting where it ran too.
    body["spec"]["validation"]["entrypoint"] = "tests.e2e.workload:validate_func"
    created = env.kube.create(body, env.namespace)
    assert created is not None
    return created


def stored_objects(emulator: GCSEmulator, bucket: str, prefix: str) -> list[str]:
    return sorted(b.name for b in emulator.client().list_blobs(bucket, prefix=prefix))


def test_quickstart_trains_to_success_on_pods(cluster: Cluster, gcs_emulator: GCSEmulator) -> None:
    env = cluster
    epochs = 2
    make_job(env, gcs_emulator, {"epochs": epochs})
    status = env.wait_phase("Running", timeout=120)
    assert status["workers"] == {"ready": 2, "desired": 2}

    # One Ray cluster of the pods' processes: the GCS in the head pod, a raylet in each pod,
    # and the training actors in the worker pods' process trees.
    def training_on_workers() -> bool:
        return all(
            any(p.name.startswith("ray::TrainWorker") for p in env.runner.processes(f"{JOB}-w{i}"))
            for i in range(2)
        )

    wait_for("TrainWorker actors in both worker pods", training_on_workers, timeout=120)
    assert any(p.name == "gcs_server" for p in env.runner.processes(f"{JOB}-head"))
    for name in (f"{JOB}-head", f"{JOB}-w0", f"{JOB}-w1", f"{JOB}-driver"):
        assert [p.name for p in env.runner.processes(name)].count("raylet") == 1, name
    status = env.wait_phase("Succeeded", timeout=240)

    # Progress and checkpoints, published by the driver with its own ServiceAccount's token.
    assert status["progress"]["step"] == epochs - 1
    assert status["progress"]["metrics"]["epoch"] == epochs - 1
    latest = status["latestCheckpoint"]
    assert latest["path"].startswith(f"gs://{env.bucket}/runs/{JOB}/checkpoint_")
    assert latest["step"] == epochs - 1
    best = status["bestCheckpoint"]
    assert best["score"] == best["metrics"]["val_loss"]
    # Validation ran on the validation pool's pod, a Ray node of a 5-node cluster
    # (head, 2 workers, validation, driver).
    assert latest["metrics"]["validated_on"] == f"{JOB}-val-0"
    assert best["metrics"]["validated_on"] == f"{JOB}-val-0"
    assert latest["metrics"]["ray_nodes"] == 5
    assert status["validations"] == {"pending": 0, "running": 0, "done": epochs, "failed": 0}
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Succeeded"]["status"] == "True"
    assert status["restarts"] == 0
    assert status.get("workerFailures", 0) == 0

    # Both checkpoints (numToKeep: 2) are in fake-gcs-server, committed (the marker next to the
    # files) and listed in the run's manifest.
    objects = stored_objects(gcs_emulator, env.bucket, f"runs/{JOB}/")
    manifest = (
        gcs_emulator.client()
        .bucket(env.bucket)
        .blob(f"runs/{JOB}/checkpoint_manifest.json")
        .download_as_text()
    )
    for epoch in range(epochs):
        name = f"checkpoint_{epoch:06d}"
        assert f"runs/{JOB}/{name}/state.pt" in objects, objects
        assert f"runs/{JOB}/{name}/{COMMIT_MARKER}" in objects, objects
        assert name in manifest
    assert latest["path"] == f"gs://{env.bucket}/runs/{JOB}/checkpoint_{epochs - 1:06d}"

    # The operator deletes the cluster's pods; the runner stops their processes.
    remaining = wait_for(
        "cluster pods deleted",
        lambda: (p := env.pods()) and set(p) == {f"{JOB}-driver"} and p,
        timeout=60,
    )
    assert remaining[f"{JOB}-driver"]["status"]["phase"] == "Succeeded"
    wait_for("no cluster pod process left", lambda: env.runner.running() == [], timeout=30)
    for name in CLUSTER_PODS | {f"{JOB}-driver"}:
        assert env.runner.launches(name) == 1, name
    driver_log = env.runner.logs(f"{JOB}-driver")
    assert "torch.distributed gloo process group ready (2 workers" in driver_log
    assert env.runner.errors == []


def test_worker_killed_mid_training_resumes_from_checkpoint(
    cluster: Cluster, gcs_emulator: GCSEmulator
) -> None:
    env = cluster
    epochs = 4
    # Small batches make epochs of seconds, so that the kill lands mid-training.
    make_job(env, gcs_emulator, {"epochs": epochs, "batch_size": 4}, failure={"maxFailures": 3})
    env.wait_phase("Running", timeout=120)
    driver = f"{JOB}-driver"
    # The driver logs each commit at once (its status patches are up to 2s apart).
    wait_for(
        "a committed checkpoint",
        lambda: "Committed checkpoint" in env.runner.logs(driver),
        timeout=180,
    )
    worker = f"{JOB}-w1"
    old_uid = env.pods()[worker]["metadata"]["uid"]
    raylets = [p for p in env.runner.processes(worker) if p.name == "raylet"]
    assert len(raylets) == 1, env.runner.processes(worker)
    os.kill(raylets[0].pid, signal.SIGKILL)  # the worker's Ray node dies

    wait_for(
        "the worker pod recreated under the same name",
        lambda: (p := env.pods().get(worker)) and p["metadata"]["uid"] != old_uid,
        timeout=60,
    )
    status = env.wait_phase("Succeeded", timeout=240)
    assert status["progress"]["step"] == epochs - 1
    assert status["latestCheckpoint"]["step"] == epochs - 1
    assert status["restarts"] == 0  # the worker group restarted, not the whole cluster
    assert status["workerFailures"] >= 1  # ... and the driver published that restart
    assert env.runner.launches(worker) == 2
    assert env.runner.launches(f"{JOB}-w0") == 1
    assert env.runner.launches(f"{JOB}-head") == 1
    assert env.runner.launches(driver) == 1
    assert any(e["reason"] == "WorkerPodLost" and worker in e["message"] for e in env.events())
    # The runtime restarted the worker group from the latest committed checkpoint.
    driver_log = env.runner.logs(driver)
    failed = re.findall(
        r"Worker group failed .*; restarting \(failure (\d) of 3\) in [\d.]+ s from (\S+)",
        driver_log,
    )
    assert failed, "no restart of the worker group in the driver log:\n" + driver_log[-3000:]
    assert all(
        source.startswith(f"gs://{env.bucket}/runs/{JOB}/checkpoint_") for _, source in failed
    )
    resumed = re.findall(r"Started 2 workers \(attempt (\d)\), resuming from (\S+)", driver_log)
    assert resumed and resumed[-1][1] == failed[-1][1]
    assert int(resumed[-1][1].rsplit("_", 1)[1]) < epochs - 1  # it had epochs left to train
    assert env.runner.errors == []
