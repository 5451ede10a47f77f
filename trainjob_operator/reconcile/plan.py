"""Pure reconcile planning: (TrainJob, status, children, now) -> :class:`Plan`.

Nothing here does I/O. The operator reads the TrainJob and its children, calls
:func:`plan_trainjob` and executes the returned :class:`Plan`
(:mod:`trainjob_operator.reconcile.apply`). Every decision is derived from what exists now
(level-based), so a restarted operator makes the same decisions and never duplicates children.

The state machine (``status.phase``, :class:`~trainjob_operator.api.status.Phase`)::

    Pending -> Starting -> Running -> Succeeded | Failed
    Pending, Starting, Running, Restarting -> Restarting   (head or driver failed; maxRestarts)
    Restarting -> Starting                                  (the next attempt's pods)
    Pending, Starting, Running, Restarting -> Suspended -> Pending   (spec.suspend)
    Pending, Starting, Running, Restarting -> Failed        (deadlines, invalid input or child)

Structure, after KubeRay's ``rayjob_controller.go``:

- :func:`plan_trainjob` is one reconcile's whole decision: the validation pool size
  (:func:`plan_validation_pool`), the children rendered for it, :func:`plan_reconcile`, and
  the pool's annotation and callback. A spec that cannot be parsed or rendered fails the job
  (:func:`plan_invalid_spec`).
- :func:`plan_reconcile` copies the status into a typed working status
  (:class:`~trainjob_operator.api.status.TrainJobStatus`, held by the :class:`Plan`) and
  dispatches on its phase to one function per phase (:data:`PHASE_HANDLERS`). Each is a
  sequence of small ``check_..._if_needed`` steps that look at one thing (the TTL, suspend,
  the driver, the head, lost pods, deadlines, failed workers, changed pods, the validation
  pool) and update the status and the plan if needed; a step that ends the reconcile (a
  failure, a restart, suspending) returns True.
- The :class:`Plan` holds every decision: children to create and delete, the new status
  (written once, and only when the operator's keys changed: :meth:`Plan.status_patch`),
  annotations to patch, Events, deleting the TrainJob and when to be called back. The apply
  layer only executes it; what it reports back (a child the API server rejected) the plan
  turns into a failure itself (:meth:`Plan.fail_rejected_child`).

The driver owns ``progress``, checkpoints, ``validations`` and ``workerFailures``; the
operator owns the keys in :data:`OPERATOR_STATUS_KEYS`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from pydantic import ValidationError

from trainjob_operator.api.spec import (
    DEFAULT_FAILURE_RULES,
    FailureRule,
    FailureRuleAction,
)
from trainjob_operator.api.status import (
    ConditionType,
    DashboardStatus,
    Phase,
    Reason,
    RestartRecord,
    TrainJobStatus,
    ValidationPoolStatus,
    WorkersStatus,
)
from trainjob_operator.api.trainjob import TrainJob
from trainjob_operator.constants import (
    ATTEMPT_LABEL,
    DRIVER_INVALID_INPUT_EXIT_CODE,
    LAST_DEMAND_ANNOTATION,
    ROLE_LABEL,
    SLICE_LABEL,
    SPEC_GENERATION_ANNOTATION,
    SPEC_HASH_ANNOTATION,
    format_time,
    parse_time,
)
from trainjob_operator.reconcile.transitions import check_transition

#: status keys the operator owns (and writes); the driver owns the others (progress,
#: checkpoints, validations, workerFailures).
OPERATOR_STATUS_KEYS = (
    "phase",
    "conditions",
    "observedGeneration",
    "startTime",
    "completionTime",
    "restarts",
    "ignoredRestarts",
    "nextAttemptTime",
    "restartHistory",
    "workers",
    "validationPool",
    "dashboard",
    "message",
)

#: status keys the driver publishes for people and dashboards that no plan reads (the plan
#: sizes the validation pool from the driver's ``validations``, which is not among them): a
#: change of these alone is no reason to reconcile. A running driver updates ``progress``
#: every few seconds; without this every running TrainJob was reconciled at every timer tick
#: (issue 20). ``tests/reconcile`` checks that changing them changes no plan.
UNPLANNED_STATUS_KEYS = ("progress", "latestCheckpoint", "bestCheckpoint", "workerFailures")

#: The driver's exit status for invalid input (its own validation of the TrainJob failed):
#: no restart can fix it, so the job fails at once (``trainjob_operator.launcher.driver``).
INVALID_INPUT_EXIT_CODE = DRIVER_INVALID_INPUT_EXIT_CODE
#: The pod condition Kubernetes (1.26+) sets on a pod it is about to delete because of a
#: preemption, an eviction (drain, API-initiated), a taint or its node going away.
DISRUPTION_TARGET = "DisruptionTarget"
#: Pod ``status.reason`` values that mean the same on clusters that set no DisruptionTarget
#: condition: evicted by the kubelet, preempted by the scheduler, node lost, graceful node
#: shutdown (``Terminated``/``Shutdown``/``NodeShutdown``).
DISRUPTION_POD_REASONS = frozenset(
    {"Evicted", "Preempting", "NodeLost", "Shutdown", "NodeShutdown", "Terminated"}
)
#: How much of a container's termination message goes into conditions and Events.
TERMINATION_MESSAGE_LIMIT = 1024
#: Longest message of a spec that cannot be parsed or rendered (``InvalidSpec``).
INVALID_SPEC_MESSAGE_LIMIT = 2000
#: Longest ``StartupDeadlineExceeded`` message (with the scheduler's or the kubelet's causes).
STARTUP_MESSAGE_LIMIT = 2000

#: (job, uid, attempt, validation replicas) -> desired child manifests (pure).
Renderer = Callable[[TrainJob, str, int, int], list[dict[str, Any]]]
#: A TrainJob status: the typed model, or its camelCase dict as read from the API.
StatusInput = TrainJobStatus | Mapping[str, Any]


class PodPhase(StrEnum):
    """``status.phase`` of a Kubernetes Pod."""

    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    UNKNOWN = "Unknown"


class EventType(StrEnum):
    """``type`` of a Kubernetes Event."""

    NORMAL = "Normal"
    WARNING = "Warning"


@dataclass
class Event:
    """A Kubernetes Event to post on the TrainJob."""

    type: str  # EventType
    reason: str  # Reason
    message: str


# --------------------------------------------------------------------------- the plan


def _status_dict(status: TrainJobStatus) -> dict[str, Any]:
    """camelCase dict of the status: the keys read, plus every key set while planning."""
    return status.model_dump(mode="json", by_alias=True, exclude_unset=True)


def _operator_keys(status: Mapping[str, Any]) -> dict[str, Any]:
    return {k: status[k] for k in OPERATOR_STATUS_KEYS if k in status}


@dataclass
class Plan:
    """What the operator should do now: every decision of one reconcile."""

    #: the TrainJob's status after this reconcile (typed; :attr:`status` is its dict form).
    new_status: TrainJobStatus
    #: the operator-owned status keys as read (what :meth:`status_patch` compares with).
    observed_status: dict[str, Any] = field(default_factory=dict)
    create: list[dict[str, Any]] = field(default_factory=list)
    delete: list[tuple[str, str]] = field(default_factory=list)  # (kind, name)
    events: list[Event] = field(default_factory=list)
    #: merged into the TrainJob's ``metadata.annotations`` (empty: no annotation patch).
    annotations: dict[str, str] = field(default_factory=dict)
    delete_trainjob: bool = False
    #: seconds after which the operator should reconcile again even if nothing changes (a
    #: deadline, the TTL, a pod being replaced); None: only on changes and periodic resync.
    requeue_after: float | None = None
    #: the TrainJob as this reconcile left it (set once the plan was carried out).
    trainjob_after: dict[str, Any] | None = None
    #: what the operator's timer compares the next watch events with (set with
    #: ``trainjob_after``; see
    #: :func:`~trainjob_operator.reconcile.fingerprint.fingerprint_after_writes`).
    fingerprint_after: str | None = None
    #: the TrainJob's ``metadata.generation`` this plan was made from (set with
    #: ``trainjob_after``; a spec change after it asks for another reconcile).
    generation_read: int | None = None

    @property
    def status(self) -> dict[str, Any]:
        """The new status as a camelCase dict: the keys read plus those set while planning
        (a key set to None, e.g. ``startTime`` while suspended, is removed by a merge patch)."""
        return _status_dict(self.new_status)

    def status_patch(self) -> dict[str, Any] | None:
        """The operator-owned status keys to write, or None when they did not change."""
        patch = _operator_keys(self.status)
        return None if patch == self.observed_status else patch

    def requeue_at_most(self, seconds: float) -> None:
        """Ask to be reconciled again within ``seconds`` (the earliest request wins)."""
        seconds = max(0.0, seconds)
        if self.requeue_after is None or seconds < self.requeue_after:
            self.requeue_after = seconds

    def fail(self, reason: str, message: str, generation: int | None, now: dt.datetime) -> None:
        """Make this plan a terminal failure: phase Failed, completionTime, conditions, an
        Event (only when the job was not Failed already).

        Only the status and events change; the next reconcile (phase Failed) tears the pods
        down (keeping the driver per ``spec.keepDriverPod``).
        """
        status = self.new_status
        check_transition(status.phase, Phase.FAILED)
        if status.phase != Phase.FAILED:
            self.events.append(Event(EventType.WARNING, reason, message))
        status.phase = Phase.FAILED
        status.message = message
        status.completion_time = _seconds(now)
        status.set_condition(ConditionType.FAILED, True, reason, message, generation, now)
        status.set_condition(ConditionType.RUNNING, False, reason, message, generation, now)

    def fail_rejected_child(
        self, manifest: dict[str, Any], body: dict[str, Any], now: dt.datetime
    ) -> None:
        """The API server rejected ``manifest`` as invalid (422, Status ``body``): the same
        spec renders the same child, so no retry can succeed; fail the job (``InvalidChild``)."""
        self.fail(
            Reason.INVALID_CHILD,
            invalid_child_message(manifest, body),
            self.new_status.observed_generation,
            now,
        )


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


# --------------------------------------------------------------------------- small helpers


def _seconds(now: dt.datetime) -> dt.datetime:
    """``now`` in UTC, whole seconds (as status times are written)."""
    return now.astimezone(dt.UTC).replace(microsecond=0)


def _ts(now: dt.datetime) -> str:
    return format_time(now)


def _parse_ts(value: Any) -> dt.datetime | None:
    if not value:
        return None
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    return parse_time(str(value))


def _read_status(status: StatusInput | None) -> TrainJobStatus:
    """``status`` typed, to read (the model itself when given one)."""
    if isinstance(status, TrainJobStatus):
        return status
    return TrainJobStatus.model_validate(dict(status or {}))


def _as_status(status: StatusInput | None) -> TrainJobStatus:
    """A private, typed copy of ``status`` (its set fields are the keys it had)."""
    if isinstance(status, TrainJobStatus):
        return status.model_copy(deep=True)
    return TrainJobStatus.model_validate(dict(status or {}))


def pod_phase(pod: dict[str, Any]) -> str:
    """``status.phase`` of a pod (Pending when unset)."""
    return str((pod.get("status") or {}).get("phase") or PodPhase.PENDING)


def pod_ready(pod: dict[str, Any]) -> bool:
    """Running with the Ready condition True."""
    if pod_phase(pod) != PodPhase.RUNNING:
        return False
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _pod_done(pod: dict[str, Any]) -> bool:
    return pod_phase(pod) in (PodPhase.FAILED, PodPhase.SUCCEEDED)


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


def _terminating(obj: dict[str, Any]) -> bool:
    return bool((obj.get("metadata") or {}).get("deletionTimestamp"))


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


def _terminations(pod: dict[str, Any], container: str | None) -> list[Termination]:
    """How every terminated container of a pod (or only ``container``) ended."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    names = [str(s.get("name") or "") for s in statuses]
    found = [container_termination(pod, name) for name in names if container in (None, name)]
    return [t for t in found if t is not None]


