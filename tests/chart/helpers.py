"""Rendering the Helm chart with the Helm v4 SDK (``helm_python``) and reading the result."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml
from helm_python import _native

REPO = Path(__file__).resolve().parents[2]
CHART_DIR = REPO / "charts" / "trainjob-operator"
NOTES = "NOTES.txt"

#: What the operator needs in every namespace it watches, exactly (the chart's Role/ClusterRole).
OPERATOR_RULES: list[dict[str, Any]] = [
    {
        "apiGroups": ["trainjob.dev"],
        "resources": ["trainjobs"],
        "verbs": ["get", "list", "watch", "patch", "delete"],
    },
    {"apiGroups": ["trainjob.dev"], "resources": ["trainjobs/status"], "verbs": ["get", "patch"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch", "create", "delete"]},
    {"apiGroups": [""], "resources": ["services", "serviceaccounts"], "verbs": ["list", "create"]},
    {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
    {
        "apiGroups": ["networking.k8s.io"],
        "resources": ["networkpolicies"],
        "verbs": ["list", "create"],
    },
    {
        "apiGroups": ["rbac.authorization.k8s.io"],
        "resources": ["roles", "rolebindings"],
        "verbs": ["list", "create"],
    },
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
]
#: kopf's resource observer (cluster-wide mode, and the optional scanning ClusterRole).
CRD_OBSERVER_RULE: dict[str, Any] = {
    "apiGroups": ["apiextensions.k8s.io"],
    "resources": ["customresourcedefinitions"],
    "verbs": ["list", "watch"],
}
NAMESPACE_OBSERVER_RULE: dict[str, Any] = {
    "apiGroups": [""],
    "resources": ["namespaces"],
    "verbs": ["list", "watch"],
}

_CHART: helm.Chart | None = None


def chart() -> helm.Chart:
    """The chart, loaded once (charts are immutable and thread-safe in the SDK)."""
    global _CHART
    if _CHART is None:
        _CHART = helm.Chart.load(CHART_DIR)
    return _CHART


def render_raw(
    values: Mapping[str, Any] | None = None,
    *,
    name: str = "tjo",
    namespace: str = "ops",
    kube_version: str | None = None,
) -> dict[str, str]:
    """``helm template``: template path -> rendered text (NOTES.txt included).

    ``kube_version``: ``.Capabilities.KubeVersion`` (``helm template --kube-version``; Helm's
    default otherwise, v1.36.0 in helm-python-sdk 0.2.2). ``Chart.render`` does not take it, so
    it goes straight to the C ABI's ``helm_render``, whose options carry ``kube_version``.
    """
    values = copy.deepcopy(dict(values)) if values else None
    if kube_version is None:
        return chart().render(values, name=name, namespace=namespace, is_install=True)
    options = {
        "name": name,
        "namespace": namespace,
        "is_install": True,
        "kube_version": kube_version,
    }
    rendered = _native.call_string(
        "helm_render", chart()._raw(), json.dumps(values) if values else None, json.dumps(options)
    )
    manifests: dict[str, str] = json.loads(rendered)
    return manifests


def render(
    values: Mapping[str, Any] | None = None,
    *,
    name: str = "tjo",
    namespace: str = "ops",
    kube_version: str | None = None,
) -> list[dict[str, Any]]:
    """The rendered Kubernetes objects, in template order (empty documents dropped)."""
    objects: list[dict[str, Any]] = []
    raw = render_raw(values, name=name, namespace=namespace, kube_version=kube_version)
    for path, text in sorted(raw.items()):
        if path.endswith(NOTES):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                assert isinstance(doc, dict), f"{path}: not an object: {doc!r}"
                objects.append(doc)
    return objects


def notes(values: Mapping[str, Any] | None = None, **kwargs: Any) -> str:
    """The rendered NOTES.txt."""
    [text] = [t for p, t in render_raw(values, **kwargs).items() if p.endswith(NOTES)]
    return text


def kinds(objects: Iterable[Mapping[str, Any]]) -> list[tuple[str, str, str | None]]:
    """``(kind, name, namespace)`` of each object, sorted."""
    return sorted(
        (o["kind"], o["metadata"]["name"], o["metadata"].get("namespace")) for o in objects
    )


def one(objects: Iterable[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    """The single object of ``kind`` (and ``name``)."""
    found = [
        o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''} in {kinds(objects)}"
    return found[0]


def all_of(objects: Iterable[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """Every object of ``kind``."""
    return [o for o in objects if o["kind"] == kind]


def container(objects: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The operator container of the Deployment."""
    [main] = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    return main
