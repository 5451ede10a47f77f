"""Pure reconcile planning: phases, restarts, suspend, TTL, deadlines, validation scaling."""

from __future__ import annotations

import copy
import datetime as dt
from typing import Any

import pytest

from trainjob_operator.api import TrainJob, TrainJobStatus, parse_trainjob
from trainjob_operator.constants import LAST_DEMAND_ANNOTATION
from trainjob_operator.reconcile.failure_rules import keep_driver_pod
from trainjob_operator.reconcile.plan import Plan
from trainjob_operator.reconcile.pods import (
    TERMINATION_MESSAGE_LIMIT,
    container_termination,
    name_of,
)
from trainjob_operator.reconcile.state_machine import NOTHING_TO_SAVE_GRACE_SECONDS, plan_reconcile
from trainjob_operator.reconcile.validation_pool import (
    validation_replicas,
    validation_scale_down_in,
)

NOW = dt.datetime(2026, 12, 1, 12, 0, 0, tzinfo=dt.UTC)


def _job(**spec: Any) -> TrainJob:
    base: dict[str, Any] = {
        "apiVersion": "trainjob.dev/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "tj", "namespace": "ns"},
        "spec": {
            "entrypoint": "pkg.mod:train",
            "scaling": {"numWorkers": 2},
            "validation": {
                "entrypoint": "pkg.mod:validate",
                "pool": {"minReplicas": 0, "maxReplicas": 3, "idleSeconds": 60},
            },
        },
    }
    base["spec"].update(spec)
    return parse_trainjob(base)


def _pod(
    name: str, role: str, attempt: int = 0, phase: str = "Pending", ready: bool = False
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if ready:
        status["conditions"] = [{"type": "Ready", "status": "True"}]
    return {
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {"trainjob.dev/role": role, "trainjob.dev/attempt": str(attempt)},
        },
        "status": status,
    }


def _desired(attempt: int = 0, validation: int = 0) -> list[dict[str, Any]]:
    pods = [
        _pod("tj-head", "head", attempt),
        _pod("tj-w0", "worker", attempt),
        _pod("tj-w1", "worker", attempt),
        _pod("tj-driver", "driver", attempt),
    ]
    pods += [_pod(f"tj-val-{i}", "validation", attempt) for i in range(validation)]
    return pods


def _running(attempt: int = 0) -> list[dict[str, Any]]:
    return [
        _pod(
            p["metadata"]["name"],
            p["metadata"]["labels"]["trainjob.dev/role"],
            attempt,
            "Running",
            True,
        )
        for p in _desired(attempt)
    ]


def _names(objs: list[dict[str, Any]]) -> list[str]:
    return sorted(o["metadata"]["name"] for o in objs)


def test_new_job_creates_every_child_and_is_starting() -> None:
    plan = plan_reconcile(_job(), {}, [], _desired(), NOW, generation=1)
    assert _names(plan.create) == ["tj-driver", "tj-head", "tj-w0", "tj-w1"]
    assert plan.status["phase"] == "Starting"
    assert plan.status["observedGeneration"] == 1
    conditions = {c["type"]: c["status"] for c in plan.status["conditions"]}
    assert conditions == {
        "Created": "True",
        "Ready": "False",
        "Reconciling": "True",
        "Stalled": "False",
    }
    # One Event per create: the first phase is in the Created Event's message.
    assert [(e.type, e.reason) for e in plan.events] == [("Normal", "Created")]
    assert plan.events[0].message == (
        "TrainJob accepted; Starting: waiting for pods: 0/2 workers ready"
    )
    # A later reconcile of the same job posts no second Created Event.
    started = plan_reconcile(_job(), plan.status, _desired(), _desired(), NOW, generation=1)
    assert "Created" not in [e.reason for e in started.events]


def test_replanning_with_everything_present_creates_nothing() -> None:
    first = plan_reconcile(_job(), {}, [], _desired(), NOW)
    again = plan_reconcile(_job(), first.status, _desired(), _desired(), NOW)
    assert again.create == [] and again.delete == []  # idempotent: no duplicates


def test_all_ready_is_running_with_start_time_and_condition() -> None:
    plan = plan_reconcile(_job(), {"phase": "Starting"}, _running(), _desired(), NOW)
    assert plan.status["phase"] == "Running"
    assert plan.status["startTime"] == "2026-12-01T12:00:00Z"
    assert plan.status["workers"] == {"ready": 2, "desired": 2}
    running = next(c for c in plan.status["conditions"] if c["type"] == "Running")
    assert running["status"] == "True" and running["reason"] == "ClusterReady"


def test_driver_success_finishes_and_tears_down_but_keeps_the_driver_pod() -> None:
    observed = _running()
    observed[-1]["status"]["phase"] = "Succeeded"
    plan = plan_reconcile(_job(), {"phase": "Running"}, observed, _desired(), NOW)
    assert plan.status["phase"] == "Succeeded"
    assert plan.status["completionTime"] == "2026-12-01T12:00:00Z"
    assert sorted(n for _, n in plan.delete) == ["tj-head", "tj-w0", "tj-w1"]
    assert plan.create == []


