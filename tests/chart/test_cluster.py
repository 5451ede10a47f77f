"""The chart on a real kube-apiserver: every rendered object passes server-side dry-run, the
RBAC it creates grants the operator exactly what it needs (SubjectAccessReview), the operator
really works under it, and a job's driver may patch only its own TrainJob's status."""

from __future__ import annotations

import contextlib
import copy
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.chart.helpers import CHART_DIR, REPO, all_of, one, render
from tests.support import EnvTest
from tests.support.waiting import wait_for
from trainjob_operator.api import parse_trainjob
from trainjob_operator.kube import ApiError, KubeClient, KubeConfig
from trainjob_operator.operator_main import run_operator
from trainjob_operator.render import render_children

pytestmark = pytest.mark.k8s

CHART_CRD = CHART_DIR / "crds" / "trainjob.dev_trainjobs.yaml"
QUICKSTART = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())

#: A minimal stand-in for the Prometheus Operator's ServiceMonitor CRD (schema not checked).
SERVICE_MONITOR_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "servicemonitors.monitoring.coreos.com"},
    "spec": {
        "group": "monitoring.coreos.com",
        "scope": "Namespaced",
        "names": {
            "plural": "servicemonitors",
            "singular": "servicemonitor",
            "kind": "ServiceMonitor",
            "listKind": "ServiceMonitorList",
        },
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                    }
                },
            }
        ],
    },
}

#: kind -> (plural, namespaced)
RESOURCES: dict[str, tuple[str, bool]] = {
    "ServiceAccount": ("serviceaccounts", True),
    "ConfigMap": ("configmaps", True),
    "Service": ("services", True),
    "Deployment": ("deployments", True),
    "PodDisruptionBudget": ("poddisruptionbudgets", True),
    "Role": ("roles", True),
    "RoleBinding": ("rolebindings", True),
    "ClusterRole": ("clusterroles", False),
    "ClusterRoleBinding": ("clusterrolebindings", False),
    "ServiceMonitor": ("servicemonitors", True),
    "Secret": ("secrets", True),
    "ValidatingWebhookConfiguration": ("validatingwebhookconfigurations", False),
}


def collection_path(obj: dict[str, Any]) -> str:
    """The REST collection ``obj`` is created in."""
    api_version = obj["apiVersion"]
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    plural, namespaced = RESOURCES[obj["kind"]]
    if namespaced:
        namespace = obj["metadata"].get("namespace")
        assert namespace, f"{obj['kind']} {obj['metadata']['name']} has no namespace"
        return f"{base}/namespaces/{namespace}/{plural}"
    assert "namespace" not in obj["metadata"]
    return f"{base}/{plural}"


