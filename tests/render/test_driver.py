"""The driver pod: command, env, the TrainJob it receives, identity, resources."""

from __future__ import annotations

import json

import pytest

from tests.render.helpers import UID, container, env, example, labels, make_job, ray_auth_env
from trainjob_operator.api import parse_trainjob
from trainjob_operator.render import (
    DRIVER_MANIFEST_ENV,
    SPEC_HASH_ANNOTATION,
    RenderOptions,
    driver_manifest,
    driver_manifest_json,
    render_children,
    render_driver_pod,
)


def _hash(obj: dict[str, object]) -> str:
    meta = obj["metadata"]
    assert isinstance(meta, dict)
    return str(meta["annotations"][SPEC_HASH_ANNOTATION])


def test_driver_pod_basics() -> None:
    pod = render_driver_pod(example("quickstart.yaml"), uid=UID)
    assert pod["metadata"]["name"] == "quickstart-driver"
    assert labels(pod)["trainjob.dev/role"] == "driver"
    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"]["serviceAccountName"] == "quickstart-driver"
    assert "automountServiceAccountToken" not in pod["spec"]
    assert container(pod)["name"] == "driver"
    assert container(pod)["resources"] == {
        "requests": {"cpu": "1", "memory": "2Gi"},
        "limits": {"cpu": "1", "memory": "2Gi"},
    }


def test_driver_env() -> None:
    job = make_job(name="dj", env=[{"name": "WANDB_MODE", "value": "offline"}])
    values = env(render_driver_pod(job, uid=UID, attempt=1))
    manifest = values.pop(DRIVER_MANIFEST_ENV)
    assert values == {
        "RAY_ADDRESS": "dj-head.dj-headless:6379",
        "TRAINJOB_NAME": "dj",
        "TRAINJOB_NAMESPACE": "ns",
        "TRAINJOB_ATTEMPT": "1",
        "TRAINJOB_TERMINATION_GRACE_PERIOD_S": "30",
        "PYTHONUNBUFFERED": "1",
        "TRAINJOB_METRICS_PORT": "9091",
        "TRAINJOB_WORKER_LABEL_SELECTOR": '{"trainjob.dev/pool": "train"}',
        **ray_auth_env("dj"),
        "WANDB_MODE": "offline",
    }
    assert manifest == driver_manifest_json(job, uid=UID)


def test_manifest_round_trips_through_parse_trainjob() -> None:
    job = example("tpu-v6e-4x4.yaml")
    text = env(render_driver_pod(job, uid=UID))[DRIVER_MANIFEST_ENV]
    data = json.loads(text)
    assert data == driver_manifest(job, uid=UID)
    assert data["metadata"] == {"name": "llm-v6e-4x4", "namespace": "training", "uid": UID}
    parsed = parse_trainjob(data)
    assert parsed.spec.entrypoint == job.spec.entrypoint
    assert parsed.spec.config == job.spec.config
    assert parsed.spec.scaling == job.spec.scaling
    assert parsed.spec.validation == job.spec.validation
    assert parsed.spec.checkpoint == job.spec.checkpoint
    assert parsed.spec.storage == job.spec.storage
    assert parsed.spec.failure.max_failures == job.spec.failure.max_failures
    # Operator-only fields are left out (and come back as defaults).
    assert "ttlSecondsAfterFinished" not in data["spec"]
    assert data["spec"]["failure"] == {"maxFailures": 2, "maxPreemptionFailures": -1}


def test_manifest_is_pinned_to_metadata_it_needs() -> None:
    body = {
        "apiVersion": "trainjob.dev/v1alpha1",
        "kind": "TrainJob",
        "metadata": {
            "name": "k",
            "namespace": "ns",
            "uid": UID,
            "generation": 7,
            "resourceVersion": "123",
            "managedFields": [{"manager": "kubectl"}],
            "labels": {"team": "a"},
        },
        "spec": {"entrypoint": "pkg.mod:train"},
        "status": {"phase": "Running"},
    }
    data = driver_manifest(parse_trainjob(body), uid=UID)
    assert data["metadata"] == {"name": "k", "namespace": "ns", "uid": UID}
    assert "status" not in data


def test_operator_only_fields_do_not_change_the_driver_hash() -> None:
    base = _hash(render_driver_pod(make_job(), uid=UID))
    for spec in (
        {"ttlSecondsAfterFinished": 60},
        {"suspend": True},
        {"failure": {"maxRestarts": 3, "activeDeadlineSeconds": 60}},
        {"queueName": None},
    ):
        assert _hash(render_driver_pod(make_job(**spec), uid=UID)) == base, spec
    assert _hash(render_driver_pod(make_job(config={"lr": 0.1}), uid=UID)) != base
    assert _hash(render_driver_pod(make_job(failure={"maxFailures": 1}), uid=UID)) != base


def test_oversized_spec_is_rejected() -> None:
    job = make_job(config={"blob": "x" * (130 * 1024)})
    with pytest.raises(ValueError, match=r"TRAINJOB_MANIFEST env var can hold; keep spec\.config"):
        render_driver_pod(job, uid=UID)
    render_driver_pod(make_job(config={"blob": "x" * (100 * 1024)}), uid=UID)


