"""The opt-in ClusterIP Service of the Ray dashboard (spec.ray.dashboard.service)."""

from __future__ import annotations

from typing import Any

from tests.render.helpers import UID, make_job
from trainjob_operator.render import render_children


def _services(job_spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    children = render_children(make_job(name="demo", **job_spec), uid=UID)
    return {c["metadata"]["name"]: c for c in children if c["kind"] == "Service"}


def test_no_dashboard_service_by_default() -> None:
    assert list(_services({})) == ["demo-headless"]


def test_dashboard_service_selects_the_head_on_the_dashboard_port() -> None:
    services = _services({"ray": {"dashboard": {"service": True}}})
    svc = services["demo-dashboard"]
    assert svc["metadata"]["labels"]["trainjob.dev/role"] == "dashboard"
    assert svc["metadata"]["ownerReferences"][0]["name"] == "demo"
    assert svc["spec"] == {
        "type": "ClusterIP",
        "selector": {"trainjob.dev/name": "demo", "trainjob.dev/role": "head"},
        "ports": [{"name": "dashboard", "port": 8265, "targetPort": 8265, "protocol": "TCP"}],
    }


def test_the_dashboard_setting_changes_no_pod() -> None:
    """Turning the Service on or off replaces nothing: the driver's copy of the spec leaves
    it out (as the restart policy), so no pod's spec hash changes."""
    plain = render_children(make_job(name="demo"), uid=UID)
    opted = render_children(make_job(name="demo", ray={"dashboard": {"service": True}}), uid=UID)
    pods = {c["metadata"]["name"]: c for c in plain if c["kind"] == "Pod"}
    assert pods == {c["metadata"]["name"]: c for c in opted if c["kind"] == "Pod"}
    policy = make_job(name="demo", failure={"restartBackoff": {"initialSeconds": 1}})
    assert pods == {
        c["metadata"]["name"]: c for c in render_children(policy, uid=UID) if c["kind"] == "Pod"
    }
