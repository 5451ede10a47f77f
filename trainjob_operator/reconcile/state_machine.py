"""The reconcile state machine: (TrainJob, status, children, now) -> :class:`Plan`.

Nothing here does I/O. The operator reads the TrainJob and its children, calls
:func:`plan_trainjob` and executes the returned :class:`Plan`
(:mod:`trainjob_operator.reconcile.apply`). Every decision is derived from what exists now
(level-based), so a restarted operator makes the same decisions and never duplicates children.

The phases (``status.phase``, :class:`~trainjob_operator.api.status.Phase`) move only along
the edges of :data:`~trainjob_operator.reconcile.transitions.PHASE_TRANSITIONS`:
:meth:`Reconcile.set_phase` refuses any other move.

Structure, after KubeRay's ``rayjob_controller.go`` and Ray Train V2's controller:

- :func:`plan_trainjob` is one reconcile's whole decision: :meth:`Reconcile.start` copies the
  status into a typed working status (held by the :class:`Plan`) and sizes the validation pool
  (:func:`~trainjob_operator.reconcile.validation_pool.plan_validation_pool`); the children are
  rendered for that size; :func:`run_reconcile` decides. A spec that cannot be parsed or
  rendered fails the job (:func:`plan_invalid_spec`).
- :func:`run_reconcile` dispatches on the phase to one handler per phase
  (:data:`PHASE_HANDLERS`). The handlers of the active phases run a sequence of steps
  (:data:`CLUSTER_STEPS`, :data:`RUNNING_STEPS`): small ``check_..._if_needed`` functions
  that look at one thing (suspend, the driver, the head, lost pods, deadlines, failed
  workers, changed pods...) and update the status and the plan if needed. Every step returns
  the same kind of result, a :data:`Done` flag: True ends the reconcile (a failure, a
  restart, suspending). Every reconcile ends with the validation pool's step
  (:func:`check_validation_pool_step`).
- The plan (:mod:`~trainjob_operator.reconcile.plan`) holds every decision; the apply layer
  only executes it.

The other concerns live in modules of their own: pod facts
(:mod:`~trainjob_operator.reconcile.pods`), failure rules
(:mod:`~trainjob_operator.reconcile.failure_rules`), the validation pool
(:mod:`~trainjob_operator.reconcile.validation_pool`) and the transition table
(:mod:`~trainjob_operator.reconcile.transitions`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from trainjob_operator.api.spec import FailureRuleAction
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
from trainjob_operator.constants import SPEC_GENERATION_ANNOTATION, format_time
from trainjob_operator.reconcile.failure_rules import decide_pod_failure, keep_driver_pod
from trainjob_operator.reconcile.plan import (
    Event,
    EventType,
    Plan,
    Renderer,
    StatusInput,
    copy_status,
    operator_keys,
    read_status,
    status_dict,
    whole_seconds,
)
from trainjob_operator.reconcile.pods import (
    DISRUPTION_TARGET,
    TERMINATION_MESSAGE_LIMIT,
    PodPhase,
    attempt_of,
    disruption_cause,
    name_of,
    pod_disrupted,
    pod_done,
    pod_ended,
    pod_phase,
    pod_ready,
    role_of,
    slice_index,
    spec_hash_of,
    startup_blockers,
    terminating,
)
from trainjob_operator.reconcile.transitions import check_transition
from trainjob_operator.reconcile.validation_pool import (
    PoolSize,
    check_validation_pool_if_needed,
    plan_validation_pool,
)

#: What a step returns: True when it ended the reconcile (a failure, a restart, suspending),
#: False when the next step should run. Every step returns one.
Done = bool
#: A step of the state machine: looks at one thing, updates the status and the plan if needed.
Step = Callable[["Reconcile"], Done]

#: Longest message of a spec that cannot be parsed or rendered (``InvalidSpec``).
INVALID_SPEC_MESSAGE_LIMIT = 2000


#: Longest ``StartupDeadlineExceeded`` message (with the scheduler's or the kubelet's causes).
STARTUP_MESSAGE_LIMIT = 2000


# ---------------------------------------------------------------------- one reconcile in the making


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
    #: the TrainJob's annotations as read (None: the caller sized no validation pool).
    annotations: Mapping[str, str] | None = None
    #: the validation pool decision (:meth:`start` makes it when given the annotations).
    pool: PoolSize | None = None
    attempt: int = field(init=False)
    pods: list[dict[str, Any]] = field(init=False)
    stale_pods: list[dict[str, Any]] = field(init=False)
    current_pods: list[dict[str, Any]] = field(init=False)
    by_role: dict[str, list[dict[str, Any]]] = field(init=False)

    def __post_init__(self) -> None:
        self.attempt = self.status.restarts
        self.pods = [o for o in self.observed if o.get("kind") == "Pod"]
        self.stale_pods = [
            p for p in self.pods if attempt_of(p) is not None and attempt_of(p) != self.attempt
        ]
        self.current_pods = [p for p in self.pods if p not in self.stale_pods]
        self.by_role = {}
        for pod in self.current_pods:
            self.by_role.setdefault(role_of(pod) or "", []).append(pod)

    @classmethod
    def start(
        cls,
        job: TrainJob,
        status: StatusInput | None,
        observed: list[dict[str, Any]],
        desired: list[dict[str, Any]],
        now: dt.datetime,
        generation: int | None = None,
        annotations: Mapping[str, str] | None = None,
    ) -> Reconcile:
        """The working state for planning ``job``: a plan on a typed copy of ``status``, with
        ``observedGeneration`` and ``restarts`` set (both are always written). Given the
        TrainJob's ``annotations``, the validation pool is sized too
        (:func:`~trainjob_operator.reconcile.validation_pool.plan_validation_pool`, from the
        status as read)."""
        new = copy_status(status)
        pool = None if annotations is None else plan_validation_pool(job, new, annotations, now)
        plan = Plan(new_status=new, observed_status=operator_keys(status_dict(new)))
        new.restarts = new.restarts  # 0 for a new job
        previous = new.observed_generation
        new.observed_generation = generation
        return cls(job, observed, desired, now, generation, plan, previous, annotations, pool)

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

    def delete_pods(self, keep_driver: bool, grace_seconds: int | None = None) -> None:
        """Delete the job's pods (those not already terminating), optionally not the driver;
        with ``grace_seconds``, that grace period instead of each pod's own."""
        for pod in self.pods:
            if keep_driver and role_of(pod) == "driver":
                continue
            if terminating(pod):
                continue
            self.plan.delete.append(("Pod", name_of(pod)))
            if grace_seconds is not None:
                self.plan.delete_grace_seconds[name_of(pod)] = grace_seconds

    def tear_down_finished(self) -> None:
        """Delete a finished job's pods (the driver's kept per ``spec.keepDriverPod``), each
        with :data:`NOTHING_TO_SAVE_GRACE_SECONDS` to stop in: the run is over and nothing is
        left to save, and with their own grace period the workers' drains wait the whole of
        it for a head that is going too, holding their nodes (accelerators) that long."""
        self.delete_pods(
            keep_driver=keep_driver_pod(self.job.spec.keep_driver_pod, self.phase),
            grace_seconds=NOTHING_TO_SAVE_GRACE_SECONDS,
        )

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
            whole_seconds(self.now + dt.timedelta(seconds=delay)) if delay else None
        )
        self.status.record_restart(
            RestartRecord(
                attempt=self.attempt + 1,
                scope="Cluster",
                reason=reason,
                message=message[:TERMINATION_MESSAGE_LIMIT],
                time=whole_seconds(self.now),
                counted=counted,
                backoff_seconds=delay,
            )
        )
        self.set_phase(Phase.RESTARTING, reason, message, EventType.WARNING)
        self.set_condition(ConditionType.RESTARTING, True, reason, message)
        self.delete_pods_driver_first(self.pods)
        self.plan.requeue_at_most(float(delay) if delay else 1.0)
        return True

    def delete_pods_driver_first(self, pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Delete ``pods`` (those not already terminating) for a restart or a suspension,
        the driver first while the Ray head is up (:func:`pods_to_delete_now`): the driver's
        SIGTERM lets it commit what it can and exit, within its own grace period; the head and
        the workers go once it ended (a later reconcile: :func:`check_stale_pods_if_needed`,
        :func:`check_suspend_if_needed`). Once no last
        commit is possible (:func:`last_commit_possible`), each pod gets
        :data:`NOTHING_TO_SAVE_GRACE_SECONDS` instead of its own grace period: a worker's
        drain would otherwise wait all of it for a run that is over, and the next attempt's
        pods (of the same names) wait for them. Returns the pods deleted now."""
        grace = None if last_commit_possible(pods) else NOTHING_TO_SAVE_GRACE_SECONDS
        now = pods_to_delete_now(pods)
        for pod in now:
            self.plan.delete.append(("Pod", name_of(pod)))
            if grace is not None:
                self.plan.delete_grace_seconds[name_of(pod)] = grace
        return now

    def tear_down_driver_first(self, pods: list[dict[str, Any]]) -> None:
        """:meth:`delete_pods_driver_first`, and a reconcile again within a second while some
        of ``pods`` wait for the driver to end (the head and the workers)."""
        deleted = self.delete_pods_driver_first(pods)
        if any(not terminating(p) and p not in deleted for p in pods):
            self.plan.requeue_at_most(1.0)

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

    def disrupted(self, pod: dict[str, Any], reason: str, message: str) -> bool:
        """A head or driver pod taken away by someone other than the operator (a disruption,
        :func:`check_disrupted_pods_if_needed`): decided as a pod with the
        ``DisruptionTarget`` condition, whether or not the API server set it (a plain
        ``kubectl delete pod`` sets none), so ``failure.rules`` on that condition apply
        and, by default, the restart is not counted against ``maxRestarts``."""
        return self.pod_failed(as_disruption_target(pod), reason, message)

    def deleting(self, name: str) -> bool:
        """Whether this plan already deletes pod ``name``."""
        return ("Pod", name) in self.plan.delete


def last_commit_possible(pods: list[dict[str, Any]]) -> bool:
    """Whether an attempt's driver, among ``pods``, can still commit a checkpoint: it still
    runs next to a Ray head that is up (not ended, not terminating, not disrupted). Once the
    driver ended, or the head is gone or going, nothing more can be committed (what was
    committed stays: a commit is whole or absent)."""
    driver_running = any(role_of(p) == "driver" and not pod_done(p) for p in pods)
    head_up = any(
        role_of(p) == "head" and not pod_done(p) and not terminating(p) and not pod_disrupted(p)
        for p in pods
    )
    return driver_running and head_up


def pods_to_delete_now(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Which of a restarted attempt's ``pods`` to delete now (those not already
    terminating): only the driver while :func:`last_commit_possible`, so that its SIGTERM
    lets it commit the checkpoint round in flight (or the one the train function saves on the
    notice) and exit 3 before Ray goes away, within its grace period; every pod otherwise
    (nothing more can be committed, so nothing waits for the driver)."""
    live = [p for p in pods if not terminating(p)]
    if last_commit_possible(pods):
        return [p for p in live if role_of(p) == "driver"]
    return live


def as_disruption_target(pod: dict[str, Any]) -> dict[str, Any]:
    """``pod`` (a copy) with the ``DisruptionTarget`` condition True, as the API server sets
    it on a pod it preempts or evicts: what :meth:`Reconcile.disrupted` decides on."""
    if pod_disrupted(pod):
        return pod
    status = dict(pod.get("status") or {})
    condition = {"type": DISRUPTION_TARGET, "status": "True", "reason": "DeletedByOthers"}
    status["conditions"] = [*(status.get("conditions") or []), condition]
    return {**pod, "status": status}


#: The grace period of pods with nothing left to save: a finished job's, and an earlier
#: attempt's once its driver can no longer commit (:func:`last_commit_possible`).
NOTHING_TO_SAVE_GRACE_SECONDS = 5


# --------------------------------------------------------------------------- the steps


def check_created_if_needed(r: Reconcile) -> Done:
    """A TrainJob seen for the first time gets the Created condition and Event."""
    if r.status.condition(ConditionType.CREATED) is None:
        r.set_condition(ConditionType.CREATED, True, Reason.CREATED, "TrainJob accepted")
        r.plan.events.append(Event(EventType.NORMAL, Reason.CREATED, "TrainJob accepted"))
    return False


def check_teardown_if_needed(r: Reconcile) -> Done:
    """A finished job's cluster is torn down: the driver's pod kept for its logs per
    ``spec.keepDriverPod``, the others given a few seconds to stop
    (:meth:`Reconcile.tear_down_finished`); its dashboard is gone with its head."""
    r.tear_down_finished()
    if r.status.dashboard is not None:
        r.status.dashboard = None  # no head to reach
    return False


def check_ttl_if_needed(r: Reconcile) -> Done:
    """A finished job is deleted ``ttlSecondsAfterFinished`` after its completionTime;
    until then the plan asks to be called back when it is due."""
    ttl = r.job.spec.ttl_seconds_after_finished
    done_at = r.status.completion_time
    if ttl is None or done_at is None:
        return False
    remaining = (done_at + dt.timedelta(seconds=ttl) - r.now).total_seconds()
    if remaining <= 0:
        r.plan.delete_trainjob = True
        r.plan.events.append(
            Event(EventType.NORMAL, Reason.TTL_EXPIRED, f"deleted {ttl}s after finishing")
        )
    else:
        r.plan.requeue_at_most(remaining)
    return False


def check_suspend_if_needed(r: Reconcile) -> Done:
    """``spec.suspend``: tear the cluster down (checkpoints are kept) and be Suspended. The
    driver goes first while its Ray head is up (:meth:`Reconcile.delete_pods_driver_first`,
    as for a restart): its SIGTERM lets it commit the checkpoint round in flight, or the one
    the train function saves on the notice, so a resumed job loses no more than that; the
    head and the workers go once it ended (a later reconcile, each with
    :data:`NOTHING_TO_SAVE_GRACE_SECONDS`)."""
    if not r.job.spec.suspend:
        return False
    r.tear_down_driver_first(r.pods)
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


def check_resume_if_needed(r: Reconcile) -> Done:
    """A Suspended job whose ``spec.suspend`` turned false: back to Pending, the cluster is
    created again (by the steps of Pending, which follow)."""
    if r.job.spec.suspend or r.phase != Phase.SUSPENDED:
        return False
    r.set_condition(ConditionType.SUSPENDED, False, Reason.RESUMED, "spec.suspend is false")
    r.set_phase(
        Phase.PENDING, Reason.RESUMED, "resumed: recreating the cluster from the latest checkpoint"
    )
    return False


def check_stale_pods_if_needed(r: Reconcile) -> Done:
    """Pods of an earlier attempt (before a whole-cluster restart) are deleted, the driver
    first while its Ray head is up (:func:`pods_to_delete_now`); the next attempt's pods of
    the same names are created once the old ones are gone."""
    r.tear_down_driver_first(r.stale_pods)
    return False


def check_driver_succeeded_if_needed(r: Reconcile) -> Done:
    """The driver succeeded: the job succeeded (whatever happens to the other pods now)."""
    for driver in r.by_role.get("driver", []):
        if pod_phase(driver) == PodPhase.SUCCEEDED:
            r.set_phase(Phase.SUCCEEDED, Reason.SUCCEEDED, "training finished")
            r.status.completion_time = whole_seconds(r.now)
            r.set_condition(
                ConditionType.SUCCEEDED, True, Reason.DRIVER_SUCCEEDED, "training finished"
            )
            r.set_condition(ConditionType.RUNNING, False, Reason.SUCCEEDED, "training finished")
            r.tear_down_finished()
            return True
    return False


def check_driver_failed_if_needed(r: Reconcile) -> Done:
    """The driver failed: it exited with the invalid-input status (the job fails at once),
    exited preempted (a restart not counted), or failed otherwise (a counted whole-cluster
    restart), as ``failure.rules`` and the defaults decide. Runs after the disruption
    checks: a driver that failed because the head was taken away is that disruption."""
    for driver in r.by_role.get("driver", []):
        if pod_phase(driver) == PodPhase.FAILED:
            return r.pod_failed(
                driver, Reason.DRIVER_FAILED, f"driver {pod_ended(driver, 'driver')}"
            )
    return False


def check_head_if_needed(r: Reconcile) -> Done:
    """A Ray head that ended on its own (its process crashed or was killed inside the pod,
    which nobody deleted) restarts the whole cluster, counted against ``maxRestarts``."""
    for head in r.by_role.get("head", []):
        if pod_done(head):
            return r.pod_failed(head, Reason.HEAD_FAILED, f"Ray head {pod_ended(head)}")
    return False


def _replaced_by_the_operator(r: Reconcile, pod: dict[str, Any]) -> bool:
    """Whether the operator itself deletes ``pod`` to apply a spec change
    (:func:`check_spec_changes_if_needed`: its spec hash is not the desired one and the
    TrainJob's spec changed since it was created). The operator deletes a head or driver
    pod of the current attempt for no other reason while the job is active: a restart,
    suspending or finishing moves the job to the next attempt or out of the active phases
    first."""
    want = next(
        (
            spec_hash_of(d)
            for d in r.desired
            if d.get("kind") == "Pod" and name_of(d) == name_of(pod)
        ),
        None,
    )
    if want is None or spec_hash_of(pod) in (None, want):
        return False
    return _spec_changed_since_created(r, pod)


def _taken_away(r: Reconcile, pod: dict[str, Any]) -> str | None:
    """Why a head or driver pod of this attempt is being taken away by someone other than
    the operator (:func:`~trainjob_operator.reconcile.pods.disruption_cause`: the node and
    why), or None: it is not, or the operator is replacing it itself."""
    cause = disruption_cause(pod)
    if cause is None or (not pod_disrupted(pod) and _replaced_by_the_operator(r, pod)):
        return None
    return cause


def _also_going(r: Reconcile, pod: dict[str, Any]) -> str:
    """``; also going: tj-driver, tj-w0`` naming the job's other pods of this attempt that
    are being deleted or taken away (every pod deleted at once), else empty."""
    others = sorted(
        name_of(p)
        for p in r.current_pods
        if p is not pod and (terminating(p) or pod_disrupted(p)) and not r.deleting(name_of(p))
    )
    return f"; also going: {', '.join(others)}" if others else ""


def check_disrupted_pods_if_needed(r: Reconcile) -> Done:
    """A head or driver pod taken away by someone other than the operator (a
    ``DisruptionTarget`` condition: preemption, eviction, drain, taint, its node gone; or
    its ``deletionTimestamp`` set by ``kubectl delete pod`` or a controller; whether it is
    still running or already ended) restarts the whole cluster from the latest checkpoint
    now, before it is gone: a disruption, not a failure of the job. By default
    (:data:`DEFAULT_FAILURE_RULES`) not counted against ``maxRestarts``, like a preemption;
    recorded in ``status.restartHistory`` with the pod, its node and why (reasons
    ``HeadDisrupted``, ``DriverDisrupted``). Runs before the driver's and the head's own
    failure checks, so a driver that failed because its head was deleted is the head's
    disruption. A head or driver that the operator deletes to apply a spec change is not
    one."""
    for head in r.by_role.get("head", []):
        if cause := _taken_away(r, head):
            return r.disrupted(
                head, Reason.HEAD_DISRUPTED, f"Ray head {cause}{_also_going(r, head)}"
            )
    for driver in r.by_role.get("driver", []):
        if cause := _taken_away(r, driver):
            message = f"driver {cause}{_also_going(r, driver)}"
            return r.disrupted(driver, Reason.DRIVER_DISRUPTED, message)
    return False


def check_lost_pods_if_needed(r: Reconcile) -> Done:
    """A Running job whose head or driver pod disappeared (deleted by someone other than
    the operator, which deletes them only when moving to the next attempt or out of the
    active phases) restarts the whole cluster: a disruption, decided as
    :func:`check_disrupted_pods_if_needed` decides (by default not counted)."""
    if not r.by_role.get("head"):
        message = f"Ray head pod {_desired_name(r, 'head')} disappeared while Running"
        return r.disrupted(_gone(r, "head"), Reason.HEAD_DISRUPTED, message)
    if not r.by_role.get("driver"):
        message = f"driver pod {_desired_name(r, 'driver')} disappeared while Running"
        return r.disrupted(_gone(r, "driver"), Reason.DRIVER_DISRUPTED, message)
    return False


def _desired_name(r: Reconcile, role: str) -> str:
    """The name of the desired pod of ``role`` (other children, e.g. the Ray token Secret,
    carry the head's role label too)."""
    pods = (d for d in r.desired if d.get("kind") == "Pod" and role_of(d) == role)
    return next((name_of(d) for d in pods), role)


def _gone(r: Reconcile, role: str) -> dict[str, Any]:
    """What the failure rules see of a pod that is gone: its name only."""
    return {"metadata": {"name": _desired_name(r, role)}}


def _seconds_since_start(r: Reconcile) -> float | None:
    started = r.status.start_time
    return (r.now - started).total_seconds() if started is not None else None


def check_deadlines_if_needed(r: Reconcile) -> Done:
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


def check_removed_pods_if_needed(r: Reconcile) -> Done:
    """Pods of this attempt that are no longer desired (e.g. the validation pool scaled
    down) are deleted."""
    desired_pods = {name_of(d) for d in r.desired if d.get("kind") == "Pod"}
    for pod in r.current_pods:
        if name_of(pod) not in desired_pods:
            r.plan.delete.append(("Pod", name_of(pod)))
    return False


def _multi_host_slices(job: TrainJob) -> bool:
    shape = job.spec.scaling.tpu_shape
    return shape is not None and shape.hosts > 1


def _host_broken(r: Reconcile, pod: dict[str, Any]) -> str | None:
    """Why a TPU host pod breaks its slice (None when it does not): it ended, Kubernetes is
    taking it away, or it is being deleted by someone else while its slice runs on."""
    if pod_done(pod):
        return pod_ended(pod)
    if pod_disrupted(pod):
        return f"pod {name_of(pod)} disrupted (DisruptionTarget)"
    if terminating(pod):
        return f"pod {name_of(pod)} is being deleted"
    return None


def check_slice_recovery_if_needed(r: Reconcile) -> Done:
    """Slice-atomic recovery of multi-host TPU slices: the hosts of a slice share ICI and the
    collectives of the others hang when one host is replaced alone, so when any host pod of
    a slice fails, is disrupted, is deleted or (once the job ran) disappeared, every host
    pod of that slice is deleted and recreated under the same names (same stable hostnames
    and ``TPU_WORKER_ID``). The runtime restarts the whole worker group (every slice) from the
    latest committed checkpoint; the other slices' pods are kept (docs/guides/failures.md,
    "Multislice"). Recorded in ``status.restartHistory`` (scope Slice) with an Event
    ``SliceRecovered``."""
    if not _multi_host_slices(r.job):
        return False
    desired_hosts: dict[int, list[str]] = {}
    for d in r.desired:
        index = slice_index(d)
        if role_of(d) == "worker" and index is not None:
            desired_hosts.setdefault(index, []).append(name_of(d))
    present: dict[str, dict[str, Any]] = {
        name_of(p): p for p in r.by_role.get("worker", []) if slice_index(p) is not None
    }
    for index, names in sorted(desired_hosts.items()):
        why = next((w for n in names if n in present and (w := _host_broken(r, present[n]))), None)
        missing = [n for n in names if n not in present]
        if why is None and missing and len(missing) < len(names) and r.phase == Phase.RUNNING:
            why = f"pod {missing[0]} disappeared"
        if why is None:
            continue
        replace_now = [
            n for n in names if n in present and not terminating(present[n]) and not r.deleting(n)
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
                time=whole_seconds(r.now),
                counted=False,
            )
        )
    return False


