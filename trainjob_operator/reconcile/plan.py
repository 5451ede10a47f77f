"""The plan: every decision of one reconcile, as data (:class:`Plan`, :class:`Event`).

The state machine (:mod:`~trainjob_operator.reconcile.state_machine`) fills a :class:`Plan`
in; the apply layer (:mod:`~trainjob_operator.reconcile.apply`) carries it out and reports
what happened in an outcome of its own, never on the plan. A :class:`Plan` holds the children
to create and delete, the new status (written once, and only when the operator's keys changed:
:meth:`Plan.status_patch`), annotations to patch, Events, deleting the TrainJob and when to be
called back.

The driver owns ``progress``, checkpoints, ``validations`` and ``workerFailures``; the
operator owns the keys in :data:`OPERATOR_STATUS_KEYS`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from trainjob_operator.api.status import ConditionType, Phase, Reason, TrainJobStatus
from trainjob_operator.api.trainjob import TrainJob
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
#: every few seconds; without this every running TrainJob was reconciled at every timer tick.
#: ``tests/reconcile`` checks that changing them changes no plan.
UNPLANNED_STATUS_KEYS = ("progress", "latestCheckpoint", "bestCheckpoint", "workerFailures")


#: (job, uid, attempt, validation replicas) -> desired child manifests (pure).
Renderer = Callable[[TrainJob, str, int, int], list[dict[str, Any]]]


#: A TrainJob status: the typed model, or its camelCase dict as read from the API.
StatusInput = TrainJobStatus | Mapping[str, Any]


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


def status_dict(status: TrainJobStatus) -> dict[str, Any]:
    """camelCase dict of the status: the keys read, plus every key set while planning."""
    return status.model_dump(mode="json", by_alias=True, exclude_unset=True)


def operator_keys(status: Mapping[str, Any]) -> dict[str, Any]:
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
    #: children of :attr:`delete` deleted with this ``gracePeriodSeconds`` instead of their
    #: own (``terminationGracePeriodSeconds``): the pods of a finished job, name -> seconds.
    delete_grace_seconds: dict[str, int] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    #: merged into the TrainJob's ``metadata.annotations`` (empty: no annotation patch).
    annotations: dict[str, str] = field(default_factory=dict)
    delete_trainjob: bool = False
    #: seconds after which the operator should reconcile again even if nothing changes (a
    #: deadline, the TTL, a pod being replaced); None: only on changes and periodic resync.
    requeue_after: float | None = None

    @property
    def status(self) -> dict[str, Any]:
        """The new status as a camelCase dict: the keys read plus those set while planning
        (a key set to None, e.g. ``startTime`` while suspended, is removed by a merge patch)."""
        return status_dict(self.new_status)

    def status_patch(self) -> dict[str, Any] | None:
        """The operator-owned status keys to write, or None when they did not change."""
        patch = operator_keys(self.status)
        return None if patch == self.observed_status else patch

    def requeue_at_most(self, seconds: float) -> None:
        """Ask to be reconciled again within ``seconds`` (the earliest request wins)."""
        seconds = max(0.0, seconds)
        if self.requeue_after is None or seconds < self.requeue_after:
            self.requeue_after = seconds

    def fail(self, reason: str, message: str, generation: int | None, now: dt.datetime) -> None:
        """Make this plan a terminal failure: phase Failed, completionTime, conditions (the
        kstatus ones too: ``Stalled``), an Event (only when the job was not Failed already).

        Only the status and events change; the next reconcile (phase Failed) tears the pods
        down (keeping the driver per ``spec.keepDriverPod``).
        """
        status = self.new_status
        check_transition(status.phase, Phase.FAILED)
        if status.phase != Phase.FAILED:
            self.events.append(Event(EventType.WARNING, reason, message))
        status.phase = Phase.FAILED
        status.message = message
        status.completion_time = whole_seconds(now)
        status.set_condition(ConditionType.FAILED, True, reason, message, generation, now)
        status.set_condition(ConditionType.RUNNING, False, reason, message, generation, now)
        status.set_summary_conditions(generation, now)

    def failed_by_rejected_child(
        self, manifest: dict[str, Any], body: dict[str, Any], now: dt.datetime
    ) -> Plan:
        """This plan as it becomes when the API server rejected ``manifest`` as invalid (422,
        Status ``body``): the same spec renders the same child, so no retry can succeed; the
        job fails (``InvalidChild``). A new plan: this one is left as it was decided."""
        failed = replace(
            self, new_status=self.new_status.model_copy(deep=True), events=list(self.events)
        )
        failed.fail(
            Reason.INVALID_CHILD,
            invalid_child_message(manifest, body),
            self.new_status.observed_generation,
            now,
        )
        return failed


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


def whole_seconds(now: dt.datetime) -> dt.datetime:
    """``now`` in UTC, whole seconds (as status times are written)."""
    return now.astimezone(dt.UTC).replace(microsecond=0)


def read_status(status: StatusInput | None) -> TrainJobStatus:
    """``status`` typed, to read (the model itself when given one)."""
    if isinstance(status, TrainJobStatus):
        return status
    return TrainJobStatus.model_validate(dict(status or {}))


def copy_status(status: StatusInput | None) -> TrainJobStatus:
    """A private, typed copy of ``status`` (its set fields are the keys it had)."""
    if isinstance(status, TrainJobStatus):
        return status.model_copy(deep=True)
    return TrainJobStatus.model_validate(dict(status or {}))
