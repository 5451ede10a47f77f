"""A real single-node cluster ready for TrainJobs: the chart installed from its image and
fake-gcs-server in a pod, with the helpers that make, fault and read back a quickstart
TrainJob there. Shared by the real-node tier (``tests/cluster/test_real_node.py``) and the
soak (``benchmarks/soak.py``), which both start a :class:`~tests.support.node.Node` first."""

from __future__ import annotations

import contextlib
import copy
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s_client

from tests.support.node import Image, Node
from tests.support.waiting import wait_for
from trainer_runtime.checkpoint import COMMIT_MARKER

REPO = Path(__file__).resolve().parents[2]
CHART_DIR = REPO / "charts" / "trainjob-operator"
QUICKSTART = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
JOB = "quickstart"
RELEASE = "trainjob-operator"
OPERATOR_NAMESPACE = "trainjob-system"
STORAGE_NAMESPACE = "trainjob-storage"
GCS_PORT = 4443
GCS_HOST = f"fake-gcs.{STORAGE_NAMESPACE}.svc.cluster.local"
DRIVER_RESOURCES = {"cpu": "50m", "memory": "512Mi"}
"""The chart's ``defaults.driver.resources`` here: the built-in 1 CPU would let one job at a
time onto the 2-core node; the driver only drives (the workers train)."""
POD_CPU = "50m"
"""What the head, each worker and each validation pod ask for: a job asks for 250m in all, so
the node holds the scenarios that run at once (the kubelet does not throttle: cpuCFSQuota is off,
and Ray still advertises at least 1 CPU per pod)."""


class Cluster:
    """The node with the chart installed and fake-gcs-server running."""

    def __init__(self, node: Node, images: dict[str, Image], gcs_url: str) -> None:
        self.node = node
        self.images = images
        self.gcs_url = gcs_url  # fake-gcs-server's Service, through a bridge to this machine
        self.api = node.api_client()
        self.core = k8s_client.CoreV1Api(self.api)
        self.custom = k8s_client.CustomObjectsApi(self.api)

    def gcs(self) -> Any:
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        return storage.Client(
            project="test",
            credentials=AnonymousCredentials(),
            client_options={"api_endpoint": self.gcs_url},
        )

    def trainjob(self, namespace: str, name: str = JOB) -> dict[str, Any]:
        obj = self.custom.get_namespaced_custom_object(
            "trainjob.dev", "v1alpha1", namespace, "trainjobs", name
        )
        return dict(obj)

    def status(self, namespace: str, name: str = JOB) -> dict[str, Any]:
        return dict(self.trainjob(namespace, name).get("status") or {})

    def wait_phase(
        self, namespace: str, phase: str, timeout: float, name: str = JOB
    ) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            status = self.status(namespace, name)
            if status.get("phase") == "Failed" and phase != "Failed":
                raise AssertionError(f"the TrainJob failed: {status.get('message')}")
            return status if status.get("phase") == phase else None

        return wait_for(f"phase {phase}", reached, timeout=timeout)

    def pods(self, namespace: str) -> dict[str, k8s_client.V1Pod]:
        return {p.metadata.name: p for p in self.core.list_namespaced_pod(namespace).items}

    def dump(self, namespace: str) -> str:
        """What a failing scenario shows: the TrainJob, pods, events and logs."""
        listing = self.node.kubectl(
            "get", "tj,pods,svc", "-n", namespace, "-o", "wide", check=False
        )
        parts = [listing.stdout]
        with contextlib.suppress(Exception):
            parts.append("status: " + json.dumps(self.status(namespace), indent=1))
        parts.append(
            self.node.kubectl("get", "events", "-n", namespace, check=False).stdout[-6000:]
        )
        for pod in self.pods(namespace):
            for previous in ("--previous=true", "--previous=false"):
                out = self.node.kubectl("logs", "-n", namespace, pod, previous, check=False)
                if out.returncode == 0:
                    tail = "\n".join(out.stdout.splitlines()[-60:])
                    parts.append(f"----- {pod} {previous} -----\n{tail}")
        operator = self.node.kubectl(
            "logs", "-n", OPERATOR_NAMESPACE, f"deploy/{RELEASE}", "--tail=80", check=False
        )
        parts.append(f"----- operator -----\n{operator.stdout}{operator.stderr}")
        return "\n".join(parts)


