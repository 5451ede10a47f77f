"""The headless Service."""

from __future__ import annotations

from tests.render.helpers import UID, example, make_job
from trainjob_operator.render import SPEC_HASH_ANNOTATION, render_headless_service


def test_headless_service_exact() -> None:
    svc = render_headless_service(make_job(name="demo"), uid=UID)
    annotations = svc["metadata"].pop("annotations")
    assert set(annotations) == {SPEC_HASH_ANNOTATION}
    assert svc == {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": "demo-headless",
            "namespace": "ns",
            "labels": {
                "app.kubernetes.io/name": "trainjob",
                "app.kubernetes.io/managed-by": "trainjob-operator",
                "trainjob.dev/name": "demo",
                "trainjob.dev/role": "head",
            },
            "ownerReferences": [
                {
                    "apiVersion": "trainjob.dev/v1alpha1",
                    "kind": "TrainJob",
                    "name": "demo",
                    "uid": UID,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {"trainjob.dev/name": "demo"},
            "ports": [
                {"name": "gcs", "port": 6379, "targetPort": 6379, "protocol": "TCP"},
                {"name": "client", "port": 10001, "targetPort": 10001, "protocol": "TCP"},
                {"name": "metrics", "port": 8080, "targetPort": 8080, "protocol": "TCP"},
            ],
        },
    }


def test_service_has_no_attempt_and_does_not_change_across_restarts() -> None:
    job = example("tpu-v6e-4x4.yaml")
    svc = render_headless_service(job, uid=UID)
    assert svc["metadata"]["name"] == "llm-v6e-4x4-headless"
    assert svc["metadata"]["namespace"] == "training"
    assert "trainjob.dev/attempt" not in svc["metadata"]["labels"]
