"""The whole set of children: content, invariants on every object, determinism, hashes, names."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from tests.render.helpers import UID, container, example, labels, make_job, tpu_job
from trainjob_operator.api import TrainJob, parse_trainjob
from trainjob_operator.render import (
    SPEC_HASH_ANNOTATION,
    RenderOptions,
    child_key,
    render_children,
    render_for_reconcile,
    spec_hash,
)

OWNER_KEYS = {"apiVersion", "kind", "name", "uid", "controller", "blockOwnerDeletion"}
POD_SECURITY = {
    "runAsNonRoot": True,
    "runAsUser": 1000,
    "runAsGroup": 1000,
    "fsGroup": 1000,
    "fsGroupChangePolicy": "OnRootMismatch",
    "seccompProfile": {"type": "RuntimeDefault"},
}
CONTAINER_SECURITY = {
    "runAsNonRoot": True,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
    "readOnlyRootFilesystem": True,
}


def _jobs() -> dict[str, Callable[[], TrainJob]]:
    return {
        "quickstart": lambda: example("quickstart.yaml"),
        "jax": lambda: example("jax.yaml"),
        "tpu-example": lambda: example("tpu-v6e-4x4.yaml"),
        "tpu-2x4": lambda: tpu_job("2x4"),
        "multislice": lambda: tpu_job(
            "4x4",
            num_slices=2,
            queueName="q",
            env=[{"name": "S", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
        ),
        "gpu": lambda: make_job(
            name="gpu",
            scaling={"numWorkers": 2, "useGpu": True},
            env=[{"name": "NCCL_DEBUG", "value": "INFO"}],
            podTemplate={
                "labels": {"team": "a"},
                "tolerations": [{"key": "g", "operator": "Exists"}],
            },
        ),
        "local": lambda: make_job(name="local", scaling={"numWorkers": 0}),
    }


def _render(job: TrainJob, **kwargs: Any) -> list[dict[str, Any]]:
    if job.spec.validation is not None:
        kwargs.setdefault("validation_replicas", job.spec.validation.pool.max_replicas)
    return render_children(job, uid=UID, **kwargs)


# --------------------------------------------------------------------------- the set


def test_cpu_quickstart_children() -> None:
    children = render_children(example("quickstart.yaml"), uid=UID, validation_replicas=1)
    assert [child_key(c) for c in children] == [
        ("ServiceAccount", "quickstart-driver"),
        ("Role", "quickstart-driver"),
        ("RoleBinding", "quickstart-driver"),
        ("Secret", "quickstart-ray-auth"),
        ("NetworkPolicy", "quickstart-ray"),
        ("Service", "quickstart-headless"),
        ("Pod", "quickstart-head"),
        ("Pod", "quickstart-w0"),
        ("Pod", "quickstart-w1"),
        ("Pod", "quickstart-val-0"),
        ("Pod", "quickstart-driver"),
    ]
    assert [labels(c)["trainjob.dev/role"] for c in children] == [
        "driver",
        "driver",
        "driver",
        "head",
        "head",
        "head",
        "head",
        "worker",
        "worker",
        "validation",
        "driver",
    ]


def test_validation_replicas_zero_and_three() -> None:
    job = make_job(validation={"entrypoint": "pkg.mod:validate", "pool": {"maxReplicas": 3}})
    roles = [labels(c)["trainjob.dev/role"] for c in render_children(job, uid=UID)]
    assert "validation" not in roles
    children = render_children(job, uid=UID, validation_replicas=3)
    assert [
        c["metadata"]["name"] for c in children if labels(c)["trainjob.dev/role"] == "validation"
    ] == [
        "job-val-0",
        "job-val-1",
        "job-val-2",
    ]


def test_tpu_example_children() -> None:
    children = render_children(example("tpu-v6e-4x4.yaml"), uid=UID, validation_replicas=2)
    assert [c["metadata"]["name"] for c in children if c["kind"] == "Pod"] == [
        "llm-v6e-4x4-head",
        "llm-v6e-4x4-s0-h0",
        "llm-v6e-4x4-s0-h1",
        "llm-v6e-4x4-s0-h2",
        "llm-v6e-4x4-s0-h3",
        "llm-v6e-4x4-val-0",
        "llm-v6e-4x4-val-1",
        "llm-v6e-4x4-driver",
    ]


# --------------------------------------------------------------------------- invariants


@pytest.mark.parametrize("case", list(_jobs()))
def test_every_object_is_owned_labelled_and_hashed(case: str) -> None:
    job = _jobs()[case]()
    children = _render(job, attempt=2)
    keys = [child_key(c) for c in children]
    assert len(keys) == len(set(keys))
    for obj in children:
        meta = obj["metadata"]
        assert meta["namespace"] == (job.metadata.namespace or "default")
        assert meta["ownerReferences"] == [
            {
                "apiVersion": "trainjob.dev/v1alpha1",
                "kind": "TrainJob",
                "name": job.metadata.name,
                "uid": UID,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        assert set(meta["ownerReferences"][0]) == OWNER_KEYS
        assert {
            k: meta["labels"][k]
            for k in ("app.kubernetes.io/name", "app.kubernetes.io/managed-by", "trainjob.dev/name")
        } == {
            "app.kubernetes.io/name": "trainjob",
            "app.kubernetes.io/managed-by": "trainjob-operator",
            "trainjob.dev/name": job.metadata.name,
        }
        assert meta["labels"]["trainjob.dev/role"] in {"head", "worker", "validation", "driver"}
        assert meta["annotations"][SPEC_HASH_ANNOTATION] == spec_hash(obj)
        assert len(meta["name"]) <= 63
        for value in meta["labels"].values():
            assert len(value) <= 63


@pytest.mark.parametrize("case", list(_jobs()))
def test_every_pod_is_secure_and_common(case: str) -> None:
    job = _jobs()[case]()
    pods = [c for c in _render(job, attempt=2) if c["kind"] == "Pod"]
    assert pods
    for pod in pods:
        spec = pod["spec"]
        main = container(pod)
        assert labels(pod)["trainjob.dev/attempt"] == "2"
        assert spec["securityContext"] == POD_SECURITY
        assert main["securityContext"] == CONTAINER_SECURITY
        # Every container: a failure's log tail becomes the termination message in pod status.
        for c in spec["containers"] + spec.get("initContainers", []):
            assert c["terminationMessagePolicy"] == "FallbackToLogsOnError"
        assert spec["restartPolicy"] == "Never"
        assert spec["enableServiceLinks"] is False
        assert spec["hostname"] == pod["metadata"]["name"]
        assert spec["subdomain"] == f"{job.metadata.name}-headless"
        assert spec["volumes"][:2] == [
            {"name": "dshm", "emptyDir": {"medium": "Memory"}},
            {"name": "tmp", "emptyDir": {}},
        ]
        assert main["volumeMounts"][:2] == [
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "tmp", "mountPath": "/tmp"},
        ]
        assert main["image"] == job.spec.image
        assert main["imagePullPolicy"] == "IfNotPresent"
        for var in job.spec.env:
            assert var.to_dict() in main["env"]
        for side in ("requests", "limits"):
            for quantity in main["resources"].get(side, {}).values():
                assert isinstance(quantity, str)
        assert main["resources"].get("requests") == main["resources"].get("limits")


@pytest.mark.parametrize("case", list(_jobs()))
def test_output_is_plain_yaml_and_json(case: str) -> None:
    children = _render(_jobs()[case]())
    assert yaml.safe_load(yaml.safe_dump(children)) == children
    assert json.loads(json.dumps(children)) == children


def test_kueue_gang_is_head_and_workers() -> None:
    children = render_children(
        make_job(queueName="q", scaling={"numWorkers": 2}, validation={"entrypoint": "a.b:c"}),
        uid=UID,
        validation_replicas=1,
    )
    gang = [
        c["metadata"]["name"]
        for c in children
        if "kueue.x-k8s.io/pod-group-name" in c["metadata"]["labels"]
    ]
    assert gang == ["job-head", "job-w0", "job-w1"]
    queued = [
        c["metadata"]["name"]
        for c in children
        if c["metadata"]["labels"].get("kueue.x-k8s.io/queue-name") == "q"
    ]
    assert queued == ["job-head", "job-w0", "job-w1", "job-val-0", "job-driver"]
    counts = {
        c["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"]
        for c in children
        if c["metadata"]["name"] in gang
    }
    assert counts == {"3"}


# --------------------------------------------------------------------------- determinism / hashes


@pytest.mark.parametrize("case", list(_jobs()))
def test_same_input_same_output(case: str) -> None:
    first = _render(_jobs()[case]())
    again = _render(_jobs()[case]())
    reparsed_job = parse_trainjob(json.loads(json.dumps(_jobs()[case]().to_dict())))
    reparsed = _render(reparsed_job)
    assert first == again == reparsed
    assert json.dumps(first) == json.dumps(again)  # key order too


def test_rendering_does_not_mutate_the_job() -> None:
    job = example("tpu-v6e-4x4.yaml")
    before = copy.deepcopy(job.model_dump())
    children = _render(job)
    [worker, *_] = [c for c in children if c["metadata"]["name"].endswith("-s0-h0")]
    worker["spec"]["nodeSelector"]["x"] = "y"
    assert job.model_dump() == before
    assert _render(job) != children


def _hashes(children: list[dict[str, Any]]) -> dict[tuple[str, str], str]:
    return {child_key(c): c["metadata"]["annotations"][SPEC_HASH_ANNOTATION] for c in children}


def _changed(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> set[tuple[str, str]]:
    ha, hb = _hashes(a), _hashes(b)
    assert ha.keys() == hb.keys()
    return {k for k in ha if ha[k] != hb[k]}


def _spec(**changes: Any) -> TrainJob:
    base: dict[str, Any] = {
        "scaling": {"numWorkers": 2, "resourcesPerWorker": {"cpu": "2"}},
        "validation": {"entrypoint": "pkg.mod:validate", "pool": {"maxReplicas": 2}},
    }
    base.update(changes)
    return make_job(**base)


def test_spec_hash_changes_only_where_the_spec_does() -> None:
    base = _render(_spec())
    pods = {k for k in _hashes(base) if k[0] == "Pod"}
    assert _changed(base, _render(_spec())) == set()
    assert _changed(base, _render(_spec(image="img:2"))) == pods
    assert _changed(base, _render(_spec(config={"lr": 1}))) == {("Pod", "job-driver")}
    assert _changed(
        base,
        _render(
            _spec(
                validation={
                    "entrypoint": "pkg.mod:validate",
                    "pool": {"maxReplicas": 2, "resources": {"cpu": "3"}},
                }
            )
        ),
    ) == {("Pod", "job-val-0"), ("Pod", "job-val-1"), ("Pod", "job-driver")}
    assert _changed(
        base, _render(_spec(scaling={"numWorkers": 2, "resourcesPerWorker": {"cpu": "4"}}))
    ) == {("Pod", "job-w0"), ("Pod", "job-w1"), ("Pod", "job-driver")}
    assert _changed(base, _render(_spec(), attempt=1)) == pods
    storage = _render(_spec(storage={"path": "gs://bucket/x", "serviceAccountName": "sa"}))
    # The storage account changes who the pods run as, never the driver's RBAC; the driver
    # gets its per-job account's token from a Secret of its own.
    token = ("Secret", "job-driver-token")
    assert token in _hashes(storage) and token not in _hashes(base)
    storage = [c for c in storage if (c["kind"], c["metadata"]["name"]) != token]
    assert _changed(base, storage) == pods - {("Pod", "job-head")}  # the head: no identity


def test_validation_pool_size_does_not_touch_existing_pods() -> None:
    small = render_children(_spec(), uid=UID, validation_replicas=1)
    large = render_children(_spec(), uid=UID, validation_replicas=2)
    small_hashes = _hashes(small)
    large_hashes = _hashes(large)
    assert {k: large_hashes[k] for k in small_hashes} == small_hashes


def test_spec_hash_ignores_only_its_own_annotation() -> None:
    [_, _, _, _, _, svc, *_] = _render(_spec())
    value = spec_hash(svc)
    assert len(value) == 16
    svc["metadata"]["annotations"][SPEC_HASH_ANNOTATION] = "other"
    assert spec_hash(svc) == value
    svc["spec"]["ports"].pop()
    assert spec_hash(svc) != value


# --------------------------------------------------------------------------- names / inputs


def test_longest_name_with_the_largest_slices_fits() -> None:
    name = "a" * 40
    job = make_job(
        name=name,
        queueName="q",
        scaling={"tpu": {"acceleratorType": "v6e", "topology": "16x16", "numSlices": 2}},
        validation={"entrypoint": "pkg.mod:validate", "pool": {"maxReplicas": 12}},
    )
    children = render_children(job, uid=UID, attempt=12345, validation_replicas=12)
    names = [c["metadata"]["name"] for c in children]
    assert f"{name}-s1-h63" in names
    assert f"{name}-val-11" in names
    assert max(len(n) for n in names) <= 63
    assert len(children) == 3 + 2 + 1 + 1 + 128 + 12 + 1


def _renamed(job: TrainJob, name: str) -> TrainJob:
    """Bypass the model's 40-character check, as a hand-built model could."""
    return job.model_copy(update={"metadata": job.metadata.model_copy(update={"name": name})})


