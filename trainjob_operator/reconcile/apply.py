"""The side-effecting half of reconciliation: read, plan (pure), apply.

:func:`reconcile_trainjob` is what every operator trigger calls (create,
update, resume, timer, child pod events). It is idempotent: running it twice,
or after an operator restart mid-way, converges to the same children.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from typing import Any

from trainjob_operator.api.models import ManifestError, TrainJob, parse_trainjob
from trainjob_operator.kube import ApiError, KubeClient
from trainjob_operator.reconcile.plan import (
    LAST_DEMAND_ANNOTATION,
    Event,
    Plan,
    mark_failed,
    plan_reconcile,
    set_condition,
    validation_replicas,
    validation_scale_down_in,
)

logger = logging.getLogger(__name__)

NAME_LABEL = "trainjob.dev/name"
CHILD_KINDS = ("Pod", "Service", "ConfigMap", "ServiceAccount", "Role", "RoleBinding")
#: status keys the operator owns; the driver owns progress, checkpoints and validations.
OPERATOR_STATUS_KEYS = (
    "phase",
    "conditions",
    "observedGeneration",
    "startTime",
    "completionTime",
    "restarts",
    "workers",
    "validationPool",
    "message",
)

#: Longest Event message posted (the API server keeps it; kubectl describe shows it).
EVENT_MESSAGE_LIMIT = 2048

#: (job, uid, attempt, validation replicas) -> desired child manifests.
Renderer = Callable[[TrainJob, str, int, int], list[dict[str, Any]]]


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def read_children(client: KubeClient, namespace: str, name: str) -> list[dict[str, Any]]:
    """Every child of the TrainJob, found by its ``trainjob.dev/name`` label."""
    out: list[dict[str, Any]] = []
    for kind in CHILD_KINDS:
        # From the API server's watch cache: a quorum read decodes every object of the kind
        # in the namespace (costly with hundreds of TrainJobs). The cache is at least as fresh
        # as the watch event that triggered this reconcile; anything newer is seen by the next
        # one, and creating what already exists is a harmless 409.
        out.extend(client.list(kind, namespace, f"{NAME_LABEL}={name}", from_cache=True))
    return out


def post_event(client: KubeClient, obj: dict[str, Any], event: Event, now: dt.datetime) -> None:
    """A core/v1 Event on the TrainJob (best effort)."""
    meta = obj["metadata"]
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    body = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": obj.get("apiVersion", "trainjob.dev/v1alpha1"),
            "kind": "TrainJob",
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta.get("uid"),
        },
        "reason": event.reason,
        "message": event.message[:EVENT_MESSAGE_LIMIT],
        "type": event.type,
        "source": {"component": "trainjob-operator"},
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
    try:
        client.create(body, meta["namespace"])
    except ApiError as exc:
        logger.warning("could not post event %s: %s", event.reason, exc)


def _invalid(client: KubeClient, obj: dict[str, Any], message: str, now: dt.datetime) -> Plan:
    """Fail a TrainJob whose spec cannot be turned into children (no retry can fix it)."""
    meta = obj["metadata"]
    status = dict(obj.get("status") or {})
    message = message[:2000]
    if status.get("phase") != "Failed":
        status["phase"] = "Failed"
        status["message"] = message
        status["completionTime"] = now.strftime("%Y-%m-%dT%H:%M:%SZ")
        set_condition(status, "Failed", True, "InvalidSpec", message, meta.get("generation"), now)
        client.patch(
            "TrainJob",
            meta["namespace"],
            meta["name"],
            {"status": {k: status[k] for k in OPERATOR_STATUS_KEYS if k in status}},
            subresource="status",
        )
        post_event(client, obj, Event("Warning", "InvalidSpec", message), now)
    return Plan(status=status)


def invalid_child_message(manifest: dict[str, Any], body: dict[str, Any]) -> str:
    """What the API server said about a child it rejected (422 Invalid), field by field.

    ``body`` is the Status object of the answer: its ``details.causes`` name each field
    (``spec.tolerations[0].value: Invalid value...``); ``message`` is the fallback.
    """
    what = f"{manifest.get('kind')} {manifest['metadata']['name']}"
    causes = (body.get("details") or {}).get("causes") or []
    errors = [
        f"{c['field']}: {c.get('message', '')}" if c.get("field") else str(c.get("message", ""))
        for c in causes
    ]
    detail = "; ".join(e for e in errors if e) or str(body.get("message") or "invalid")
    return f"the API server rejected {what}: {detail}"


def reconcile_trainjob(
    client: KubeClient, namespace: str, name: str, render: Renderer, now: dt.datetime | None = None
) -> Plan | None:
    """Bring one TrainJob's children and status to what its spec asks for."""
    now = now or _now()
    obj = client.get("TrainJob", namespace, name)
    if obj is None or obj["metadata"].get("deletionTimestamp"):
        return None  # gone: owner references let the garbage collector delete the children
    try:
        job = parse_trainjob(obj)
    except ManifestError as exc:
        return _invalid(client, obj, "; ".join(e.format() for e in exc.errors), now)
    meta = obj["metadata"]
    status = dict(obj.get("status") or {})
    annotations = dict(meta.get("annotations") or {})
    replicas, stamp = validation_replicas(job, status, annotations, now)
    attempt = int(status.get("restarts", 0))
    try:
        desired = render(job, meta["uid"], attempt, replicas)
    except ValueError as exc:  # e.g. spec.podTemplate.<key>: unknown key
        return _invalid(client, obj, str(exc), now)
    observed = read_children(client, namespace, name)
    plan = plan_reconcile(job, status, observed, desired, now, generation=meta.get("generation"))
    scale_down_in = validation_scale_down_in(job, status, annotations, now)
    if scale_down_in is not None:
        plan.requeue_at_most(scale_down_in + 1.0)

    for kind, child in plan.delete:
        client.delete(kind, namespace, child)
    for manifest in plan.create:
        try:
            client.create(manifest, namespace)  # 409 (already exists) is success
        except ApiError as exc:
            if exc.status != 422:
                raise
            # Invalid: the same spec renders the same child, so no retry can succeed. Fail
            # the job once (the next reconcile, phase Failed, deletes what was created).
            message = invalid_child_message(manifest, exc.body)
            mark_failed(plan, "InvalidChild", message, meta.get("generation"), now)
            break
    if plan.delete_trainjob:
        client.delete("TrainJob", namespace, name)
    else:
        patch = {k: plan.status[k] for k in OPERATOR_STATUS_KEYS if k in plan.status}
        current = {k: status[k] for k in OPERATOR_STATUS_KEYS if k in status}
        if patch != current:
            client.patch("TrainJob", namespace, name, {"status": patch}, subresource="status")
        if stamp and stamp != annotations.get(LAST_DEMAND_ANNOTATION):
            client.patch(
                "TrainJob",
                namespace,
                name,
                {"metadata": {"annotations": {LAST_DEMAND_ANNOTATION: stamp}}},
            )
    for event in plan.events:
        post_event(client, obj, event, now)
    return plan
