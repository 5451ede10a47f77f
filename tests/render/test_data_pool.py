"""Data pool pods (``spec.data.pool``) and the driver's data-pool selector."""

from __future__ import annotations

from typing import Any

import pytest

from tests.render.helpers import UID, container, env, labels, make_job, ray_start_args
from trainjob_operator.render import (
    RenderOptions,
    render_children,
    render_data_pods,
    render_driver_pod,
)

DATA = {"datasets": "pkg.data:datasets"}


def _job(**pool: Any) -> Any:
    return make_job(name="dj", data={**DATA, "pool": pool} if pool else DATA)


def test_without_spec_data_no_pool_and_no_selector() -> None:
    job = make_job(name="dj")
    assert render_data_pods(job, uid=UID) == []
    assert "TRAINJOB_DATA_LABEL_SELECTOR" not in env(render_driver_pod(job, uid=UID))


def test_the_default_pool_is_one_pod_advertising_one_cpu_labelled_data() -> None:
    [pod] = render_data_pods(_job(), uid=UID)
    assert pod["metadata"]["name"] == "dj-data-0"
    assert labels(pod)["trainjob.dev/role"] == "data"
    assert container(pod)["name"] == "ray-data"
    assert ray_start_args(pod) == [
        "--address=dj-head.dj-headless:6379",
        "--block",
        "--metrics-export-port=8080",
        "--disable-usage-stats",
        "--num-cpus=1",
        "--num-gpus=0",
        "--labels=trainjob.dev/pool=data",
    ]
    assert "cloud.google.com/gke-spot" not in (pod["spec"].get("nodeSelector") or {})


def test_replicas_resources_and_spot() -> None:
    custom = {"key": "dedicated", "operator": "Equal", "value": "data", "effect": "NoSchedule"}
    pods = render_data_pods(
        _job(
            replicas=2,
            resources={"cpu": "1500m", "memory": "4Gi"},
            nodeSelector={"pool": "cpu"},
            tolerations=[custom],
            spot=True,
        ),
        uid=UID,
    )
    assert [p["metadata"]["name"] for p in pods] == ["dj-data-0", "dj-data-1"]
    for pod in pods:
        assert "--num-cpus=2" in ray_start_args(pod)  # 1500m rounded up
        assert container(pod)["resources"]["requests"] == {"cpu": "1500m", "memory": "4Gi"}
        assert pod["spec"]["nodeSelector"] == {
            "cloud.google.com/gke-spot": "true",
            "pool": "cpu",
        }
        assert custom in pod["spec"]["tolerations"]


def test_spot_contradicted_by_the_node_selector_names_the_field() -> None:
    job = _job(spot=True, nodeSelector={"cloud.google.com/gke-spot": "false"})
    with pytest.raises(ValueError, match=r"spec\.data\.pool\.nodeSelector"):
        render_data_pods(job, uid=UID)


def test_the_driver_pins_the_datasets_ray_data_to_the_data_pool() -> None:
    driver_env = env(render_driver_pod(_job(), uid=UID))
    assert driver_env["TRAINJOB_DATA_LABEL_SELECTOR"] == '{"trainjob.dev/pool": "data"}'
    assert driver_env["TRAINJOB_WORKER_LABEL_SELECTOR"] == '{"trainjob.dev/pool": "train"}'


def test_children_include_the_pool_before_the_driver_and_count_it_in_the_budget() -> None:
    job = _job(replicas=3)
    names = [c["metadata"]["name"] for c in render_children(job, uid=UID) if c["kind"] == "Pod"]
    assert names[-4:] == ["dj-data-0", "dj-data-1", "dj-data-2", "dj-driver"]
    with pytest.raises(ValueError, match=r"up to 6 pods .*3 data pod\(s\)"):
        render_children(job, uid=UID, options=RenderOptions(max_pods_per_job=5))