def pod_conditions(pod: dict[str, Any]) -> dict[str, str]:
    """A pod's conditions (type -> status). A pod whose ``status.reason`` is one of
    :data:`DISRUPTION_POD_REASONS` counts as having ``DisruptionTarget`` True (clusters
    before Kubernetes 1.26 set only the reason)."""
    status = pod.get("status") or {}
    found = {str(c.get("type")): str(c.get("status")) for c in status.get("conditions") or []}
    if status.get("reason") in DISRUPTION_POD_REASONS:
        found[DISRUPTION_TARGET] = "True"
    return found


def pod_disrupted(pod: dict[str, Any]) -> bool:
    """Whether Kubernetes took the pod away (preemption, eviction, drain, node gone)."""
    return pod_conditions(pod).get(DISRUPTION_TARGET) == "True"


def failure_rule_matches(rule: FailureRule, pod: dict[str, Any]) -> bool:
    """Whether ``rule`` matches a failed or disrupted pod.

    ``onExitCodes``: some terminated container (the named one only, when given) exited with
    a code In (or NotIn, and not 0) the values. ``onPodConditions``: the pod has one of the
    conditions with that status (see :func:`pod_conditions`).
    """
    if rule.on_exit_codes is not None:
        match = rule.on_exit_codes
        codes = [
            t.exit_code for t in _terminations(pod, match.container_name) if t.exit_code is not None
        ]
        if match.operator == "In":
            return any(code in match.values for code in codes)
        return any(code != 0 and code not in match.values for code in codes)
    conditions = pod_conditions(pod)
    return any(conditions.get(c.type) == c.status for c in rule.on_pod_conditions)