def check_worker_replacement_if_needed(r: Reconcile) -> Done:
    """A worker, validation or data pod that ended is deleted, to be recreated under the same name
    (the runtime restarts the worker group from the latest checkpoint); the hosts of a
    multi-host TPU slice are replaced together (:func:`check_slice_recovery_if_needed`)."""
    check_slice_recovery_if_needed(r)
    for pod in r.current_pods:
        if (
            role_of(pod) in ("worker", "validation", "data")
            and pod_done(pod)
            and not r.deleting(name_of(pod))
        ):
            r.plan.delete.append(("Pod", name_of(pod)))
            r.plan.events.append(
                Event(EventType.WARNING, Reason.WORKER_POD_LOST, f"{pod_ended(pod)}; recreating it")
            )
    return False


def check_spec_changes_if_needed(r: Reconcile) -> Done:
    """A pod whose rendered spec changed with the TrainJob's spec (image, resources, env...:
    its spec-hash annotation differs) is replaced; the runtime resumes the workers from the
    latest checkpoint. A pod rendered differently only because the operator changed (an
    upgrade: the TrainJob's spec is the one it was created for) keeps running, as KubeRay
    does not restart clusters on its upgrades; the next spec change replaces it."""
    desired_hash = {name_of(d): spec_hash_of(d) for d in r.desired if d.get("kind") == "Pod"}
    for pod in r.current_pods:
        want = desired_hash.get(name_of(pod))
        if want is None or spec_hash_of(pod) in (None, want) or r.deleting(name_of(pod)):
            continue
        if not _spec_changed_since_created(r, pod):
            continue
        r.plan.delete.append(("Pod", name_of(pod)))
        r.plan.events.append(
            Event(
                EventType.NORMAL,
                Reason.SPEC_CHANGED,
                f"pod {name_of(pod)} replaced to apply the new spec",
            )
        )
    return False


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


