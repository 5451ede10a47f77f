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

#: The driver's exit status for invalid input (its own validation of the TrainJob failed):
#: no restart can fix it, so the job fails at once (``trainjob_operator.driver_main``).
INVALID_INPUT_EXIT_CODE = 2
#: How much of a container's termination message goes into conditions and Events.
TERMINATION_MESSAGE_LIMIT = 1024


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
    #: seconds after which the operator should reconcile again even if nothing changes (a
    #: deadline, the TTL, a pod being replaced); None: only on changes and periodic resync.
    requeue_after: float | None = None

    def requeue_at_most(self, seconds: float) -> None:
        """Ask to be reconciled again within ``seconds`` (the earliest request wins)."""
        seconds = max(0.0, seconds)
        if self.requeue_after is None or seconds < self.requeue_after:
            self.requeue_after = seconds


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


@dataclass(frozen=True)
class Termination:
    """How a pod's container ended (``status.containerStatuses[].state.terminated``)."""

    container: str
    exit_code: int | None
    reason: str | None
    message: str | None

    def describe(self) -> str:
        """``container 'driver' OOMKilled, exit code 137: <message tail>`` (message <= 1 KiB)."""
        parts = [f"container {self.container!r}"]
        if self.reason:
            parts.append(f" {self.reason}")
        if self.exit_code is not None:
            parts.append(f"{',' if self.reason else ''} exit code {self.exit_code}")
        text = "".join(parts)
        message = (self.message or "").strip()
        if message:
            if len(message) > TERMINATION_MESSAGE_LIMIT:
                message = "..." + message[-TERMINATION_MESSAGE_LIMIT:]  # the log tail matters
            text += f": {message}"
        return text


def container_termination(pod: dict[str, Any], container: str | None = None) -> Termination | None:
    """The terminated state of ``container`` (or of the first terminated container) of a pod.

    Reads ``state.terminated`` (else ``lastState.terminated``) of
    ``status.containerStatuses``: exit code, reason (e.g. ``OOMKilled``, ``Error``) and the
    termination message (with ``terminationMessagePolicy: FallbackToLogsOnError``, the tail of
    the container's log when it wrote no message). None when no such container terminated.
    """
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    for status in statuses:
        if container is not None and status.get("name") != container:
            continue
        terminated = (status.get("state") or {}).get("terminated") or (
            status.get("lastState") or {}
        ).get("terminated")
        if not terminated:
            continue
        code = terminated.get("exitCode")
        return Termination(
            container=str(status.get("name") or ""),
            exit_code=int(code) if code is not None else None,
            reason=terminated.get("reason") or None,
            message=terminated.get("message") or None,
        )
    return None


def _pod_ended(pod: dict[str, Any], container: str | None = None) -> str:
    """``pod <name> failed`` plus how its container ended, when the pod status says."""
    text = f"pod {_name(pod)} {pod_phase(pod).lower()}"
    term = container_termination(pod, container)
    return f"{text} ({term.describe()})" if term is not None else text


def keep_driver_pod(policy: str, phase: str) -> bool:
    """Whether a finished job (``phase`` Succeeded or Failed) keeps its driver pod for its logs.

    ``spec.keepDriverPod``: ``Always`` keeps it, ``OnFailure`` only when the job failed,
    ``Never`` deletes it with the rest of the cluster.
    """
    if policy == "Always":
        return True
    if policy == "OnFailure":
        return phase == "Failed"
    return False


def _condition_true(status: dict[str, Any], type_: str) -> bool:
    return any(
        c.get("type") == type_ and c.get("status") == "True" for c in status.get("conditions", [])
    )


