"""The observed state of a TrainJob (``status``): phase, conditions and their reasons, and
what the driver publishes (progress, checkpoints, validations)."""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import Field

from trainjob_operator.api.fields import ApiModel, FreeForm

__all__ = [
    "BestCheckpointSummary",
    "CheckpointSummary",
    "Condition",
    "ConditionType",
    "DashboardStatus",
    "Phase",
    "ProgressStatus",
    "Reason",
    "RestartRecord",
    "TrainJobStatus",
    "ValidationPoolStatus",
    "ValidationsStatus",
    "WorkersStatus",
    "status_defaults",
]

#: entries kept in ``status.restartHistory`` (the oldest go first).
RESTART_HISTORY_LIMIT = 10
_CONDITION_REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"


class Phase(StrEnum):
    """The single derived phase shown in ``kubectl get trainjobs``."""

    PENDING = "Pending"
    STARTING = "Starting"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"

    @property
    def finished(self) -> bool:
        """True for the terminal phases."""
        return self in (Phase.SUCCEEDED, Phase.FAILED)


class ConditionType(StrEnum):
    """``status.conditions[].type`` of a TrainJob (one condition per type)."""

    #: the operator accepted the TrainJob (True once)
    CREATED = "Created"
    #: head, workers and driver are up
    RUNNING = "Running"
    #: spec.suspend tore the cluster down
    SUSPENDED = "Suspended"
    #: a whole-cluster restart is under way
    RESTARTING = "Restarting"
    #: the driver finished training
    SUCCEEDED = "Succeeded"
    #: the job failed for good (its reason says why)
    FAILED = "Failed"
    #: kstatus: the job is where its spec asks (Running, Succeeded or Suspended); False while
    #: it starts or restarts and once it failed
    READY = "Ready"
    #: kstatus (abnormal-true): the operator is bringing the job up (Pending, Starting,
    #: Restarting)
    RECONCILING = "Reconciling"
    #: kstatus (abnormal-true): the job failed and nothing will change that but a new spec
    STALLED = "Stalled"


#: phases in which ``Ready`` is True: as kstatus reads a batch/v1 Job (Current once it runs,
#: after it completed and while it is suspended), so Flux's health checks and
#: ``kubectl wait --for=condition=Ready`` do not wait for the whole training run.
READY_PHASES = frozenset({Phase.RUNNING, Phase.SUCCEEDED, Phase.SUSPENDED})
#: phases in which ``Reconciling`` is True (kstatus: InProgress).
RECONCILING_PHASES = frozenset({Phase.PENDING, Phase.STARTING, Phase.RESTARTING})


class Reason(StrEnum):
    """CamelCase reasons of TrainJob conditions and of the Events posted on a TrainJob.

    Set by the operator (:mod:`trainjob_operator.reconcile`) and, for ``trainjob run`` and the
    driver's own view of a run, by :class:`trainjob_operator.launcher.status.StatusTracker`.
    """

    # lifecycle
    CREATED = "Created"
    STARTING = "Starting"
    RUNNING = "Running"
    CLUSTER_READY = "ClusterReady"
    SUSPENDED = "Suspended"
    RESUMED = "Resumed"
    SUCCEEDED = "Succeeded"
    DRIVER_SUCCEEDED = "DriverSucceeded"
    TTL_EXPIRED = "TTLExpired"
    # whole-cluster restarts (operator)
    DRIVER_FAILED = "DriverFailed"
    HEAD_FAILED = "HeadFailed"
    #: the Ray head's pod taken away by someone other than the operator: preempted, evicted,
    #: drained, deleted, its node gone, or gone while Running (not counted against maxRestarts)
    HEAD_DISRUPTED = "HeadDisrupted"
    #: the driver's pod taken away by someone other than the operator, as for the head (not
    #: counted against maxRestarts)
    DRIVER_DISRUPTED = "DriverDisrupted"
    # failures that no restart can fix (operator)
    INVALID_INPUT = "InvalidInput"
    INVALID_SPEC = "InvalidSpec"
    INVALID_CHILD = "InvalidChild"
    DEADLINE_EXCEEDED = "DeadlineExceeded"
    STARTUP_DEADLINE_EXCEEDED = "StartupDeadlineExceeded"
    #: a FailJob rule of spec.failure.rules matched (as a Kubernetes Job's podFailurePolicy)
    POD_FAILURE_POLICY = "PodFailurePolicy"
    # pods replaced in place (operator Events)
    WORKER_POD_LOST = "WorkerPodLost"
    SPEC_CHANGED = "SpecChanged"
    #: every host pod of a multi-host TPU slice replaced because one failed or disappeared
    SLICE_RECOVERED = "SliceRecovered"
    #: the next attempt waits for spec.failure.restartBackoff
    RESTART_BACKOFF = "RestartBackoff"
    # the runtime's view of a run (driver)
    WORKERS_READY = "WorkersReady"
    WORKER_GROUP_FAILED = "WorkerGroupFailed"
    TRAINING_FAILED = "TrainingFailed"
    TRAINING_FINISHED = "TrainingFinished"


