"""Pod facts: what the planner reads off a pod or any child (pure functions of one object).

Phase, readiness, labels (role, attempt, slice), annotations (spec hash), deletion, its node,
how its containers ended (:class:`Termination`), its conditions, whether Kubernetes is taking
it away (:func:`pod_disrupted`) and why it is going away (:func:`disruption_cause`), and why
pods are not running (:func:`startup_blockers`). Nothing here knows the TrainJob or the plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from trainjob_operator.constants import ATTEMPT_LABEL, ROLE_LABEL, SLICE_LABEL, SPEC_HASH_ANNOTATION

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


class PodPhase(StrEnum):
    """``status.phase`` of a Kubernetes Pod."""

    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    UNKNOWN = "Unknown"


def pod_phase(pod: dict[str, Any]) -> str:
    """``status.phase`` of a pod (Pending when unset)."""
    return str((pod.get("status") or {}).get("phase") or PodPhase.PENDING)


def pod_ready(pod: dict[str, Any]) -> bool:
    """Running with the Ready condition True."""
    if pod_phase(pod) != PodPhase.RUNNING:
        return False
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def pod_done(pod: dict[str, Any]) -> bool:
    return pod_phase(pod) in (PodPhase.FAILED, PodPhase.SUCCEEDED)


def role_of(obj: dict[str, Any]) -> str | None:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    role = labels.get(ROLE_LABEL)
    return str(role) if role is not None else None


def attempt_of(obj: dict[str, Any]) -> int | None:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    value = labels.get(ATTEMPT_LABEL)
    return int(value) if value is not None else None


def spec_hash_of(obj: dict[str, Any]) -> str | None:
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(SPEC_HASH_ANNOTATION)
    return str(value) if value is not None else None


def name_of(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["name"])


def terminating(obj: dict[str, Any]) -> bool:
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


def pod_and_node(pod: dict[str, Any]) -> str:
    """``pod <name> on node <node>``, or ``pod <name>`` before it was placed on a node."""
    node = node_of(pod)
    return f"pod {name_of(pod)}" + (f" on node {node}" if node else "")


def pod_ended(pod: dict[str, Any], container: str | None = None) -> str:
    """``pod <name> on node <node> failed`` (:func:`pod_and_node`) plus how its container
    ended, when the pod status says."""
    text = f"{pod_and_node(pod)} {pod_phase(pod).lower()}"
    term = container_termination(pod, container)
    return f"{text} ({term.describe()})" if term is not None else text


def terminations(pod: dict[str, Any], container: str | None) -> list[Termination]:
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


def node_of(pod: dict[str, Any]) -> str | None:
    """The node a pod was placed on (``spec.nodeName``), None before it was scheduled."""
    node = (pod.get("spec") or {}).get("nodeName")
    return str(node) if node else None


def disruption_cause(pod: dict[str, Any]) -> str | None:
    """Why the pod is being taken away, in words, as its object says; None when nothing says
    so. Its ``DisruptionTarget`` condition (reason and message: a preemption, an eviction,
    a taint, its node going away), else a ``status.reason`` of
    :data:`DISRUPTION_POD_REASONS` (``Evicted``...), else its ``deletionTimestamp``
    (someone deleted it: ``kubectl delete pod``, a drain without the eviction API, a
    controller). Names the pod and the node it ran on:
    ``pod tj-head on node n1 evicted (DisruptionTarget EvictionByEvictionAPI: ...)``.
    Whether the deletion is the operator's own is not a fact of the pod: the planner
    decides."""
    status = pod.get("status") or {}
    where = pod_and_node(pod)
    for condition in status.get("conditions") or []:
        if condition.get("type") == DISRUPTION_TARGET and condition.get("status") == "True":
            detail = " ".join(
                str(x) for x in (condition.get("reason"), condition.get("message")) if x
            )
            return f"{where} disrupted ({DISRUPTION_TARGET}{' ' + detail if detail else ''})"
    reason = status.get("reason")
    if reason in DISRUPTION_POD_REASONS:
        message = status.get("message")
        return f"{where} disrupted (pod reason {reason}{': ' + message if message else ''})"
    deleted = (pod.get("metadata") or {}).get("deletionTimestamp")
    if deleted:
        return f"{where} deleted (deletionTimestamp {deleted})"
    return None


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
    live = sorted((p for p in pods if not terminating(p)), key=name_of)
    unscheduled: dict[tuple[str, str], list[str]] = {}
    waiting: dict[tuple[str, str], list[str]] = {}
    for pod in live:
        status = pod.get("status") or {}
        for condition in status.get("conditions") or []:
            if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
                reason = str(condition.get("reason") or "Unschedulable")
                key = (reason, str(condition.get("message") or ""))
                unscheduled.setdefault(key, []).append(name_of(pod))
        for container in status.get("containerStatuses") or []:
            state = (container.get("state") or {}).get("waiting") or {}
            waiting_reason = str(state.get("reason") or "")
            if waiting_reason and waiting_reason not in _STARTING_REASONS:
                key = (waiting_reason, str(state.get("message") or ""))
                waiting.setdefault(key, []).append(f"{name_of(pod)}/{container.get('name')}")
    causes = [
        f"pod {_pod_names(names)} {reason}" + (f": {message}" if message else "")
        for (reason, message), names in unscheduled.items()
    ] + [
        f"container {_pod_names(names)} waiting: {reason}" + (f": {message}" if message else "")
        for (reason, message), names in waiting.items()
    ]
    return "; ".join(causes) or None


def slice_index(pod: dict[str, Any]) -> int | None:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    value = labels.get(SLICE_LABEL)
    return int(value) if value is not None else None
