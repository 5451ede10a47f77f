"""The envtest control plane is a real Kubernetes 1.20 API server: storage, CRDs, RBAC."""

from __future__ import annotations

import json
import ssl
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
from kubernetes import client, config

from tests.support import EnvTest, EnvTestError

pytestmark = pytest.mark.k8s

T = TypeVar("T")

GROUP = "envtest.trainjob.dev"
VERSION = "v1"
PLURAL = "widgets"
CRD_NAME = f"{PLURAL}.{GROUP}"


def eventually(fn: Callable[[], T], timeout: float = 30.0, interval: float = 0.2) -> T:
    """Call ``fn`` until it returns without raising (AssertionError or ApiException)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except (AssertionError, client.ApiException):
            if time.monotonic() > deadline:
                raise
            time.sleep(interval)


def api_error(excinfo: pytest.ExceptionInfo[client.ApiException]) -> tuple[int, str]:
    e = excinfo.value
    return int(e.status or 0), str(e.body or "")


# --------------------------------------------------------------------------------------------
# Basics
# --------------------------------------------------------------------------------------------


def test_version_is_1_20(k8s_api: client.ApiClient) -> None:
    info = client.VersionApi(k8s_api).get_code()
    assert info.major == "1"
    assert info.minor.rstrip("+") == "20"
    assert info.git_version.startswith("v1.20.")


def test_readyz_with_verified_tls(envtest: EnvTest) -> None:
    # The apiserver's self-signed certificate (with its CA) verifies for https://127.0.0.1.
    context = ssl.create_default_context(cafile=str(envtest.ca_file))
    request = urllib.request.Request(
        f"{envtest.host}/readyz?verbose", headers={"Authorization": f"Bearer {envtest.token}"}
    )
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
    )
    with opener.open(request, timeout=10) as response:
        body = response.read().decode()
    assert response.status == 200
    assert "readyz check passed" in body
    assert "[+]etcd ok" in body


def test_kubeconfig_works(envtest: EnvTest) -> None:
    api = config.new_client_from_config(config_file=str(envtest.kubeconfig))
    try:
        names = [ns.metadata.name for ns in client.CoreV1Api(api).list_namespace().items]
        assert {"default", "kube-system", "kube-public"} <= set(names)
    finally:
        api.close()


def test_configmap_create_read_delete(k8s_api: client.ApiClient, k8s_namespace: str) -> None:
    core = client.CoreV1Api(k8s_api)
    cm = client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name="settings"), data={"lr": "0.1", "steps": "100"}
    )
    created = core.create_namespaced_config_map(k8s_namespace, cm)
    assert created.metadata.uid
    assert created.metadata.resource_version

    read = core.read_namespaced_config_map("settings", k8s_namespace)
    assert read.data == {"lr": "0.1", "steps": "100"}

    with pytest.raises(client.ApiException) as excinfo:
        core.create_namespaced_config_map(k8s_namespace, cm)
    assert excinfo.value.status == 409  # AlreadyExists, from etcd's compare-and-swap

    core.delete_namespaced_config_map("settings", k8s_namespace)
    with pytest.raises(client.ApiException) as excinfo:
        core.read_namespaced_config_map("settings", k8s_namespace)
    assert excinfo.value.status == 404


def test_token_file_is_fixed_after_start(envtest: EnvTest) -> None:
    assert envtest.token_for("alice") == envtest.users["alice"].token
    with pytest.raises(EnvTestError, match="token file"):
        envtest.token_for(f"late-{uuid.uuid4().hex[:6]}")


# --------------------------------------------------------------------------------------------
# CustomResourceDefinitions
# --------------------------------------------------------------------------------------------


WIDGET_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "spec": {
            "type": "object",
            "required": ["size"],
            "properties": {
                "size": {"type": "integer", "minimum": 1},
                "color": {"type": "string", "enum": ["red", "blue"]},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        },
        "status": {
            "type": "object",
            "properties": {"ready": {"type": "boolean"}, "message": {"type": "string"}},
        },
    },
}


def wait_established(ext: client.ApiextensionsV1Api, name: str, timeout: float = 30.0) -> None:
    def check() -> None:
        crd = ext.read_custom_resource_definition(name)
        conditions = {c.type: c.status for c in (crd.status.conditions or [])}
        assert conditions.get("NamesAccepted") == "True", conditions
        assert conditions.get("Established") == "True", conditions

    eventually(check, timeout=timeout)


@pytest.fixture(scope="module")
def widget_crd(envtest: EnvTest) -> Iterator[str]:
    api = envtest.api_client()
    ext = client.ApiextensionsV1Api(api)
    body = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"plural": PLURAL, "singular": "widget", "kind": "Widget"},
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": WIDGET_SCHEMA},
                    "subresources": {"status": {}},
                }
            ],
        },
    }
    ext.create_custom_resource_definition(body)
    try:
        wait_established(ext, CRD_NAME)
        # The new endpoint may lag Established by a moment.
        co = client.CustomObjectsApi(api)
        eventually(lambda: co.list_cluster_custom_object(GROUP, VERSION, PLURAL), timeout=10)
        yield CRD_NAME
    finally:
        ext.delete_custom_resource_definition(CRD_NAME)
        api.close()


def widget(name: str, spec: dict[str, Any], status: dict[str, Any] | None = None) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Widget",
        "metadata": {"name": name},
        "spec": spec,
    }
    if status is not None:
        obj["status"] = status
    return obj


def test_crd_structural_schema_and_status_subresource(
    k8s_api: client.ApiClient, k8s_namespace: str, widget_crd: str
) -> None:
    ext = client.ApiextensionsV1Api(k8s_api)
    crd = ext.read_custom_resource_definition(widget_crd)
    assert crd.spec.versions[0].subresources.status == {}
    conditions = {c.type: c.status for c in crd.status.conditions}
    assert conditions.get("NonStructuralSchema") is None

    co = client.CustomObjectsApi(k8s_api)

    obj = widget("w1", {"size": 3, "color": "red"}, status={"ready": True})
    created = co.create_namespaced_custom_object(GROUP, VERSION, k8s_namespace, PLURAL, obj)
    assert created["spec"] == {"size": 3, "color": "red"}
    assert "status" not in created  # status subresource: the main endpoint ignores status
    assert created["metadata"]["generation"] == 1

    patched = co.patch_namespaced_custom_object_status(
        GROUP, VERSION, k8s_namespace, PLURAL, "w1", {"status": {"ready": True, "message": "ok"}}
    )
    assert patched["status"] == {"ready": True, "message": "ok"}
    assert patched["metadata"]["generation"] == 1  # status writes do not bump generation

    spec_patched = co.patch_namespaced_custom_object(
        GROUP, VERSION, k8s_namespace, PLURAL, "w1", {"spec": {"size": 4}}
    )
    assert spec_patched["spec"]["size"] == 4
    assert spec_patched["metadata"]["generation"] == 2
    assert spec_patched["status"]["message"] == "ok"

    # Unknown fields are pruned (structural schema, no preserve-unknown-fields).
    pruned = co.create_namespaced_custom_object(
        GROUP, VERSION, k8s_namespace, PLURAL, widget("w2", {"size": 1, "bogus": "x"})
    )
    assert pruned["spec"] == {"size": 1}

    listed = co.list_namespaced_custom_object(GROUP, VERSION, k8s_namespace, PLURAL)
    assert sorted(i["metadata"]["name"] for i in listed["items"]) == ["w1", "w2"]


@pytest.mark.parametrize(
    ("spec", "field", "fragment"),
    [
        ({"size": "big"}, "spec.size", "integer"),
        ({"size": 0}, "spec.size", "greater than or equal to 1"),
        ({"size": 1, "color": "green"}, "spec.color", "supported values"),
        ({"color": "red"}, "spec.size", "Required"),
        ({"size": 1, "labels": {"a": 1}}, "spec.labels.a", "string"),
    ],
)
def test_crd_rejects_invalid_objects(
    k8s_api: client.ApiClient,
    k8s_namespace: str,
    widget_crd: str,
    spec: dict[str, Any],
    field: str,
    fragment: str,
) -> None:
    co = client.CustomObjectsApi(k8s_api)
    with pytest.raises(client.ApiException) as excinfo:
        co.create_namespaced_custom_object(GROUP, VERSION, k8s_namespace, PLURAL, widget("x", spec))
    status, body = api_error(excinfo)
    assert status == 422, body
    details = json.loads(body)
    assert details["reason"] == "Invalid"
    message = details["message"]
    assert field in message, message
    assert fragment.lower() in message.lower(), message
    causes = details["details"]["causes"]
    assert any(c.get("field") == field for c in causes), causes


# --------------------------------------------------------------------------------------------
# RBAC
# --------------------------------------------------------------------------------------------


def test_rbac_is_enforced_for_non_admin_tokens(
    envtest: EnvTest, k8s_api: client.ApiClient, k8s_namespace: str
) -> None:
    admin_core = client.CoreV1Api(k8s_api)
    admin_core.create_namespaced_config_map(
        k8s_namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="c1"), data={})
    )
    alice_api = envtest.api_client(user="alice")
    bob_api = envtest.api_client(user="bob")  # in group trainjob-devs
    try:
        alice = client.CoreV1Api(alice_api)
        bob = client.CoreV1Api(bob_api)

        # Authenticated but granted nothing: 403 (a bad token would be 401).
        for core in (alice, bob):
            with pytest.raises(client.ApiException) as excinfo:
                core.list_namespaced_config_map(k8s_namespace)
            assert excinfo.value.status == 403
            assert "forbidden" in str(excinfo.value.body).lower()
        with pytest.raises(client.ApiException) as excinfo:
            client.CoreV1Api(envtest.api_client(token="not-a-token")).list_namespace()
        assert excinfo.value.status == 401

        rbac = client.RbacAuthorizationV1Api(k8s_api)
        rbac.create_namespaced_role(
            k8s_namespace,
            client.V1Role(
                metadata=client.V1ObjectMeta(name="configmap-reader"),
                rules=[
                    client.V1PolicyRule(
                        api_groups=[""], resources=["configmaps"], verbs=["get", "list"]
                    )
                ],
            ),
        )
        rbac.create_namespaced_role_binding(
            k8s_namespace,
            client.V1RoleBinding(
                metadata=client.V1ObjectMeta(name="configmap-readers"),
                role_ref=client.V1RoleRef(
                    api_group="rbac.authorization.k8s.io", kind="Role", name="configmap-reader"
                ),
                subjects=[
                    client.RbacV1Subject(
                        kind="User", name="alice", api_group="rbac.authorization.k8s.io"
                    ),
                    client.RbacV1Subject(
                        kind="Group", name="trainjob-devs", api_group="rbac.authorization.k8s.io"
                    ),
                ],
            ),
        )

        # The authorizer's informers catch up within moments.
        for core in (alice, bob):
            names = eventually(
                lambda core=core: [
                    c.metadata.name for c in core.list_namespaced_config_map(k8s_namespace).items
                ],
                timeout=15,
            )
            assert "c1" in names
            assert core.read_namespaced_config_map("c1", k8s_namespace).metadata.name == "c1"

        # Exactly what was granted: no writes, no other namespaces, no other resources.
        with pytest.raises(client.ApiException) as excinfo:
            alice.create_namespaced_config_map(
                k8s_namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="c2"))
            )
        assert excinfo.value.status == 403
        with pytest.raises(client.ApiException) as excinfo:
            alice.delete_namespaced_config_map("c1", k8s_namespace)
        assert excinfo.value.status == 403
        with pytest.raises(client.ApiException) as excinfo:
            alice.list_namespaced_config_map("default")
        assert excinfo.value.status == 403
        with pytest.raises(client.ApiException) as excinfo:
            alice.list_namespaced_secret(k8s_namespace)
        assert excinfo.value.status == 403

        # The same answers from the authorizer, asked directly.
        authz = client.AuthorizationV1Api(k8s_api)

        def allowed(user: str, verb: str, namespace: str, resource: str = "configmaps") -> bool:
            review = authz.create_subject_access_review(
                client.V1SubjectAccessReview(
                    spec=client.V1SubjectAccessReviewSpec(
                        user=user,
                        resource_attributes=client.V1ResourceAttributes(
                            namespace=namespace, verb=verb, resource=resource
                        ),
                    )
                )
            )
            return bool(review.status.allowed)

        assert allowed("alice", "list", k8s_namespace)
        assert allowed("alice", "get", k8s_namespace)
        assert not allowed("alice", "create", k8s_namespace)
        assert not allowed("alice", "list", "default")
        assert not allowed("alice", "list", k8s_namespace, resource="secrets")
        assert not allowed("carol", "list", k8s_namespace)

        own = client.AuthorizationV1Api(alice_api).create_self_subject_access_review(
            client.V1SelfSubjectAccessReview(
                spec=client.V1SelfSubjectAccessReviewSpec(
                    resource_attributes=client.V1ResourceAttributes(
                        namespace=k8s_namespace, verb="watch", resource="configmaps"
                    )
                )
            )
        )
        assert own.status.allowed is False
    finally:
        alice_api.close()
        bob_api.close()


# --------------------------------------------------------------------------------------------
# kube-controller-manager (namespace deletion, garbage collection, service accounts)
# --------------------------------------------------------------------------------------------


@pytest.fixture
def controller_manager(envtest: EnvTest) -> None:
    if not envtest.controller_manager_running:
        pytest.skip("kube-controller-manager is not running (no binary in the assets)")


@pytest.mark.usefixtures("controller_manager")
def test_owner_references_are_garbage_collected(
    k8s_api: client.ApiClient, k8s_namespace: str
) -> None:
    core = client.CoreV1Api(k8s_api)
    owner = core.create_namespaced_config_map(
        k8s_namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="owner"))
    )
    core.create_namespaced_config_map(
        k8s_namespace,
        client.V1ConfigMap(
            metadata=client.V1ObjectMeta(
                name="child",
                owner_references=[
                    client.V1OwnerReference(
                        api_version="v1", kind="ConfigMap", name="owner", uid=owner.metadata.uid
                    )
                ],
            )
        ),
    )
    core.delete_namespaced_config_map("owner", k8s_namespace)

    def child_gone() -> None:
        names = [c.metadata.name for c in core.list_namespaced_config_map(k8s_namespace).items]
        assert "child" not in names, names

    eventually(child_gone, timeout=60, interval=0.5)


@pytest.mark.usefixtures("controller_manager")
def test_namespaces_get_a_default_service_account_and_are_really_deleted(
    k8s_api: client.ApiClient,
) -> None:
    core = client.CoreV1Api(k8s_api)
    name = f"gone-{uuid.uuid4().hex[:8]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    eventually(lambda: core.read_namespaced_service_account("default", name), timeout=30)
    core.create_namespaced_config_map(
        name, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="c"))
    )
    core.delete_namespace(name)

    def gone() -> None:
        try:
            ns = core.read_namespace(name)
        except client.ApiException as e:
            assert e.status == 404
            return
        raise AssertionError(f"namespace {name} still {ns.status.phase}")

    eventually(gone, timeout=60, interval=0.5)


def test_pods_can_be_created_without_a_token_controller(
    k8s_api: client.ApiClient, k8s_namespace: str
) -> None:
    core = client.CoreV1Api(k8s_api)
    pod = core.create_namespaced_pod(
        k8s_namespace,
        client.V1Pod(
            metadata=client.V1ObjectMeta(name="p"),
            spec=client.V1PodSpec(
                containers=[client.V1Container(name="main", image="busybox", command=["true"])],
                restart_policy="Never",
            ),
        ),
    )
    assert pod.status.phase == "Pending"  # no scheduler, no kubelet
    assert pod.spec.node_name is None


@pytest.mark.usefixtures("controller_manager")
def test_aggregated_cluster_roles_get_their_rules(
    envtest: EnvTest, k8s_api: client.ApiClient, k8s_namespace: str
) -> None:
    rbac = client.RbacAuthorizationV1Api(k8s_api)
    name = f"widgets-view-{uuid.uuid4().hex[:6]}"
    rbac.create_cluster_role(
        client.V1ClusterRole(
            metadata=client.V1ObjectMeta(
                name=name, labels={"rbac.authorization.k8s.io/aggregate-to-view": "true"}
            ),
            rules=[
                client.V1PolicyRule(api_groups=[GROUP], resources=[PLURAL], verbs=["get", "list"])
            ],
        )
    )
    try:

        def aggregated() -> None:
            rules = rbac.read_cluster_role("view").rules or []
            assert any(GROUP in (r.api_groups or []) for r in rules), rules

        eventually(aggregated, timeout=30, interval=0.5)

        rbac.create_namespaced_role_binding(
            k8s_namespace,
            client.V1RoleBinding(
                metadata=client.V1ObjectMeta(name="alice-view"),
                role_ref=client.V1RoleRef(
                    api_group="rbac.authorization.k8s.io", kind="ClusterRole", name="view"
                ),
                subjects=[
                    client.RbacV1Subject(
                        kind="User", name="alice", api_group="rbac.authorization.k8s.io"
                    )
                ],
            ),
        )
        alice_api = envtest.api_client(user="alice")
        try:
            alice = client.CoreV1Api(alice_api)
            eventually(lambda: alice.list_namespaced_config_map(k8s_namespace), timeout=15)
            with pytest.raises(client.ApiException) as excinfo:
                alice.list_namespaced_secret(k8s_namespace)  # view excludes secrets
            assert excinfo.value.status == 403
        finally:
            alice_api.close()
    finally:
        rbac.delete_cluster_role(name)
