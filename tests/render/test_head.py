"""The Ray head pod."""

from __future__ import annotations

from tests.render.helpers import UID, container, env, example, labels, make_job, ray_auth_env
from trainjob_operator.render import RenderOptions, render_head_pod


def test_head_command_ports_and_probe() -> None:
    pod = render_head_pod(make_job(), uid=UID)
    main = container(pod)
    assert pod["metadata"]["name"] == "job-head"
    assert main["command"] == [
        "ray",
        "start",
        "--head",
        "--block",
        "--port=6379",
        "--dashboard-host=127.0.0.1",
        "--dashboard-port=8265",
        "--ray-client-server-port=10001",
        "--metrics-export-port=8080",
        "--num-cpus=0",
        "--num-gpus=0",
        "--disable-usage-stats",
    ]
    assert main["ports"] == [
        {"name": "gcs", "containerPort": 6379, "protocol": "TCP"},
        {"name": "client", "containerPort": 10001, "protocol": "TCP"},
        {"name": "metrics", "containerPort": 8080, "protocol": "TCP"},
    ]
    assert main["readinessProbe"] == {
        "tcpSocket": {"port": 6379},
        "periodSeconds": 5,
        "failureThreshold": 3,
    }
    assert labels(pod)["trainjob.dev/role"] == "head"
    assert pod["spec"]["hostname"] == "job-head"
    assert pod["spec"]["subdomain"] == "job-headless"
    assert pod["spec"]["restartPolicy"] == "Never"


def test_head_resources_from_spec_ray_head() -> None:
    pod = render_head_pod(example("tpu-v6e-4x4.yaml"), uid=UID)
    assert container(pod)["resources"] == {
        "requests": {"cpu": "4", "memory": "16Gi"},
        "limits": {"cpu": "4", "memory": "16Gi"},
    }


def test_head_resources_default_from_options() -> None:
    pod = render_head_pod(make_job(), uid=UID)
    assert container(pod)["resources"]["limits"] == {"cpu": "1", "memory": "2Gi"}
    options = RenderOptions(head_resources={"cpu": "500m", "memory": "1Gi"})
    pod = render_head_pod(make_job(), uid=UID, options=options)
    assert container(pod)["resources"]["requests"] == {"cpu": "500m", "memory": "1Gi"}


def test_head_runs_no_user_code_so_no_identity() -> None:
    pod = render_head_pod(example("tpu-v6e-4x4.yaml"), uid=UID)
    assert "serviceAccountName" not in pod["spec"]
    assert pod["spec"]["automountServiceAccountToken"] is False


def test_head_on_cpu_nodes_without_tpu_selectors_or_tolerations() -> None:
    pod = render_head_pod(example("tpu-v6e-4x4.yaml"), uid=UID)
    assert "nodeSelector" not in pod["spec"]
    assert "tolerations" not in pod["spec"]
    assert "affinity" not in pod["spec"]


def test_head_env_and_spec_env() -> None:
    job = make_job(env=[{"name": "HF_HOME", "value": "/cache"}])
    assert env(render_head_pod(job, uid=UID, attempt=2)) == {
        "TRAINJOB_NAME": "job",
        "TRAINJOB_NAMESPACE": "ns",
        "TRAINJOB_ATTEMPT": "2",
        "TRAINJOB_TERMINATION_GRACE_PERIOD_S": "30",
        **ray_auth_env("job"),
        "HF_HOME": "/cache",
    }


def test_head_is_in_the_kueue_gang() -> None:
    job = make_job(queueName="q", scaling={"numWorkers": 3})
    pod = render_head_pod(job, uid=UID)
    assert labels(pod)["kueue.x-k8s.io/queue-name"] == "q"
    assert labels(pod)["kueue.x-k8s.io/pod-group-name"] == "job-attempt-0"
    assert pod["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"] == "4"