def create(envtest: EnvTest, obj: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
    path = collection_path(obj) + ("?dryRun=All" if dry_run else "")
    status, body = envtest.request("POST", path, obj)
    assert status == 201, f"{obj['kind']} {obj['metadata']['name']}: {status} {body}"
    assert isinstance(body, dict)
    return body


def delete(envtest: EnvTest, obj: dict[str, Any]) -> None:
    path = f"{collection_path(obj)}/{obj['metadata']['name']}"
    status, body = envtest.request("DELETE", path)
    assert status in (200, 202, 404), body


@contextlib.contextmanager
def created(envtest: EnvTest, objects: list[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    """Create ``objects`` for real; delete them afterwards (cluster-scoped ones outlive a test
    namespace)."""
    done: list[dict[str, Any]] = []
    try:
        for obj in objects:
            create(envtest, obj)
            done.append(obj)
        yield done
    finally:
        for obj in reversed(done):
            delete(envtest, obj)


@contextlib.contextmanager
def namespaces(envtest: EnvTest, count: int) -> Iterator[list[str]]:
    names = [f"chart-{uuid.uuid4().hex[:8]}" for _ in range(count)]
    for name in names:
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        status, result = envtest.request("POST", "/api/v1/namespaces", body)
        assert status == 201, result
    try:
        yield names
    finally:
        for name in names:
            envtest.request("DELETE", f"/api/v1/namespaces/{name}")


def release_name() -> str:
    """Unique per test: ClusterRoles are cluster-wide and named after the release."""
    return f"tjo-{uuid.uuid4().hex[:6]}"


def rbac_objects(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ServiceAccount and RBAC objects, in an order the API server accepts."""
    order = ["ServiceAccount", "ClusterRole", "Role", "ClusterRoleBinding", "RoleBinding"]
    return [o for kind in order for o in all_of(objects, kind)]


@pytest.fixture(scope="module")
def trainjob_crd(envtest: EnvTest) -> None:
    """The chart's CRD (what ``helm install`` creates from crds/)."""
    envtest.apply_crd(CHART_CRD)


# --------------------------------------------------------------------------- SubjectAccessReview


def service_account_user(namespace: str, name: str) -> tuple[str, list[str]]:
    """The user name and groups a ServiceAccount's token authenticates as."""
    return (
        f"system:serviceaccount:{namespace}:{name}",
        ["system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"],
    )


def allowed(
    envtest: EnvTest,
    who: tuple[str, list[str]],
    verb: str,
    resource: str,
    namespace: str | None = None,
    group: str = "",
    name: str | None = None,
) -> bool:
    """Whether ``who`` may ``verb`` ``resource`` (``plural`` or ``plural/subresource``)."""
    plural, _, subresource = resource.partition("/")
    attributes: dict[str, Any] = {"verb": verb, "group": group, "resource": plural}
    if subresource:
        attributes["subresource"] = subresource
    if namespace is not None:
        attributes["namespace"] = namespace
    if name is not None:
        attributes["name"] = name
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {"user": who[0], "groups": who[1], "resourceAttributes": attributes},
    }
    status, body = envtest.request(
        "POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", review
    )
    assert status == 201, body
    return bool(body["status"].get("allowed"))


def wait_until_allowed(
    envtest: EnvTest,
    who: tuple[str, list[str]],
    verb: str,
    resource: str,
    namespace: str | None = None,
    group: str = "",
    name: str | None = None,
    expected: bool = True,
) -> None:
    """Wait until the API server's RBAC authorizer, which reads Roles and bindings from an
    informer cache, has caught up with objects just created (or deleted)."""
    wait_for(
        f"{who[0]} {verb} {resource} allowed={expected}",
        lambda: allowed(envtest, who, verb, resource, namespace, group, name) is expected,
        timeout=30,
    )


#: (verb, resource, group) the operator needs in every namespace it watches.
OPERATOR_NEEDS: list[tuple[str, str, str]] = [
    *((v, "trainjobs", "trainjob.dev") for v in ("get", "list", "watch", "patch", "delete")),
    *((v, "trainjobs/status", "trainjob.dev") for v in ("get", "patch")),
    *((v, "pods", "") for v in ("list", "watch", "create", "delete")),
    *((v, r, "") for r in ("services", "serviceaccounts") for v in ("list", "create")),
    ("create", "secrets", ""),
    *((v, "networkpolicies", "networking.k8s.io") for v in ("list", "create")),
    *(
        (v, r, "rbac.authorization.k8s.io")
        for r in ("roles", "rolebindings")
        for v in ("list", "create")
    ),
    ("create", "events", ""),
]
#: (verb, resource, group) the operator must not be able to do, in a watched namespace.
OPERATOR_MUST_NOT: list[tuple[str, str, str]] = [
    ("get", "secrets", ""),
    ("list", "secrets", ""),
    ("watch", "secrets", ""),
    ("patch", "pods", ""),
    ("get", "configmaps", ""),
    ("create", "configmaps", ""),
    ("delete", "services", ""),
    ("patch", "rolebindings", "rbac.authorization.k8s.io"),
    ("create", "trainjobs", "trainjob.dev"),
    ("update", "trainjobs", "trainjob.dev"),
    ("update", "trainjobs/status", "trainjob.dev"),
    ("create", "pods/exec", ""),
    ("update", "pods", ""),
    ("patch", "deployments", "apps"),
    ("create", "deployments", "apps"),
    ("escalate", "roles", "rbac.authorization.k8s.io"),
    ("bind", "roles", "rbac.authorization.k8s.io"),
    ("bind", "clusterroles", "rbac.authorization.k8s.io"),
    ("update", "roles", "rbac.authorization.k8s.io"),
    ("create", "persistentvolumeclaims", ""),
]
#: Cluster-scoped things the operator must never do.
OPERATOR_MUST_NOT_CLUSTER: list[tuple[str, str, str]] = [
    ("delete", "namespaces", ""),
    ("create", "namespaces", ""),
    ("list", "secrets", ""),
    ("create", "clusterroles", "rbac.authorization.k8s.io"),
    ("create", "clusterrolebindings", "rbac.authorization.k8s.io"),
    ("patch", "clusterroles", "rbac.authorization.k8s.io"),
    ("list", "nodes", ""),
    ("create", "customresourcedefinitions", "apiextensions.k8s.io"),
    ("delete", "customresourcedefinitions", "apiextensions.k8s.io"),
    ("get", "customresourcedefinitions", "apiextensions.k8s.io"),
    ("create", "users", ""),
    ("impersonate", "serviceaccounts", ""),
]


# --------------------------------------------------------------------------- server dry-run


@pytest.mark.parametrize("mode", ["cluster-wide", "namespaced"])
def test_every_object_passes_server_side_dry_run(
    envtest: EnvTest, k8s_namespace: str, mode: str
) -> None:
    envtest.apply_crd(SERVICE_MONITOR_CRD)
    with namespaces(envtest, 2) as watched:
        values: dict[str, Any] = {"serviceMonitor": {"enabled": True}}
        if mode == "namespaced":
            values.update(
                watchNamespaces=watched,
                rbac={"clusterScanning": True},
                image={"repository": "registry.example.com/trainjob-operator", "tag": "1.0"},
                logLevel="debug",
                extraEnv=[{"name": "A", "value": "b"}],
                tolerations=[{"key": "k", "operator": "Exists", "effect": "NoSchedule"}],
                defaults={
                    "tpu": {"nodeSelector": {"a": "b"}, "tolerations": []},
                    "validationPool": {"nodeSelector": {}, "tolerations": [{"key": "v"}]},
                },
            )
        objects = render(values, name=release_name(), namespace=k8s_namespace)
        expected = {"Deployment", "ServiceAccount", "Service", "ConfigMap", "ServiceMonitor"}
        assert expected <= {o["kind"] for o in objects}
        for obj in objects:
            stored = create(envtest, obj, dry_run=True)
            assert stored["kind"] == obj["kind"]
            if obj["kind"] == "Deployment":
                # Nothing the API server defaults or drops changes what the chart asked for.
                pod = stored["spec"]["template"]["spec"]
                sent = obj["spec"]["template"]["spec"]
                assert pod["securityContext"] == sent["securityContext"]
                assert (
                    pod["containers"][0]["securityContext"]
                    == (sent["containers"][0]["securityContext"])
                )
                assert stored["spec"]["strategy"]["type"] == "RollingUpdate"  # leader election
            # A dry run persists nothing.
            path = f"{collection_path(obj)}/{obj['metadata']['name']}"
            assert envtest.request("GET", path)[0] == 404


# --------------------------------------------------------------------------- operator RBAC


def test_cluster_wide_rbac(envtest: EnvTest, k8s_namespace: str) -> None:
    objects = render(name=release_name(), namespace=k8s_namespace)
    sa = one(objects, "ServiceAccount")["metadata"]["name"]
    who = service_account_user(k8s_namespace, sa)
    with namespaces(envtest, 1) as [other], created(envtest, rbac_objects(objects)):
        wait_until_allowed(envtest, who, "list", "trainjobs", None, "trainjob.dev")
        for namespace in (other, k8s_namespace):
            for verb, resource, group in OPERATOR_NEEDS:
                assert allowed(envtest, who, verb, resource, namespace, group), (verb, resource)
            for verb, resource, group in OPERATOR_MUST_NOT:
                assert not allowed(envtest, who, verb, resource, namespace, group), (
                    verb,
                    resource,
                )
        # All namespaces at once (kopf's cluster-wide list/watch).
        for verb in ("list", "watch"):
            assert allowed(envtest, who, verb, "trainjobs", None, "trainjob.dev")
            assert allowed(envtest, who, verb, "pods", None)
            assert allowed(
                envtest, who, verb, "customresourcedefinitions", None, "apiextensions.k8s.io"
            )
        assert not allowed(envtest, who, "list", "namespaces", None)
        for verb, resource, group in OPERATOR_MUST_NOT_CLUSTER:
            assert not allowed(envtest, who, verb, resource, None, group), (verb, resource)
        # Leader election: its own Lease in the release namespace, nothing else.
        lease = ("leases", k8s_namespace, "coordination.k8s.io")
        assert allowed(envtest, who, "create", *lease)
        for verb in ("get", "update"):
            assert allowed(envtest, who, verb, *lease, name="trainjob-operator")
            assert not allowed(envtest, who, verb, *lease, name="kube-scheduler")
        assert not allowed(envtest, who, "delete", *lease, name="trainjob-operator")
        assert not allowed(envtest, who, "update", "leases", other, "coordination.k8s.io")
    # Gone with the release: no rights left behind.
    wait_until_allowed(envtest, who, "list", "pods", k8s_namespace, expected=False)


@pytest.mark.parametrize("scanning", [False, True], ids=["roles-only", "cluster-scanning"])
def test_namespaced_rbac(envtest: EnvTest, k8s_namespace: str, scanning: bool) -> None:
    with namespaces(envtest, 3) as [team_a, team_b, unwatched]:
        values = {"watchNamespaces": [team_a, team_b], "rbac": {"clusterScanning": scanning}}
        objects = render(values, name=release_name(), namespace=k8s_namespace)
        sa = one(objects, "ServiceAccount")["metadata"]["name"]
        who = service_account_user(k8s_namespace, sa)
        with created(envtest, rbac_objects(objects)):
            for namespace in (team_a, team_b):
                wait_until_allowed(envtest, who, "list", "trainjobs", namespace, "trainjob.dev")
            if scanning:
                wait_until_allowed(envtest, who, "list", "namespaces")
            for namespace in (team_a, team_b):
                for verb, resource, group in OPERATOR_NEEDS:
                    assert allowed(envtest, who, verb, resource, namespace, group), (
                        namespace,
                        verb,
                        resource,
                    )
                for verb, resource, group in OPERATOR_MUST_NOT:
                    assert not allowed(envtest, who, verb, resource, namespace, group)
            # Nothing outside the watched namespaces: not its own, not another, not all.
            outside: tuple[str | None, ...] = (unwatched, k8s_namespace, None)
            for elsewhere in outside:
                for verb, resource, group in OPERATOR_NEEDS:
                    assert not allowed(envtest, who, verb, resource, elsewhere, group), (
                        elsewhere,
                        verb,
                        resource,
                    )
            for verb, resource, group in OPERATOR_MUST_NOT_CLUSTER:
                assert not allowed(envtest, who, verb, resource, None, group), (verb, resource)
            # The optional scanning ClusterRole: read-only namespaces and CRDs.
            for verb in ("list", "watch"):
                assert allowed(envtest, who, verb, "namespaces", None) is scanning
                assert (
                    allowed(
                        envtest,
                        who,
                        verb,
                        "customresourcedefinitions",
                        None,
                        "apiextensions.k8s.io",
                    )
                    is scanning
                )
            assert not allowed(envtest, who, "get", "namespaces", None, name=team_a)


def test_aggregated_user_roles(envtest: EnvTest, k8s_namespace: str) -> None:
    """With the chart's aggregated ClusterRoles, the built-in edit and view roles (bound in a
    namespace) give users TrainJob access; status stays read-only for them."""
    if not envtest.controller_manager_running:
        pytest.skip("needs kube-controller-manager (ClusterRole aggregation)")
    objects = render(name=release_name(), namespace=k8s_namespace)
    aggregated = [o for o in all_of(objects, "ClusterRole") if "-edit" in o["metadata"]["name"]]
    aggregated += [o for o in all_of(objects, "ClusterRole") if "-view" in o["metadata"]["name"]]
    bindings = [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": f"{user}-{role}", "namespace": k8s_namespace},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": role,
            },
            "subjects": [{"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"}],
        }
        for user, role in (("alice", "edit"), ("bob", "view"))
    ]
    alice: tuple[str, list[str]] = ("alice", [])
    bob: tuple[str, list[str]] = ("bob", ["trainjob-devs"])
    with created(envtest, [*aggregated, *bindings]):
        wait_for(
            "aggregation into edit",
            lambda: allowed(envtest, alice, "create", "trainjobs", k8s_namespace, "trainjob.dev"),
        )
        wait_for(
            "aggregation into view",
            lambda: allowed(envtest, bob, "list", "trainjobs", k8s_namespace, "trainjob.dev"),
        )
        wait_for(  # edit aggregates the view role too (its own, separately updated rules)
            "aggregation of view into edit",
            lambda: allowed(
                envtest, alice, "get", "trainjobs/status", k8s_namespace, "trainjob.dev"
            ),
        )
        for verb in ("get", "list", "watch", "create", "update", "patch", "delete"):
            assert allowed(envtest, alice, verb, "trainjobs", k8s_namespace, "trainjob.dev")
        assert allowed(envtest, alice, "get", "trainjobs/status", k8s_namespace, "trainjob.dev")
        assert allowed(envtest, bob, "get", "trainjobs/status", k8s_namespace, "trainjob.dev")
        for verb in ("create", "patch", "delete"):
            assert not allowed(envtest, bob, verb, "trainjobs", k8s_namespace, "trainjob.dev")
        for who in (alice, bob):
            assert not allowed(
                envtest, who, "patch", "trainjobs/status", k8s_namespace, "trainjob.dev"
            )
            assert not allowed(envtest, who, "list", "trainjobs", "default", "trainjob.dev")


# --------------------------------------------------------------------------- the driver's RBAC


def service_account_token(envtest: EnvTest, namespace: str, name: str) -> str:
    """A real token of a ServiceAccount (TokenRequest API)."""
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}
    status, body = envtest.request(
        "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token", request
    )
    assert status == 201, body
    return str(body["status"]["token"])