def mark_failed(
    plan: Plan, reason: str, message: str, generation: int | None, now: dt.datetime
) -> Plan:
    """Make ``plan`` a terminal failure: phase Failed, completionTime, conditions, one Event.

    Only the status and events change; the next reconcile (phase Failed) tears the pods down
    (keeping the driver per ``spec.keepDriverPod``). Used by the planner and by the apply layer
    (a child the API server rejects).
    """
    status = plan.status
    if status.get("phase") != "Failed":
        plan.events.append(Event("Warning", reason, message))
    status["phase"] = "Failed"
    status["message"] = message
    status["completionTime"] = _ts(now)
    set_condition(status, "Failed", True, reason, message, generation, now)
    set_condition(status, "Running", False, reason, message, generation, now)
    return plan


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

    Demand is ``status.validations.pending + running`` (published by the driver). Rules:

    - scale up at once to the demand, capped by ``pool.maxReplicas`` and by
      ``validation.maxConcurrent`` (more pods than concurrent validations would sit idle);
    - never scale down while any validation is pending or running: pods are numbered and a
      scale-down deletes the highest numbers, which may be the ones still validating;
    - after ``pool.idleSeconds`` without demand, go to ``pool.minReplicas``.

    The pool never exceeds ``maxReplicas`` (a lowered ``maxReplicas`` applies at once) and is
    never below ``minReplicas``. The timestamp is stored in the TrainJob's
    ``trainjob.dev/validation-last-demand`` annotation by the caller.
    """
    validation = job.spec.validation
    if validation is None:
        return 0, None
    pool = validation.pool
    counts = status.get("validations") or {}
    demand = int(counts.get("pending") or 0) + int(counts.get("running") or 0)
    current = int((status.get("validationPool") or {}).get("replicas") or 0)
    last = _parse_ts(annotations.get(LAST_DEMAND_ANNOTATION))
    wanted = min(pool.max_replicas, validation.max_concurrent, demand)

    def bounded(replicas: int) -> int:
        return min(pool.max_replicas, max(pool.min_replicas, replicas))

    if demand > 0:
        return bounded(max(current, wanted)), _ts(now)
    stamp = annotations.get(LAST_DEMAND_ANNOTATION)
    if last is not None and (now - last).total_seconds() < pool.idle_seconds:
        return bounded(current), stamp
    return bounded(pool.min_replicas), stamp


def validation_scale_down_in(
    job: TrainJob, status: dict[str, Any], annotations: dict[str, str], now: dt.datetime
) -> float | None:
    """Seconds until :func:`validation_replicas` would shrink an idle pool to
    ``pool.minReplicas`` (None when no scale-down is waiting)."""
    validation = job.spec.validation
    if validation is None:
        return None
    counts = status.get("validations") or {}
    if int(counts.get("pending") or 0) + int(counts.get("running") or 0) > 0:
        return None
    current = int((status.get("validationPool") or {}).get("replicas") or 0)
    last = _parse_ts(annotations.get(LAST_DEMAND_ANNOTATION))
    if current <= validation.pool.min_replicas or last is None:
        return None
    return max(0.0, validation.pool.idle_seconds - (now - last).total_seconds())


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
        """Delete the job's pods (those not already terminating), optionally not the driver."""
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
        delete_pods(keep_driver=keep_driver_pod(spec.keep_driver_pod, phase))
        ttl = spec.ttl_seconds_after_finished
        done_at = _parse_ts(new.get("completionTime"))
        if ttl is not None and done_at is not None:
            remaining = (done_at + dt.timedelta(seconds=ttl) - now).total_seconds()
            if remaining <= 0:
                plan.delete_trainjob = True
                plan.events.append(Event("Normal", "TTLExpired", f"deleted {ttl}s after finishing"))
            else:
                plan.requeue_at_most(remaining)
        return plan

    # -- suspend ------------------------------------------------------------------------------
    if spec.suspend:
        delete_pods(keep_driver=False)
        transition("Suspended", "Suspended", "suspended: cluster torn down, checkpoints kept")
        set_condition(new, "Suspended", True, "Suspended", "spec.suspend is true", generation, now)
        set_condition(new, "Running", False, "Suspended", "suspended", generation, now)
        new["workers"] = {"ready": 0, "desired": 0}
        if new.get("startTime"):
            # Suspended time does not count towards activeDeadlineSeconds: startTime is set
            # again when the resumed job's pods are created (Kubernetes Job semantics).
            new["startTime"] = None
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
        mark_failed(plan, reason, message, generation, now)
        delete_pods(keep_driver=keep_driver_pod(spec.keep_driver_pod, "Failed"))
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
        plan.requeue_at_most(1.0)
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
            delete_pods(keep_driver=keep_driver_pod(spec.keep_driver_pod, "Succeeded"))
            return plan
        if pod_phase(driver) == "Failed":
            term = container_termination(driver, "driver")
            if term is not None and term.exit_code == INVALID_INPUT_EXIT_CODE:
                # The driver's own validation of the TrainJob failed: a restart runs the same
                # input again, so fail at once with what the driver said.
                return fail("InvalidInput", f"driver {_pod_ended(driver, 'driver')}")
            return restart("DriverFailed", f"driver {_pod_ended(driver, 'driver')}")
    for head in by_role.get("head", []):
        if pod_phase(head) in ("Failed", "Succeeded"):
            return restart("HeadFailed", f"Ray head {_pod_ended(head)}")
    if phase == "Running" and (not by_role.get("head") or not drivers):
        return restart("HeadOrDriverLost", "the Ray head or driver pod disappeared")

    # -- deadlines -----------------------------------------------------------------------------
    # startTime: when this run's pods were first created (reset by suspend/resume), as for a
    # Kubernetes Job; both deadlines count from it, so a job stuck in Starting hits them too.
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
    startup = spec.failure.startup_deadline_seconds
    if (
        startup is not None
        and started is not None
        and not _condition_true(new, "Running")
        and (now - started).total_seconds() > startup
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
                Event("Warning", "WorkerPodLost", f"{_pod_ended(pod)}; recreating it")
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
            plan.requeue_at_most(1.0)  # recreated once the old pod is gone
    if not new.get("startTime") and any(d.get("kind") == "Pod" for d in desired):
        new["startTime"] = _ts(now)  # the pods of this run are created now

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
    # Be called back when a deadline would pass (the operator otherwise only resyncs).
    started = _parse_ts(new.get("startTime"))
    if started is not None:
        for limit in (
            spec.failure.active_deadline_seconds,
            None if _condition_true(new, "Running") else startup,
        ):
            if limit is not None:
                plan.requeue_at_most((started - now).total_seconds() + limit + 1.0)
    return plan
