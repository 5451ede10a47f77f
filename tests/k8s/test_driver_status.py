"""The driver's status publisher against a real kube-apiserver (status subresource + RBAC)."""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import EnvTest
from trainer_runtime.checkpoint_manager import CheckpointRecord, CheckpointStatus
from trainjob_operator.kube import DRIVER_USER_AGENT, KubeClient, KubeConfig
from trainjob_operator.launcher.driver import StatusPublisher

pytestmark = pytest.mark.usefixtures("crd")

REPO = Path(__file__).resolve().parents[2]


def _status(kube: KubeClient, ns: str) -> dict[str, Any]:
    obj = kube.get("TrainJob", ns, "quickstart")
    assert obj is not None
    return dict(obj.get("status") or {})


def test_publisher_patches_progress_checkpoints_and_demand(
    kube: KubeClient, k8s_namespace: str
) -> None:
    body = copy.deepcopy(yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text()))
    body["metadata"]["namespace"] = k8s_namespace
    kube.create(body, k8s_namespace)
    # The operator owns phase; the driver's patch must not touch it.
    kube.patch(
        "TrainJob",
        k8s_namespace,
        "quickstart",
        {"status": {"phase": "Running"}},
        subresource="status",
    )
    pub = StatusPublisher(kube, k8s_namespace, "quickstart", "val_loss", min_interval=0.1)
    pub.on_report(0, {"epoch": 0, "train_loss": 0.5})
    record = CheckpointRecord(
        "checkpoint_000000",
        "/ckpt/checkpoint_000000",
        0,
        {"epoch": 0, "train_loss": 0.5},
        status=CheckpointStatus.PENDING_VALIDATION,
    )
    pub.on_checkpoint(record, None)
    pub.on_validation_demand(1, 0)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and "validations" not in _status(kube, k8s_namespace):
        time.sleep(0.1)
    record.status = CheckpointStatus.VALIDATED
    record.validation_metrics = {"val_loss": 0.25}
    pub.on_checkpoint(record, record)
    pub.on_validation_demand(0, 0)
    pub.close()
    status = _status(kube, k8s_namespace)
    assert status["phase"] == "Running"
    assert status["progress"]["step"] == 0
    assert status["progress"]["metrics"] == {"epoch": 0, "train_loss": 0.5}
    assert status["latestCheckpoint"]["path"] == "/ckpt/checkpoint_000000"
    assert status["bestCheckpoint"]["score"] == 0.25
    assert status["validations"] == {"pending": 0, "running": 0, "done": 1, "failed": 0}


def test_publisher_sends_nan_and_infinite_metrics_the_api_server_accepts(
    kube: KubeClient, k8s_namespace: str
) -> None:
    # A diverging run reports NaN/inf. JSON has no such numbers: free-form metrics carry them
    # as strings and the typed bestCheckpoint.score as null, so this patch and every later
    # one are accepted (a bare NaN token would make the API server reject all of them).
    body = copy.deepcopy(yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text()))
    body["metadata"]["namespace"] = k8s_namespace
    kube.create(body, k8s_namespace)
    pub = StatusPublisher(kube, k8s_namespace, "quickstart", "val_loss", min_interval=0.1)
    nan, inf = float("nan"), float("inf")
    pub.on_report(0, {"epoch": 0, "train_loss": nan, "grad": [1.0, -inf], "ok": 1.5})
    record = CheckpointRecord(
        "checkpoint_000000",
        "/ckpt/checkpoint_000000",
        0,
        {"epoch": 0, "train_loss": nan},
        status=CheckpointStatus.VALIDATED,
        validation_metrics={"val_loss": inf},
    )
    pub.on_checkpoint(record, record)
    pub.close()
    status = _status(kube, k8s_namespace)
    assert status["progress"]["metrics"] == {
        "epoch": 0,
        "train_loss": "NaN",
        "grad": [1.0, "-Infinity"],
        "ok": 1.5,
    }
    assert status["latestCheckpoint"]["metrics"] == {
        "epoch": 0,
        "train_loss": "NaN",
        "val_loss": "Infinity",
    }
    assert status["bestCheckpoint"]["path"] == "/ckpt/checkpoint_000000"
    assert status["bestCheckpoint"].get("score") is None
    # Later patches still go through, and a finite score is a number again.
    pub = StatusPublisher(kube, k8s_namespace, "quickstart", "val_loss", min_interval=0.1)
    pub.on_report(1, {"epoch": 1, "train_loss": 0.5})
    record = CheckpointRecord(
        "checkpoint_000001",
        "/ckpt/checkpoint_000001",
        1,
        {"epoch": 1},
        status=CheckpointStatus.VALIDATED,
        validation_metrics={"val_loss": 0.25},
    )
    pub.on_checkpoint(record, record)
    pub.close()
    status = _status(kube, k8s_namespace)
    assert status["progress"]["step"] == 1
    assert status["progress"]["metrics"]["train_loss"] == 0.5
    assert status["bestCheckpoint"]["score"] == 0.25


def test_kube_client_refuses_to_send_a_non_finite_float(kube: KubeClient) -> None:
    with pytest.raises(ValueError, match=r"PATCH .*NaN or infinite float"):
        kube.patch("TrainJob", "default", "nothing", {"status": {"x": float("nan")}})


def test_kube_client_keeps_one_connection_alive_per_thread(
    kube: KubeClient, k8s_namespace: str
) -> None:
    import threading

    kube.list("Pod", k8s_namespace)
    conn = kube._local.conn
    sock = conn.sock
    assert sock is not None  # kept open after the answer
    kube.get("ServiceAccount", k8s_namespace, "default")
    kube.list("Pod", k8s_namespace, "a=b", from_cache=True)
    assert kube._local.conn is conn and conn.sock is sock  # no new TLS handshake
    seen: list[Any] = []
    worker = threading.Thread(
        target=lambda: (kube.list("Pod", k8s_namespace), seen.append(kube._local.conn))
    )
    worker.start()
    worker.join()
    assert seen and seen[0] is not conn  # each thread has its own connection


def test_the_api_server_names_the_operator_and_the_driver_as_the_status_writers(
    envtest: EnvTest, kube: KubeClient, k8s_namespace: str
) -> None:
    # Each client identifies itself (User-Agent), and the API server records the writer of
    # every field after it: `kubectl get --show-managed-fields` tells who wrote what.
    body = copy.deepcopy(yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text()))
    body["metadata"]["namespace"] = k8s_namespace
    kube.create(body, k8s_namespace)
    kube.patch("TrainJob", k8s_namespace, "quickstart", {"status": {"phase": "Running"}}, "status")
    config = KubeConfig(host=envtest.host, token=envtest.token, ca_file=str(envtest.ca_file))
    driver = KubeClient(config, user_agent=DRIVER_USER_AGENT)
    pub = StatusPublisher(driver, k8s_namespace, "quickstart", "val_loss", min_interval=0.0)
    pub.on_report(3, {"epoch": 0, "train_loss": 0.5})
    pub.close()
    obj = kube.get("TrainJob", k8s_namespace, "quickstart")
    assert obj is not None
    status_fields: dict[str, set[str]] = {}
    for entry in obj["metadata"]["managedFields"]:
        fields = entry["fieldsV1"].get("f:status", {})
        status_fields.setdefault(entry["manager"], set()).update(fields)
    assert "f:phase" in status_fields["trainjob-operator"]
    assert "f:progress" in status_fields["trainjob-driver"]
    assert "f:phase" not in status_fields["trainjob-driver"]