def check_restart_backoff_if_needed(r: Reconcile) -> Done:
    """Restarting: the next attempt's pods wait until ``status.nextAttemptTime``
    (``failure.restartBackoff``); the plan asks to be called back then. Once due, the time
    is cleared and the pods are created."""
    due = r.status.next_attempt_time
    if due is None:
        return False
    remaining = (due - r.now).total_seconds()
    if r.phase == Phase.RESTARTING and remaining > 0:
        r.status.message = (
            f"restart back-off: the next attempt starts at {format_time(due)} "
            "(failure.restartBackoff)"
        )
        r.plan.requeue_at_most(remaining)
        return True
    r.status.next_attempt_time = None
    return False


def create_missing_children(r: Reconcile) -> Done:
    """Create every desired child that does not exist; a pod being deleted now is created
    by a later reconcile (called back within a second)."""
    existing = {(str(o.get("kind")), name_of(o)) for o in r.observed}
    for obj in r.desired:
        key = (str(obj.get("kind")), name_of(obj))
        if key not in existing:
            r.plan.create.append(_with_spec_generation(obj, r.generation))
        elif key[0] == "Pod" and r.deleting(key[1]):
            r.plan.requeue_at_most(1.0)  # recreated once the old pod is gone
    return False


def _with_spec_generation(obj: dict[str, Any], generation: int | None) -> dict[str, Any]:
    """A pod to create, stamped with the TrainJob generation it is created for (outside its
    spec hash, which the renderer computed); other kinds and unknown generations as they
    are. A copy: the rendered object is left alone."""
    if obj.get("kind") != "Pod" or generation is None:
        return obj
    meta = obj["metadata"]
    annotations = {**(meta.get("annotations") or {}), SPEC_GENERATION_ANNOTATION: str(generation)}
    return {**obj, "metadata": {**meta, "annotations": annotations}}