def test_failed_worker_is_replaced_under_the_same_name() -> None:
    observed = _running()
    observed[1]["status"]["phase"] = "Failed"
    plan = plan_reconcile(_job(), {"phase": "Running"}, observed, _desired(), NOW)
    assert plan.delete == [("Pod", "tj-w0")]
    assert plan.status["phase"] == "Running" and plan.status["workers"]["ready"] == 1
    assert "WorkerPodLost" in [e.reason for e in plan.events]
    gone = [p for p in observed if p["metadata"]["name"] != "tj-w0"]
    later = plan_reconcile(_job(), plan.status, gone, _desired(), NOW)
    assert _names(later.create) == ["tj-w0"]


def test_driver_failure_restarts_the_whole_cluster_until_max_restarts() -> None:
    job = _job(failure={"maxRestarts": 1})
    observed = _running()
    observed[-1]["status"]["phase"] = "Failed"
    plan = plan_reconcile(job, {"phase": "Running", "restarts": 0}, observed, _desired(), NOW)
    assert plan.status["phase"] == "Restarting" and plan.status["restarts"] == 1
    assert sorted(n for _, n in plan.delete) == _names(observed)
    assert plan.status["nextAttemptTime"] == "2026-12-01T12:00:10Z"  # the default back-off
    # Next attempt, after the back-off: old pods are stale, new attempt's pods get created.
    waiting = plan_reconcile(job, plan.status, [], _desired(attempt=1), NOW)
    assert waiting.create == [] and waiting.status["phase"] == "Restarting"
    later = NOW + dt.timedelta(seconds=10)
    plan2 = plan_reconcile(job, plan.status, [], _desired(attempt=1), later)
    assert _names(plan2.create) == _names(_desired(1))
    assert plan2.status["nextAttemptTime"] is None
    failed_again = _running(attempt=1)
    failed_again[-1]["status"]["phase"] = "Failed"
    plan3 = plan_reconcile(
        job, {**plan2.status, "phase": "Running"}, failed_again, _desired(1), NOW
    )
    assert plan3.status["phase"] == "Failed"
    assert "maxRestarts=1 exhausted" in plan3.status["message"]


def test_pods_of_an_earlier_attempt_are_deleted_the_driver_first() -> None:
    """While the old attempt's head is up, its running driver goes first, with its own grace
    period (its SIGTERM lets it commit what it can and exit 3); the head and workers once it
    ended, or at once when the head is already gone or going: then nothing more can be
    committed, and each gets NOTHING_TO_SAVE_GRACE_SECONDS instead of its own grace period
    (a worker's drain would wait all of it, and the next attempt's pods wait for them)."""
    restarting = {"phase": "Restarting", "restarts": 1}
    plan = plan_reconcile(_job(), restarting, _running(0), _desired(1), NOW)
    assert [n for _, n in plan.delete] == ["tj-driver"] and plan.create == []
    assert plan.delete_grace_seconds == {}
    assert plan.requeue_after == 1.0
    ending = _running(0)
    ending[-1]["metadata"]["deletionTimestamp"] = "2026-12-01T11:59:59Z"
    plan = plan_reconcile(_job(), restarting, ending, _desired(1), NOW)
    assert plan.delete == []  # the driver is still committing
    ending[-1]["status"]["phase"] = "Failed"
    plan = plan_reconcile(_job(), restarting, ending, _desired(1), NOW)
    nothing_to_save = ["tj-head", "tj-w0", "tj-w1"]
    assert sorted(n for _, n in plan.delete) == nothing_to_save
    assert plan.delete_grace_seconds == dict.fromkeys(
        nothing_to_save, NOTHING_TO_SAVE_GRACE_SECONDS
    )
    without_driver = _running(0)[:-1]
    plan = plan_reconcile(_job(), restarting, without_driver, _desired(1), NOW)
    assert sorted(n for _, n in plan.delete) == nothing_to_save
    assert set(plan.delete_grace_seconds) == set(nothing_to_save)
    head_going = _running(0)
    head_going[0]["metadata"]["deletionTimestamp"] = "2026-12-01T11:59:59Z"
    plan = plan_reconcile(_job(), restarting, head_going, _desired(1), NOW)
    assert sorted(n for _, n in plan.delete) == ["tj-driver", "tj-w0", "tj-w1"]
    assert set(plan.delete_grace_seconds) == {"tj-driver", "tj-w0", "tj-w1"}