@pytest.mark.parametrize(
    ("length", "message"),
    [(55, r"Service name 'a+-headless' is 64 characters long"), (64, "TrainJob name")],
)
def test_names_that_cannot_fit_are_rejected(length: int, message: str) -> None:
    job = _renamed(make_job(), "a" * length)
    with pytest.raises(ValueError, match=message):
        render_children(job, uid=UID)


def test_headless_service_is_the_binding_limit_then_the_kueue_group() -> None:
    # 54 characters: "-headless" just fits and every pod suffix is shorter.
    tpu = {"acceleratorType": "v6e", "topology": "16x16", "numSlices": 2}
    job = _renamed(make_job(scaling={"tpu": tpu}), "a" * 54)
    names = [c["metadata"]["name"] for c in render_children(job, uid=UID)]
    assert max(len(n) for n in names) == 63
    # The Kueue pod group name grows with the attempt and is checked too.
    job = _renamed(make_job(queueName="q"), "a" * 53)
    render_children(job, uid=UID, attempt=9)
    with pytest.raises(ValueError, match=r"Kueue pod group name 'a+-attempt-10' is 64"):
        render_children(job, uid=UID, attempt=10)


def test_invalid_inputs() -> None:
    with pytest.raises(ValueError, match="uid is required"):
        render_children(make_job(), uid="")
    with pytest.raises(ValueError, match="attempt must be >= 0"):
        render_children(make_job(), uid=UID, attempt=-1)


