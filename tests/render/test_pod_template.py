"""``spec.podTemplate``: merged into every pod, unknown or reserved keys rejected."""

from __future__ import annotations

from typing import Any

import pytest

from tests.render.helpers import UID, container, make_job, tpu_job
from trainjob_operator.render import (
    POD_TEMPLATE_KEYS,
    render_children,
    render_worker_pods,
    validate_pod_template,
)

TEMPLATE: dict[str, Any] = {
    "labels": {"team": "ml"},
    "annotations": {"example.com/cost-center": "42"},
    "nodeSelector": {"topology.kubernetes.io/zone": "us-east5-b"},
    "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
    "volumes": [{"name": "ckpt", "persistentVolumeClaim": {"claimName": "ckpt"}}],
    "volumeMounts": [{"name": "ckpt", "mountPath": "/mnt/ckpt"}],
    "envFrom": [{"secretRef": {"name": "wandb"}}],
    "imagePullSecrets": [{"name": "registry"}],
    "priorityClassName": "high",
    "schedulerName": "custom",
    "terminationGracePeriodSeconds": 5,
    "securityContext": {"runAsUser": 2000, "fsGroup": 3000},
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "arch", "operator": "In", "values": ["x"]}]}
                ]
            }
        }
    },
}


def _pods(job: Any) -> list[dict[str, Any]]:
    replicas = 1 if job.spec.validation is not None else 0
    children = render_children(job, uid=UID, validation_replicas=replicas)
    return [c for c in children if c["kind"] == "Pod"]


def test_every_key_is_merged_into_every_pod() -> None:
    job = make_job(
        podTemplate=TEMPLATE,
        scaling={"numWorkers": 1},
        validation={"entrypoint": "pkg.mod:validate", "pool": {"spot": False}},
    )
    pods = _pods(job)
    assert {p["metadata"]["labels"]["trainjob.dev/role"] for p in pods} == {
        "head",
        "worker",
        "validation",
        "driver",
    }
    for pod in pods:
        spec = pod["spec"]
        main = container(pod)
        assert pod["metadata"]["labels"]["team"] == "ml"
        assert pod["metadata"]["annotations"]["example.com/cost-center"] == "42"
        assert spec["nodeSelector"] == {"topology.kubernetes.io/zone": "us-east5-b"}
        assert spec["tolerations"] == TEMPLATE["tolerations"]
        assert spec["volumes"] == [
            {"name": "dshm", "emptyDir": {"medium": "Memory"}},
            {"name": "tmp", "emptyDir": {}},
            *TEMPLATE["volumes"],
        ]
        assert main["volumeMounts"] == [
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "tmp", "mountPath": "/tmp"},
            *TEMPLATE["volumeMounts"],
        ]
        assert main["envFrom"] == TEMPLATE["envFrom"]
        assert spec["imagePullSecrets"] == [{"name": "registry"}]
        assert spec["priorityClassName"] == "high"
        assert spec["schedulerName"] == "custom"
        assert spec["terminationGracePeriodSeconds"] == 5
        assert spec["securityContext"]["runAsUser"] == 2000
        assert spec["securityContext"]["fsGroup"] == 3000
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert "runAsUser" not in main["securityContext"]  # the pod-level uid applies
        assert main["securityContext"]["allowPrivilegeEscalation"] is False
        assert spec["affinity"] == TEMPLATE["affinity"]


def test_overrides_are_not_shared_between_pods() -> None:
    pods = _pods(make_job(podTemplate=TEMPLATE, scaling={"numWorkers": 2}))
    pods[0]["spec"]["tolerations"].append({"key": "mutated"})
    pods[0]["spec"]["volumes"][2]["name"] = "mutated"
    assert pods[1]["spec"]["tolerations"] == TEMPLATE["tolerations"]
    assert pods[1]["spec"]["volumes"][2]["name"] == "ckpt"
    assert TEMPLATE["volumes"][0]["name"] == "ckpt"