@dataclass(frozen=True)
class FailureDecision:
    """What :func:`decide_pod_failure` found for a failed or disrupted head or driver pod."""

    action: FailureRuleAction
    #: which rule decided: ``failure.rules[i]``, ``default rule i`` or ``no rule matched``.
    rule: str
    #: the index in :data:`DEFAULT_FAILURE_RULES` when a default rule decided.
    default_index: int | None = None


def decide_pod_failure(pod: dict[str, Any], rules: list[FailureRule]) -> FailureDecision:
    """The first rule of ``failure.rules`` then :data:`DEFAULT_FAILURE_RULES` that matches
    ``pod`` decides; ``Count`` when none does."""
    for index, rule in enumerate(rules):
        if failure_rule_matches(rule, pod):
            return FailureDecision(FailureRuleAction(rule.action), f"failure.rules[{index}]")
    for index, rule in enumerate(DEFAULT_FAILURE_RULES):
        if failure_rule_matches(rule, pod):
            return FailureDecision(FailureRuleAction(rule.action), f"default rule {index}", index)
    return FailureDecision(FailureRuleAction.COUNT, "no rule matched")


def keep_driver_pod(policy: str, phase: str) -> bool:
    """Whether a finished job (``phase`` Succeeded or Failed) keeps its driver pod for its logs.

    ``spec.keepDriverPod``: ``Always`` keeps it, ``OnFailure`` only when the job failed,
    ``Never`` deletes it with the rest of the cluster.
    """
    if policy == "Always":
        return True
    if policy == "OnFailure":
        return phase == Phase.FAILED
    return False


# --------------------------------------------------------------------------- validation pool


def _validation_demand(status: TrainJobStatus) -> int:
    counts = status.validations
    return (counts.pending + counts.running) if counts is not None else 0


def _pool_replicas(status: TrainJobStatus) -> int:
    return status.validation_pool.replicas if status.validation_pool is not None else 0


def validation_replicas(
    job: TrainJob, status: StatusInput, annotations: Mapping[str, str], now: dt.datetime
) -> tuple[int, str | None]:
    """Validation pool size from the driver's demand, and the new last-demand timestamp.

    Demand is ``status.validations.pending + running`` (published by the driver). Rules:

    - scale up at once to the demand, capped by ``pool.maxReplicas`` and by
      ``validation.maxConcurrent`` (more pods than concurrent validations would sit idle);
    - never scale down while any validation is pending or running: pods are numbered and a
      scale-down deletes the highest numbers, which may be the ones still validating;
    - after ``pool.idleSeconds`` without demand, go to ``pool.minReplicas``.

    The pool never exceeds ``maxReplicas`` (a lowered ``maxReplicas`` applies at once) and is
    never below ``minReplicas``. The timestamp is kept in the TrainJob's
    ``trainjob.dev/validation-last-demand`` annotation (:func:`check_validation_pool_if_needed`).
    """
    validation = job.spec.validation
    if validation is None:
        return 0, None
    typed = _read_status(status)
    pool = validation.pool
    demand = _validation_demand(typed)
    current = _pool_replicas(typed)
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
    job: TrainJob, status: StatusInput, annotations: Mapping[str, str], now: dt.datetime
) -> float | None:
    """Seconds until :func:`validation_replicas` would shrink an idle pool to
    ``pool.minReplicas`` (None when no scale-down is waiting)."""
    validation = job.spec.validation
    if validation is None:
        return None
    typed = _read_status(status)
    if _validation_demand(typed) > 0:
        return None
    last = _parse_ts(annotations.get(LAST_DEMAND_ANNOTATION))
    if _pool_replicas(typed) <= validation.pool.min_replicas or last is None:
        return None
    return max(0.0, validation.pool.idle_seconds - (now - last).total_seconds())


@dataclass(frozen=True)
class PoolSize:
    """The validation pool decision of one reconcile (:func:`plan_validation_pool`)."""

    #: validation pods to render.
    replicas: int
    #: the ``trainjob.dev/validation-last-demand`` annotation's new value (None: leave it).
    last_demand: str | None
    #: seconds until an idle pool shrinks to ``minReplicas`` (None: none waiting).
    scale_down_in: float | None


def plan_validation_pool(
    job: TrainJob, status: StatusInput, annotations: Mapping[str, str], now: dt.datetime
) -> PoolSize:
    """Size the validation pool (:func:`validation_replicas`) and say when it shrinks next."""
    typed = _read_status(status)
    replicas, stamp = validation_replicas(job, typed, annotations, now)
    return PoolSize(replicas, stamp, validation_scale_down_in(job, typed, annotations, now))


def check_validation_pool_if_needed(
    plan: Plan, pool: PoolSize, annotations: Mapping[str, str]
) -> None:
    """Store a new last-demand time in the annotation, and be called back when an idle pool
    is due to shrink; both only while the job's cluster exists (the plan's phase is an active
    one). A finished or suspended job has no pool left to size: its status keeps the last
    ``validationPool.replicas`` (and maybe the driver's last demand), so a callback or a new
    timestamp there would come back on every reconcile."""
    phase = plan.new_status.phase
    if phase is not None and (phase.finished or phase == Phase.SUSPENDED):
        return
    if pool.scale_down_in is not None:
        plan.requeue_at_most(pool.scale_down_in + 1.0)
    if pool.last_demand and pool.last_demand != annotations.get(LAST_DEMAND_ANNOTATION):
        plan.annotations[LAST_DEMAND_ANNOTATION] = pool.last_demand


# --------------------------------------------------------------------------- one reconcile


