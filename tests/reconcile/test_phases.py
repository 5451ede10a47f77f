"""The reconcile state machine piece by piece: the phase dispatch, the check_..._if_needed
steps, the whole-reconcile decision (pool size, render, annotation, callback), the one status
write, and a child the API server rejects."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from tests.reconcile.test_plan import NOW, _desired, _job, _pod, _running
from trainjob_operator.api import (
    ConditionType,
    Phase,
    Reason,
    TrainJob,
    TrainJobStatus,
)
from trainjob_operator.constants import LAST_DEMAND_ANNOTATION
from trainjob_operator.kube import ApiError
from trainjob_operator.reconcile.apply import execute_plan, reconcile_trainjob
from trainjob_operator.reconcile.plan import Plan
from trainjob_operator.reconcile.state_machine import (
    NOTHING_TO_SAVE_GRACE_SECONDS,
    PHASE_HANDLERS,
    Reconcile,
    check_deadlines_if_needed,
    check_lost_pods_if_needed,
    check_spec_changes_if_needed,
    check_stale_pods_if_needed,
    check_suspend_if_needed,
    check_ttl_if_needed,
    plan_invalid_spec,
    plan_reconcile,
    plan_trainjob,
    update_cluster_status,
)
from trainjob_operator.reconcile.validation_pool import (
    check_validation_pool_if_needed,
    plan_validation_pool,
)


def _reconcile(
    job: TrainJob,
    status: dict[str, Any],
    observed: list[dict[str, Any]] | None = None,
    desired: list[dict[str, Any]] | None = None,
    now: dt.datetime = NOW,
) -> Reconcile:
    return Reconcile.start(job, status, observed or [], desired or [], now, generation=3)


# --------------------------------------------------------------------------- dispatch, status


def test_every_phase_has_a_handler() -> None:
    assert set(PHASE_HANDLERS) == set(Phase)


def test_the_input_status_is_not_changed_and_a_model_is_accepted() -> None:
    status = {"phase": "Running", "restarts": 0, "startTime": "2026-12-01T11:00:00Z"}
    before = dict(status)
    observed = _running()
    observed[-1]["status"]["phase"] = "Succeeded"
    from_dict = plan_reconcile(_job(), status, observed, _desired(), NOW, generation=2)
    assert status == before
    model = TrainJobStatus.model_validate(status)
    from_model = plan_reconcile(_job(), model, observed, _desired(), NOW, generation=2)
    assert model.phase == Phase.RUNNING and model.completion_time is None
    assert from_model.status == from_dict.status
    assert from_dict.new_status.phase == Phase.SUCCEEDED


def test_status_patch_holds_only_operator_keys_and_is_none_when_nothing_changed() -> None:
    driver_keys = {"progress": {"step": 7}, "workerFailures": 1, "validations": {"pending": 0}}
    first = plan_reconcile(_job(), driver_keys, _running(), _desired(), NOW, generation=1)
    patch = first.status_patch()
    assert patch is not None and patch["phase"] == "Running"
    assert not set(patch) & set(driver_keys)  # the driver's keys are never written back
    again = plan_reconcile(
        _job(), {**first.status, **driver_keys}, _running(), _desired(), NOW, generation=1
    )
    assert again.status_patch() is None  # a steady state writes nothing
    newer = plan_reconcile(
        _job(), {**first.status, **driver_keys}, _running(), _desired(), NOW, generation=2
    )
    changed = newer.status_patch()
    assert changed is not None and changed["observedGeneration"] == 2


def test_set_condition_changes_the_transition_time_only_with_the_status() -> None:
    status = TrainJobStatus()
    status.set_condition(ConditionType.RUNNING, True, Reason.CLUSTER_READY, "up", None, NOW)
    later = NOW + dt.timedelta(seconds=30, microseconds=5)
    status.set_condition(ConditionType.RUNNING, True, Reason.RUNNING, "still up", 4, later)
    running = status.condition(ConditionType.RUNNING)
    assert running is not None and running.last_transition_time == NOW
    assert running.reason == Reason.RUNNING
    assert running.observed_generation == 4
    status.set_condition(ConditionType.RUNNING, False, Reason.SUSPENDED, "down", None, later)
    assert running.last_transition_time == later.replace(microsecond=0)
    assert status.condition_true(ConditionType.RUNNING) is False
    assert status.to_dict()["conditions"][0]["lastTransitionTime"] == "2026-12-01T12:00:30Z"


# --------------------------------------------------------------------------- the steps


def test_check_ttl_if_needed() -> None:
    job = _job(ttlSecondsAfterFinished=60)
    r = _reconcile(job, {"phase": "Failed", "completionTime": "2026-12-01T11:59:30Z"})
    check_ttl_if_needed(r)
    assert not r.plan.delete_trainjob and r.plan.requeue_after == pytest.approx(30)
    r = _reconcile(job, {"phase": "Failed"})  # no completionTime: nothing to count from
    check_ttl_if_needed(r)
    assert r.plan.requeue_after is None and not r.plan.delete_trainjob


def test_check_suspend_if_needed_tears_down_and_clears_only_a_set_start_time() -> None:
    assert not check_suspend_if_needed(_reconcile(_job(), {"phase": "Running"}, _running()))
    r = _reconcile(_job(suspend=True), {"phase": "Starting"}, _running())
    assert check_suspend_if_needed(r)
    # The driver first, with its own grace period to commit a last checkpoint; the rest once
    # it ended, with nothing left to save.
    assert r.status.phase == Phase.SUSPENDED and r.plan.delete == [("Pod", "tj-driver")]
    assert r.plan.delete_grace_seconds == {} and r.plan.requeue_after == 1.0
    without_driver = [p for p in _running() if p["metadata"]["name"] != "tj-driver"]
    r = _reconcile(_job(suspend=True), {"phase": "Suspended"}, without_driver)
    assert check_suspend_if_needed(r)
    assert sorted(r.plan.delete) == [("Pod", "tj-head"), ("Pod", "tj-w0"), ("Pod", "tj-w1")]
    assert set(r.plan.delete_grace_seconds.values()) == {NOTHING_TO_SAVE_GRACE_SECONDS}
    assert "startTime" not in r.plan.status  # nothing to remove
    r = _reconcile(_job(suspend=True), {"phase": "Running", "startTime": "2026-12-01T11:00:00Z"})
    check_suspend_if_needed(r)
    assert r.plan.status["startTime"] is None


def test_suspended_job_stays_suspended_without_a_new_event() -> None:
    first = plan_reconcile(_job(suspend=True), {"phase": "Running"}, _running(), [], NOW)
    again = plan_reconcile(_job(suspend=True), first.status, [], [], NOW)
    assert again.status["phase"] == "Suspended" and again.events == []
    assert again.status_patch() is None


def test_stale_pods_already_terminating_are_left_alone() -> None:
    old = _running(attempt=0)
    old[0]["metadata"]["deletionTimestamp"] = "2026-12-01T11:59:59Z"
    r = _reconcile(_job(), {"phase": "Restarting", "restarts": 1}, old, _desired(1))
    check_stale_pods_if_needed(r)
    assert sorted(n for _, n in r.plan.delete) == ["tj-driver", "tj-w0", "tj-w1"]
    assert r.current_pods == [] and r.attempt == 1


def test_lost_head_or_driver_restarts_only_a_running_job() -> None:
    without_head = [p for p in _running() if p["metadata"]["name"] != "tj-head"]
    job = _job(failure={"maxRestarts": 2})
    r = _reconcile(job, {"phase": "Running"}, without_head, _desired())
    assert check_lost_pods_if_needed(r)
    assert r.status.phase == Phase.RESTARTING and r.status.restarts == 1
    assert r.status.ignored_restarts == 1  # a disruption: not counted
    assert [e.reason for e in r.plan.events] == ["HeadDisrupted"]
    without_driver = [p for p in _running() if p["metadata"]["name"] != "tj-driver"]
    r = _reconcile(job, {"phase": "Running"}, without_driver, _desired())
    assert check_lost_pods_if_needed(r)
    assert [e.reason for e in r.plan.events] == ["DriverDisrupted"]
    starting = plan_reconcile(job, {"phase": "Starting"}, without_head, _desired(), NOW)
    assert starting.status["phase"] == "Starting"  # still being created: no restart
    assert _names_of(starting.create) == ["tj-head"]


def _names_of(objs: list[dict[str, Any]]) -> list[str]:
    return sorted(o["metadata"]["name"] for o in objs)


def test_check_deadlines_if_needed_counts_from_start_time_only() -> None:
    job = _job(failure={"activeDeadlineSeconds": 10})
    assert not check_deadlines_if_needed(_reconcile(job, {"phase": "Starting"}))
    r = _reconcile(job, {"phase": "Starting", "startTime": "2026-12-01T11:59:50Z"})
    assert not check_deadlines_if_needed(r)  # exactly at the deadline: not yet
    r = _reconcile(job, {"phase": "Starting", "startTime": "2026-12-01T11:59:49Z"})
    assert check_deadlines_if_needed(r)
    failed = r.status.condition(ConditionType.FAILED)
    assert failed is not None and failed.reason == Reason.DEADLINE_EXCEEDED
    assert failed.observed_generation == 3


def test_a_pod_being_replaced_is_not_replaced_twice() -> None:
    observed = _running()
    for pod in observed:
        pod["metadata"]["annotations"] = {"trainjob.dev/spec-hash": "old"}
    observed[1]["status"]["phase"] = "Failed"  # tj-w0 is deleted as lost already
    desired = _desired()
    for pod in desired:
        pod["metadata"]["annotations"] = {"trainjob.dev/spec-hash": "new"}
    r = _reconcile(_job(), {"phase": "Running"}, observed, desired)
    r.plan.delete.append(("Pod", "tj-w0"))
    check_spec_changes_if_needed(r)
    assert sorted(n for _, n in r.plan.delete) == [
        "tj-driver",
        "tj-head",
        "tj-w0",
        "tj-w1",
    ]


def test_update_cluster_status_keeps_a_running_job_running_while_a_worker_is_replaced() -> None:
    observed = _running()
    observed[1]["status"] = {"phase": "Pending"}
    r = _reconcile(_job(), {"phase": "Running"}, observed, _desired(validation=2))
    update_cluster_status(r)
    assert r.status.phase == Phase.RUNNING and r.plan.events == []
    assert r.status.message == "1/2 workers ready; replacing lost workers"
    assert r.plan.status["validationPool"] == {"replicas": 2}
    r = _reconcile(_job(), {"phase": "Starting"}, observed, _desired())
    update_cluster_status(r)
    assert r.status.phase == Phase.STARTING and r.plan.events == []  # no change, no Event


def test_an_elastic_job_is_running_with_min_workers_ready() -> None:
    observed = _running()
    observed[1]["status"] = {"phase": "Pending"}  # 1 of the 2 workers ready
    job = _job(scaling={"numWorkers": 2, "minWorkers": 1})
    r = _reconcile(job, {"phase": "Starting"}, observed, _desired())
    update_cluster_status(r)
    assert r.status.phase == Phase.RUNNING
    assert r.status.message == "1/2 workers ready (elastic: at least 1)"
    assert r.plan.status["workers"] == {"ready": 1, "desired": 2}
    r = _reconcile(_job(), {"phase": "Starting"}, observed, _desired())  # fixed size: waits
    update_cluster_status(r)
    assert r.status.phase == Phase.STARTING


# --------------------------------------------------------------------------- validation pool


def test_plan_validation_pool_and_its_annotation_and_callback() -> None:
    job = _job(
        validation={
            "entrypoint": "pkg.mod:validate",
            "maxConcurrent": 3,
            "pool": {"minReplicas": 0, "maxReplicas": 3, "idleSeconds": 60},
        }
    )
    busy = {"validations": {"pending": 2, "running": 0}, "validationPool": {"replicas": 1}}
    pool = plan_validation_pool(job, busy, {}, NOW)
    assert (pool.replicas, pool.last_demand, pool.scale_down_in) == (
        2,
        "2026-12-01T12:00:00Z",
        None,
    )
    plan = Plan(TrainJobStatus())
    check_validation_pool_if_needed(plan, pool, {})
    assert plan.annotations == {LAST_DEMAND_ANNOTATION: "2026-12-01T12:00:00Z"}
    assert plan.requeue_after is None
    same = Plan(TrainJobStatus())
    check_validation_pool_if_needed(same, pool, {LAST_DEMAND_ANNOTATION: pool.last_demand or ""})
    assert same.annotations == {}  # unchanged: no patch
    idle = {"validations": {"pending": 0, "running": 0}, "validationPool": {"replicas": 2}}
    stamp = {LAST_DEMAND_ANNOTATION: "2026-12-01T11:59:40Z"}
    pool = plan_validation_pool(job, idle, stamp, NOW)
    assert pool.replicas == 2 and pool.scale_down_in == pytest.approx(40)
    plan = Plan(TrainJobStatus())
    check_validation_pool_if_needed(plan, pool, stamp)
    assert plan.annotations == {} and plan.requeue_after == pytest.approx(41)


@pytest.mark.parametrize(
    ("phase", "suspend"), [("Succeeded", False), ("Failed", False), ("Suspended", True)]
)
def test_a_job_without_a_cluster_gets_no_pool_callback_or_demand_stamp(
    phase: str, suspend: bool
) -> None:
    # Its status keeps the last pool size (above minReplicas) and the driver's last demand;
    # the pool's idle callback and demand stamp used to come back on every reconcile.
    job = _job(
        suspend=suspend,
        validation={
            "entrypoint": "pkg.mod:validate",
            "pool": {"minReplicas": 0, "maxReplicas": 3, "idleSeconds": 60},
        },
    )
    stamp = {LAST_DEMAND_ANNOTATION: "2026-12-01T10:00:00Z"}  # idle for two hours

    def render(job: TrainJob, uid: str, attempt: int, replicas: int) -> list[dict[str, Any]]:
        return _desired(attempt, replicas)

    for validations in ({"pending": 0, "running": 0}, {"pending": 1, "running": 1}):
        status = {"phase": phase, "validationPool": {"replicas": 2}, "validations": validations}
        plan = plan_trainjob(job, "u", status, stamp, [], render, NOW)
        assert plan.status["phase"] == phase
        assert plan.requeue_after is None, validations
        assert plan.annotations == {}, validations


def test_plan_trainjob_renders_the_current_attempt_with_the_pool_size() -> None:
    calls: list[tuple[str, int, int]] = []

    def render(job: TrainJob, uid: str, attempt: int, replicas: int) -> list[dict[str, Any]]:
        calls.append((uid, attempt, replicas))
        return _desired(attempt, replicas)

    status = {"phase": "Running", "restarts": 1, "validations": {"pending": 1, "running": 0}}
    plan = plan_trainjob(_job(), "uid-1", status, {}, _running(1), render, NOW, generation=5)
    assert calls == [("uid-1", 1, 1)]
    assert _names_of(plan.create) == ["tj-val-0"]
    assert plan.annotations == {LAST_DEMAND_ANNOTATION: "2026-12-01T12:00:00Z"}
    assert plan.status["observedGeneration"] == 5


def test_plan_trainjob_fails_a_spec_that_does_not_render() -> None:
    def render(job: TrainJob, uid: str, attempt: int, replicas: int) -> list[dict[str, Any]]:
        raise ValueError("spec.podTemplate.bogus: unknown key")

    plan = plan_trainjob(_job(), "u", {"phase": "Running"}, {}, _running(), render, NOW, 2)
    assert plan.status["phase"] == "Failed" and plan.create == [] and plan.delete == []
    failed = plan.new_status.condition(ConditionType.FAILED)
    assert failed is not None and failed.reason == "InvalidSpec"
    assert [e.reason for e in plan.events] == ["InvalidSpec"]
    # every status the operator writes says which generation it saw (kstatus, Argo CD)
    assert plan.status["observedGeneration"] == 2
    stalled = plan.new_status.condition(ConditionType.STALLED)
    assert stalled is not None and stalled.status == "True" and stalled.reason == "InvalidSpec"


def test_plan_invalid_spec_fails_once_and_survives_a_status_it_cannot_read() -> None:
    plan = plan_invalid_spec({"progress": {"step": 3}}, "x" * 5000, 1, NOW)
    patch = plan.status_patch()
    assert patch is not None and len(patch["message"]) == 2000
    assert set(patch) == {"phase", "message", "completionTime", "conditions", "observedGeneration"}
    again = plan_invalid_spec(plan.status, "other", 1, NOW)
    assert again.status_patch() is None and again.events == []
    odd = plan_invalid_spec({"phase": "NoSuchPhase"}, "bad", 1, NOW)
    assert odd.status_patch() is not None and odd.status["phase"] == "Failed"


# --------------------------------------------------------------------------- executing a plan


class FakeClient:
    """Records every call; ensure (create) raises 422 for names in ``reject``."""

    def __init__(
        self, obj: dict[str, Any] | None = None, reject: frozenset[str] = frozenset()
    ) -> None:
        self.obj = obj
        self.reject = reject
        self.calls: list[tuple[Any, ...]] = []
        self.graces: dict[str, int] = {}  # name -> gracePeriodSeconds of its delete

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.obj

    def list(self, kind: str, namespace: str, selector: str, **_: Any) -> list[dict[str, Any]]:
        return []

    def ensure(self, obj: dict[str, Any], namespace: str) -> bool:
        if obj.get("kind") == "Event":
            self.calls.append(("event", obj["reason"]))
            return True
        name = obj["metadata"]["name"]
        if name in self.reject:
            raise ApiError(422, {"message": f"{name} is invalid"}, "create")
        self.calls.append(("create", name))
        return True

    def delete(
        self, kind: str, namespace: str, name: str, grace_seconds: int | None = None
    ) -> bool:
        self.calls.append(("delete", kind, name))
        if grace_seconds is not None:
            self.graces[name] = grace_seconds
        return True

    def patch(self, kind: str, namespace: str, name: str, body: Any, **kw: Any) -> Any:
        self.calls.append(("patch", kw.get("subresource"), body))
        return body


def _trainjob_object(status: dict[str, Any] | None = None) -> dict[str, Any]:
    job = _job().to_dict()
    job["metadata"].update(uid="u", generation=1)
    if status is not None:
        job["status"] = status
    return job


def test_execute_plan_writes_the_status_once_after_the_children() -> None:
    obj = _trainjob_object()
    plan = plan_reconcile(_job(), {}, [], _desired(), NOW, generation=1)
    plan.delete += [("Pod", "tj-old"), ("Pod", "tj-older")]
    plan.delete_grace_seconds["tj-older"] = 5
    plan.annotations[LAST_DEMAND_ANNOTATION] = "2026-12-01T12:00:00Z"
    client = FakeClient()
    execute_plan(client, obj, plan, NOW)  # type: ignore[arg-type]
    kinds = [c[0] for c in client.calls]
    assert kinds == ["delete"] * 2 + ["create"] * 4 + ["patch"] * 2 + ["event"]
    assert client.graces == {"tj-older": 5}  # the other with its own grace period
    status_patches = [c for c in client.calls if c[0] == "patch" and c[1] == "status"]
    assert len(status_patches) == 1 and status_patches[0][2]["status"]["phase"] == "Starting"
    assert client.calls[7] == (
        "patch",
        None,
        {"metadata": {"annotations": {LAST_DEMAND_ANNOTATION: "2026-12-01T12:00:00Z"}}},
    )


def test_execute_plan_turns_a_rejected_child_into_one_failure() -> None:
    obj = _trainjob_object()
    plan = plan_reconcile(_job(), {}, [], _desired(), NOW, generation=1)
    plan.create.insert(0, {"kind": "Service", "metadata": {"name": "tj-head-svc"}})
    client = FakeClient(reject=frozenset({"tj-w0", "tj-head-svc"}))
    execute_plan(client, obj, plan, NOW)  # type: ignore[arg-type]
    # The first wave (every non-Pod child) was rejected: no Pod of the next wave is created.
    assert [c for c in client.calls if c[0] == "create"] == []
    (status_patch,) = [c[2]["status"] for c in client.calls if c[0] == "patch"]
    assert status_patch["phase"] == "Failed"
    failed = next(c for c in status_patch["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "InvalidChild" and failed["observedGeneration"] == 1
    assert (
        "the API server rejected Service tj-head-svc: tj-head-svc is invalid" in (failed["message"])
    )
    assert [c[1] for c in client.calls if c[0] == "event"] == ["Created", "InvalidChild"]


def test_execute_plan_deletes_the_trainjob_instead_of_writing_its_status() -> None:
    plan = plan_reconcile(
        _job(ttlSecondsAfterFinished=0),
        {"phase": "Succeeded", "completionTime": "2026-12-01T11:00:00Z"},
        [_pod("tj-head", "head", 0, "Running")],
        [],
        NOW,
    )
    plan.annotations["x"] = "y"
    client = FakeClient()
    execute_plan(client, _trainjob_object(), plan, NOW)  # type: ignore[arg-type]
    assert [c for c in client.calls if c[0] != "event"] == [
        ("delete", "Pod", "tj-head"),
        ("delete", "TrainJob", "tj"),
    ]


def test_reconcile_trainjob_fails_a_manifest_that_does_not_parse() -> None:
    obj = _trainjob_object({"phase": "Running"})
    obj["spec"]["scaling"]["numWorkers"] = -1
    client = FakeClient(obj)
    plan = reconcile_trainjob(client, "ns", "tj", lambda *a: [], now=NOW)  # type: ignore[arg-type]
    assert plan is not None and plan.new_status.phase == Phase.FAILED
    (patch,) = [c[2]["status"] for c in client.calls if c[0] == "patch"]
    assert patch["conditions"][0]["reason"] == "InvalidSpec"
    assert "spec.scaling.numWorkers" in patch["message"]
    assert client.calls[-1] == ("event", "InvalidSpec")
