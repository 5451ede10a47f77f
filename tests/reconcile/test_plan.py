"""Pure reconcile planning: phases, restarts, suspend, TTL, deadlines, validation scaling."""

from __future__ import annotations

import copy
import datetime as dt
from typing import Any

import pytest

from trainjob_operator.api.models import TrainJob, parse_trainjob
from trainjob_operator.reconcile.plan import (
    LAST_DEMAND_ANNOTATION,
    plan_reconcile,
    validation_replicas,
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
    assert {c["type"] for c in plan.status["conditions"]} == {"Created"}
    assert [e.reason for e in plan.events] == ["Created", "Starting"]


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
    # Next attempt: old pods are stale, new attempt's pods get created.
    plan2 = plan_reconcile(job, plan.status, [], _desired(attempt=1), NOW)
    assert _names(plan2.create) == _names(_desired(1))
    failed_again = _running(attempt=1)
    failed_again[-1]["status"]["phase"] = "Failed"
    plan3 = plan_reconcile(
        job, {**plan2.status, "phase": "Running"}, failed_again, _desired(1), NOW
    )
    assert plan3.status["phase"] == "Failed"
    assert "maxRestarts=1 exhausted" in plan3.status["message"]


def test_pods_of_an_earlier_attempt_are_deleted() -> None:
    plan = plan_reconcile(
        _job(), {"phase": "Restarting", "restarts": 1}, _running(0), _desired(1), NOW
    )
    assert sorted(n for _, n in plan.delete) == _names(_running(0))


def test_suspend_tears_down_and_resume_recreates() -> None:
    plan = plan_reconcile(_job(suspend=True), {"phase": "Running"}, _running(), _desired(), NOW)
    assert plan.status["phase"] == "Suspended"
    assert len(plan.delete) == 4 and plan.create == []
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


def test_validation_pool_follows_demand_then_idles_back_to_min() -> None:
    job = _job()
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