@dataclass
class Reconcile:
    """One reconcile in the making: its inputs, and the plan the steps fill in.

    ``attempt`` is ``status.restarts`` as read: pods labelled with another attempt are stale
    (:attr:`stale_pods`); the others are this attempt's (:attr:`current_pods`).
    """

    job: TrainJob
    observed: list[dict[str, Any]]
    desired: list[dict[str, Any]]
    now: dt.datetime
    generation: int | None
    plan: Plan
    #: ``status.observedGeneration`` as read: the generation the last reconcile planned for.
    previous_generation: int | None = None
    attempt: int = field(init=False)
    pods: list[dict[str, Any]] = field(init=False)
    stale_pods: list[dict[str, Any]] = field(init=False)
    current_pods: list[dict[str, Any]] = field(init=False)
    by_role: dict[str, list[dict[str, Any]]] = field(init=False)

    def __post_init__(self) -> None:
        self.attempt = self.status.restarts
        self.pods = [o for o in self.observed if o.get("kind") == "Pod"]
        self.stale_pods = [
            p for p in self.pods if _attempt(p) is not None and _attempt(p) != self.attempt
        ]
        self.current_pods = [p for p in self.pods if p not in self.stale_pods]
        self.by_role = {}
        for pod in self.current_pods:
            self.by_role.setdefault(_role(pod) or "", []).append(pod)

    @classmethod
    def start(
        cls,
        job: TrainJob,
        status: StatusInput | None,
        observed: list[dict[str, Any]],
        desired: list[dict[str, Any]],
        now: dt.datetime,
        generation: int | None = None,
    ) -> Reconcile:
        """The working state for planning ``job``: a plan on a typed copy of ``status``, with
        ``observedGeneration`` and ``restarts`` set (both are always written)."""
        new = _as_status(status)
        plan = Plan(new_status=new, observed_status=_operator_keys(_status_dict(new)))
        new.restarts = new.restarts  # 0 for a new job
        previous = new.observed_generation
        new.observed_generation = generation
        return cls(job, observed, desired, now, generation, plan, previous)

    @property
    def status(self) -> TrainJobStatus:
        """The working status (the plan's new status)."""
        return self.plan.new_status

    @property
    def phase(self) -> Phase:
        """The working phase (Pending for a new job)."""
        return self.status.phase or Phase.PENDING

    # -- building blocks of the steps -------------------------------------------------------

    def set_phase(
        self, to: Phase, reason: str, message: str, event_type: str = EventType.NORMAL
    ) -> None:
        """Move to phase ``to`` with ``message``; an Event when the phase changes.

        A new TrainJob's first phase goes into its Created Event ("TrainJob accepted;
        Starting: waiting for pods: ...") rather than an Event of its own: each Event is a
        write to the API server, and a burst of new TrainJobs pays it for every one.

        Raises:
            UndeclaredTransition: the move is not in :data:`PHASE_TRANSITIONS`.
        """
        check_transition(self.status.phase, to)
        if self.status.phase != to:
            events = self.plan.events
            if events and events[-1].reason == Reason.CREATED and event_type == EventType.NORMAL:
                accepted = events[-1].message
                events[-1] = Event(EventType.NORMAL, Reason.CREATED, f"{accepted}; {to}: {message}")
            else:
                events.append(Event(event_type, reason, message))
        self.status.phase = to
        self.status.message = message

    def set_condition(self, type_: str, true: bool, reason: str, message: str) -> None:
        """Set one condition of the working status."""
        self.status.set_condition(type_, true, reason, message, self.generation, self.now)

    def delete_pods(self, keep_driver: bool) -> None:
        """Delete the job's pods (those not already terminating), optionally not the driver."""
        for pod in self.pods:
            if keep_driver and _role(pod) == "driver":
                continue
            if _terminating(pod):
                continue
            self.plan.delete.append(("Pod", _name(pod)))

    def fail(self, reason: str, message: str) -> bool:
        """Fail the job now and tear its pods down (the driver per ``spec.keepDriverPod``)."""
        self.plan.fail(reason, message, self.generation, self.now)
        self.delete_pods(keep_driver=keep_driver_pod(self.job.spec.keep_driver_pod, Phase.FAILED))
        return True

    def restart(self, reason: str, message: str, counted: bool = True) -> bool:
        """Restart the whole cluster from the latest checkpoint (the next attempt), or fail
        when ``failure.maxRestarts`` is used up.

        A counted restart waits ``failure.restartBackoff`` (doubling with each counted
        restart) before the next attempt's pods are created (``status.nextAttemptTime``); one
        not counted (``counted=False``: a disruption, an ``Ignore`` rule) neither uses the
        budget nor waits. Each restart is recorded in ``status.restartHistory``.
        """
        failure = self.job.spec.failure
        max_restarts = failure.max_restarts
        used = self.status.counted_restarts
        if counted and used >= max_restarts:
            return self.fail(reason, f"{message}; maxRestarts={max_restarts} exhausted")
        delay = failure.restart_backoff.delay(used + 1) if counted else 0
        self.status.restarts = self.attempt + 1
        if counted:
            message = f"{message}; restart {used + 1} of {max_restarts} from the latest checkpoint"
        else:
            self.status.ignored_restarts = self.status.ignored_restarts + 1
            message = (
                f"{message}; restart from the latest checkpoint, not counted against "
                f"maxRestarts={max_restarts}"
            )
        if delay:
            message = f"{message}; next attempt in {delay}s (failure.restartBackoff)"
        self.status.next_attempt_time = (
            _seconds(self.now + dt.timedelta(seconds=delay)) if delay else None
        )
        self.status.record_restart(
            RestartRecord(
                attempt=self.attempt + 1,
                scope="Cluster",
                reason=reason,
                message=message[:TERMINATION_MESSAGE_LIMIT],
                time=_seconds(self.now),
                counted=counted,
                backoff_seconds=delay,
            )
        )
        self.set_phase(Phase.RESTARTING, reason, message, EventType.WARNING)
        self.set_condition(ConditionType.RESTARTING, True, reason, message)
        self.delete_pods(keep_driver=False)
        self.plan.requeue_at_most(float(delay) if delay else 1.0)
        return True

    def pod_failed(self, pod: dict[str, Any], reason: str, message: str) -> bool:
        """A head or driver pod failed or was disrupted: ``failure.rules`` and the defaults
        (:func:`decide_pod_failure`) decide between failing the job, a restart not counted
        against ``maxRestarts`` and a counted one."""
        decision = decide_pod_failure(pod, self.job.spec.failure.rules)
        if decision.action == FailureRuleAction.FAIL_JOB:
            if decision.default_index == 0:
                # The driver's own validation of the TrainJob failed: a restart runs the same
                # input again, so fail at once with what the driver said.
                return self.fail(Reason.INVALID_INPUT, message)
            return self.fail(Reason.POD_FAILURE_POLICY, f"{message}; {decision.rule} is FailJob")
        if decision.action == FailureRuleAction.IGNORE:
            why = "disrupted" if pod_disrupted(pod) else "ignored"
            return self.restart(reason, f"{message} ({why}: {decision.rule})", counted=False)
        return self.restart(reason, message)

    def deleting(self, name: str) -> bool:
        """Whether this plan already deletes pod ``name``."""
        return ("Pod", name) in self.plan.delete