def test_suspend_tears_down_and_resume_recreates() -> None:
    plan = plan_reconcile(_job(suspend=True), {"phase": "Running"}, _running(), _desired(), NOW)
    assert plan.status["phase"] == "Suspended"
    assert plan.delete == [("Pod", "tj-driver")] and plan.create == []  # the driver first
    rest = [p for p in _running() if p["metadata"]["name"] != "tj-driver"]
    later = plan_reconcile(_job(suspend=True), plan.status, rest, _desired(), NOW)
    assert len(later.delete) == 3 and later.create == []
    resumed = plan_reconcile(_job(), plan.status, [], _desired(), NOW)
    assert resumed.status["phase"] == "Starting"
    assert len(resumed.create) == 4
    suspended = next(c for c in resumed.status["conditions"] if c["type"] == "Suspended")
    assert suspended["status"] == "False"


def test_ttl_after_finished() -> None:
    job = _job(ttlSecondsAfterFinished=30)
    status = {"phase": "Succeeded", "completionTime": "2026-12-01T11:59:50Z"}
    early = plan_reconcile(job, status, [], [], NOW)
    assert not early.delete_trainjob and early.requeue_after == pytest.approx(20)
    late = plan_reconcile(job, status, [], [], NOW + dt.timedelta(seconds=25))
    assert late.delete_trainjob


def test_deadlines() -> None:
    job = _job(failure={"activeDeadlineSeconds": 60, "startupDeadlineSeconds": 30})
    status = {"phase": "Running", "startTime": "2026-12-01T11:58:00Z"}
    plan = plan_reconcile(job, status, _running(), _desired(), NOW)
    assert plan.status["phase"] == "Failed" and "activeDeadlineSeconds=60" in plan.status["message"]
    start = plan_reconcile(job, {}, [], _desired(), NOW - dt.timedelta(seconds=40))
    stuck = plan_reconcile(job, copy.deepcopy(start.status), _desired(), _desired(), NOW)
    assert stuck.status["phase"] == "Failed"
    assert (
        next(c for c in stuck.status["conditions"] if c["type"] == "Failed")["reason"]
        == "StartupDeadlineExceeded"
    )


def test_deadlines_ask_to_be_reconciled_when_they_would_pass() -> None:
    job = _job(failure={"activeDeadlineSeconds": 600, "startupDeadlineSeconds": 30})
    start = plan_reconcile(job, {}, [], _desired(), NOW)
    assert start.status["startTime"] == "2026-12-01T12:00:00Z"
    assert start.requeue_after == pytest.approx(31)  # the startup deadline, plus a second
    starting = plan_reconcile(
        job, copy.deepcopy(start.status), _desired(), _desired(), NOW + dt.timedelta(seconds=10)
    )
    assert starting.requeue_after == pytest.approx(21)
    running = plan_reconcile(
        job, copy.deepcopy(start.status), _running(), _desired(), NOW + dt.timedelta(seconds=10)
    )
    assert running.status["phase"] == "Running"
    assert running.requeue_after == pytest.approx(591)  # only the active deadline is left
    nothing_due = plan_reconcile(_job(), {}, [], _desired(), NOW)
    assert nothing_due.requeue_after is None  # no deadline: changes and resyncs only


def test_requeue_at_most_keeps_the_earliest_request() -> None:
    plan = Plan(TrainJobStatus())
    plan.requeue_at_most(30)
    plan.requeue_at_most(5)
    plan.requeue_at_most(12)
    assert plan.requeue_after == 5
    plan.requeue_at_most(-3)
    assert plan.requeue_after == 0


def _validation_job(**pool: Any) -> TrainJob:
    settings = {"minReplicas": 0, "maxReplicas": 3, "idleSeconds": 60, **pool}
    return _job(validation={"entrypoint": "pkg.mod:validate", "maxConcurrent": 3, "pool": settings})


def test_validation_pool_follows_demand_then_idles_back_to_min() -> None:
    job = _validation_job()
    busy = {"validations": {"pending": 5, "running": 1}}
    replicas, stamp = validation_replicas(job, busy, {}, NOW)
    assert replicas == 3 and stamp == "2026-12-01T12:00:00Z"  # capped at maxReplicas
    idle = {"validations": {"pending": 0, "running": 0}, "validationPool": {"replicas": 3}}
    soon = NOW + dt.timedelta(seconds=30)
    assert validation_replicas(job, idle, {LAST_DEMAND_ANNOTATION: stamp}, soon)[0] == 3
    later = NOW + dt.timedelta(seconds=61)
    assert validation_replicas(job, idle, {LAST_DEMAND_ANNOTATION: stamp}, later)[0] == 0


def test_scaled_down_validation_pods_are_deleted() -> None:
    observed = [
        *_running(),
        _pod("tj-val-0", "validation", 0, "Running", True),
        _pod("tj-val-1", "validation", 0, "Running", True),
    ]
    plan = plan_reconcile(_job(), {"phase": "Running"}, observed, _desired(validation=1), NOW)
    assert plan.delete == [("Pod", "tj-val-1")]
    assert plan.status["validationPool"] == {"replicas": 1}


