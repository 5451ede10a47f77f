"""Validation pool pods."""

from __future__ import annotations

from typing import Any

import pytest

from tests.render.helpers import UID, container, example, labels, make_job, ray_start_args
from trainjob_operator.render import RenderOptions, render_validation_pods

SPOT_TOLERATION = {
    "key": "cloud.google.com/gke-spot",
    "operator": "Equal",
    "value": "true",
    "effect": "NoSchedule",
}


def _job(**pool: Any) -> Any:
    return make_job(
        name="vj",
        validation={"entrypoint": "pkg.mod:validate", "pool": {"maxReplicas": 4, **pool}},
    )


def _ray_args(pod: dict[str, Any]) -> list[str]:
    return ray_start_args(pod)


def test_zero_replicas_renders_nothing() -> None:
    assert render_validation_pods(_job(), uid=UID, validation_replicas=0) == []


def test_three_replicas() -> None:
    pods = render_validation_pods(_job(), uid=UID, validation_replicas=3)
    assert [p["metadata"]["name"] for p in pods] == ["vj-val-0", "vj-val-1", "vj-val-2"]
    for pod in pods:
        assert labels(pod)["trainjob.dev/role"] == "validation"
        assert pod["spec"]["hostname"] == pod["metadata"]["name"]
        assert pod["spec"]["subdomain"] == "vj-headless"
        assert _ray_args(pod) == [
            "--address=vj-head.vj-headless:6379",
            "--block",
            "--metrics-export-port=8080",
            "--disable-usage-stats",
            "--num-cpus=1",  # pool without a cpu: 1, for the Ray Data tasks of a validation
            "--num-gpus=0",
            '--resources={"validation":1}',
            "--labels=trainjob.dev/pool=validation",
        ]


def test_spot_selector_merged_with_pool_selector_and_tolerations() -> None:
    custom = {"key": "dedicated", "operator": "Equal", "value": "val", "effect": "NoSchedule"}
    job = _job(
        spot=True,
        nodeSelector={"cloud.google.com/gke-nodepool": "val-pool"},
        tolerations=[custom],
        resources={"cpu": "2", "memory": "8Gi"},
    )
    [pod] = render_validation_pods(job, uid=UID, validation_replicas=1)
    assert pod["spec"]["nodeSelector"] == {
        "cloud.google.com/gke-nodepool": "val-pool",
        "cloud.google.com/gke-spot": "true",
    }
    assert pod["spec"]["tolerations"] == [custom, SPOT_TOLERATION]
    assert container(pod)["resources"] == {
        "requests": {"cpu": "2", "memory": "8Gi"},
        "limits": {"cpu": "2", "memory": "8Gi"},
    }


def test_on_demand_pool_has_no_spot_selector() -> None:
    [pod] = render_validation_pods(_job(spot=False), uid=UID, validation_replicas=1)
    assert "nodeSelector" not in pod["spec"]
    assert "tolerations" not in pod["spec"]


def test_pool_selector_contradicting_spot_is_rejected() -> None:
    job = _job(spot=True, nodeSelector={"cloud.google.com/gke-spot": "false"})
    with pytest.raises(ValueError, match=r"spec\.validation\.pool\.nodeSelector"):
        render_validation_pods(job, uid=UID, validation_replicas=1)


def test_pool_selector_overrides_pod_template_selector() -> None:
    job = make_job(
        podTemplate={"nodeSelector": {"cloud.google.com/gke-nodepool": "general", "zone": "a"}},
        validation={
            "entrypoint": "pkg.mod:validate",
            "pool": {"spot": False, "nodeSelector": {"cloud.google.com/gke-nodepool": "val"}},
        },
    )
    [pod] = render_validation_pods(job, uid=UID, validation_replicas=1)
    assert pod["spec"]["nodeSelector"] == {"cloud.google.com/gke-nodepool": "val", "zone": "a"}


def test_example_pool() -> None:
    job = example("tpu-v6e-4x4.yaml")
    pods = render_validation_pods(job, uid=UID, validation_replicas=2)
    assert [p["metadata"]["name"] for p in pods] == ["llm-v6e-4x4-val-0", "llm-v6e-4x4-val-1"]
    for pod in pods:
        assert pod["spec"]["nodeSelector"] == {"cloud.google.com/gke-spot": "true"}
        assert pod["spec"]["serviceAccountName"] == "trainjob-gcs"
        assert container(pod)["resources"]["limits"] == {"cpu": "4", "memory": "16Gi"}
        assert "--num-cpus=4" in _ray_args(pod)  # the pod's CPUs, for Ray Data's tasks
        # not TPU pods
        assert "google.com/tpu" not in container(pod)["resources"]["limits"]
        assert "affinity" not in pod["spec"]


def test_validation_slots_option() -> None:
    options = RenderOptions(validation_slots=2)
    [pod] = render_validation_pods(_job(), uid=UID, validation_replicas=1, options=options)
    assert _ray_args(pod)[-3:] == [
        "--num-gpus=0",
        '--resources={"validation":2}',
        "--labels=trainjob.dev/pool=validation",
    ]
    with pytest.raises(ValueError, match="validation_slots"):
        RenderOptions(validation_slots=0)


@pytest.mark.parametrize(
    ("replicas", "message"),
    [(-1, "must be >= 0"), (5, r"exceeds spec\.validation\.pool\.maxReplicas \(4\)")],
)
def test_bad_replica_counts(replicas: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        render_validation_pods(_job(), uid=UID, validation_replicas=replicas)


def test_replicas_without_validation_spec() -> None:
    assert render_validation_pods(make_job(), uid=UID, validation_replicas=0) == []
    with pytest.raises(ValueError, match=r"spec\.validation is not set"):
        render_validation_pods(make_job(), uid=UID, validation_replicas=1)


def test_validation_pods_are_queued_but_not_in_the_gang() -> None:
    job = make_job(queueName="q", validation={"entrypoint": "pkg.mod:validate"})
    [pod] = render_validation_pods(job, uid=UID, validation_replicas=1)
    assert labels(pod)["kueue.x-k8s.io/queue-name"] == "q"
    assert "kueue.x-k8s.io/pod-group-name" not in labels(pod)
    assert "kueue.x-k8s.io/pod-group-total-count" not in pod["metadata"]["annotations"]


def test_the_pool_keeps_the_ray_data_of_its_validations_on_its_nodes() -> None:
    """Its env names its Ray node label for the Ray Data tasks of a validation
    (trainer_runtime._validation.keep_ray_data_on_this_pool reads it)."""
    [pod] = render_validation_pods(_job(), uid=UID, validation_replicas=1)
    values = {e["name"]: e.get("value") for e in container(pod)["env"]}
    assert (
        values["TRAINJOB_VALIDATION_DATA_LABEL_SELECTOR"] == '{"trainjob.dev/pool": "validation"}'
    )
    assert "--labels=trainjob.dev/pool=validation" in _ray_args(pod)