def client_for(envtest: EnvTest, token: str) -> KubeClient:
    return KubeClient(
        KubeConfig(host=envtest.host, token=token, ca_file=str(envtest.ca_file)), attempts=1
    )


def make_trainjob(envtest: EnvTest, namespace: str, name: str) -> dict[str, Any]:
    body = copy.deepcopy(QUICKSTART)
    body["metadata"] = {"name": name, "namespace": namespace}
    status, stored = envtest.request(
        "POST", f"/apis/trainjob.dev/v1alpha1/namespaces/{namespace}/trainjobs", body
    )
    assert status == 201, stored
    assert isinstance(stored, dict)
    return stored


def test_driver_may_patch_only_its_own_status(
    envtest: EnvTest, trainjob_crd: None, k8s_namespace: str
) -> None:
    ns = k8s_namespace
    mine = make_trainjob(envtest, ns, "mine")
    make_trainjob(envtest, ns, "other")
    children = render_children(parse_trainjob(mine), uid=mine["metadata"]["uid"])
    rbac = [c for c in children if c["kind"] in ("ServiceAccount", "Role", "RoleBinding")]
    assert [c["kind"] for c in rbac] == ["ServiceAccount", "Role", "RoleBinding"]
    for obj in rbac:  # owned by the real TrainJob, so the garbage collector keeps them
        create(envtest, {**obj, "metadata": {**obj["metadata"], "namespace": ns}})
    sa = one(rbac, "ServiceAccount")["metadata"]["name"]
    who = service_account_user(ns, sa)
    group = "trainjob.dev"
    wait_until_allowed(envtest, who, "patch", "trainjobs/status", ns, group, name="mine")

    assert allowed(envtest, who, "patch", "trainjobs/status", ns, group, name="mine")
    assert allowed(envtest, who, "get", "trainjobs/status", ns, group, name="mine")
    assert allowed(envtest, who, "get", "trainjobs", ns, group, name="mine")
    # Not another TrainJob, not the spec, not other verbs, nothing else.
    assert not allowed(envtest, who, "patch", "trainjobs/status", ns, group, name="other")
    assert not allowed(envtest, who, "get", "trainjobs", ns, group, name="other")
    for verb in ("patch", "update", "delete"):
        assert not allowed(envtest, who, verb, "trainjobs", ns, group, name="mine")
    assert not allowed(envtest, who, "update", "trainjobs/status", ns, group, name="mine")
    for verb in ("list", "watch", "create"):
        assert not allowed(envtest, who, verb, "trainjobs", ns, group)
    assert not allowed(envtest, who, "patch", "trainjobs/status", "default", group, name="mine")
    for verb, resource in (("get", "secrets"), ("create", "pods"), ("list", "pods")):
        assert not allowed(envtest, who, verb, resource, ns)

    # The same with the driver's real token.
    driver = client_for(envtest, service_account_token(envtest, ns, sa))
    progress = {"status": {"progress": {"step": 7}}}
    driver.patch("TrainJob", ns, "mine", progress, subresource="status")
    stored = driver.get("TrainJob", ns, "mine")
    assert stored is not None and stored["status"]["progress"]["step"] == 7
    with pytest.raises(ApiError) as raised:
        driver.patch("TrainJob", ns, "other", progress, subresource="status")
    assert raised.value.status == 403
    with pytest.raises(ApiError) as raised:
        driver.patch("TrainJob", ns, "mine", {"spec": {"suspend": True}})
    assert raised.value.status == 403
    with pytest.raises(ApiError) as raised:
        driver.list("TrainJob", ns)
    assert raised.value.status == 403