def check_dashboard_if_needed(r: Reconcile) -> Done:
    """``status.dashboard`` names the Ray dashboard's Service while one is desired
    (``spec.ray.dashboard.service``); a dashboard Service no longer desired is deleted."""
    wanted = [d for d in r.desired if d.get("kind") == "Service" and role_of(d) == "dashboard"]
    for service in r.observed:
        if (
            service.get("kind") == "Service"
            and role_of(service) == "dashboard"
            and name_of(service) not in {name_of(d) for d in wanted}
            and not terminating(service)
        ):
            r.plan.delete.append(("Service", name_of(service)))
    if not wanted:
        if r.status.dashboard is not None:
            r.status.dashboard = None
        return False
    name = name_of(wanted[0])
    namespace = r.job.metadata.namespace or "default"
    port = wanted[0]["spec"]["ports"][0]["port"]
    r.status.dashboard = DashboardStatus(
        service=name,
        address=f"http://{name}.{namespace}.svc:{port}",
        port_forward=f"kubectl -n {namespace} port-forward svc/{name} {port}",
    )
    return False


def check_start_time_if_needed(r: Reconcile) -> Done:
    """``startTime`` is set when the pods of this run are first created."""
    if not r.status.start_time and any(d.get("kind") == "Pod" for d in r.desired):
        r.status.start_time = whole_seconds(r.now)
    return False