def _with_hash(pods: list[dict[str, Any]], value: str) -> list[dict[str, Any]]:
    for pod in pods:
        pod["metadata"]["annotations"] = {"trainjob.dev/spec-hash": value}
    return pods


def test_changed_pod_spec_replaces_the_pod() -> None:
    observed = _with_hash(_running(), "old")
    desired = _with_hash(_desired(), "old")
    desired[1]["metadata"]["annotations"]["trainjob.dev/spec-hash"] = "new"  # tj-w0 changed
    plan = plan_reconcile(_job(), {"phase": "Running"}, observed, desired, NOW)
    assert plan.delete == [("Pod", "tj-w0")]
    assert "SpecChanged" in [e.reason for e in plan.events]
    same = plan_reconcile(
        _job(), {"phase": "Running"}, observed, _with_hash(_desired(), "old"), NOW
    )
    assert same.delete == []


def test_an_operator_upgrade_alone_replaces_no_pod_and_the_next_spec_change_does() -> None:
    """A new operator build may render pods differently (another env var, label...): their
    spec hash changes although the TrainJob's spec did not. KubeRay does not restart
    clusters on its upgrades, and neither does this operator: a pod is replaced only when
    the TrainJob's generation moved since the pod was created (stamped on it at creation;
    for a pod of a build that did not stamp it, since the last reconcile planned)."""
    rendered = _desired()
    created = plan_reconcile(_job(), {"phase": "Pending"}, [], rendered, NOW, generation=4)
    stamped = [p["metadata"]["annotations"] for p in created.create if p["kind"] == "Pod"]
    assert len(stamped) == 4
    assert all(a["trainjob.dev/spec-generation"] == "4" for a in stamped)
    # the rendered objects are left as they were (the stamp is not in the spec hash)
    assert all("trainjob.dev/spec-generation" not in a for a in _metadata_annotations(rendered))

    running = {"phase": "Running", "observedGeneration": 4}
    observed = _with_hash(_running(), "old")
    for pod in observed:
        pod["metadata"]["annotations"]["trainjob.dev/spec-generation"] = "4"
    upgraded = _with_hash(_desired(), "new")  # every pod renders differently now
    assert plan_reconcile(_job(), running, observed, upgraded, NOW, generation=4).delete == []
    changed = plan_reconcile(_job(), running, observed, upgraded, NOW, generation=5)
    assert len(changed.delete) == 4 and "SpecChanged" in [e.reason for e in changed.events]

    legacy = _with_hash(_running(), "old")  # created by a build that stamped no generation
    assert plan_reconcile(_job(), running, legacy, upgraded, NOW, generation=4).delete == []
    assert len(plan_reconcile(_job(), running, legacy, upgraded, NOW, generation=5).delete) == 4


def _metadata_annotations(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o["metadata"].get("annotations") or {} for o in objs]


# --------------------------------------------------------------------------- validation pool


def _demand(pending: int, running: int, replicas: int) -> dict[str, Any]:
    return {
        "validations": {"pending": pending, "running": running},
        "validationPool": {"replicas": replicas},
    }


def test_validation_pool_scales_up_at_once_capped_by_max_concurrent() -> None:
    job = _job(
        validation={
            "entrypoint": "pkg.mod:validate",
            "maxConcurrent": 2,
            "pool": {"minReplicas": 0, "maxReplicas": 5},
        }
    )
    assert validation_replicas(job, _demand(1, 0, 0), {}, NOW)[0] == 1
    assert validation_replicas(job, _demand(4, 0, 1), {}, NOW)[0] == 2  # maxConcurrent
    assert validation_replicas(job, _demand(0, 7, 2), {}, NOW)[0] == 2


def test_validation_pool_never_shrinks_while_a_validation_is_pending_or_running() -> None:
    job = _validation_job()
    # val-0 and val-1 each ran a validation; val-0's finished first: the pool holds at 2,
    # so val-1 (the highest number, the one a scale-down deletes) keeps running its validation.
    replicas, stamp = validation_replicas(job, _demand(0, 1, 2), {}, NOW)
    assert replicas == 2 and stamp == "2026-12-01T12:00:00Z"
    replicas, _ = validation_replicas(job, _demand(1, 0, 2), {}, NOW)
    assert replicas == 2
    later = NOW + dt.timedelta(hours=1)  # long-running: still held, idleSeconds is about idling
    assert (
        validation_replicas(job, _demand(0, 1, 2), {LAST_DEMAND_ANNOTATION: stamp}, later)[0] == 2
    )
    observed = [
        *_running(),
        _pod("tj-val-0", "validation", 0, "Running", True),
        _pod("tj-val-1", "validation", 0, "Running", True),
    ]
    plan = plan_reconcile(
        job, {"phase": "Running", **_demand(0, 1, 2)}, observed, _desired(validation=2), NOW
    )
    assert plan.delete == [] and plan.status["validationPool"] == {"replicas": 2}


