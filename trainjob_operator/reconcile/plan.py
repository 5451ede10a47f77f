"""Pure reconcile planning: (TrainJob, observed children, desired children, now) -> Plan.

Nothing here does I/O. The operator reads the TrainJob and its children, calls
:func:`plan_reconcile`, and applies the returned creates, deletes, status and
events. Every decision is derived from what exists now (level-based), so a
restarted operator makes the same decisions and never duplicates children.

Phases (``status.phase``): Pending -> Starting -> Running -> Succeeded | Failed,
with Restarting (whole-cluster restart after a head or driver failure, up to
``spec.failure.maxRestarts``) and Suspended (``spec.suspend``). The driver
owns ``progress``, checkpoints and ``validations``; the operator owns phase,
conditions, workers, restarts, times and message.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from trainjob_operator.api.models import TrainJob

ROLE_LABEL = "trainjob.dev/role"
ATTEMPT_LABEL = "trainjob.dev/attempt"
CLUSTER_ROLES = ("head", "worker", "validation")
LAST_DEMAND_ANNOTATION = "trainjob.dev/validation-last-demand"
SPEC_HASH_ANNOTATION = "trainjob.dev/spec-hash"

CONDITION_TYPES = ("Created", "Running", "Suspended", "Restarting", "Succeeded", "Failed")


@dataclass
class Event:
    """A Kubernetes Event to post on the TrainJob."""

    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass
class Plan:
    """What the operator should do now."""

    status: dict[str, Any]
    create: list[dict[str, Any]] = field(default_factory=list)
    delete: list[tuple[str, str]] = field(default_factory=list)  # (kind, name)
    events: list[Event] = field(default_factory=list)
    delete_trainjob: bool = False
    requeue_after: float | None = None


def _ts(now: dt.datetime) -> str:
    return now.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_ts(value: Any) -> dt.datetime | None:
    if not value:
        return None
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    return dt.datetime.strptime(str(value), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)


def pod_phase(pod: dict[str, Any]) -> str:
    """``status.phase`` of a pod (Pending when unset)."""
    return str((pod.get("status") or {}).get("phase") or "Pending")


def pod_ready(pod: dict[str, Any]) -> bool:
    """Running with the Ready condition True."""
    if pod_phase(pod) != "Running":
        return False
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _role(obj: dict[str, Any]) -> str | None:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    role = labels.get(ROLE_LABEL)
    return str(role) if role is not None else None


def _attempt(obj: dict[str, Any]) -> int | None:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    value = labels.get(ATTEMPT_LABEL)
    return int(value) if value is not None else None


def _spec_hash(obj: dict[str, Any]) -> str | None:
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(SPEC_HASH_ANNOTATION)
    return str(value) if value is not None else None


def _name(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["name"])


def set_condition(
    status: dict[str, Any],
    type_: str,
    true: bool,
    reason: str,
    message: str,
    generation: int | None,
    now: dt.datetime,
) -> None:
    """Set one metav1.Condition; ``lastTransitionTime`` changes only when the status does."""
    conditions: list[dict[str, Any]] = status.setdefault("conditions", [])
    value = "True" if true else "False"
    for cond in conditions:
        if cond["type"] == type_:
            if cond["status"] != value:
                cond["lastTransitionTime"] = _ts(now)
            cond.update(status=value, reason=reason, message=message)
            if generation is not None:
                cond["observedGeneration"] = generation
            return
    cond = {
        "type": type_,
        "status": value,
        "reason": reason,
        "message": message,
        "lastTransitionTime": _ts(now),
    }
    if generation is not None:
        cond["observedGeneration"] = generation
    conditions.append(cond)


def validation_replicas(
    job: TrainJob, status: dict[str, Any], annotations: dict[str, str], now: dt.datetime
) -> tuple[int, str | None]:
    """Validation pool size from the driver's demand, and the new last-demand timestamp.

    ``pending + running`` validations, capped at ``maxReplicas``; after
    ``idleSeconds`` without demand the pool returns to ``minReplicas``.
    """
    validation = job.spec.validation
    if validation is None:
        return 0, None
    pool = validation.pool
    counts = status.get("validations") or {}
    demand = int(counts.get("pending", 0)) + int(counts.get("running", 0))
    current = int((status.get("validationPool") or {}).get("replicas", pool.min_replicas))
    last = _parse_ts(annotations.get(LAST_DEMAND_ANNOTATION))
    if demand > 0:
        return max(pool.min_replicas, min(pool.max_replicas, demand)), _ts(now)
    if last is not None and (now - last).total_seconds() < pool.idle_seconds:
        return max(pool.min_replicas, current), annotations.get(LAST_DEMAND_ANNOTATION)
    return pool.min_replicas, annotations.get(LAST_DEMAND_ANNOTATION)


def plan_reconcile(
    job: TrainJob,
    status: dict[str, Any],
    observed: list[dict[str, Any]],
    desired: list[dict[str, Any]],
    now: dt.datetime,
    generation: int | None = None,
) -> Plan:
    """Decide creates, deletes, status and events for one TrainJob.

    ``status``: the TrainJob's current status (dict, camelCase). ``observed``:
    its children as read from the API. ``desired``: the children rendered for
    the current attempt (``status.restarts``) and validation pool size.
    """
    new = {k: v for k, v in status.items()}
    new.setdefault("restarts", 0)
    new["observedGeneration"] = generation
    plan = Plan(status=new)
    spec = job.spec
    phase = new.get("phase") or "Pending"
    attempt = int(new["restarts"])
    pods = [o for o in observed if o.get("kind") == "Pod"]
    existing_keys = {(str(o.get("kind")), _name(o)) for o in observed}

    def delete_pods(keep_driver: bool) -> None:
        for pod in pods:
            if keep_driver and _role(pod) == "driver":
                continue
            if (pod.get("metadata") or {}).get("deletionTimestamp"):
                continue
            plan.delete.append(("Pod", _name(pod)))

    def transition(to: str, reason: str, message: str, event_type: str = "Normal") -> None:
        if new.get("phase") != to:
            plan.events.append(Event(event_type, reason, message))
        new["phase"] = to
        new["message"] = message

    if "Created" not in {c["type"] for c in new.get("conditions", [])}:
        set_condition(new, "Created", True, "Created", "TrainJob accepted", generation, now)
        plan.events.append(Event("Normal", "Created", "TrainJob accepted"))

    # -- finished jobs: tear down, keep the driver's log pod, honour the TTL -----------------
    if phase in ("Succeeded", "Failed"):
        delete_pods(keep_driver=True)
        ttl = spec.ttl_seconds_after_finished
        done_at = _parse_ts(new.get("completionTime"))
        if ttl is not None and done_at is not None:
            remaining = (done_at + dt.timedelta(seconds=ttl) - now).total_seconds()
            if remaining <= 0:
                plan.delete_trainjob = True
                plan.events.append(Event("Normal", "TTLExpired", f"deleted {ttl}s after finishing"))
            else:
                plan.requeue_after = remaining
        return plan

    # -- suspend ------------------------------------------------------------------------------
    if spec.suspend:
        delete_pods(keep_driver=False)
        transition("Suspended", "Suspended", "suspended: cluster torn down, checkpoints kept")
        set_condition(new, "Suspended", True, "Suspended", "spec.suspend is true", generation, now)
        set_condition(new, "Running", False, "Suspended", "suspended", generation, now)
        new["workers"] = {"ready": 0, "desired": 0}
        return plan
    if phase == "Suspended":
        set_condition(new, "Suspended", False, "Resumed", "spec.suspend is false", generation, now)
        transition(
            "Pending", "Resumed", "resumed: recreating the cluster from the latest checkpoint"
        )
        phase = "Pending"

    # -- stale pods of earlier attempts --------------------------------------------------------
    stale = [p for p in pods if _attempt(p) is not None and _attempt(p) != attempt]
    for pod in stale:
        if not (pod.get("metadata") or {}).get("deletionTimestamp"):
            plan.delete.append(("Pod", _name(pod)))
    current = [p for p in pods if p not in stale]
    by_role: dict[str, list[dict[str, Any]]] = {}
    for pod in current:
        by_role.setdefault(_role(pod) or "", []).append(pod)

    def fail(reason: str, message: str) -> Plan:
        transition("Failed", reason, message, "Warning")
        new["completionTime"] = _ts(now)
        set_condition(new, "Failed", True, reason, message, generation, now)
        set_condition(new, "Running", False, reason, message, generation, now)
        delete_pods(keep_driver=True)
        return plan

    def restart(reason: str, message: str) -> Plan:
        max_restarts = spec.failure.max_restarts
        if attempt >= max_restarts:
            return fail(reason, f"{message}; maxRestarts={max_restarts} exhausted")
        new["restarts"] = attempt + 1
        message = f"{message}; restart {attempt + 1} of {max_restarts} from the latest checkpoint"
        transition("Restarting", reason, message, "Warning")
        set_condition(new, "Restarting", True, reason, message, generation, now)
        delete_pods(keep_driver=False)
        plan.requeue_after = 1.0
        return plan

    # -- the driver decides success ------------------------------------------------------------
    drivers = by_role.get("driver", [])
    for driver in drivers:
        if pod_phase(driver) == "Succeeded":
            transition("Succeeded", "Succeeded", "training finished")
            new["completionTime"] = _ts(now)
            set_condition(
                new, "Succeeded", True, "DriverSucceeded", "training finished", generation, now
            )
            set_condition(new, "Running", False, "Succeeded", "training finished", generation, now)
            delete_pods(keep_driver=True)
            return plan
        if pod_phase(driver) == "Failed":
            return restart("DriverFailed", f"driver pod {_name(driver)} failed")
    for head in by_role.get("head", []):
        if pod_phase(head) in ("Failed", "Succeeded"):
            return restart("HeadFailed", f"Ray head pod {_name(head)} exited")
    if phase == "Running" and (not by_role.get("head") or not drivers):
        return restart("HeadOrDriverLost", "the Ray head or driver pod disappeared")

    # -- deadlines -----------------------------------------------------------------------------
    started = _parse_ts(new.get("startTime"))
    if (
        spec.failure.active_deadline_seconds is not None
        and started is not None
        and (now - started).total_seconds() > spec.failure.active_deadline_seconds
    ):
        return fail(
            "DeadlineExceeded",
            f"activeDeadlineSeconds={spec.failure.active_deadline_seconds} exceeded",
        )
    created = _parse_ts(
        next(
            (c["lastTransitionTime"] for c in new.get("conditions", []) if c["type"] == "Created"),
            None,
        )
    )
    startup = spec.failure.startup_deadline_seconds
    if (
        startup is not None
        and started is None
        and created is not None
        and (now - created).total_seconds() > startup
    ):
        return fail(
            "StartupDeadlineExceeded", f"not Running within startupDeadlineSeconds={startup}"
        )

    # -- converge children: create missing, replace failed workers (same name) ---------------
    desired_pods = {_name(d) for d in desired if d.get("kind") == "Pod"}
    for obj in observed:
        if obj.get("kind") == "Pod" and obj in current and _name(obj) not in desired_pods:
            plan.delete.append(("Pod", _name(obj)))  # e.g. validation pool scaled down
    for pod in current:
        if _role(pod) in ("worker", "validation") and pod_phase(pod) in ("Failed", "Succeeded"):
            plan.delete.append(("Pod", _name(pod)))
            plan.events.append(
                Event(
                    "Warning",
                    "WorkerPodLost",
                    f"pod {_name(pod)} {pod_phase(pod).lower()}; recreating it",
                )
            )
    desired_hash = {_name(d): _spec_hash(d) for d in desired if d.get("kind") == "Pod"}
    for pod in current:
        want = desired_hash.get(_name(pod))
        if (
            want is not None
            and _spec_hash(pod) not in (None, want)
            and (("Pod", _name(pod)) not in plan.delete)
        ):
            # The spec changed (image, resources, env...): replace the pod; the runtime
            # resumes the workers from the latest checkpoint.
            plan.delete.append(("Pod", _name(pod)))
            plan.events.append(
                Event("Normal", "SpecChanged", f"pod {_name(pod)} replaced to apply the new spec")
            )
    deleting = {name for kind, name in plan.delete if kind == "Pod"}
    for obj in desired:
        key = (str(obj.get("kind")), _name(obj))
        if key not in existing_keys:
            plan.create.append(obj)
        elif key[0] == "Pod" and key[1] in deleting:
            plan.requeue_after = 1.0  # recreated once the old pod is gone

    # -- status ----------------------------------------------------------------------------
    desired_workers = sum(1 for d in desired if _role(d) == "worker")
    ready_workers = sum(
        1 for p in by_role.get("worker", []) if pod_ready(p) and _name(p) not in deleting
    )
    new["workers"] = {"ready": ready_workers, "desired": desired_workers}
    new["validationPool"] = {"replicas": sum(1 for d in desired if _role(d) == "validation")}
    cluster_ready = (
        bool(by_role.get("head"))
        and all(pod_ready(p) for p in by_role.get("head", []))
        and ready_workers == desired_workers
        and bool(drivers)
        and pod_phase(drivers[0]) == "Running"
    )
    if cluster_ready:
        if new.get("phase") != "Running":
            new.setdefault("startTime", _ts(now))
        transition("Running", "Running", f"{ready_workers}/{desired_workers} workers ready")
        set_condition(
            new,
            "Running",
            True,
            "ClusterReady",
            "head, workers and driver running",
            generation,
            now,
        )
        set_condition(new, "Restarting", False, "Running", "running", generation, now)
    elif new.get("phase") == "Running":
        transition(
            "Running",
            "Running",
            f"{ready_workers}/{desired_workers} workers ready; replacing lost workers",
        )
    else:
        transition(
            "Starting",
            "Starting",
            f"waiting for pods: {ready_workers}/{desired_workers} workers ready",
        )
    if plan.requeue_after is None:
        plan.requeue_after = 10.0
    return plan