# --------------------------------------------------------------------------- the steps


def check_created_if_needed(r: Reconcile) -> None:
    """A TrainJob seen for the first time gets the Created condition and Event."""
    if r.status.condition(ConditionType.CREATED) is None:
        r.set_condition(ConditionType.CREATED, True, Reason.CREATED, "TrainJob accepted")
        r.plan.events.append(Event(EventType.NORMAL, Reason.CREATED, "TrainJob accepted"))


def check_ttl_if_needed(r: Reconcile) -> None:
    """A finished job is deleted ``ttlSecondsAfterFinished`` after its completionTime;
    until then the plan asks to be called back when it is due."""
    ttl = r.job.spec.ttl_seconds_after_finished
    done_at = r.status.completion_time
    if ttl is None or done_at is None:
        return
    remaining = (done_at + dt.timedelta(seconds=ttl) - r.now).total_seconds()
    if remaining <= 0:
        r.plan.delete_trainjob = True
        r.plan.events.append(
            Event(EventType.NORMAL, Reason.TTL_EXPIRED, f"deleted {ttl}s after finishing")
        )
    else:
        r.plan.requeue_at_most(remaining)


def check_suspend_if_needed(r: Reconcile) -> bool:
    """``spec.suspend``: tear the cluster down (checkpoints are kept) and be Suspended."""
    if not r.job.spec.suspend:
        return False
    r.delete_pods(keep_driver=False)
    r.set_phase(Phase.SUSPENDED, Reason.SUSPENDED, "suspended: cluster torn down, checkpoints kept")
    r.set_condition(ConditionType.SUSPENDED, True, Reason.SUSPENDED, "spec.suspend is true")
    r.set_condition(ConditionType.RUNNING, False, Reason.SUSPENDED, "suspended")
    r.status.workers = WorkersStatus(ready=0, desired=0)
    if r.status.dashboard is not None:
        r.status.dashboard = None  # no head to reach
    if r.status.start_time:
        # Suspended time does not count towards activeDeadlineSeconds: startTime is set
        # again when the resumed job's pods are created (Kubernetes Job semantics).
        r.status.start_time = None
    return True


def resume(r: Reconcile) -> None:
    """``spec.suspend`` turned false: back to Pending, the cluster is created again."""
    r.set_condition(ConditionType.SUSPENDED, False, Reason.RESUMED, "spec.suspend is false")
    r.set_phase(
        Phase.PENDING, Reason.RESUMED, "resumed: recreating the cluster from the latest checkpoint"
    )


def check_stale_pods_if_needed(r: Reconcile) -> None:
    """Pods of an earlier attempt (before a whole-cluster restart) are deleted."""
    for pod in r.stale_pods:
        if not _terminating(pod):
            r.plan.delete.append(("Pod", _name(pod)))


def check_driver_if_needed(r: Reconcile) -> bool:
    """The driver decides: it succeeded (the job succeeded), it exited with the invalid-input
    status (the job fails at once), or it failed otherwise (a whole-cluster restart)."""
    for driver in r.by_role.get("driver", []):
        if pod_phase(driver) == PodPhase.SUCCEEDED:
            r.set_phase(Phase.SUCCEEDED, Reason.SUCCEEDED, "training finished")
            r.status.completion_time = _seconds(r.now)
            r.set_condition(
                ConditionType.SUCCEEDED, True, Reason.DRIVER_SUCCEEDED, "training finished"
            )
            r.set_condition(ConditionType.RUNNING, False, Reason.SUCCEEDED, "training finished")
            r.delete_pods(keep_driver=keep_driver_pod(r.job.spec.keep_driver_pod, Phase.SUCCEEDED))
            return True
        if pod_phase(driver) == PodPhase.FAILED:
            return r.pod_failed(
                driver, Reason.DRIVER_FAILED, f"driver {_pod_ended(driver, 'driver')}"
            )
    return False


def check_head_if_needed(r: Reconcile) -> bool:
    """A Ray head that ended restarts the whole cluster."""
    for head in r.by_role.get("head", []):
        if _pod_done(head):
            return r.pod_failed(head, Reason.HEAD_FAILED, f"Ray head {_pod_ended(head)}")
    return False


def check_disrupted_pods_if_needed(r: Reconcile) -> bool:
    """A head or driver pod that Kubernetes is taking away (a ``DisruptionTarget``
    condition: preemption, eviction, drain, its node gone) restarts the cluster now, before
    it is gone; by default (:data:`DEFAULT_FAILURE_RULES`) not counted against
    ``maxRestarts``."""
    for role in ("head", "driver"):
        for pod in r.by_role.get(role, []):
            if not _pod_done(pod) and pod_disrupted(pod):
                return r.pod_failed(pod, Reason.POD_DISRUPTED, f"pod {_name(pod)} disrupted")
    return False


def check_lost_pods_if_needed(r: Reconcile) -> bool:
    """A Running job whose head or driver pod disappeared restarts the whole cluster."""
    if not r.by_role.get("head") or not r.by_role.get("driver"):
        return r.restart(Reason.HEAD_OR_DRIVER_LOST, "the Ray head or driver pod disappeared")
    return False


def _seconds_since_start(r: Reconcile) -> float | None:
    started = r.status.start_time
    return (r.now - started).total_seconds() if started is not None else None


#: Container waiting reasons that only mean "starting normally" (not a cause worth naming).
_STARTING_REASONS = frozenset({"ContainerCreating", "PodInitializing"})
#: How many pod names a startup cause lists before "and N more".
_CAUSE_POD_NAMES = 3


def _pod_names(names: list[str]) -> str:
    shown = ", ".join(names[:_CAUSE_POD_NAMES])
    more = len(names) - _CAUSE_POD_NAMES
    return f"{shown} and {more} more" if more > 0 else shown