def install_chart(node: Node, images: dict[str, Image]) -> None:
    import helm_python as helm

    repository, tag = images["operator"].name.rsplit(":", 1)
    config = helm.Config(kubeconfig_path=str(node.kubeconfig), namespace=OPERATOR_NAMESPACE)
    try:
        config.install(
            helm.Chart.load(CHART_DIR),
            RELEASE,
            {
                "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
                "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
                "defaults": {"driver": {"resources": DRIVER_RESOURCES}},
            },
            namespace=OPERATOR_NAMESPACE,
            create_namespace=True,
        )
    finally:
        config.close()
    # Waiting here rather than in Helm (whose wait a Python signal cannot interrupt).
    rollout = node.kubectl(
        "rollout",
        "status",
        "-n",
        OPERATOR_NAMESPACE,
        f"deployment/{RELEASE}",
        "--timeout=300s",
        check=False,
        timeout=320,
    )
    if rollout.returncode != 0:
        logs = node.kubectl(
            "logs", "-n", OPERATOR_NAMESPACE, f"deployment/{RELEASE}", "--tail=40", check=False
        )
        raise AssertionError(f"the operator did not start: {rollout.stderr}\n{logs.stdout}")


def create_fake_gcs(node: Node, images: dict[str, Image]) -> None:
    """fake-gcs-server as a pod behind the Service fake-gcs (:func:`fake_gcs_url` waits for
    it: it starts while the chart is installed)."""
    manifest = f"""
apiVersion: v1
kind: Namespace
metadata: {{name: {STORAGE_NAMESPACE}}}
---
apiVersion: v1
kind: Pod
metadata:
  name: fake-gcs
  namespace: {STORAGE_NAMESPACE}
  labels: {{app: fake-gcs}}
spec:
  # Service links would set FAKE_GCS_PORT=tcp://..., which fake-gcs-server reads as its port.
  enableServiceLinks: false
  containers:
  - name: fake-gcs
    image: {images["fake-gcs"].name}
    imagePullPolicy: Never
    args: ["-scheme", "http", "-host", "0.0.0.0", "-port", "{GCS_PORT}", "-backend", "memory",
           "-external-url", "http://{GCS_HOST}:{GCS_PORT}",
           "-public-host", "{GCS_HOST}:{GCS_PORT}", "-log-level", "warn"]
    ports: [{{containerPort: {GCS_PORT}, name: http}}]
    readinessProbe:
      tcpSocket: {{port: {GCS_PORT}}}
      periodSeconds: 2
---
apiVersion: v1
kind: Service
metadata: {{name: fake-gcs, namespace: {STORAGE_NAMESPACE}}}
spec:
  selector: {{app: fake-gcs}}
  ports: [{{name: http, port: {GCS_PORT}, targetPort: {GCS_PORT}}}]
"""
    node.kubectl("apply", "-f", "-", input=manifest)


def fake_gcs_url(node: Node) -> str:
    """fake-gcs-server's URL from here, once its pod is Ready."""
    node.kubectl(
        "wait",
        "-n",
        STORAGE_NAMESPACE,
        "--for=condition=Ready",
        "pod/fake-gcs",
        "--timeout=180s",
        timeout=200,
    )
    service = node.kubectl(
        "get", "svc", "-n", STORAGE_NAMESPACE, "fake-gcs", "-o", "jsonpath={.spec.clusterIP}"
    ).stdout.strip()
    return f"http://127.0.0.1:{node.forward(service, GCS_PORT)}"


def job_manifest(
    cluster: Cluster,
    namespace: str,
    config: dict[str, Any],
    *,
    validation: bool = False,
    **spec: Any,
) -> tuple[dict[str, Any], str]:
    """The quickstart TrainJob in the examples image, sized for a 2-core node, storing its
    checkpoints in a new bucket of the cluster's fake-gcs-server: (the manifest, the bucket).
    Without ``validation`` (the scenarios that assert nothing about it) the job has no
    validation pool and no score attribute: one Ray node less on the node."""
    bucket = f"real-{uuid.uuid4().hex[:8]}"
    cluster.gcs().create_bucket(bucket)
    body = copy.deepcopy(QUICKSTART)
    body["metadata"] = {"name": JOB, "namespace": namespace}
    s = body["spec"]
    s["image"] = cluster.images["examples"].name
    s["config"].update(config)
    s["scaling"]["resourcesPerWorker"] = {"cpu": POD_CPU}
    s["validation"]["pool"]["resources"] = {"cpu": POD_CPU}
    # The pool asks for GKE spot nodes by default (cloud.google.com/gke-spot); this node is not
    # one, and the quickstart's pod would stay Pending.
    s["validation"]["pool"]["spot"] = False
    s["ray"] = {"head": {"resources": {"cpu": POD_CPU}}}
    s["storage"] = {"path": f"gs://{bucket}/runs"}
    s["env"] = [{"name": "STORAGE_EMULATOR_HOST", "value": f"http://{GCS_HOST}:{GCS_PORT}"}]
    if not validation:
        del s["validation"], s["checkpoint"]["scoreAttribute"], s["checkpoint"]["scoreOrder"]
    s.update(spec)
    return body, bucket