def update_cluster_status(r: Reconcile) -> Done:
    """Workers and validation pool counts, and Running (head, every worker and the driver
    up; for an elastic job, ``minWorkers`` of the workers) or Starting; a Running job with a
    worker being replaced stays Running."""
    desired_workers = sum(1 for d in r.desired if role_of(d) == "worker")
    elastic_min = r.job.spec.scaling.elastic_min_workers
    needed_workers = desired_workers if elastic_min is None else min(elastic_min, desired_workers)
    ready_workers = sum(
        1 for p in r.by_role.get("worker", []) if pod_ready(p) and not r.deleting(name_of(p))
    )
    r.status.workers = WorkersStatus(ready=ready_workers, desired=desired_workers)
    r.status.validation_pool = ValidationPoolStatus(
        replicas=sum(1 for d in r.desired if role_of(d) == "validation")
    )
    heads = r.by_role.get("head", [])
    drivers = r.by_role.get("driver", [])
    cluster_ready = (
        bool(heads)
        and all(pod_ready(p) for p in heads)
        and ready_workers >= needed_workers
        and bool(drivers)
        and pod_phase(drivers[0]) == PodPhase.RUNNING
    )
    workers = f"{ready_workers}/{desired_workers} workers ready"
    if elastic_min is not None:
        workers += f" (elastic: at least {needed_workers})"
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
    return False


