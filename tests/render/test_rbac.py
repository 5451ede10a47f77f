"""The driver's ServiceAccount, Role and RoleBinding."""

from __future__ import annotations

from tests.render.helpers import UID, example, make_job
from trainjob_operator.render import (
    SPEC_HASH_ANNOTATION,
    driver_service_account_name,
    render_driver_role,
    render_driver_role_binding,
    render_driver_service_account,
)

OWNER = {
    "apiVersion": "trainjob.dev/v1alpha1",
    "kind": "TrainJob",
    "name": "rj",
    "uid": UID,
    "controller": True,
    "blockOwnerDeletion": True,
}
LABELS = {
    "app.kubernetes.io/name": "trainjob",
    "app.kubernetes.io/managed-by": "trainjob-operator",
    "trainjob.dev/name": "rj",
    "trainjob.dev/role": "driver",
}


def _strip_hash(obj: dict[str, object]) -> dict[str, object]:
    meta = obj["metadata"]
    assert isinstance(meta, dict)
    assert set(meta.pop("annotations")) == {SPEC_HASH_ANNOTATION}
    return obj


def _meta() -> dict[str, object]:
    return {"name": "rj-driver", "namespace": "ns", "labels": LABELS, "ownerReferences": [OWNER]}


def test_service_account() -> None:
    sa = _strip_hash(render_driver_service_account(make_job(name="rj"), uid=UID))
    assert sa == {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta()}


def test_role_allows_only_this_jobs_status() -> None:
    role = _strip_hash(render_driver_role(make_job(name="rj"), uid=UID))
    assert role == {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _meta(),
        "rules": [
            {
                "apiGroups": ["trainjob.dev"],
                "resources": ["trainjobs/status"],
                "resourceNames": ["rj"],
                "verbs": ["get", "patch"],
            },
            {
                "apiGroups": ["trainjob.dev"],
                "resources": ["trainjobs"],
                "resourceNames": ["rj"],
                "verbs": ["get"],
            },
        ],
    }


def test_role_binding_to_the_per_job_account() -> None:
    binding = _strip_hash(render_driver_role_binding(make_job(name="rj"), uid=UID))
    assert binding == {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _meta(),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "rj-driver"},
        "subjects": [{"kind": "ServiceAccount", "name": "rj-driver", "namespace": "ns"}],
    }


def test_the_storage_account_gets_no_rights_on_the_trainjob() -> None:
    # The storage account may be shared by other jobs: the per-job account alone is bound.
    job = example("tpu-v6e-4x4.yaml")
    assert driver_service_account_name(job) == "trainjob-gcs"
    binding = render_driver_role_binding(job, uid=UID)
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "llm-v6e-4x4-driver", "namespace": "training"},
    ]


def test_storage_account_on_a_volume_path_is_used_too() -> None:
    job = make_job(storage={"path": "/mnt/ckpt", "serviceAccountName": "fuse-sa"})
    assert driver_service_account_name(job) == "fuse-sa"
    job = make_job(storage={"path": "gs://bucket/x"})
    assert driver_service_account_name(job) == "job-driver"
    assert len(render_driver_role_binding(job, uid=UID)["subjects"]) == 1