def startup_blockers(pods: list[dict[str, Any]]) -> str | None:
    """Why pods are not running, as the Kubernetes objects say, or None when they do not say.

    The pods kube-scheduler could not place (``PodScheduled=False``, e.g. ``Unschedulable``
    with its ``0/12 nodes are available: ...`` message), grouped by message; then containers
    waiting for a reason other than normal start-up (``ErrImagePull``, ``ImagePullBackOff``,
    ``CreateContainerConfigError``...). Both kinds are named when both occur (a pod that
    cannot be placed and another whose image cannot be pulled). Pods being deleted are left
    out.
    """
    live = sorted((p for p in pods if not _terminating(p)), key=_name)
    unscheduled: dict[tuple[str, str], list[str]] = {}
    waiting: dict[tuple[str, str], list[str]] = {}
    for pod in live:
        status = pod.get("status") or {}
        for condition in status.get("conditions") or []:
            if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
                reason = str(condition.get("reason") or "Unschedulable")
                key = (reason, str(condition.get("message") or ""))
                unscheduled.setdefault(key, []).append(_name(pod))
        for container in status.get("containerStatuses") or []:
            state = (container.get("state") or {}).get("waiting") or {}
            waiting_reason = str(state.get("reason") or "")
            if waiting_reason and waiting_reason not in _STARTING_REASONS:
                key = (waiting_reason, str(state.get("message") or ""))
                waiting.setdefault(key, []).append(f"{_name(pod)}/{container.get('name')}")
    causes = [
        f"pod {_pod_names(names)} {reason}" + (f": {message}" if message else "")
        for (reason, message), names in unscheduled.items()
    ] + [
        f"container {_pod_names(names)} waiting: {reason}" + (f": {message}" if message else "")
        for (reason, message), names in waiting.items()
    ]
    return "; ".join(causes) or None


def check_deadlines_if_needed(r: Reconcile) -> bool:
    """``activeDeadlineSeconds`` and ``startupDeadlineSeconds`` fail the job when passed.

    ``startTime``: when this run's pods were first created (reset by suspend/resume), as for
    a Kubernetes Job; both deadlines count from it, so a job stuck in Starting hits them too.
    The startup deadline no longer applies once the job has been Running; its message says
    what held the pods back when the pods say (:func:`startup_blockers`: the scheduler's
    reason for a pod it could not place, or a container's waiting reason).
    """
    failure = r.job.spec.failure
    elapsed = _seconds_since_start(r)
    if elapsed is None:
        return False
    active = failure.active_deadline_seconds
    if active is not None and elapsed > active:
        return r.fail(Reason.DEADLINE_EXCEEDED, f"activeDeadlineSeconds={active} exceeded")
    startup = failure.startup_deadline_seconds
    if (
        startup is not None
        and not r.status.condition_true(ConditionType.RUNNING)
        and elapsed > startup
    ):
        message = f"not Running within startupDeadlineSeconds={startup}"
        cause = startup_blockers(r.current_pods)
        if cause:
            message = f"{message}: {cause}"
        return r.fail(Reason.STARTUP_DEADLINE_EXCEEDED, message[:STARTUP_MESSAGE_LIMIT])
    return False


def check_removed_pods_if_needed(r: Reconcile) -> None:
    """Pods of this attempt that are no longer desired (e.g. the validation pool scaled
    down) are deleted."""
    desired_pods = {_name(d) for d in r.desired if d.get("kind") == "Pod"}
    for pod in r.current_pods:
        if _name(pod) not in desired_pods:
            r.plan.delete.append(("Pod", _name(pod)))


def _slice_index(pod: dict[str, Any]) -> int | None:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    value = labels.get(SLICE_LABEL)
    return int(value) if value is not None else None


def _multi_host_slices(job: TrainJob) -> bool:
    shape = job.spec.scaling.tpu_shape
    return shape is not None and shape.hosts > 1


def _host_broken(r: Reconcile, pod: dict[str, Any]) -> str | None:
    """Why a TPU host pod breaks its slice (None when it does not): it ended, Kubernetes is
    taking it away, or it is being deleted by someone else while its slice runs on."""
    if _pod_done(pod):
        return _pod_ended(pod)
    if pod_disrupted(pod):
        return f"pod {_name(pod)} disrupted (DisruptionTarget)"
    if _terminating(pod):
        return f"pod {_name(pod)} is being deleted"
    return None


def check_slice_recovery_if_needed(r: Reconcile) -> None:
    """Slice-atomic recovery of multi-host TPU slices: the hosts of a slice share ICI and the
    collectives of the others hang when one host is replaced alone, so when any host pod of
    a slice fails, is disrupted, is deleted or (once the job ran) disappeared, every host
    pod of that slice is deleted and recreated under the same names (same stable hostnames
    and ``TPU_WORKER_ID``). The runtime restarts the whole worker group (every slice) from the
    latest committed checkpoint; the other slices' pods are kept (docs/guides/failures.md,
    "Multislice"). Recorded in ``status.restartHistory`` (scope Slice) with an Event
    ``SliceRecovered``."""
    if not _multi_host_slices(r.job):
        return
    desired_hosts: dict[int, list[str]] = {}
    for d in r.desired:
        index = _slice_index(d)
        if _role(d) == "worker" and index is not None:
            desired_hosts.setdefault(index, []).append(_name(d))
    present: dict[str, dict[str, Any]] = {
        _name(p): p for p in r.by_role.get("worker", []) if _slice_index(p) is not None
    }
    for index, names in sorted(desired_hosts.items()):
        why = next((w for n in names if n in present and (w := _host_broken(r, present[n]))), None)
        missing = [n for n in names if n not in present]
        if why is None and missing and len(missing) < len(names) and r.phase == Phase.RUNNING:
            why = f"pod {missing[0]} disappeared"
        if why is None:
            continue
        replace_now = [
            n for n in names if n in present and not _terminating(present[n]) and not r.deleting(n)
        ]
        if not replace_now:
            continue  # the slice is already being replaced
        for name in replace_now:
            r.plan.delete.append(("Pod", name))
        message = (
            f"slice {index} ({len(names)} hosts, {names[0]}..{names[-1]}) replaced as a unit: {why}"
        )
        r.plan.events.append(Event(EventType.WARNING, Reason.SLICE_RECOVERED, message))
        r.status.record_restart(
            RestartRecord(
                attempt=r.attempt,
                scope="Slice",
                slice=index,
                reason=Reason.SLICE_RECOVERED,
                message=message[:TERMINATION_MESSAGE_LIMIT],
                time=_seconds(r.now),
                counted=False,
            )
        )