def test_default_namespace_option() -> None:
    job = make_job(namespace=None)
    children = render_children(job, uid=UID, options=RenderOptions(default_namespace="team-a"))
    assert {c["metadata"]["namespace"] for c in children} == {"team-a"}
    binding = next(c for c in children if c["kind"] == "RoleBinding")
    assert binding["subjects"][0]["namespace"] == "team-a"


def test_child_key() -> None:
    assert child_key({"kind": "Pod", "metadata": {"name": "x"}}) == ("Pod", "x")


def test_render_for_reconcile_is_render_children_positionally() -> None:
    job = make_job(validation={"entrypoint": "pkg.mod:validate", "pool": {"maxReplicas": 2}})
    assert render_for_reconcile(job, UID, 1, 2) == render_children(
        job, uid=UID, attempt=1, validation_replicas=2
    )


def test_the_job_context_is_resolved_once_for_all_children(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import trainjob_operator.render.context as context
    import trainjob_operator.render.placement as placement

    calls: dict[str, int] = {}

    def counted(module: Any, name: str) -> None:
        original = getattr(module, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls[name] = calls.get(name, 0) + 1
            return original(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapper)

    counted(context, "parse_pod_template")
    for role in ("head", "worker", "validation", "driver"):
        counted(placement, f"{role}_placement")
    job = tpu_job(
        "4x4",
        num_slices=2,
        validation={"entrypoint": "pkg.mod:validate", "pool": {"maxReplicas": 3}},
        podTemplate={"tolerations": [{"key": "team", "operator": "Exists"}]},
    )
    children = render_children(job, uid=UID, validation_replicas=3)
    assert sum(1 for c in children if c["kind"] == "Pod") == 1 + 8 + 3 + 1
    assert calls == {
        "parse_pod_template": 1,
        "head_placement": 1,
        "worker_placement": 1,
        "validation_placement": 1,
        "driver_placement": 1,
    }