def test_validation_pool_goes_to_min_replicas_after_idle_seconds_without_demand() -> None:
    job = _validation_job(minReplicas=1, idleSeconds=30)
    stamp = validation_replicas(job, _demand(0, 2, 3), {}, NOW)[1]
    assert stamp is not None
    idle = {LAST_DEMAND_ANNOTATION: stamp}
    assert validation_replicas(job, _demand(0, 0, 3), idle, NOW + dt.timedelta(seconds=29)) == (
        3,
        stamp,
    )
    assert validation_replicas(job, _demand(0, 0, 3), idle, NOW + dt.timedelta(seconds=31)) == (
        1,
        stamp,
    )
    assert validation_replicas(job, {}, {}, NOW)[0] == 1  # never below minReplicas


def test_validation_scale_down_in_tells_when_an_idle_pool_shrinks() -> None:
    job = _validation_job(minReplicas=1, idleSeconds=30)
    stamp = validation_replicas(job, _demand(0, 2, 3), {}, NOW)[1]
    assert stamp is not None
    idle = {LAST_DEMAND_ANNOTATION: stamp}
    later = NOW + dt.timedelta(seconds=12)
    assert validation_scale_down_in(job, _demand(0, 0, 3), idle, later) == pytest.approx(18)
    assert validation_scale_down_in(job, _demand(1, 0, 3), idle, later) is None  # busy
    assert validation_scale_down_in(job, _demand(0, 0, 1), idle, later) is None  # at minimum
    assert validation_scale_down_in(_job(validation=None), {}, idle, later) is None


def test_validation_pool_respects_a_lowered_max_replicas() -> None:
    job = _validation_job(maxReplicas=1)
    assert validation_replicas(job, _demand(0, 2, 3), {}, NOW)[0] == 1
    assert validation_replicas(job, _demand(0, 0, 3), {}, NOW)[0] == 0
    assert validation_replicas(_job(validation=None), _demand(3, 0, 0), {}, NOW) == (0, None)


# --------------------------------------------------------------------------- startTime, deadlines