def check_worker_replacement_if_needed(r: Reconcile) -> None:
    """A worker or validation pod that ended is deleted, to be recreated under the same name
    (the runtime restarts the worker group from the latest checkpoint); the hosts of a
    multi-host TPU slice are replaced together (:func:`check_slice_recovery_if_needed`)."""
    check_slice_recovery_if_needed(r)
    for pod in r.current_pods:
        if _role(pod) in ("worker", "validation") and _pod_done(pod) and not r.deleting(_name(pod)):
            r.plan.delete.append(("Pod", _name(pod)))
            r.plan.events.append(
                Event(
                    EventType.WARNING, Reason.WORKER_POD_LOST, f"{_pod_ended(pod)}; recreating it"
                )
            )


def check_spec_changes_if_needed(r: Reconcile) -> None:
    """A pod whose rendered spec changed with the TrainJob's spec (image, resources, env...:
    its spec-hash annotation differs) is replaced; the runtime resumes the workers from the
    latest checkpoint. A pod rendered differently only because the operator changed (an
    upgrade: the TrainJob's spec is the one it was created for) keeps running, as KubeRay
    does not restart clusters on its upgrades; the next spec change replaces it."""
    desired_hash = {_name(d): _spec_hash(d) for d in r.desired if d.get("kind") == "Pod"}
    for pod in r.current_pods:
        want = desired_hash.get(_name(pod))
        if want is None or _spec_hash(pod) in (None, want) or r.deleting(_name(pod)):
            continue
        if not _spec_changed_since_created(r, pod):
            continue
        r.plan.delete.append(("Pod", _name(pod)))
        r.plan.events.append(
            Event(
                EventType.NORMAL,
                Reason.SPEC_CHANGED,
                f"pod {_name(pod)} replaced to apply the new spec",
            )
        )


def _spec_changed_since_created(r: Reconcile, pod: dict[str, Any]) -> bool:
    """Whether the TrainJob's spec changed since ``pod`` was created: the generation it was
    created for (:data:`SPEC_GENERATION_ANNOTATION`) is not the current one. For a pod an
    earlier operator build created without it: whether the spec changed since the last
    reconcile planned (``status.observedGeneration``)."""
    if r.generation is None:
        return True
    recorded = ((pod.get("metadata") or {}).get("annotations") or {}).get(
        SPEC_GENERATION_ANNOTATION
    )
    if recorded is None:
        return r.previous_generation != r.generation
    return str(recorded) != str(r.generation)


def check_restart_backoff_if_needed(r: Reconcile) -> bool:
    """Restarting: the next attempt's pods wait until ``status.nextAttemptTime``
    (``failure.restartBackoff``); the plan asks to be called back then. Once due, the time
    is cleared and the pods are created."""
    due = r.status.next_attempt_time
    if due is None:
        return False
    remaining = (due - r.now).total_seconds()
    if r.phase == Phase.RESTARTING and remaining > 0:
        r.status.message = (
            f"restart back-off: the next attempt starts at {_ts(due)} (failure.restartBackoff)"
        )
        r.plan.requeue_at_most(remaining)
        return True
    r.status.next_attempt_time = None
    return False


def create_missing_children(r: Reconcile) -> None:
    """Create every desired child that does not exist; a pod being deleted now is created
    by a later reconcile (called back within a second)."""
    existing = {(str(o.get("kind")), _name(o)) for o in r.observed}
    for obj in r.desired:
        key = (str(obj.get("kind")), _name(obj))
        if key not in existing:
            r.plan.create.append(_with_spec_generation(obj, r.generation))
        elif key[0] == "Pod" and r.deleting(key[1]):
            r.plan.requeue_at_most(1.0)  # recreated once the old pod is gone


def _with_spec_generation(obj: dict[str, Any], generation: int | None) -> dict[str, Any]:
    """A pod to create, stamped with the TrainJob generation it is created for (outside its
    spec hash, which the renderer computed); other kinds and unknown generations as they
    are. A copy: the rendered object is left alone."""
    if obj.get("kind") != "Pod" or generation is None:
        return obj
    meta = obj["metadata"]
    annotations = {**(meta.get("annotations") or {}), SPEC_GENERATION_ANNOTATION: str(generation)}
    return {**obj, "metadata": {**meta, "annotations": annotations}}


def check_dashboard_if_needed(r: Reconcile) -> None:
    """``status.dashboard`` names the Ray dashboard's Service while one is desired
    (``spec.ray.dashboard.service``); a dashboard Service no longer desired is deleted."""
    wanted = [d for d in r.desired if d.get("kind") == "Service" and _role(d) == "dashboard"]
    for service in r.observed:
        if (
            service.get("kind") == "Service"
            and _role(service) == "dashboard"
            and _name(service) not in {_name(d) for d in wanted}
            and not _terminating(service)
        ):
            r.plan.delete.append(("Service", _name(service)))
    if not wanted:
        if r.status.dashboard is not None:
            r.status.dashboard = None
        return
    name = _name(wanted[0])
    namespace = r.job.metadata.namespace or "default"
    port = wanted[0]["spec"]["ports"][0]["port"]
    r.status.dashboard = DashboardStatus(
        service=name,
        address=f"http://{name}.{namespace}.svc:{port}",
        port_forward=f"kubectl -n {namespace} port-forward svc/{name} {port}",
    )


def check_start_time_if_needed(r: Reconcile) -> None:
    """``startTime`` is set when the pods of this run are first created."""
    if not r.status.start_time and any(d.get("kind") == "Pod" for d in r.desired):
        r.status.start_time = _seconds(r.now)


def update_cluster_status(r: Reconcile) -> None:
    """Workers and validation pool counts, and Running (head, every worker and the driver
    up) or Starting; a Running job with a worker being replaced stays Running."""
    desired_workers = sum(1 for d in r.desired if _role(d) == "worker")
    ready_workers = sum(
        1 for p in r.by_role.get("worker", []) if pod_ready(p) and not r.deleting(_name(p))
    )
    r.status.workers = WorkersStatus(ready=ready_workers, desired=desired_workers)
    r.status.validation_pool = ValidationPoolStatus(
        replicas=sum(1 for d in r.desired if _role(d) == "validation")
    )
    heads = r.by_role.get("head", [])
    drivers = r.by_role.get("driver", [])
    cluster_ready = (
        bool(heads)
        and all(pod_ready(p) for p in heads)
        and ready_workers == desired_workers
        and bool(drivers)
        and pod_phase(drivers[0]) == PodPhase.RUNNING
    )
    workers = f"{ready_workers}/{desired_workers} workers ready"
    if cluster_ready:
        r.set_phase(Phase.RUNNING, Reason.RUNNING, workers)
        r.set_condition(
            ConditionType.RUNNING, True, Reason.CLUSTER_READY, "head, workers and driver running"
        )
        r.set_condition(ConditionType.RESTARTING, False, Reason.RUNNING, "running")
    elif r.status.phase == Phase.RUNNING:
        r.set_phase(Phase.RUNNING, Reason.RUNNING, f"{workers}; replacing lost workers")
    else:
        r.set_phase(Phase.STARTING, Reason.STARTING, f"waiting for pods: {workers}")