def make_job(
    cluster: Cluster,
    namespace: str,
    config: dict[str, Any],
    *,
    validation: bool = False,
    **spec: Any,
) -> dict[str, Any]:
    """:func:`job_manifest`'s TrainJob, created; its ``bucket`` added to the returned body."""
    body, bucket = job_manifest(cluster, namespace, config, validation=validation, **spec)
    cluster.custom.create_namespaced_custom_object(
        "trainjob.dev", "v1alpha1", namespace, "trainjobs", body
    )
    body["bucket"] = bucket
    return body


def wait_for_a_committed_checkpoint(cluster: Cluster, namespace: str) -> None:
    """The job is Running and has committed a checkpoint (a fault now lands mid-run)."""
    cluster.wait_phase(namespace, "Running", timeout=600)
    wait_for(
        "a committed checkpoint",
        lambda: cluster.status(namespace).get("latestCheckpoint"),
        timeout=600,
        every=1.0,
    )


def kill_in_container(cluster: Cluster, namespace: str, pod: str, program: str) -> None:
    """SIGKILL every process of ``program`` in the pod's container (``kubectl exec``; the
    image has no procps, so Python reads /proc)."""
    code = (
        "import os, signal\n"
        "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
        "    try:\n"
        "        cmd = open(f'/proc/{pid}/cmdline', 'rb').read().split(b'\\0')[0]\n"
        "    except OSError:\n"
        "        continue\n"
        f"    if os.path.basename(cmd) == b'{program}':\n"
        "        os.kill(int(pid), signal.SIGKILL); print('killed', pid)\n"
    )
    out = cluster.node.kubectl("exec", "-n", namespace, pod, "--", "python", "-c", code).stdout
    assert "killed" in out, out


GRACEFUL_TERMINATION: dict[str, dict[str, Any]] = {
    "config": {"preemption_check_every": 5},
    "podTemplate": {"terminationGracePeriodSeconds": 90},
}
"""What a job needs for :func:`terminate_a_worker_pod_gracefully`: a preemption check every
5 batches, and pods given 90 s to end."""


def terminate_a_worker_pod_gracefully(cluster: Cluster, namespace: str) -> str:
    """``kubectl delete pod <job>-w1 --grace-period=90`` (the kubelet's SIGTERM, as a node
    drain or spot reclaim gives) of a job made with :data:`GRACEFUL_TERMINATION`, Running.
    Returns the deleted pod's uid."""
    worker = cluster.pods(namespace)[f"{JOB}-w1"]
    env = {e.name: e.value for e in worker.spec.containers[0].env}
    assert env["TRAINJOB_TERMINATION_GRACE_PERIOD_S"] == "90"
    cluster.node.kubectl(
        "delete", "pod", "-n", namespace, f"{JOB}-w1", "--grace-period=90", "--wait=false"
    )
    return str(worker.metadata.uid)


def checkpoint_folders(cluster: Cluster, bucket: str) -> tuple[set[str], set[str]]:
    """(every checkpoint folder of the job's run folder in storage, those committed: with
    their commit marker)."""
    names = [b.name for b in cluster.gcs().bucket(bucket).list_blobs(prefix=f"runs/{JOB}/")]
    paths = [n.split("/") for n in names]
    # runs/<job>/checkpoint_NNNNNN/<file>: folders only (not checkpoint_manifest.json)
    folders = {p[2] for p in paths if len(p) > 3 and p[2].startswith("checkpoint_")}
    committed = {n.split("/")[2] for n in names if n.endswith(f"/{COMMIT_MARKER}")}
    return folders, committed


@contextlib.contextmanager
def ready_cluster(node: Node, images: dict[str, Image]) -> Iterator[Cluster]:
    """fake-gcs-server and the chart on the running ``node``; the :class:`Cluster`, its API
    client closed afterwards. Records how long this took in ``node.timings``."""
    started = time.monotonic()
    create_fake_gcs(node, images)
    install_chart(node, images)
    cluster = Cluster(node, images, fake_gcs_url(node))
    node.timings["then the chart and fake-gcs-server"] = round(time.monotonic() - started, 1)
    try:
        yield cluster
    finally:
        cluster.api.close()