def test_driver_runs_as_storage_service_account_when_set() -> None:
    pod = render_driver_pod(example("tpu-v6e-4x4.yaml"), uid=UID)
    assert pod["spec"]["serviceAccountName"] == "trainjob-gcs"
    # ...with the per-job account's API token, never the storage account's.
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert {
        "name": "driver-api-token",
        "secret": {"secretName": "llm-v6e-4x4-driver-token", "defaultMode": 0o440},
    } in pod["spec"]["volumes"]
    assert {
        "name": "driver-api-token",
        "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
        "readOnly": True,
    } in container(pod)["volumeMounts"]
    children = render_children(example("tpu-v6e-4x4.yaml"), uid=UID)
    [token] = [c for c in children if c["metadata"]["name"] == "llm-v6e-4x4-driver-token"]
    assert token["type"] == "kubernetes.io/service-account-token"
    assert token["metadata"]["annotations"]["kubernetes.io/service-account.name"] == (
        "llm-v6e-4x4-driver"
    )
    names = [c["metadata"]["name"] for c in children if c["kind"] != "Pod"]
    assert names.index("llm-v6e-4x4-driver") < names.index("llm-v6e-4x4-driver-token")
    # Without a storage account: the per-job account, its token mounted by the kubelet.
    plain = render_driver_pod(make_job(), uid=UID)
    assert plain["spec"]["serviceAccountName"] == "job-driver"
    assert "automountServiceAccountToken" not in plain["spec"]
    assert "job-driver-token" not in [
        c["metadata"]["name"] for c in render_children(make_job(), uid=UID)
    ]


def test_local_mode_driver_gets_worker_resources() -> None:
    job = make_job(scaling={"numWorkers": 0, "resourcesPerWorker": {"cpu": "4", "memory": "8Gi"}})
    assert container(render_driver_pod(job, uid=UID))["resources"]["limits"] == {
        "cpu": "4",
        "memory": "8Gi",
    }
    job = make_job(scaling={"numWorkers": 0, "useGpu": True})
    assert container(render_driver_pod(job, uid=UID))["resources"]["limits"] == {
        "cpu": "1",
        "memory": "2Gi",
        "nvidia.com/gpu": "1",
    }


def test_driver_resources_from_spec_ray_driver_before_the_operators_default() -> None:
    sized = {"cpu": "500m", "memory": "4Gi"}
    job = make_job(ray={"driver": {"resources": sized}})
    options = RenderOptions(driver_resources={"cpu": "50m", "memory": "512Mi"})
    assert container(render_driver_pod(job, uid=UID, options=options))["resources"] == {
        "requests": sized,
        "limits": sized,
    }
    # Local mode: the train function runs in the driver, sized as a worker first.
    job = make_job(
        ray={"driver": {"resources": sized}},
        scaling={"numWorkers": 0, "resourcesPerWorker": {"cpu": "4", "memory": "8Gi"}},
    )
    limits = container(render_driver_pod(job, uid=UID))["resources"]["limits"]
    assert limits == {"cpu": "4", "memory": "8Gi"}
    job = make_job(ray={"driver": {"resources": sized}}, scaling={"numWorkers": 0})
    assert container(render_driver_pod(job, uid=UID))["resources"]["limits"] == sized


def test_driver_is_not_in_the_gang() -> None:
    pod = render_driver_pod(make_job(queueName="q"), uid=UID)
    assert labels(pod)["kueue.x-k8s.io/queue-name"] == "q"
    assert "kueue.x-k8s.io/pod-group-name" not in labels(pod)


def test_driver_container_starts_the_driver_start_launcher() -> None:
    """Waiting for the head, joining and exec'ing the driver is
    ``trainjob_operator.launcher.driver_start`` (tests/test_driver_start.py runs it)."""
    pod = render_driver_pod(make_job(name="dj"), uid=UID)
    assert container(pod)["command"] == ["python", "-m", "trainjob_operator.launcher.driver_start"]
    assert env(pod)["RAY_ADDRESS"] == "dj-head.dj-headless:6379"


def test_driver_serves_its_training_metrics_on_a_named_port_with_scrape_annotations() -> None:
    pod = render_driver_pod(make_job(name="dj"), uid=UID)
    assert container(pod)["ports"] == [
        {"name": "metrics", "containerPort": 9091, "protocol": "TCP"}
    ]
    assert env(pod)["TRAINJOB_METRICS_PORT"] == "9091"
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == "9091"
    assert annotations["prometheus.io/path"] == "/metrics"


def test_the_jobs_network_policy_opens_only_the_drivers_metrics_port_to_other_pods() -> None:
    from trainjob_operator.render.context import build_context
    from trainjob_operator.render.security import network_policy

    policy = network_policy(build_context(make_job(name="dj"), uid=UID))
    assert policy["spec"]["podSelector"] == {"matchLabels": {"trainjob.dev/name": "dj"}}
    assert policy["spec"]["ingress"] == [
        {"from": [{"podSelector": {"matchLabels": {"trainjob.dev/name": "dj"}}}]},
        {"ports": [{"protocol": "TCP", "port": 9091}]},
    ]