def check_deadline_callbacks_if_needed(r: Reconcile) -> None:
    """Be called back when a deadline would pass (the operator otherwise only resyncs)."""
    started = r.status.start_time
    if started is None:
        return
    failure = r.job.spec.failure
    startup = failure.startup_deadline_seconds
    if r.status.condition_true(ConditionType.RUNNING):
        startup = None  # it applies only until the job is first Running
    for limit in (failure.active_deadline_seconds, startup):
        if limit is not None:
            r.plan.requeue_at_most((started - r.now).total_seconds() + limit + 1.0)


# --------------------------------------------------------------------------- one function per phase


def _converge_cluster(r: Reconcile, running: bool = False) -> None:
    """The steps of every active phase: the current attempt's cluster should exist."""
    if check_suspend_if_needed(r):
        return
    check_stale_pods_if_needed(r)
    if check_driver_if_needed(r) or check_head_if_needed(r) or check_disrupted_pods_if_needed(r):
        return
    if running and check_lost_pods_if_needed(r):
        return
    if check_deadlines_if_needed(r):
        return
    check_removed_pods_if_needed(r)
    check_worker_replacement_if_needed(r)
    check_spec_changes_if_needed(r)
    if check_restart_backoff_if_needed(r):
        return
    create_missing_children(r)
    check_dashboard_if_needed(r)
    check_start_time_if_needed(r)
    update_cluster_status(r)
    check_deadline_callbacks_if_needed(r)


def reconcile_pending(r: Reconcile) -> None:
    """Pending (a new or resumed job): create the cluster of the current attempt."""
    _converge_cluster(r)


def reconcile_starting(r: Reconcile) -> None:
    """Starting: the pods exist or are being created; Running once all are up."""
    _converge_cluster(r)


def reconcile_running(r: Reconcile) -> None:
    """Running: as Starting, and a head or driver pod that disappeared restarts the cluster."""
    _converge_cluster(r, running=True)


def reconcile_restarting(r: Reconcile) -> None:
    """Restarting: the previous attempt's pods go, the next attempt's are created."""
    _converge_cluster(r)


def reconcile_suspended(r: Reconcile) -> None:
    """Suspended: stay torn down while ``spec.suspend``; otherwise resume (as Pending)."""
    if check_suspend_if_needed(r):
        return
    resume(r)
    reconcile_pending(r)


def reconcile_finished(r: Reconcile) -> None:
    """Succeeded or Failed: tear the cluster down (keeping the driver's pod for its logs per
    ``spec.keepDriverPod``) and honour ``ttlSecondsAfterFinished``."""
    r.delete_pods(keep_driver=keep_driver_pod(r.job.spec.keep_driver_pod, r.phase))
    if r.status.dashboard is not None:
        r.status.dashboard = None  # no head to reach
    check_ttl_if_needed(r)


#: What a reconcile does in each phase.
PHASE_HANDLERS: dict[Phase, Callable[[Reconcile], None]] = {
    Phase.PENDING: reconcile_pending,
    Phase.STARTING: reconcile_starting,
    Phase.RUNNING: reconcile_running,
    Phase.RESTARTING: reconcile_restarting,
    Phase.SUSPENDED: reconcile_suspended,
    Phase.SUCCEEDED: reconcile_finished,
    Phase.FAILED: reconcile_finished,
}


def plan_reconcile(
    job: TrainJob,
    status: StatusInput | None,
    observed: list[dict[str, Any]],
    desired: list[dict[str, Any]],
    now: dt.datetime,
    generation: int | None = None,
) -> Plan:
    """Decide creates, deletes, status and events for one TrainJob.

    ``status``: the TrainJob's current status (the model, or its camelCase dict; not
    changed). ``observed``: its children as read from the API. ``desired``: the children
    rendered for the current attempt (``status.restarts``) and validation pool size.
    """
    r = Reconcile.start(job, status, observed, desired, now, generation)
    check_created_if_needed(r)
    PHASE_HANDLERS[r.phase](r)
    return r.plan


def plan_invalid_spec(
    status: Mapping[str, Any] | None, message: str, generation: int | None, now: dt.datetime
) -> Plan:
    """Fail a TrainJob whose spec cannot be parsed or rendered (no retry can fix it):
    ``InvalidSpec``, once (a job already Failed is left as it is); its pods are left alone."""
    raw = dict(status or {})
    try:
        new = TrainJobStatus.model_validate(raw)
    except ValidationError:  # the status itself is what does not parse: start from nothing
        new = TrainJobStatus()
    plan = Plan(new_status=new, observed_status=_operator_keys(raw))
    if new.phase != Phase.FAILED:
        check_transition(new.phase, Phase.FAILED)
        message = message[:INVALID_SPEC_MESSAGE_LIMIT]
        new.phase = Phase.FAILED
        new.message = message
        new.completion_time = _seconds(now)
        new.set_condition(ConditionType.FAILED, True, Reason.INVALID_SPEC, message, generation, now)
        plan.events.append(Event(EventType.WARNING, Reason.INVALID_SPEC, message))
    return plan


def plan_trainjob(
    job: TrainJob,
    uid: str,
    status: StatusInput | None,
    annotations: Mapping[str, str],
    observed: list[dict[str, Any]],
    render: Renderer,
    now: dt.datetime,
    generation: int | None = None,
) -> Plan:
    """One reconcile's whole decision: size the validation pool, render the children of the
    current attempt for it (``render`` is pure), plan (:func:`plan_reconcile`) and add the
    pool's annotation and callback. A spec that does not render fails the job."""
    typed = _as_status(status)
    pool = plan_validation_pool(job, typed, annotations, now)
    try:
        desired = render(job, uid, typed.restarts, pool.replicas)
    except ValueError as exc:  # e.g. spec.podTemplate.<key>: unknown key
        raw = status if isinstance(status, Mapping) else _status_dict(typed)
        return plan_invalid_spec(raw, str(exc), generation, now)
    plan = plan_reconcile(job, typed, observed, desired, now, generation)
    check_validation_pool_if_needed(plan, pool, annotations)
    return plan
