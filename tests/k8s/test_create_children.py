"""The reconciler's concurrent creates (:func:`create_children`) on a real kube-apiserver."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from trainjob_operator.api import parse_trainjob
from trainjob_operator.kube import KubeClient
from trainjob_operator.reconcile.apply import (
    CHILD_KINDS,
    create_children,
    create_waves,
    read_children,
)
from trainjob_operator.render import render_for_reconcile

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())


def _children(namespace: str, name: str) -> list[dict]:
    body = copy.deepcopy(QUICKSTART)
    body["metadata"] = {"name": name, "namespace": namespace, "uid": f"{name}-uid"}
    out = []
    for child in render_for_reconcile(parse_trainjob(body), f"{name}-uid", 0, 0):
        child = copy.deepcopy(child)
        # No TrainJob owns them here (the garbage collector would delete them).
        child["metadata"].pop("ownerReferences", None)
        out.append(child)
    return out


def _existing(kube: KubeClient, namespace: str, name: str) -> set[tuple[str, str]]:
    kinds = [*CHILD_KINDS, "Secret"]
    return {
        (kind, obj["metadata"]["name"])
        for kind in kinds
        for obj in kube.list(kind, namespace, f"trainjob.dev/name={name}")
    }


def test_waves_put_pods_after_their_account_and_the_binding_after_its_role() -> None:
    children = _children("ns", "tj")
    first, second = create_waves(children)
    assert {m["kind"] for m in second} == {"Pod", "RoleBinding"}
    assert {"ServiceAccount", "Role"} <= {m["kind"] for m in first}
    assert not {"Pod", "RoleBinding"} & {m["kind"] for m in first}
    assert sorted(map(id, first + second)) == sorted(map(id, children))


def test_all_children_are_created_concurrently_and_again_is_a_no_op(
    kube: KubeClient, k8s_namespace: str
) -> None:
    children = _children(k8s_namespace, "tj")
    assert create_children(kube, k8s_namespace, children) is None
    expected = {(m["kind"], m["metadata"]["name"]) for m in children}
    assert _existing(kube, k8s_namespace, "tj") == expected
    # What the reconciler reads back (its kinds listed concurrently): every child it reads.
    read = read_children(kube, k8s_namespace, "tj")
    assert sorted((c["kind"], c["metadata"]["name"]) for c in read) == sorted(
        (kind, child) for kind, child in expected if kind in CHILD_KINDS
    )
    uids = {
        obj["metadata"]["name"]: obj["metadata"]["uid"]
        for obj in kube.list("Pod", k8s_namespace, "trainjob.dev/name=tj")
    }
    # Everything exists: every create is a 409, which is success; nothing is replaced.
    assert create_children(kube, k8s_namespace, children) is None
    assert {
        obj["metadata"]["name"]: obj["metadata"]["uid"]
        for obj in kube.list("Pod", k8s_namespace, "trainjob.dev/name=tj")
    } == uids


def test_a_rejected_pod_is_returned_and_the_others_are_created(
    kube: KubeClient, k8s_namespace: str
) -> None:
    children = _children(k8s_namespace, "bad")
    pods = [m for m in children if m["kind"] == "Pod"]
    bad = pods[1]
    bad["spec"]["containers"][0]["name"] = "Not_A_DNS_Label"
    rejected = create_children(kube, k8s_namespace, children)
    assert rejected is not None
    manifest, error = rejected
    assert manifest is bad and error.status == 422
    assert "Not_A_DNS_Label" in str(error.body)
    expected = {(m["kind"], m["metadata"]["name"]) for m in children if m is not bad}
    assert _existing(kube, k8s_namespace, "bad") == expected


def test_a_rejected_first_wave_creates_no_pod(kube: KubeClient, k8s_namespace: str) -> None:
    children = _children(k8s_namespace, "bad-sa")
    account = next(m for m in children if m["kind"] == "ServiceAccount")
    account["metadata"]["name"] = "Not_A_Name"
    rejected = create_children(kube, k8s_namespace, children)
    assert rejected is not None and rejected[0] is account and rejected[1].status == 422
    assert not kube.list("Pod", k8s_namespace, "trainjob.dev/name=bad-sa")


def test_ensure_creates_once_without_reading_the_object_back(
    kube: KubeClient, k8s_namespace: str
) -> None:
    from trainjob_operator.kube import ApiError

    account = next(m for m in _children(k8s_namespace, "ens") if m["kind"] == "ServiceAccount")
    assert kube.ensure(account, k8s_namespace) is True  # created
    assert kube.ensure(account, k8s_namespace) is False  # 409: it exists, which is success
    name = account["metadata"]["name"]
    assert kube.get("ServiceAccount", k8s_namespace, name) is not None
    # Other refusals are raised with the server's (parsed) answer.
    bad = {**account, "metadata": {**account["metadata"], "name": "Not_A_Name"}}
    with pytest.raises(ApiError) as caught:
        kube.ensure(bad, k8s_namespace)
    assert caught.value.status == 422 and "Not_A_Name" in str(caught.value.body)


def test_a_delete_with_a_grace_period_overrides_the_pods_own(
    kube: KubeClient, k8s_namespace: str
) -> None:
    """KubeClient.delete's ``grace_seconds`` (a finished job's teardown) reaches the API
    server: the bound pod is terminating with that grace period, not its own 90 s."""

    def bound_pod(name: str) -> dict:
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": k8s_namespace},
            "spec": {
                "nodeName": "no-such-node",  # bound: the API server leaves it terminating
                "terminationGracePeriodSeconds": 90,
                "containers": [{"name": "main", "image": "busybox"}],
            },
        }

    for name in ("short", "own"):
        kube.ensure(bound_pod(name), k8s_namespace)
    assert kube.delete("Pod", k8s_namespace, "short", grace_seconds=5)
    assert kube.delete("Pod", k8s_namespace, "own")
    graces = {
        name: (kube.get("Pod", k8s_namespace, name) or {})["metadata"].get(
            "deletionGracePeriodSeconds"
        )
        for name in ("short", "own")
    }
    assert graces == {"short": 5, "own": 90}
    for name in ("short", "own"):  # no kubelet to finish the deletion
        kube.delete("Pod", k8s_namespace, name, grace_seconds=0)
    assert kube.get("Pod", k8s_namespace, "short") is None