class Condition(ApiModel):
    """A metav1.Condition."""

    type: str = Field(description="Condition type in CamelCase (Ready, Progressing...).")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(
        description="CamelCase reason of the last transition.",
        json_schema_extra={"pattern": _CONDITION_REASON_PATTERN},
    )
    message: str = Field(default="", description="Human readable details.")
    last_transition_time: datetime = Field(description="When status last changed.")
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation the condition was computed from."
    )


class WorkersStatus(ApiModel):
    """Worker pods."""

    ready: int = Field(default=0, ge=0, description="Ready worker pods.")
    desired: int = Field(default=0, ge=0, description="Desired worker pods.")


class ValidationPoolStatus(ApiModel):
    """The validation pool."""

    replicas: int = Field(default=0, ge=0, description="Current validation pods.")


class ProgressStatus(ApiModel):
    """Training progress published by the driver."""

    step: int | None = Field(default=None, ge=0, description="Last reported step (report count).")
    metrics: FreeForm = Field(default_factory=dict, description="Last reported metrics.")
    workers: int | None = Field(
        default=None,
        ge=0,
        description=(
            "Workers in the running worker group: spec.scaling.numWorkers, or fewer while an "
            "elastic job (minWorkers, tpu.minSlices) runs with what is there."
        ),
    )
    updated_at: datetime | None = Field(
        default=None, description="When progress was last reported."
    )


class CheckpointSummary(ApiModel):
    """A committed checkpoint."""

    path: str = Field(description="Storage path of the checkpoint.")
    step: int | None = Field(default=None, ge=0, description="Step the checkpoint was reported at.")
    metrics: FreeForm = Field(default_factory=dict, description="Metrics of the checkpoint.")


class BestCheckpointSummary(CheckpointSummary):
    """The best checkpoint by spec.checkpoint.scoreAttribute."""

    score: float | None = Field(default=None, description="Its value of scoreAttribute.")


class DashboardStatus(ApiModel):
    """Where the Ray dashboard is (spec.ray.dashboard.service)."""

    service: str = Field(description="The ClusterIP Service selecting the Ray head.")
    address: str = Field(
        description=(
            "Its cluster DNS address, http://<service>.<ns>.svc:8265 (the dashboard listens on "
            "the head's loopback: reach it through portForward)."
        )
    )
    port_forward: str = Field(description="The kubectl command that makes it local.")


class ValidationsStatus(ApiModel):
    """Validation task counters."""

    pending: int = Field(default=0, ge=0, description="Waiting for a validation pod.")
    running: int = Field(default=0, ge=0, description="Running.")
    done: int = Field(default=0, ge=0, description="Finished successfully.")
    failed: int = Field(default=0, ge=0, description="Failed or timed out.")


class RestartRecord(ApiModel):
    """One entry of ``status.restartHistory``: a whole-cluster restart or a slice recovery."""

    attempt: int = Field(
        ge=0, description="The attempt (status.restarts) the restart or recovery started."
    )
    scope: Literal["Cluster", "Slice"] = Field(
        description="Cluster: every pod replaced; Slice: the hosts of one TPU slice."
    )
    slice: int | None = Field(default=None, ge=0, description="The slice index (scope Slice).")
    reason: str = Field(
        description="CamelCase cause (DriverFailed, HeadFailed, HeadDisrupted, DriverDisrupted, "
        "SliceRecovered...).",
        json_schema_extra={"pattern": _CONDITION_REASON_PATTERN},
    )
    message: str = Field(default="", description="What happened (the pod and how it ended).")
    time: datetime = Field(description="When the operator decided it.")
    counted: bool = Field(
        default=True, description="Whether it counts against failure.maxRestarts."
    )
    backoff_seconds: int = Field(
        default=0, ge=0, description="How long the next attempt waited (failure.restartBackoff)."
    )