def check_deadline_callbacks_if_needed(r: Reconcile) -> Done:
    """Be called back when a deadline would pass (the operator otherwise only resyncs)."""
    started = r.status.start_time
    if started is None:
        return False
    failure = r.job.spec.failure
    startup = failure.startup_deadline_seconds
    if r.status.condition_true(ConditionType.RUNNING):
        startup = None  # it applies only until the job is first Running
    for limit in (failure.active_deadline_seconds, startup):
        if limit is not None:
            r.plan.requeue_at_most((started - r.now).total_seconds() + limit + 1.0)
    return False


def check_validation_pool_step(r: Reconcile) -> Done:
    """The last step of every reconcile: the validation pool's last-demand annotation and
    scale-down callback, while the job's cluster exists
    (:func:`~trainjob_operator.reconcile.validation_pool.check_validation_pool_if_needed`);
    nothing when the caller sized no pool (:func:`plan_reconcile`)."""
    if r.pool is not None:
        check_validation_pool_if_needed(r.plan, r.pool, r.annotations or {})
    return False


# --------------------------------------------------------------------------- one handler per phase

#: The steps every active phase (Pending, Starting, Restarting) runs, in order: the current
#: attempt's cluster should exist. The first step that returns True ends the reconcile.
CLUSTER_STEPS: tuple[Step, ...] = (
    check_suspend_if_needed,
    check_stale_pods_if_needed,
    check_driver_succeeded_if_needed,
    check_disrupted_pods_if_needed,
    check_driver_failed_if_needed,
    check_head_if_needed,
    check_deadlines_if_needed,
    check_removed_pods_if_needed,
    check_worker_replacement_if_needed,
    check_spec_changes_if_needed,
    check_restart_backoff_if_needed,
    create_missing_children,
    check_dashboard_if_needed,
    check_start_time_if_needed,
    update_cluster_status,
    check_deadline_callbacks_if_needed,
)
#: Running: :data:`CLUSTER_STEPS`, and a head or driver pod that disappeared restarts it
#: (before the driver's failure is looked at: a driver that failed because its head is gone
#: is that disruption).
RUNNING_STEPS: tuple[Step, ...] = (
    *CLUSTER_STEPS[: CLUSTER_STEPS.index(check_disrupted_pods_if_needed) + 1],
    check_lost_pods_if_needed,
    *CLUSTER_STEPS[CLUSTER_STEPS.index(check_disrupted_pods_if_needed) + 1 :],
)
#: Suspended: resume (as Pending) unless ``spec.suspend``, then the steps of Pending (whose
#: first step keeps a job that is still suspended torn down).
SUSPENDED_STEPS: tuple[Step, ...] = (check_resume_if_needed, *CLUSTER_STEPS)
#: Succeeded or Failed: tear down, then the TTL.
FINISHED_STEPS: tuple[Step, ...] = (check_teardown_if_needed, check_ttl_if_needed)


