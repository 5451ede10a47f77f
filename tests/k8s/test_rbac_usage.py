"""Every verb the chart grants the operator is one the operator uses, and every request the
operator makes is granted (issue 18, item 4).

The reconciler's requests are recorded (a :class:`KubeClient` that notes each request's verb and
resource) while it takes a TrainJob through its life on a real kube-apiserver: created, scaled
down (a worker deleted), its driver succeeded (the pods deleted), its TTL passed (the TrainJob
deleted). kopf's own requests, which do not go through that client, are listed with the
kopf code that makes them.
"""

from __future__ import annotations

import copy
import re
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart.helpers import render
from tests.support import EnvTest
from trainjob_operator.kube import KubeClient, KubeConfig
from trainjob_operator.reconcile.apply import reconcile_trainjob
from trainjob_operator.render import render_for_reconcile

pytestmark = pytest.mark.k8s

REPO = Path(__file__).resolve().parents[2]

#: (verb, group, resource) kopf itself uses: its watches (list + watch) of TrainJobs and of
#: the managed pods (kopf.on.event), the patch that removes the finalizer an earlier version's
#: change handlers left on a TrainJob (kopf._core.reactor.processing), and the events it posts
#: for handler outcomes (kopf._core.engines.posting).
KOPF_USES = {
    ("list", "trainjob.dev", "trainjobs"),
    ("watch", "trainjob.dev", "trainjobs"),
    ("patch", "trainjob.dev", "trainjobs"),
    ("list", "", "pods"),
    ("watch", "", "pods"),
    ("create", "", "events"),
}
#: Granted without being called: the operator creates each driver's Role, which allows get of
#: the TrainJob's status, and the API server lets it create that Role only while it holds that
#: permission itself (RBAC escalation check).
HELD_FOR_DRIVER_ROLE = {("get", "trainjob.dev", "trainjobs/status")}

_PATH = re.compile(
    r"^/(?:api/v1|apis/(?P<group>[^/]+)/[^/]+)(?:/namespaces/[^/]+)?/(?P<plural>[^/]+)"
    r"(?:/(?P<name>[^/]+)(?:/(?P<sub>[^/]+))?)?$"
)


class RecordingClient(KubeClient):
    """A :class:`KubeClient` that records ``(verb, group, resource)`` of every request."""

    def __init__(self, config: KubeConfig) -> None:
        super().__init__(config)
        self.used: set[tuple[str, str, str]] = set()

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        query: dict[str, str] | None = None,
        decode: bool = True,
    ) -> Any:
        match = _PATH.match(urllib.parse.urlsplit(path).path)
        assert match, path
        resource = match["plural"] + (f"/{match['sub']}" if match["sub"] else "")
        verb = {"POST": "create", "DELETE": "delete", "PATCH": "patch", "PUT": "update"}.get(
            method, "get" if match["name"] else "list"
        )
        if query and query.get("watch"):
            verb = "watch"
        self.used.add((verb, match["group"] or "", resource))
        return super().request(method, path, body, content_type, query, decode)


def chart_grants() -> set[tuple[str, str, str]]:
    """(verb, group, resource) of the chart's operator Role (namespaced mode)."""
    objects = render({"watchNamespaces": ["team-a"]}, name="tjo", namespace="ops")
    [role] = [o for o in objects if o["kind"] == "Role" and o["metadata"]["namespace"] == "team-a"]
    return {
        (verb, group, resource)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_the_chart_grants_exactly_what_the_operator_uses(
    envtest: EnvTest, k8s_namespace: str
) -> None:
    envtest.apply_crd(REPO / "crds" / "trainjob.dev_trainjobs.yaml")
    ns = k8s_namespace
    admin = KubeClient(
        KubeConfig(host=envtest.host, token=envtest.token, ca_file=str(envtest.ca_file))
    )
    operator = RecordingClient(
        KubeConfig(host=envtest.host, token=envtest.token, ca_file=str(envtest.ca_file))
    )
    body = copy.deepcopy(yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text()))
    body["metadata"] = {"name": "life", "namespace": ns}
    body["spec"]["ttlSecondsAfterFinished"] = 0
    body["spec"]["keepDriverPod"] = "Never"
    admin.create(body, ns)

    def reconcile() -> None:
        reconcile_trainjob(operator, ns, "life", render_for_reconcile)

    reconcile()
    pods = {p["metadata"]["name"] for p in admin.list("Pod", ns)}
    assert {"life-head", "life-w0", "life-w1", "life-driver"} <= pods
    # Scaled down: a worker deleted.
    admin.patch("TrainJob", ns, "life", {"spec": {"scaling": {"numWorkers": 1}}})
    reconcile()
    assert "life-w1" not in {p["metadata"]["name"] for p in admin.list("Pod", ns)}
    # The driver's spec (the manifest it runs) changed too: deleted, then created anew.
    reconcile()
    assert admin.get("Pod", ns, "life-driver") is not None
    # The driver succeeded: the job succeeds, its pods go, then the TTL deletes it.
    admin.patch("Pod", ns, "life-driver", {"status": {"phase": "Succeeded"}}, subresource="status")
    for _ in range(3):
        reconcile()
    assert admin.get("TrainJob", ns, "life") is None

    used = operator.used
    granted = chart_grants()
    assert used - granted == set(), "requests the chart does not allow"
    never_used = granted - used - KOPF_USES - HELD_FOR_DRIVER_ROLE
    assert never_used == set(), f"granted but never used: {sorted(never_used)}"