class TrainJobStatus(ApiModel):
    """The observed state of a TrainJob (phase and conditions are owned by the operator)."""

    phase: Phase | None = Field(default=None, description="Derived phase.")
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Conditions, one per type.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
        },
    )
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation the status was computed from."
    )
    start_time: datetime | None = Field(
        default=None,
        description=(
            "When the job's pods were first created (cleared while suspended, set again on "
            "resume); activeDeadlineSeconds counts from it."
        ),
    )
    completion_time: datetime | None = Field(default=None, description="When the job finished.")
    restarts: int = Field(
        default=0,
        ge=0,
        description=(
            "Whole-cluster restarts so far (the attempt number; pods carry it in their "
            "attempt label)."
        ),
    )
    ignored_restarts: int = Field(
        default=0,
        ge=0,
        description=(
            "Restarts not counted against failure.maxRestarts (disruptions, Ignore rules); "
            "the budget used is restarts - ignoredRestarts."
        ),
    )
    next_attempt_time: datetime | None = Field(
        default=None,
        description=(
            "While Restarting: the next attempt's pods are created at this time "
            "(failure.restartBackoff)."
        ),
    )
    restart_history: list[RestartRecord] = Field(
        default_factory=list,
        max_length=RESTART_HISTORY_LIMIT,
        description=(
            f"The last {RESTART_HISTORY_LIMIT} whole-cluster restarts and slice recoveries, "
            "oldest first."
        ),
    )
    worker_failures: int = Field(
        default=0,
        ge=0,
        description=(
            "Worker-group failures in the driver's current run, each followed by a restart of "
            "the workers from the latest committed checkpoint while failure.maxFailures allows "
            "(published by the driver)."
        ),
    )
    workers: WorkersStatus | None = Field(default=None, description="Worker pods.")
    validation_pool: ValidationPoolStatus | None = Field(
        default=None, description="Validation pool."
    )
    progress: ProgressStatus | None = Field(default=None, description="Training progress.")
    latest_checkpoint: CheckpointSummary | None = Field(
        default=None, description="Latest checkpoint."
    )
    best_checkpoint: BestCheckpointSummary | None = Field(
        default=None, description="Best checkpoint."
    )
    validations: ValidationsStatus | None = Field(default=None, description="Validation tasks.")
    dashboard: DashboardStatus | None = Field(
        default=None, description="The Ray dashboard's Service (spec.ray.dashboard.service)."
    )
    message: str | None = Field(default=None, description="Human readable summary of the state.")

    def record_restart(self, record: RestartRecord) -> None:
        """Append to ``restartHistory``, keeping the last :data:`RESTART_HISTORY_LIMIT`."""
        self.restart_history = [*self.restart_history, record][-RESTART_HISTORY_LIMIT:]

    @property
    def counted_restarts(self) -> int:
        """Restarts that count against ``failure.maxRestarts``."""
        return max(0, self.restarts - self.ignored_restarts)

    def condition(self, type_: str) -> Condition | None:
        """The condition of the given type, if present."""
        return next((c for c in self.conditions if c.type == type_), None)

    def condition_true(self, type_: str) -> bool:
        """Whether the condition of the given type is present with status True."""
        found = self.condition(type_)
        return found is not None and found.status == "True"

    def set_condition(
        self,
        type_: str,
        true: bool,
        reason: str,
        message: str,
        generation: int | None,
        now: datetime,
    ) -> None:
        """Set one condition (added when missing); ``lastTransitionTime`` (``now`` in UTC,
        whole seconds) changes only when the condition's status does, ``observedGeneration``
        only when ``generation`` is given."""
        value: Literal["True", "False"] = "True" if true else "False"
        stamp = now.astimezone(UTC).replace(microsecond=0)
        found = self.condition(type_)
        if found is None:
            found = Condition(
                type=type_, status=value, reason=reason, message=message, last_transition_time=stamp
            )
            self.conditions.append(found)
        else:
            if found.status != value:
                found.last_transition_time = stamp
            found.status = value
            found.reason = reason
            found.message = message
        if generation is not None:
            found.observed_generation = generation
        self.conditions = self.conditions  # counts as set (a patch of the status includes it)

    def set_summary_conditions(self, generation: int | None, now: datetime) -> None:
        """Set ``Ready``, ``Reconciling`` and ``Stalled`` from the phase, for tools that read
        the kstatus conventions (Flux's health checks, ``kubectl wait``): ``Ready`` in
        :data:`READY_PHASES`, ``Reconciling`` in :data:`RECONCILING_PHASES`, ``Stalled`` when
        Failed. All three carry the phase as reason (Failed: the ``Failed`` condition's reason
        and message) and ``status.message``. Called on every status the operator writes."""
        phase = self.phase or Phase.PENDING
        reason, message = phase.value, self.message or phase.value
        failed = self.condition(ConditionType.FAILED)
        if phase == Phase.FAILED and failed is not None:
            reason, message = failed.reason, failed.message or message
        for type_, true in (
            (ConditionType.READY, phase in READY_PHASES),
            (ConditionType.RECONCILING, phase in RECONCILING_PHASES),
            (ConditionType.STALLED, phase == Phase.FAILED),
        ):
            self.set_condition(type_, true, reason, message, generation, now)


def status_defaults() -> dict[str, Any]:
    """The status keys that have a value when absent (``restarts: 0``, ``conditions: []``...),
    by their API names: the CRD's schema defaults some of them, so the API server adds them
    to the first status write, and a status without them reads the same."""
    defaults: dict[str, Any] = {}
    for name, field in TrainJobStatus.model_fields.items():
        value = field.get_default(call_default_factory=True)
        if value is not None:
            defaults[field.alias or name] = value
    return defaults