def run_steps(r: Reconcile, steps: tuple[Step, ...]) -> Done:
    """Run ``steps`` in order until one ends the reconcile (returns True)."""
    return any(step(r) for step in steps)


def reconcile_pending(r: Reconcile) -> Done:
    """Pending (a new or resumed job): create the cluster of the current attempt."""
    return run_steps(r, CLUSTER_STEPS)


def reconcile_starting(r: Reconcile) -> Done:
    """Starting: the pods exist or are being created; Running once all are up."""
    return run_steps(r, CLUSTER_STEPS)


def reconcile_running(r: Reconcile) -> Done:
    """Running: as Starting, and a head or driver pod that disappeared restarts the cluster."""
    return run_steps(r, RUNNING_STEPS)


def reconcile_restarting(r: Reconcile) -> Done:
    """Restarting: the previous attempt's pods go, the next attempt's are created."""
    return run_steps(r, CLUSTER_STEPS)


def reconcile_suspended(r: Reconcile) -> Done:
    """Suspended: stay torn down while ``spec.suspend``; otherwise resume (as Pending)."""
    return run_steps(r, SUSPENDED_STEPS)


def reconcile_finished(r: Reconcile) -> Done:
    """Succeeded or Failed: tear the cluster down (keeping the driver's pod for its logs per
    ``spec.keepDriverPod``) and honour ``ttlSecondsAfterFinished``."""
    return run_steps(r, FINISHED_STEPS)