def test_tpu_workers_merge_selectors_tolerations_and_affinity_terms() -> None:
    user_term = {
        "labelSelector": {"matchLabels": {"app": "cache"}},
        "topologyKey": "kubernetes.io/hostname",
    }
    job = tpu_job(
        "4x4",
        podTemplate={
            "nodeSelector": {"cloud.google.com/gke-nodepool": "pool-a"},
            "tolerations": [{"key": "x", "operator": "Exists"}],
            "affinity": {
                "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [user_term]}
            },
        },
    )
    [pod, *_] = render_worker_pods(job, uid=UID)
    assert pod["spec"]["nodeSelector"] == {
        "cloud.google.com/gke-nodepool": "pool-a",
        "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
        "cloud.google.com/gke-tpu-topology": "4x4",
    }
    assert pod["spec"]["tolerations"] == [
        {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "x", "operator": "Exists"},
    ]
    terms = pod["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert len(terms) == 2
    assert terms[0]["topologyKey"] == "cloud.google.com/gke-nodepool"
    assert terms[1] == user_term


def test_conflicting_tpu_selector_is_rejected() -> None:
    job = tpu_job("4x4", podTemplate={"nodeSelector": {"cloud.google.com/gke-tpu-topology": "2x2"}})
    with pytest.raises(
        ValueError, match=r"spec\.podTemplate\.nodeSelector\['cloud.google.com/gke-tpu-topology'\]"
    ):
        render_worker_pods(job, uid=UID)


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ({"foo": 1}, r"^spec\.podTemplate\.foo: unknown key; accepted keys: labels, annotations"),
        ({"env": []}, r"spec\.podTemplate\.env: unknown key.*hint: set environment variables"),
        ({"resources": {}}, r"spec\.podTemplate\.resources: .*resourcesPerWorker"),
        ({"spec": {}}, r"spec\.podTemplate\.spec: .*write the keys flat"),
        ({"serviceAccountName": "x"}, r"spec\.podTemplate\.serviceAccountName: .*storage"),
        ({"labels": {"trainjob.dev/role": "x"}}, r"labels\['trainjob.dev/role'\]: .*operator"),
        (
            {"labels": {"kueue.x-k8s.io/queue-name": "q"}},
            r"labels\['kueue.x-k8s.io/queue-name'\].*spec\.queueName",
        ),
        ({"labels": {"app.kubernetes.io/name": "x"}}, r"labels\['app.kubernetes.io/name'\]"),
        ({"annotations": {"trainjob.dev/spec-hash": "x"}}, r"annotations\['trainjob.dev/"),
        ({"labels": {"n": 1}}, r"spec\.podTemplate\.labels\['n'\]: .*strings"),
        ({"labels": ["a"]}, r"spec\.podTemplate\.labels: expected a mapping"),
        ({"tolerations": {"key": "x"}}, r"spec\.podTemplate\.tolerations: expected a list"),
        ({"tolerations": ["x"]}, r"spec\.podTemplate\.tolerations\[0\]: expected a mapping"),
        ({"volumes": [{"emptyDir": {}}]}, r"spec\.podTemplate\.volumes\[0\]\.name: required"),
        ({"volumes": [{"name": "dshm", "emptyDir": {}}]}, r"volumes\[0\]\.name: 'dshm'"),
        (
            {"volumes": [{"name": "a", "emptyDir": {}}, {"name": "a", "emptyDir": {}}]},
            r"volumes\[1\]\.name: 'a' is used twice",
        ),
        (
            {"volumeMounts": [{"name": "nope", "mountPath": "/x"}]},
            r"volumeMounts\[0\]\.name: no volume 'nope'",
        ),
        (
            {
                "volumes": [{"name": "s", "emptyDir": {}}],
                "volumeMounts": [{"name": "s", "mountPath": "/dev/shm/"}],
            },
            r"volumeMounts\[0\]\.mountPath: /dev/shm",
        ),
        (
            {"volumes": [{"name": "s", "emptyDir": {}}], "volumeMounts": [{"name": "s"}]},
            r"volumeMounts\[0\]\.mountPath: required",
        ),
        ({"affinity": {"podAffinityX": {}}}, r"spec\.podTemplate\.affinity\.podAffinityX"),
        ({"affinity": {"podAffinity": {"x": {}}}}, r"affinity\.podAffinity\.x: expected a list"),
        ({"securityContext": {"privileged": True}}, r"securityContext\.privileged: not accepted"),
        ({"securityContext": {"runAsUser": 0}}, r"securityContext\.runAsUser: .*root"),
        ({"securityContext": {"fsGroup": "1"}}, r"securityContext\.fsGroup: expected"),
        ({"securityContext": {"fsGroupChangePolicy": "x"}}, r"fsGroupChangePolicy: must be"),
        ({"securityContext": {"supplementalGroups": [-1]}}, r"supplementalGroups: expected"),
        ({"terminationGracePeriodSeconds": -1}, r"terminationGracePeriodSeconds: expected"),
        ({"priorityClassName": ""}, r"priorityClassName: expected a non-empty string"),
    ],
)
def test_rejections_name_the_field(template: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        validate_pod_template(template)
    with pytest.raises(ValueError, match=message):
        render_children(make_job(podTemplate=template), uid=UID)


def test_accepted_keys_are_documented() -> None:
    assert list(POD_TEMPLATE_KEYS) == [
        "labels",
        "annotations",
        "nodeSelector",
        "tolerations",
        "affinity",
        "volumes",
        "volumeMounts",
        "envFrom",
        "imagePullSecrets",
        "priorityClassName",
        "schedulerName",
        "terminationGracePeriodSeconds",
        "securityContext",
    ]
    validate_pod_template(None)
    validate_pod_template({})
    validate_pod_template(TEMPLATE)
