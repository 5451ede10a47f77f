"""The driver's Kubernetes identity on a real kube-apiserver (RBAC and the token controller):
with ``spec.storage.serviceAccountName`` the driver runs as the (possibly shared) storage
account, yet its rights are the per-job account's, through the ``<job>-driver-token`` Secret;
the storage account gains nothing."""

from __future__ import annotations

import base64
import copy
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import EnvTest
from trainjob_operator.api import parse_trainjob
from trainjob_operator.kube import ApiError, KubeClient, KubeConfig
from trainjob_operator.render import render_children

pytestmark = [pytest.mark.k8s, pytest.mark.usefixtures("crd")]

REPO = Path(__file__).resolve().parents[2]


def _trainjob(kube: KubeClient, namespace: str, name: str) -> dict[str, Any]:
    body = copy.deepcopy(yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text()))
    body["metadata"] = {"name": name, "namespace": namespace}
    body["spec"]["storage"] = {"path": "gs://bucket/runs", "serviceAccountName": "shared-gcs"}
    created = kube.create(body, namespace)
    assert created is not None
    return created


def _may(kube: KubeClient, user: str, namespace: str, verb: str, resource: str, name: str) -> bool:
    group, _, sub = resource.partition("/")
    review = kube.request(
        "POST",
        "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": user,
                "groups": ["system:serviceaccounts", "system:authenticated"],
                "resourceAttributes": {
                    "namespace": namespace,
                    "verb": verb,
                    "group": "trainjob.dev",
                    "resource": group,
                    "subresource": sub,
                    "name": name,
                },
            },
        },
    )
    return bool(review["status"].get("allowed"))


def test_the_driver_acts_as_its_job_account_and_the_storage_account_gains_nothing(
    envtest: EnvTest, kube: KubeClient, k8s_namespace: str
) -> None:
    ns = k8s_namespace
    kube.create(
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "shared-gcs"}}, ns
    )
    mine = _trainjob(kube, ns, "mine")
    other = _trainjob(kube, ns, "other")
    children = render_children(parse_trainjob(mine), uid=mine["metadata"]["uid"])
    for child in children:
        if child["kind"] != "Pod":  # the pods would only stay Pending here
            kube.create(child, ns)
    driver = next(
        c for c in children if c["metadata"]["name"] == "mine-driver" and c["kind"] == "Pod"
    )
    assert driver["spec"]["serviceAccountName"] == "shared-gcs"
    assert driver["spec"]["automountServiceAccountToken"] is False

    # The token controller fills the per-job account's token into the Secret the driver mounts.
    deadline = time.monotonic() + 60
    while True:
        secret = kube.get("Secret", ns, "mine-driver-token")
        if secret and (secret.get("data") or {}).get("token"):
            break
        assert time.monotonic() < deadline, f"the token controller did not fill it: {secret}"
        time.sleep(0.2)
    token = base64.b64decode(secret["data"]["token"]).decode()
    as_driver = KubeClient(
        KubeConfig(host=envtest.host, token=token, ca_file=str(envtest.ca_file)), attempts=1
    )
    as_driver.patch("TrainJob", ns, "mine", {"status": {"progress": {"step": 1}}}, "status")
    mine_now = kube.get("TrainJob", ns, "mine")
    assert mine_now is not None and mine_now["status"]["progress"]["step"] == 1
    with pytest.raises(ApiError) as refused:
        as_driver.patch("TrainJob", ns, "other", {"status": {"progress": {"step": 9}}}, "status")
    assert refused.value.status == 403
    with pytest.raises(ApiError) as refused:
        as_driver.list("Pod", ns)
    assert refused.value.status == 403

    # The shared storage account: no rights on any TrainJob, this one's included.
    storage_user = f"system:serviceaccount:{ns}:shared-gcs"
    for job in ("mine", "other"):
        assert not _may(kube, storage_user, ns, "patch", "trainjobs/status", job)
        assert not _may(kube, storage_user, ns, "get", "trainjobs", job)
    assert _may(
        kube, f"system:serviceaccount:{ns}:mine-driver", ns, "patch", "trainjobs/status", "mine"
    )
    assert other["metadata"]["name"] == "other"
