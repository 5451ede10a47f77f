"""Operator-wide pod defaults (the chart's ``defaults.tpu``/``defaults.validationPool``)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.render.helpers import UID, make_job, tpu_job
from trainjob_operator.render import (
    RenderOptions,
    render_children,
    render_head_pod,
    render_options_from_env,
    render_validation_pods,
    render_worker_pods,
    renderer_for,
)

TPU_TOLERATION = {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}
SPOT_TOLERATION = {
    "key": "cloud.google.com/gke-spot",
    "operator": "Equal",
    "value": "true",
    "effect": "NoSchedule",
}
RESERVED = {"key": "reserved", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}
TEAM = {"key": "team", "operator": "Exists", "effect": "NoExecute"}

OPTIONS = RenderOptions(
    tpu_node_selector={"cloud.google.com/gke-nodepool": "tpu-v6e", "zone": "a"},
    tpu_tolerations=(RESERVED, TEAM),
    validation_node_selector={"cloud.google.com/gke-nodepool": "val-spot", "disk": "ssd"},
    validation_tolerations=(RESERVED, TEAM),
)


def _validation_job(**spec: Any) -> Any:
    pool = spec.pop("pool", {})
    return make_job(
        name="vj",
        validation={"entrypoint": "pkg.mod:validate", "pool": {"maxReplicas": 2, **pool}},
        **spec,
    )


def test_tpu_defaults_apply_to_tpu_workers() -> None:
    for pod in render_worker_pods(tpu_job("4x4"), uid=UID, options=OPTIONS):
        assert pod["spec"]["nodeSelector"] == {
            "cloud.google.com/gke-nodepool": "tpu-v6e",
            "zone": "a",
            "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
            "cloud.google.com/gke-tpu-topology": "4x4",
        }
        assert pod["spec"]["tolerations"] == [TPU_TOLERATION, RESERVED, TEAM]


def test_the_trainjobs_pod_template_wins_over_tpu_defaults() -> None:
    own = {"key": "reserved", "operator": "Equal", "value": "mine", "effect": "NoSchedule"}
    job = tpu_job(
        "2x4",
        podTemplate={"nodeSelector": {"zone": "b"}, "tolerations": [own]},
    )
    [pod] = render_worker_pods(job, uid=UID, options=OPTIONS)
    assert pod["spec"]["nodeSelector"]["zone"] == "b"
    assert pod["spec"]["nodeSelector"]["cloud.google.com/gke-nodepool"] == "tpu-v6e"
    # The default `reserved` toleration gives way to the job's own one (same key and effect).
    assert pod["spec"]["tolerations"] == [TPU_TOLERATION, TEAM, own]


def test_tpu_defaults_do_not_touch_other_pods() -> None:
    cpu = make_job(
        scaling={"numWorkers": 2},
        validation={"entrypoint": "pkg.mod:validate", "pool": {"spot": False}},
    )
    pods = [
        c
        for c in render_children(cpu, uid=UID, validation_replicas=1, options=OPTIONS)
        if c["kind"] == "Pod"
    ]
    assert {p["metadata"]["labels"]["trainjob.dev/role"] for p in pods} == {
        "head",
        "worker",
        "validation",
        "driver",
    }
    for pod in pods:
        selector = pod["spec"].get("nodeSelector", {})
        assert selector.get("zone") is None  # the TPU default
        if pod["metadata"]["labels"]["trainjob.dev/role"] != "validation":
            assert "nodeSelector" not in pod["spec"] and "tolerations" not in pod["spec"]
    tpu_head = render_head_pod(tpu_job("4x4"), uid=UID, options=OPTIONS)
    assert "nodeSelector" not in tpu_head["spec"] and "tolerations" not in tpu_head["spec"]


def test_validation_defaults_apply_to_validation_pods() -> None:
    pods = render_validation_pods(
        _validation_job(), uid=UID, validation_replicas=2, options=OPTIONS
    )
    for pod in pods:
        assert pod["spec"]["nodeSelector"] == {
            "cloud.google.com/gke-nodepool": "val-spot",
            "disk": "ssd",
            "cloud.google.com/gke-spot": "true",
        }
        assert pod["spec"]["tolerations"] == [SPOT_TOLERATION, RESERVED, TEAM]


def test_pool_and_pod_template_win_over_validation_defaults() -> None:
    own = {"key": "team", "operator": "Equal", "value": "x", "effect": "NoExecute"}
    job = _validation_job(
        pool={
            "spot": False,
            "nodeSelector": {"cloud.google.com/gke-nodepool": "my-pool"},
            "tolerations": [own],
        },
        podTemplate={"nodeSelector": {"disk": "hdd"}},
    )
    [pod] = render_validation_pods(job, uid=UID, validation_replicas=1, options=OPTIONS)
    assert pod["spec"]["nodeSelector"] == {
        "cloud.google.com/gke-nodepool": "my-pool",
        "disk": "hdd",
    }
    assert pod["spec"]["tolerations"] == [own, RESERVED]


def test_empty_defaults_render_exactly_as_before() -> None:
    validation = {"entrypoint": "pkg.mod:validate"}
    for job in (tpu_job("4x4", validation=validation), _validation_job()):
        plain = render_children(job, uid=UID, validation_replicas=1)
        assert render_children(job, uid=UID, validation_replicas=1, options=RenderOptions()) == (
            plain
        )
        assert render_children(
            job, uid=UID, validation_replicas=1, options=render_options_from_env({})
        ) == (plain)


def test_renderer_for_uses_the_options() -> None:
    job = tpu_job("4x4")
    render = renderer_for(OPTIONS)
    assert render(job, UID, 1, 0) == render_children(job, uid=UID, attempt=1, options=OPTIONS)


# --------------------------------------------------------------------------- from the env


def test_options_from_the_chart_env() -> None:
    env = {
        "TRAINJOB_DEFAULT_TPU_NODE_SELECTOR": json.dumps({"cloud.google.com/gke-nodepool": "t"}),
        "TRAINJOB_DEFAULT_TPU_TOLERATIONS": json.dumps([RESERVED]),
        "TRAINJOB_DEFAULT_VALIDATION_NODE_SELECTOR": "{}",
        "TRAINJOB_DEFAULT_VALIDATION_TOLERATIONS": json.dumps([TEAM]),
    }
    options = render_options_from_env(env)
    assert options.tpu_node_selector == {"cloud.google.com/gke-nodepool": "t"}
    assert list(options.tpu_tolerations) == [RESERVED]
    assert options.validation_node_selector == {}
    assert list(options.validation_tolerations) == [TEAM]
    assert render_options_from_env({}) == RenderOptions()
    assert render_options_from_env({"TRAINJOB_DEFAULT_TPU_TOLERATIONS": " "}) == RenderOptions()


def test_head_and_driver_resources_from_the_chart_env() -> None:
    options = render_options_from_env(
        {
            "TRAINJOB_DEFAULT_DRIVER_RESOURCES": json.dumps({"cpu": "100m", "memory": "512Mi"}),
            "TRAINJOB_DEFAULT_HEAD_RESOURCES": "{}",  # the chart's default: the built-in one
        }
    )
    assert options.driver_resources == {"cpu": "100m", "memory": "512Mi"}
    assert options.head_resources == RenderOptions().head_resources == {"cpu": "1", "memory": "2Gi"}


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ("{cpu: 1}", r"not valid JSON .*JSON object such as"),
        ("[1]", r"expected a JSON object, got '\[1\]'"),
        (json.dumps({"cpu": "lots"}), r"cpu: 'lots' is not a Kubernetes resource quantity"),
        (json.dumps({"Bad Name": 1}), r"'Bad Name' is not a valid resource name"),
        (json.dumps({"cpu": 1, "memory": "256Mi"}), r"memory 256Mi is less than 512Mi, the least"),
    ],
)
def test_bad_driver_resources_name_the_variable_and_the_chart_value(value: str, match: str) -> None:
    with pytest.raises(ValueError, match=match) as info:
        render_options_from_env({"TRAINJOB_DEFAULT_DRIVER_RESOURCES": value})
    assert str(info.value).startswith("TRAINJOB_DEFAULT_DRIVER_RESOURCES: ")
    assert str(info.value).endswith("(chart value defaults.driver.resources)")


@pytest.mark.parametrize(
    ("var", "value", "match"),
    [
        (
            "TRAINJOB_DEFAULT_TPU_NODE_SELECTOR",
            "{pool: tpu}",
            r"^TRAINJOB_DEFAULT_TPU_NODE_SELECTOR: not valid JSON .*JSON object.*"
            r"defaults\.tpu\.nodeSelector",
        ),
        (
            "TRAINJOB_DEFAULT_VALIDATION_TOLERATIONS",
            "[{",
            r"^TRAINJOB_DEFAULT_VALIDATION_TOLERATIONS: not valid JSON .*JSON list.*"
            r"defaults\.validationPool\.tolerations",
        ),
        (
            "TRAINJOB_DEFAULT_TPU_TOLERATIONS",
            json.dumps({"key": "a"}),
            r"^TRAINJOB_DEFAULT_TPU_TOLERATIONS: expected a list of tolerations, got dict",
        ),
        (
            "TRAINJOB_DEFAULT_TPU_TOLERATIONS",
            json.dumps([{"key": "a", "efect": "NoSchedule"}]),
            r"^TRAINJOB_DEFAULT_TPU_TOLERATIONS\[0\]: unknown toleration field\(s\) efect",
        ),
        (
            "TRAINJOB_DEFAULT_VALIDATION_NODE_SELECTOR",
            json.dumps({"ssd": True}),
            r"^TRAINJOB_DEFAULT_VALIDATION_NODE_SELECTOR\['ssd'\]: .*must be strings",
        ),
        (
            "TRAINJOB_DEFAULT_TPU_NODE_SELECTOR",
            json.dumps({"cloud.google.com/gke-tpu-topology": "4x4"}),
            r"^TRAINJOB_DEFAULT_TPU_NODE_SELECTOR\['cloud\.google\.com/gke-tpu-topology'\]: "
            r"the operator sets this label .*remove it",
        ),
        (
            "TRAINJOB_DEFAULT_VALIDATION_NODE_SELECTOR",
            json.dumps({"cloud.google.com/gke-spot": "true"}),
            r"gke-spot'\]: the operator sets this label \(set per TrainJob by "
            r"spec\.validation\.pool\.spot\)",
        ),
    ],
)
def test_bad_env_values_name_the_variable(var: str, value: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        render_options_from_env({var: value})


def test_operator_default_renderer_reads_the_env(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainjob_operator.operator_main import default_renderer

    monkeypatch.setenv("TRAINJOB_DEFAULT_TPU_NODE_SELECTOR", json.dumps({"zone": "a"}))
    [pod, *_] = render_worker_pods(tpu_job("4x4"), uid=UID, options=OPTIONS)
    children = default_renderer()(tpu_job("4x4"), UID, 0, 0)
    worker = next(c for c in children if c["metadata"]["name"] == pod["metadata"]["name"])
    assert worker["spec"]["nodeSelector"]["zone"] == "a"
    monkeypatch.setenv("TRAINJOB_DEFAULT_TPU_TOLERATIONS", "nope")
    with pytest.raises(ValueError, match="TRAINJOB_DEFAULT_TPU_TOLERATIONS: not valid JSON"):
        default_renderer()