def test_start_time_is_set_when_pods_are_created_and_the_deadline_counts_in_starting() -> None:
    job = _job(failure={"activeDeadlineSeconds": 60})
    first = plan_reconcile(job, {}, [], _desired(), NOW - dt.timedelta(seconds=61))
    assert first.status["phase"] == "Starting"
    assert first.status["startTime"] == "2026-12-01T11:58:59Z"
    still = plan_reconcile(
        job, copy.deepcopy(first.status), _desired(), _desired(), NOW - dt.timedelta(seconds=5)
    )
    assert still.status["phase"] == "Starting"
    stuck = plan_reconcile(job, copy.deepcopy(still.status), _desired(), _desired(), NOW)
    assert stuck.status["phase"] == "Failed"
    failed = next(c for c in stuck.status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "DeadlineExceeded"
    assert sorted(n for _, n in stuck.delete) == ["tj-head", "tj-w0", "tj-w1"]  # driver kept


def test_start_time_survives_restarts_and_running() -> None:
    status = {"phase": "Starting", "startTime": "2026-12-01T11:00:00Z"}
    running = plan_reconcile(_job(), status, _running(), _desired(), NOW)
    assert running.status["phase"] == "Running"
    assert running.status["startTime"] == "2026-12-01T11:00:00Z"
    observed = _running()
    observed[-1]["status"]["phase"] = "Failed"
    restart = plan_reconcile(
        _job(failure={"maxRestarts": 1}), running.status, observed, _desired(), NOW
    )
    assert restart.status["phase"] == "Restarting"
    assert restart.status["startTime"] == "2026-12-01T11:00:00Z"


def test_suspended_time_does_not_count_towards_the_deadline() -> None:
    job = _job(failure={"activeDeadlineSeconds": 60})
    status = {"phase": "Running", "startTime": "2026-12-01T11:59:30Z"}
    suspended = plan_reconcile(
        _job(suspend=True, failure={"activeDeadlineSeconds": 60}), status, _running(), [], NOW
    )
    assert suspended.status["startTime"] is None  # merge patch: removed
    resumed_at = NOW + dt.timedelta(hours=2)
    resumed = plan_reconcile(job, copy.deepcopy(suspended.status), [], _desired(), resumed_at)
    assert resumed.status["phase"] == "Starting"
    assert resumed.status["startTime"] == "2026-12-01T14:00:00Z"
    soon = resumed_at + dt.timedelta(seconds=30)
    later = plan_reconcile(job, copy.deepcopy(resumed.status), _running(), _desired(), soon)
    assert later.status["phase"] == "Running"


def test_startup_deadline_counts_from_start_time_until_running() -> None:
    job = _job(failure={"startupDeadlineSeconds": 30})
    status = {"phase": "Starting", "startTime": "2026-12-01T11:59:00Z"}
    stuck = plan_reconcile(job, status, _desired(), _desired(), NOW)
    assert stuck.status["phase"] == "Failed"
    was_running = {
        "phase": "Starting",
        "startTime": "2026-12-01T11:00:00Z",
        "conditions": [
            {
                "type": "Running",
                "status": "True",
                "reason": "ClusterReady",
                "message": "",
                "lastTransitionTime": "2026-12-01T11:00:30Z",
            }
        ],
    }
    assert plan_reconcile(job, was_running, _desired(), _desired(), NOW).status["phase"] == (
        "Starting"
    )


SCHEDULER_MESSAGE = (
    "0/12 nodes are available: 10 node(s) didn't match Pod's node affinity, 2 node(s) had "
    "taint {cloud.google.com/gke-spot: true}, that the pod didn't tolerate."
)


def _unschedulable(pod: dict[str, Any], message: str = SCHEDULER_MESSAGE) -> dict[str, Any]:
    pod["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
    ]
    return pod


def _startup_failure(observed: list[dict[str, Any]]) -> dict[str, Any]:
    job = _job(failure={"startupDeadlineSeconds": 30})
    status = {"phase": "Starting", "startTime": "2026-12-01T11:59:00Z"}
    plan = plan_reconcile(job, status, observed, _desired(), NOW)
    assert plan.status["phase"] == "Failed"
    failed = next(c for c in plan.status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "StartupDeadlineExceeded"
    assert plan.status["message"] == failed["message"]
    return dict(failed)


def test_startup_deadline_names_the_pods_the_scheduler_could_not_place() -> None:
    observed = _desired()
    _unschedulable(observed[1])
    _unschedulable(observed[2])
    _unschedulable(observed[3], "0/12 nodes are available: 12 Insufficient cpu.")
    failed = _startup_failure(observed)
    assert failed["message"] == (
        "not Running within startupDeadlineSeconds=30: "
        "pod tj-driver Unschedulable: 0/12 nodes are available: 12 Insufficient cpu.; "
        f"pod tj-w0, tj-w1 Unschedulable: {SCHEDULER_MESSAGE}"
    )


def test_startup_deadline_lists_a_few_pods_per_cause() -> None:
    observed = [_unschedulable(_pod(f"tj-s0-h{i}", "worker")) for i in range(8)]
    failed = _startup_failure(observed)
    assert failed["message"] == (
        "not Running within startupDeadlineSeconds=30: pod tj-s0-h0, tj-s0-h1, tj-s0-h2 "
        f"and 5 more Unschedulable: {SCHEDULER_MESSAGE}"
    )


def test_startup_deadline_names_containers_that_cannot_start() -> None:
    observed = _desired()
    observed[0]["status"]["containerStatuses"] = [
        {
            "name": "ray-head",
            "state": {
                "waiting": {
                    "reason": "ImagePullBackOff",
                    "message": 'Back-off pulling image "example.invalid/x:1"',
                }
            },
        }
    ]
    observed[1]["status"]["containerStatuses"] = [
        {"name": "ray-worker", "state": {"waiting": {"reason": "ContainerCreating"}}}
    ]
    failed = _startup_failure(observed)
    assert failed["message"] == (
        "not Running within startupDeadlineSeconds=30: container tj-head/ray-head waiting: "
        'ImagePullBackOff: Back-off pulling image "example.invalid/x:1"'
    )


def test_startup_deadline_names_both_unplaced_pods_and_images_that_cannot_be_pulled() -> None:
    observed = _desired()
    observed[0]["status"]["containerStatuses"] = [
        {"name": "ray-head", "state": {"waiting": {"reason": "ErrImagePull"}}}
    ]
    _unschedulable(observed[2], "0/1 nodes are available: 1 Insufficient cpu.")
    failed = _startup_failure(observed)
    assert failed["message"] == (
        "not Running within startupDeadlineSeconds=30: "
        "pod tj-w1 Unschedulable: 0/1 nodes are available: 1 Insufficient cpu.; "
        "container tj-head/ray-head waiting: ErrImagePull"
    )


def test_startup_deadline_without_a_known_cause_and_pods_being_deleted() -> None:
    observed = _desired()
    _unschedulable(observed[1])["metadata"]["deletionTimestamp"] = "2026-12-01T11:59:59Z"
    failed = _startup_failure(observed)
    assert failed["message"] == "not Running within startupDeadlineSeconds=30"


def test_startup_deadline_message_is_bounded() -> None:
    observed = [
        _unschedulable(_pod(f"tj-s0-h{i}", "worker"), f"{i}: " + "x" * 500) for i in range(8)
    ]
    failed = _startup_failure(observed)
    assert len(failed["message"]) == 2000


# --------------------------------------------------------------------------- driver exit status


def _terminated(
    pod: dict[str, Any], exit_code: int, reason: str, message: str, container: str = "driver"
) -> dict[str, Any]:
    pod["status"]["phase"] = "Failed"
    pod["status"]["containerStatuses"] = [
        {
            "name": container,
            "state": {"terminated": {"exitCode": exit_code, "reason": reason, "message": message}},
        }
    ]
    return pod


def test_driver_exit_code_2_fails_at_once_with_its_message() -> None:
    job = _job(failure={"maxRestarts": 3})
    observed = _running()
    _terminated(observed[-1], 2, "Error", "invalid TrainJob: spec.config.lr: must be > 0")
    plan = plan_reconcile(job, {"phase": "Running", "restarts": 0}, observed, _desired(), NOW)
    assert plan.status["phase"] == "Failed" and plan.status["restarts"] == 0
    failed = next(c for c in plan.status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "InvalidInput"
    assert "spec.config.lr: must be > 0" in failed["message"]
    assert "exit code 2" in failed["message"]
    assert [e.reason for e in plan.events] == ["Created", "InvalidInput"]
    assert "spec.config.lr" in plan.events[-1].message


def test_other_driver_failures_restart_with_the_container_termination() -> None:
    job = _job(failure={"maxRestarts": 1})
    observed = _running()
    _terminated(observed[-1], 137, "OOMKilled", "")
    plan = plan_reconcile(job, {"phase": "Running", "restarts": 0}, observed, _desired(), NOW)
    assert plan.status["phase"] == "Restarting" and plan.status["restarts"] == 1
    restarting = next(c for c in plan.status["conditions"] if c["type"] == "Restarting")
    assert "OOMKilled, exit code 137" in restarting["message"]
    assert any("OOMKilled" in e.message for e in plan.events if e.reason == "DriverFailed")

    tail = "x" * 5000 + "ZeroDivisionError: division by zero"
    observed = _running(attempt=1)
    _terminated(observed[-1], 1, "Error", tail)
    exhausted = plan_reconcile(job, {"phase": "Running", "restarts": 1}, observed, _desired(1), NOW)
    assert exhausted.status["phase"] == "Failed"
    message = exhausted.status["message"]
    assert "ZeroDivisionError: division by zero" in message  # the log tail is kept
    assert "maxRestarts=1 exhausted" in message
    assert len(message) < TERMINATION_MESSAGE_LIMIT + 300


def test_container_termination_reads_state_or_last_state() -> None:
    pod = _pod("p", "head")
    assert container_termination(pod) is None
    pod["status"]["containerStatuses"] = [
        {"name": "ray-head", "state": {"running": {}}},
        {"name": "sidecar", "lastState": {"terminated": {"exitCode": 143}}},
    ]
    term = container_termination(pod)
    assert term is not None and term.container == "sidecar" and term.exit_code == 143
    assert term.describe() == "container 'sidecar' exit code 143"
    assert container_termination(pod, "ray-head") is None


def test_head_and_worker_failures_carry_the_container_termination() -> None:
    observed = _running()
    _terminated(observed[0], 137, "OOMKilled", "", container="ray-head")
    plan = plan_reconcile(
        _job(failure={"maxRestarts": 1}), {"phase": "Running"}, observed, _desired(), NOW
    )
    assert plan.status["phase"] == "Restarting"
    assert "OOMKilled" in plan.status["message"]
    observed = _running()
    _terminated(observed[1], 1, "Error", "Traceback ... RuntimeError: boom", container="ray-worker")
    plan = plan_reconcile(_job(), {"phase": "Running"}, observed, _desired(), NOW)
    lost = next(e for e in plan.events if e.reason == "WorkerPodLost")
    assert "RuntimeError: boom" in lost.message
    # The Event names the node the pod ran on (a lost node shows as the same node each time).
    observed[1].setdefault("spec", {})["nodeName"] = "node-b"
    plan = plan_reconcile(_job(), {"phase": "Running"}, observed, _desired(), NOW)
    lost = next(e for e in plan.events if e.reason == "WorkerPodLost")
    assert lost.message.startswith(f"pod {observed[1]['metadata']['name']} on node node-b failed")


# --------------------------------------------------------------------------- keepDriverPod


@pytest.mark.parametrize(
    ("policy", "phase", "keep"),
    [
        ("Always", "Succeeded", True),
        ("Always", "Failed", True),
        ("OnFailure", "Succeeded", False),
        ("OnFailure", "Failed", True),
        ("Never", "Succeeded", False),
        ("Never", "Failed", False),
    ],
)
def test_keep_driver_pod_policy(policy: str, phase: str, keep: bool) -> None:
    assert keep_driver_pod(policy, phase) is keep
    job = _job(keepDriverPod=policy)
    observed = _running()
    if phase == "Succeeded":
        observed[-1]["status"]["phase"] = "Succeeded"
        plan: Plan = plan_reconcile(job, {"phase": "Running"}, observed, _desired(), NOW)
    else:
        _terminated(observed[-1], 2, "Error", "bad input")
        plan = plan_reconcile(job, {"phase": "Running"}, observed, _desired(), NOW)
    assert plan.status["phase"] == phase
    deleted = {n for _, n in plan.delete}
    assert ("tj-driver" not in deleted) is keep
    # Later reconciles of the finished job agree.
    again = plan_reconcile(job, plan.status, observed, [], NOW)
    assert ("tj-driver" not in {n for _, n in again.delete}) is keep


def test_a_finished_jobs_pods_get_a_short_grace_period_a_suspended_jobs_their_own() -> None:
    """Nothing is left to save once a job finished: its head and workers go in
    NOTHING_TO_SAVE_GRACE_SECONDS instead of draining for their whole grace period. A suspended
    job's driver keeps its own, to commit a last checkpoint."""
    job = _job(keepDriverPod="Never")
    observed = _running()
    observed[-1]["status"]["phase"] = "Succeeded"
    plan = plan_reconcile(job, {"phase": "Running"}, observed, _desired(), NOW)
    assert plan.status["phase"] == "Succeeded"
    deleted = {n for _, n in plan.delete}
    assert deleted == {name_of(p) for p in observed}, plan.delete
    assert plan.delete_grace_seconds == dict.fromkeys(deleted, NOTHING_TO_SAVE_GRACE_SECONDS)
    suspended = plan_reconcile(_job(suspend=True), {"phase": "Running"}, _running(), [], NOW)
    assert suspended.delete and not suspended.delete_grace_seconds


def test_keep_driver_pod_defaults_to_always() -> None:
    assert _job().spec.keep_driver_pod == "Always"


# --------------------------------------------------------------------------- what plans read


def _decisions(plan: Plan) -> tuple[Any, ...]:
    """Everything a plan makes the operator do (its writes, Events and callbacks)."""
    return (
        plan.create,
        plan.delete,
        [(e.type, e.reason, e.message) for e in plan.events],
        plan.annotations,
        plan.delete_trainjob,
        plan.requeue_after,
        plan.status_patch(),
    )


def _observed(state: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A TrainJob's status and pods in ``state``."""
    if state == "new":
        return {}, []
    if state == "starting":
        return plan_reconcile(_job(), {}, [], _desired(), NOW, generation=1).status, _desired()
    pods = _running()
    status: dict[str, Any] = {"phase": "Running", "restarts": 0, "observedGeneration": 1}
    if state == "worker lost":
        pods[1]["status"]["phase"] = "Failed"
    elif state == "driver failed":
        pods[-1]["status"]["phase"] = "Failed"
    elif state == "driver succeeded":
        pods[-1]["status"]["phase"] = "Succeeded"
    elif state == "validating":
        status["validations"] = {"pending": 2, "running": 1, "done": 4, "failed": 0}
        status["validationPool"] = {"replicas": 1}
    return status, pods


@pytest.mark.parametrize(
    "state",
    [
        "new",
        "starting",
        "running",
        "worker lost",
        "driver failed",
        "driver succeeded",
        "validating",
    ],
)
def test_the_status_keys_no_plan_reads_change_no_plan(state: str) -> None:
    # The timer leaves these keys out of what it compares (a running driver updates its
    # progress every few seconds, and each change used to cost a reconcile): that is sound
    # only while no plan reads them.
    from trainjob_operator.reconcile.plan import UNPLANNED_STATUS_KEYS
    from trainjob_operator.reconcile.state_machine import plan_trainjob

    status, pods = _observed(state)

    def render(job: TrainJob, uid: str, attempt: int, validation: int) -> list[dict[str, Any]]:
        return _desired(attempt, validation)

    published = {
        "progress": {"step": 1234, "metrics": {"loss": 0.25}, "updatedAt": "2026-12-01T11:59:58Z"},
        "latestCheckpoint": {"path": "gs://b/run/checkpoint_000012", "step": 1200},
        "bestCheckpoint": {"path": "gs://b/run/checkpoint_000010", "step": 1000, "score": 0.2},
        "workerFailures": 3,
    }
    assert set(published) == set(UNPLANNED_STATUS_KEYS)
    job = _validation_job()
    plans = [
        plan_trainjob(job, "uid", copy.deepcopy(s), {}, copy.deepcopy(pods), render, NOW, 1)
        for s in (status, {**status, **published})
    ]
    assert _decisions(plans[0]) == _decisions(plans[1])
    # The driver's validation demand, by contrast, is read: it sizes the pool.
    if state == "running":
        busy = {**status, "validations": {"pending": 3, "running": 0, "done": 0, "failed": 0}}
        demanded = plan_trainjob(job, "uid", busy, {}, copy.deepcopy(pods), render, NOW, 1)
        assert _decisions(demanded) != _decisions(plans[0])