# --------------------------------------------------------------------------- the operator


@pytest.mark.parametrize("mode", ["namespaced", "namespaced-roles-only", "cluster-wide"])
def test_operator_works_under_the_chart_rbac(
    envtest: EnvTest, trainjob_crd: None, k8s_namespace: str, mode: str
) -> None:
    """The operator, in-process, authenticated as the chart's ServiceAccount (a real token),
    reconciles a TrainJob: it creates the driver's ServiceAccount, Role (which the RBAC
    escalation check allows only because the operator holds those rights) and RoleBinding, the
    Service and Pods, writes status and posts events.

    ``namespaced-roles-only`` (``rbac.clusterScanning: false``) works too, but kopf first retries
    listing namespaces and CRDs for about 50 s before it falls back (slow by design)."""
    with namespaces(envtest, 1) as [jobs]:
        values: dict[str, Any] = {}
        if mode.startswith("namespaced"):
            values["watchNamespaces"] = [jobs]
            values["rbac"] = {"clusterScanning": mode == "namespaced"}
        objects = render(values, name=release_name(), namespace=k8s_namespace)
        sa = one(objects, "ServiceAccount")["metadata"]["name"]
        with created(envtest, rbac_objects(objects)):
            who = service_account_user(k8s_namespace, sa)
            first = values["watchNamespaces"][0] if "watchNamespaces" in values else None
            wait_until_allowed(envtest, who, "watch", "trainjobs", first, "trainjob.dev")
            token = service_account_token(envtest, k8s_namespace, sa)
            config = KubeConfig(host=envtest.host, token=token, ca_file=str(envtest.ca_file))
            stop, ready = threading.Event(), threading.Event()
            thread = threading.Thread(
                target=run_operator,
                args=(config, values.get("watchNamespaces")),
                kwargs={"stop_flag": stop, "ready_flag": ready, "timer_interval": 1.0},
                daemon=True,
            )
            thread.start()
            try:
                assert ready.wait(120), "operator did not become ready"
                make_trainjob(envtest, jobs, "quickstart")
                admin = client_for(envtest, envtest.token)
                selector = "trainjob.dev/name=quickstart"

                def children() -> set[tuple[str, str]]:
                    found = set()
                    for kind in ("ServiceAccount", "Role", "RoleBinding", "Service", "Pod"):
                        for obj in admin.list(kind, jobs, selector):
                            found.add((kind, obj["metadata"]["name"]))
                    return found

                expected = {
                    ("ServiceAccount", "quickstart-driver"),
                    ("Role", "quickstart-driver"),
                    ("RoleBinding", "quickstart-driver"),
                    ("Service", "quickstart-headless"),
                    ("Pod", "quickstart-head"),
                    ("Pod", "quickstart-driver"),
                }
                wait_for("children", lambda: expected <= children(), timeout=150)

                def phase() -> Any:
                    job = admin.get("TrainJob", jobs, "quickstart")
                    return (job or {}).get("status", {}).get("phase")

                assert wait_for("status.phase", phase) in ("Pending", "Starting")
                events = wait_for(
                    "an event",
                    lambda: [
                        e
                        for e in admin.list("Event", jobs)
                        if e["involvedObject"].get("name") == "quickstart"
                    ],
                )
                assert events[0]["source"]["component"] == "trainjob-operator"
            finally:
                stop.set()
                thread.join(60)
            assert not thread.is_alive()