#: What a reconcile does in each phase.
PHASE_HANDLERS: dict[Phase, Callable[[Reconcile], Done]] = {
    Phase.PENDING: reconcile_pending,
    Phase.STARTING: reconcile_starting,
    Phase.RUNNING: reconcile_running,
    Phase.RESTARTING: reconcile_restarting,
    Phase.SUSPENDED: reconcile_suspended,
    Phase.SUCCEEDED: reconcile_finished,
    Phase.FAILED: reconcile_finished,
}


# --------------------------------------------------------------------------- one reconcile


def run_reconcile(r: Reconcile) -> Plan:
    """The whole state machine for one reconcile: the Created step, the phase's handler
    (:data:`PHASE_HANDLERS`), then the validation pool's step; returns the plan, whose status
    has the kstatus conditions of its phase
    (:meth:`~trainjob_operator.api.status.TrainJobStatus.set_summary_conditions`)."""
    check_created_if_needed(r)
    PHASE_HANDLERS[r.phase](r)
    check_validation_pool_step(r)
    r.status.set_summary_conditions(r.generation, r.now)
    return r.plan


def plan_reconcile(
    job: TrainJob,
    status: StatusInput | None,
    observed: list[dict[str, Any]],
    desired: list[dict[str, Any]],
    now: dt.datetime,
    generation: int | None = None,
) -> Plan:
    """Decide creates, deletes, status and events for one TrainJob from children a caller
    rendered (no validation pool decision: see :func:`plan_trainjob`).

    ``status``: the TrainJob's current status (the model, or its camelCase dict; not
    changed). ``observed``: its children as read from the API. ``desired``: the children
    rendered for the current attempt (``status.restarts``) and validation pool size.
    """
    return run_reconcile(Reconcile.start(job, status, observed, desired, now, generation))


def plan_invalid_spec(
    status: Mapping[str, Any] | None, message: str, generation: int | None, now: dt.datetime
) -> Plan:
    """Fail a TrainJob whose spec cannot be parsed or rendered (no retry can fix it):
    ``InvalidSpec``, once (a job already Failed keeps its failure); its pods are left alone.
    ``observedGeneration`` is ``generation``, as on every status the operator writes."""
    raw = dict(status or {})
    try:
        new = TrainJobStatus.model_validate(raw)
    except ValidationError:  # the status itself is what does not parse: start from nothing
        new = TrainJobStatus()
    plan = Plan(new_status=new, observed_status=operator_keys(raw))
    if generation is not None:
        new.observed_generation = generation
    if new.phase != Phase.FAILED:
        check_transition(new.phase, Phase.FAILED)
        message = message[:INVALID_SPEC_MESSAGE_LIMIT]
        new.phase = Phase.FAILED
        new.message = message
        new.completion_time = whole_seconds(now)
        new.set_condition(ConditionType.FAILED, True, Reason.INVALID_SPEC, message, generation, now)
        plan.events.append(Event(EventType.WARNING, Reason.INVALID_SPEC, message))
    new.set_summary_conditions(generation, now)
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
    """One reconcile's whole decision: start it (:meth:`Reconcile.start` sizes the validation
    pool), render the children of the current attempt for that size (``render`` is pure) and
    run the state machine (:func:`run_reconcile`). A spec that does not render fails the
    job."""
    r = Reconcile.start(job, status, observed, [], now, generation, annotations=annotations)
    replicas = r.pool.replicas if r.pool is not None else 0  # sized: annotations given
    try:
        r.desired = render(job, uid, r.attempt, replicas)
    except ValueError as exc:  # e.g. spec.podTemplate.<key>: unknown key
        raw = status if isinstance(status, Mapping) else status_dict(read_status(status))
        return plan_invalid_spec(raw, str(exc), generation, now)
    return run_reconcile(r)
