"""Restart policy rules of the planner: back-off between counted restarts, failure rules by
cause (``spec.failure.rules`` then the defaults), disruptions not counted against
``maxRestarts``, the restart history, and slice-atomic recovery of multi-host TPU slices."""

from __future__ import annotations

import copy
import datetime as dt
from typing import Any

import pytest

from tests.reconcile.test_plan import NOW, _desired, _job, _pod, _running
from trainjob_operator.api import FieldError, ManifestError, RestartBackoff, parse_trainjob
from trainjob_operator.api.spec import DEFAULT_FAILURE_RULES, FailureRuleAction
from trainjob_operator.api.status import RESTART_HISTORY_LIMIT
from trainjob_operator.constants import (
    DRIVER_PREEMPTED_EXIT_CODE,
    ROLE_LABEL,
    SPEC_GENERATION_ANNOTATION,
    SPEC_HASH_ANNOTATION,
)
from trainjob_operator.reconcile.failure_rules import INVALID_INPUT_EXIT_CODE, decide_pod_failure
from trainjob_operator.reconcile.pods import disruption_cause, pod_disrupted
from trainjob_operator.reconcile.state_machine import plan_reconcile


def _terminated(pod: dict[str, Any], code: int, container: str = "driver") -> dict[str, Any]:
    pod["status"]["phase"] = "Failed"
    pod["status"]["containerStatuses"] = [
        {"name": container, "state": {"terminated": {"exitCode": code, "reason": "Error"}}}
    ]
    return pod


def _disrupted(pod: dict[str, Any], terminating: bool = True) -> dict[str, Any]:
    pod["status"].setdefault("conditions", []).append(
        {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
    )
    if terminating:
        pod["metadata"]["deletionTimestamp"] = "2026-12-01T11:59:59Z"
    return pod


def _condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == type_)


# --------------------------------------------------------------------------- the spec


def test_backoff_doubles_from_initial_and_is_capped() -> None:
    backoff = RestartBackoff(initial_seconds=10, max_seconds=60)
    assert [backoff.delay(n) for n in range(6)] == [0, 10, 20, 40, 60, 60]
    assert RestartBackoff(initial_seconds=0, max_seconds=0).delay(5) == 0
    assert RestartBackoff(initial_seconds=1, max_seconds=300).delay(1000) == 300  # no overflow


def _errors(failure: dict[str, Any]) -> list[FieldError]:
    manifest = {
        "apiVersion": "trainjob.dev/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "tj"},
        "spec": {"entrypoint": "pkg.mod:train", "failure": failure},
    }
    with pytest.raises(ManifestError) as caught:
        parse_trainjob(manifest)
    return caught.value.errors


@pytest.mark.parametrize(
    ("failure", "path", "words"),
    [
        (
            {"restartBackoff": {"initialSeconds": 60, "maxSeconds": 10}},
            "spec.failure.restartBackoff.initialSeconds",
            "greater than maxSeconds",
        ),
        (
            {"rules": [{"action": "FailJob"}]},
            "spec.failure.rules[0].onExitCodes",
            "exactly one of onExitCodes and onPodConditions",
        ),
        (
            {
                "rules": [
                    {
                        "action": "Ignore",
                        "onExitCodes": {"operator": "In", "values": [1]},
                        "onPodConditions": [{"type": "DisruptionTarget"}],
                    }
                ]
            },
            "spec.failure.rules[0].onExitCodes",
            "exactly one",
        ),
        (
            {"rules": [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [0]}}]},
            "spec.failure.rules[0].onExitCodes.values",
            "exit code 0 is a success",
        ),
        (
            {"rules": [{"action": "Retry", "onPodConditions": [{"type": "X"}]}]},
            "spec.failure.rules[0].action",
            "",
        ),
    ],
)
def test_invalid_failure_settings_name_the_field(
    failure: dict[str, Any], path: str, words: str
) -> None:
    errors = _errors(failure)
    assert [e.path for e in errors] == [path], errors
    assert words in errors[0].message


def test_defaults_are_documented_values() -> None:
    spec = _job().spec.failure
    assert spec.restart_backoff.initial_seconds == 10 and spec.restart_backoff.max_seconds == 300
    assert spec.rules == []
    invalid_input, disruption, preempted = DEFAULT_FAILURE_RULES
    assert invalid_input.action == FailureRuleAction.FAIL_JOB
    assert invalid_input.on_exit_codes is not None
    assert invalid_input.on_exit_codes.values == [INVALID_INPUT_EXIT_CODE]
    assert invalid_input.on_exit_codes.container_name == "driver"
    assert disruption.action == FailureRuleAction.IGNORE
    assert [c.type for c in disruption.on_pod_conditions] == ["DisruptionTarget"]
    assert preempted.action == FailureRuleAction.IGNORE
    assert preempted.on_exit_codes is not None
    assert preempted.on_exit_codes.values == [DRIVER_PREEMPTED_EXIT_CODE]
    assert preempted.on_exit_codes.container_name == "driver"


# --------------------------------------------------------------------------- matching


def test_pod_disrupted_by_condition_or_by_a_disruption_reason() -> None:
    pod = _pod("p", "head", phase="Running")
    assert not pod_disrupted(pod)
    assert pod_disrupted(_disrupted(copy.deepcopy(pod), terminating=False))
    for reason in ("Evicted", "NodeLost", "Terminated", "Shutdown", "Preempting"):
        evicted = copy.deepcopy(pod)
        evicted["status"]["reason"] = reason
        assert pod_disrupted(evicted), reason
    false = copy.deepcopy(pod)
    false["status"]["conditions"] = [{"type": "DisruptionTarget", "status": "False"}]
    assert not pod_disrupted(false)


def test_first_matching_rule_wins_and_user_rules_come_before_the_defaults() -> None:
    job = _job(
        failure={
            "rules": [
                {"action": "Count", "onExitCodes": {"operator": "In", "values": [2]}},
                {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [2, 3]}},
            ]
        }
    )
    driver = _terminated(_pod("tj-driver", "driver"), 2)
    decision = decide_pod_failure(driver, job.spec.failure.rules)
    assert decision.action == FailureRuleAction.COUNT and decision.rule == "failure.rules[0]"
    assert decide_pod_failure(driver, []).rule == "default rule 0"
    assert decide_pod_failure(_terminated(_pod("h", "head"), 1, "ray-head"), []).rule == (
        "no rule matched"
    )


def test_exit_code_rules_honour_the_container_name_and_not_in() -> None:
    job = _job(
        failure={
            "rules": [
                {
                    "action": "FailJob",
                    "onExitCodes": {"containerName": "ray-head", "operator": "In", "values": [42]},
                },
                {"action": "Ignore", "onExitCodes": {"operator": "NotIn", "values": [1, 137]}},
            ]
        }
    )
    rules = job.spec.failure.rules
    assert decide_pod_failure(_terminated(_pod("h", "head"), 42, "ray-head"), rules).action == (
        FailureRuleAction.FAIL_JOB
    )
    # 42 in another container: not rule 0; NotIn [1, 137] matches it.
    other = decide_pod_failure(_terminated(_pod("d", "driver"), 42, "driver"), rules)
    assert other.action == FailureRuleAction.IGNORE and other.rule == "failure.rules[1]"
    counted = decide_pod_failure(_terminated(_pod("d", "driver"), 137, "driver"), rules)
    assert counted.action == FailureRuleAction.COUNT


# --------------------------------------------------------------------------- planning


def test_a_fail_job_rule_fails_at_once_with_reason_pod_failure_policy() -> None:
    job = _job(
        failure={
            "maxRestarts": 5,
            "rules": [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}}],
        }
    )
    observed = _running()
    _terminated(observed[-1], 42)
    plan = plan_reconcile(job, {"phase": "Running"}, observed, _desired(), NOW)
    assert plan.status["phase"] == "Failed" and plan.status["restarts"] == 0
    failed = _condition(plan.status, "Failed")
    assert failed["reason"] == "PodFailurePolicy"
    assert (
        "exit code 42" in failed["message"] and "failure.rules[0] is FailJob" in failed["message"]
    )
    assert "restartHistory" not in plan.status


def test_a_counted_restart_backs_off_records_history_and_says_so() -> None:
    job = _job(failure={"maxRestarts": 3, "restartBackoff": {"initialSeconds": 5}})
    observed = _running()
    _terminated(observed[-1], 1)
    plan = plan_reconcile(job, {"phase": "Running"}, observed, _desired(), NOW)
    status = plan.status
    assert status["phase"] == "Restarting" and status["restarts"] == 1
    assert status["nextAttemptTime"] == "2026-12-01T12:00:05Z"
    assert plan.requeue_after == pytest.approx(5)
    (record,) = status["restartHistory"]
    assert record["attempt"] == 1 and record["scope"] == "Cluster"
    assert record["reason"] == "DriverFailed" and record["counted"] is True
    assert record["backoffSeconds"] == 5 and record["time"] == "2026-12-01T12:00:00Z"
    event = next(e for e in plan.events if e.reason == "DriverFailed")
    assert "restart 1 of 3" in event.message and "next attempt in 5s" in event.message

    # While backing off: nothing is created, Restarting says until when, callback when due.
    waiting = plan_reconcile(
        job, status, [], _desired(1), NOW + dt.timedelta(seconds=2), generation=1
    )
    assert waiting.create == [] and waiting.status["phase"] == "Restarting"
    assert "2026-12-01T12:00:05Z" in waiting.status["message"]
    assert waiting.requeue_after == pytest.approx(3)
    due = plan_reconcile(job, status, [], _desired(1), NOW + dt.timedelta(seconds=5))
    assert len(due.create) == 4 and due.status["phase"] == "Starting"

    # The second counted restart waits twice as long.
    failed_again = _running(1)
    _terminated(failed_again[-1], 1)
    second = plan_reconcile(job, {**due.status, "phase": "Running"}, failed_again, _desired(1), NOW)
    assert second.status["restartHistory"][-1]["backoffSeconds"] == 10
    assert second.status["restarts"] == 2


def test_a_disrupted_driver_restarts_without_using_the_budget_or_waiting() -> None:
    job = _job(failure={"maxRestarts": 0})
    observed = _running()
    _terminated(observed[-1], 143)
    _disrupted(observed[-1], terminating=False)
    plan = plan_reconcile(job, {"phase": "Running"}, observed, _desired(), NOW)
    status = plan.status
    assert status["phase"] == "Restarting" and status["restarts"] == 1
    assert status["ignoredRestarts"] == 1 and status["nextAttemptTime"] is None
    assert "not counted against maxRestarts=0" in status["message"]
    assert "disrupted: default rule 1" in status["message"]
    assert status["restartHistory"][0]["counted"] is False
    # The driver ended: its pod, the head and the workers have nothing left to save and stop
    # within seconds, not their grace period.
    assert sorted(plan.delete_grace_seconds) == ["tj-driver", "tj-head", "tj-w0", "tj-w1"]
    # The next attempt starts at once, and a real failure then still has its budget of 0.
    started = plan_reconcile(job, status, [], _desired(1), NOW)
    assert len(started.create) == 4
    failed = _running(1)
    _terminated(failed[-1], 1)
    done = plan_reconcile(job, {**started.status, "phase": "Running"}, failed, _desired(1), NOW)
    assert done.status["phase"] == "Failed" and "maxRestarts=0 exhausted" in done.status["message"]


def test_a_driver_preempted_after_its_last_checkpoint_restarts_without_using_the_budget() -> None:
    job = _job(failure={"maxRestarts": 0})
    observed = _running()
    _terminated(observed[-1], DRIVER_PREEMPTED_EXIT_CODE)  # no DisruptionTarget on the driver
    plan = plan_reconcile(job, {"phase": "Running"}, observed, _desired(), NOW)
    status = plan.status
    assert status["phase"] == "Restarting" and status["restarts"] == 1
    assert status["ignoredRestarts"] == 1 and status["nextAttemptTime"] is None
    assert "ignored: default rule 2" in status["message"]
    assert status["restartHistory"][0]["counted"] is False
    # Another exit status of the driver is still a counted failure.
    other = _running()
    _terminated(other[-1], 1)
    failed = plan_reconcile(job, {"phase": "Running"}, other, _desired(), NOW)
    assert failed.status["phase"] == "Failed"


def test_ignored_restarts_leave_the_counted_budget_intact() -> None:
    job = _job(failure={"maxRestarts": 1, "restartBackoff": {"initialSeconds": 0}})
    status = {"phase": "Running", "restarts": 3, "ignoredRestarts": 3}
    observed = _running(3)
    _terminated(observed[-1], 1)
    plan = plan_reconcile(job, status, observed, _desired(3), NOW)
    assert plan.status["phase"] == "Restarting" and plan.status["restarts"] == 4
    assert "restart 1 of 1" in plan.status["message"]
    assert plan.status["nextAttemptTime"] is None  # initialSeconds 0: no back-off


def test_a_head_being_evicted_restarts_before_it_is_gone() -> None:
    job = _job(failure={"maxRestarts": 0})
    observed = _running()
    _disrupted(observed[0])  # the head: Running, terminating, DisruptionTarget
    observed[0]["spec"] = {"nodeName": "node-a"}
    plan = plan_reconcile(job, {"phase": "Running"}, observed, _desired(), NOW)
    assert plan.status["phase"] == "Restarting"
    assert _condition(plan.status, "Restarting")["reason"] == "HeadDisrupted"
    [record] = plan.status["restartHistory"]
    assert record["reason"] == "HeadDisrupted" and record["counted"] is False
    # Which pod, on which node, and why.
    assert (
        "Ray head pod tj-head on node node-a disrupted (DisruptionTarget PreemptionByScheduler)"
        in plan.status["message"]
    )
    assert [e.reason for e in plan.events][-1] == "HeadDisrupted"


@pytest.mark.parametrize("ended", [False, True], ids=["still-running", "ended"])
@pytest.mark.parametrize(
    ("role", "reason"), [("head", "HeadDisrupted"), ("driver", "DriverDisrupted")]
)
def test_a_head_or_driver_pod_deleted_by_someone_else_is_a_disruption(
    role: str, reason: str, ended: bool
) -> None:
    """``kubectl delete pod``, a drain without the eviction API, a controller: only the
    ``deletionTimestamp`` says so (no DisruptionTarget condition). With the defaults
    (maxRestarts 0) the job restarts from the latest checkpoint, not counted, whether the
    operator sees the pod still terminating or already ended (the driver exits 15 or 3, the
    head's container ends with its Ray)."""
    job = _job()
    observed = _running()
    pod = next(p for p in observed if p["metadata"]["labels"]["trainjob.dev/role"] == role)
    pod["metadata"]["deletionTimestamp"] = "2026-12-01T11:59:59Z"
    if ended:
        _terminated(pod, 143, container=role)
    plan = plan_reconcile(job, {"phase": "Running"}, observed, _desired(), NOW)
    status = plan.status
    assert status["phase"] == "Restarting" and status["restarts"] == 1
    assert status["ignoredRestarts"] == 1 and status["nextAttemptTime"] is None
    [record] = status["restartHistory"]
    assert record["reason"] == reason and record["counted"] is False
    assert f"pod tj-{role} deleted (deletionTimestamp 2026-12-01T11:59:59Z)" in record["message"]
    assert "not counted against maxRestarts=0" in record["message"]
    assert _condition(status, "Restarting")["reason"] == reason


def test_a_driver_that_failed_because_its_head_was_deleted_is_the_heads_disruption() -> None:
    job = _job()
    observed = _running()
    observed[0]["metadata"]["deletionTimestamp"] = "2026-12-01T11:59:59Z"  # the head
    _terminated(observed[-1], 1)  # the driver lost its Ray cluster
    plan = plan_reconcile(job, {"phase": "Running"}, observed, _desired(), NOW)
    assert plan.status["phase"] == "Restarting"
    assert plan.status["restartHistory"][0]["reason"] == "HeadDisrupted"
    # The head already gone: the same (the job was Running).
    gone = [p for p in _running() if p["metadata"]["name"] != "tj-head"]
    _terminated(gone[-1], 1)
    # The Ray token Secret carries the head's role label too, and is rendered before the head.
    secret = {"kind": "Secret", "metadata": {"name": "tj-ray-auth", "labels": {ROLE_LABEL: "head"}}}
    plan = plan_reconcile(job, {"phase": "Running"}, gone, [secret, *_desired()], NOW)
    [record] = plan.status["restartHistory"]
    assert record["reason"] == "HeadDisrupted" and record["counted"] is False
    assert "Ray head pod tj-head disappeared while Running" in record["message"]


def test_every_pod_deleted_at_once_is_one_disruption_naming_them() -> None:
    observed = _running()
    for pod in observed:
        pod["metadata"]["deletionTimestamp"] = "2026-12-01T11:59:59Z"
    plan = plan_reconcile(_job(), {"phase": "Running"}, observed, _desired(), NOW)
    [record] = plan.status["restartHistory"]
    assert record["reason"] == "HeadDisrupted" and record["counted"] is False
    assert "also going: tj-driver, tj-w0, tj-w1" in record["message"]
    assert plan.delete == []  # every pod is already being deleted


def test_a_head_that_ended_on_its_own_or_is_replaced_for_a_spec_change_is_no_disruption() -> None:
    """The head killed from inside (its process crashed, nobody deleted the pod) is a
    failure, counted against maxRestarts; a head the operator deletes itself to apply a
    spec change is not someone else's disruption."""
    job = _job()
    crashed = _running()
    _terminated(crashed[0], 137, container="ray-head")
    plan = plan_reconcile(job, {"phase": "Running"}, crashed, _desired(), NOW)
    assert plan.status["phase"] == "Failed"
    assert "HeadFailed" in [e.reason for e in plan.events]
    assert "maxRestarts=0 exhausted" in plan.status["message"]

    desired = _desired()
    desired[0]["metadata"]["annotations"] = {SPEC_HASH_ANNOTATION: "new"}
    replaced = _running()
    replaced[0]["metadata"]["annotations"] = {
        SPEC_HASH_ANNOTATION: "old",
        SPEC_GENERATION_ANNOTATION: "2",
    }
    replaced[0]["metadata"]["deletionTimestamp"] = "2026-12-01T11:59:59Z"
    plan = plan_reconcile(job, {"phase": "Running"}, replaced, desired, NOW, generation=3)
    assert plan.status["phase"] == "Running" and not plan.status.get("restartHistory")


@pytest.mark.parametrize(
    ("change", "cause"),
    [
        (
            {
                "status": {
                    "conditions": [
                        {
                            "type": "DisruptionTarget",
                            "status": "True",
                            "reason": "EvictionByEvictionAPI",
                            "message": "Eviction API: evicting",
                        }
                    ]
                }
            },
            "pod p on node n1 disrupted (DisruptionTarget EvictionByEvictionAPI Eviction API: "
            "evicting)",
        ),
        (
            {"status": {"phase": "Failed", "reason": "Evicted", "message": "low on memory"}},
            "pod p on node n1 disrupted (pod reason Evicted: low on memory)",
        ),
        (
            {"metadata": {"deletionTimestamp": "2026-12-01T11:59:59Z"}},
            "pod p on node n1 deleted (deletionTimestamp 2026-12-01T11:59:59Z)",
        ),
        ({}, None),
    ],
    ids=["condition", "pod-reason", "deleted", "none"],
)
def test_disruption_cause_names_the_pod_its_node_and_why(
    change: dict[str, Any], cause: str | None
) -> None:
    pod: dict[str, Any] = {
        "metadata": {"name": "p", **change.get("metadata", {})},
        "spec": {"nodeName": "n1"},
        "status": {"phase": "Running", **change.get("status", {})},
    }
    assert disruption_cause(pod) == cause


def test_a_rule_can_count_disruptions_too() -> None:
    job = _job(
        failure={
            "maxRestarts": 0,
            "rules": [{"action": "Count", "onPodConditions": [{"type": "DisruptionTarget"}]}],
        }
    )
    observed = _running()
    _disrupted(observed[0])
    plan = plan_reconcile(job, {"phase": "Running"}, observed, _desired(), NOW)
    assert plan.status["phase"] == "Failed"
    assert "maxRestarts=0 exhausted" in plan.status["message"]
    # A pod only deleted (no condition) or gone counts as DisruptionTarget for the rules.
    deleted = _running()
    deleted[-1]["metadata"]["deletionTimestamp"] = "2026-12-01T11:59:59Z"
    gone = _running()[:-1]
    for observed in (deleted, gone):
        plan = plan_reconcile(job, {"phase": "Running"}, observed, _desired(), NOW)
        assert plan.status["phase"] == "Failed", plan.status
        assert "DriverDisrupted" in [e.reason for e in plan.events]


def test_restart_history_keeps_the_last_entries() -> None:
    job = _job(failure={"maxRestarts": 100, "restartBackoff": {"initialSeconds": 0}})
    status: dict[str, Any] = {"phase": "Running"}
    for attempt in range(RESTART_HISTORY_LIMIT + 2):
        observed = _running(attempt)
        _terminated(observed[-1], 1)
        status = plan_reconcile(
            job, {**status, "phase": "Running"}, observed, _desired(attempt), NOW
        ).status
    history = status["restartHistory"]
    assert len(history) == RESTART_HISTORY_LIMIT
    assert [h["attempt"] for h in history] == list(range(3, RESTART_HISTORY_LIMIT + 3))


# --------------------------------------------------------------------------- TPU slices


def _tpu_job(num_slices: int = 2, topology: str = "4x4") -> Any:
    return _job(
        scaling={"tpu": {"acceleratorType": "v6e", "topology": topology, "numSlices": num_slices}}
    )


def _host(slice_index: int, host: int, phase: str = "Running", attempt: int = 0) -> dict[str, Any]:
    pod = _pod(f"tj-s{slice_index}-h{host}", "worker", attempt, phase, phase == "Running")
    pod["metadata"]["labels"]["trainjob.dev/slice"] = str(slice_index)
    return pod


def _tpu_desired(num_slices: int = 2, hosts: int = 4) -> list[dict[str, Any]]:
    others = [p for p in _desired() if p["metadata"]["labels"]["trainjob.dev/role"] != "worker"]
    workers = [_host(s, h, "Pending") for s in range(num_slices) for h in range(hosts)]
    return others + workers


def _tpu_running(num_slices: int = 2, hosts: int = 4) -> list[dict[str, Any]]:
    others = [p for p in _running() if p["metadata"]["labels"]["trainjob.dev/role"] != "worker"]
    return others + [_host(s, h) for s in range(num_slices) for h in range(hosts)]


def _deleted(plan: Any) -> list[str]:
    return sorted(name for _, name in plan.delete)


def test_a_failed_host_replaces_its_whole_slice_and_only_that_slice() -> None:
    observed = _tpu_running()
    failed = next(p for p in observed if p["metadata"]["name"] == "tj-s1-h2")
    _terminated(failed, 1, "ray-worker")
    plan = plan_reconcile(_tpu_job(), {"phase": "Running"}, observed, _tpu_desired(), NOW)
    assert _deleted(plan) == [f"tj-s1-h{h}" for h in range(4)]
    assert plan.status["phase"] == "Running"  # the runtime restarts the worker group
    (event,) = [e for e in plan.events if e.reason == "SliceRecovered"]
    assert "slice 1 (4 hosts, tj-s1-h0..tj-s1-h3)" in event.message
    assert "tj-s1-h2 failed" in event.message and "exit code 1" in event.message
    assert "WorkerPodLost" not in [e.reason for e in plan.events]  # one event, not two
    (record,) = plan.status["restartHistory"]
    assert record["scope"] == "Slice" and record["slice"] == 1 and record["counted"] is False
    assert plan.status["restarts"] == 0

    # Next reconcile: the slice is terminating: no second recovery, nothing created yet.
    for pod in observed:
        if pod["metadata"]["name"].startswith("tj-s1-"):
            pod["metadata"]["deletionTimestamp"] = "2026-12-01T12:00:01Z"
    again = plan_reconcile(_tpu_job(), plan.status, observed, _tpu_desired(), NOW)
    assert [e for e in again.events if e.reason == "SliceRecovered"] == []
    assert again.create == [] and len(again.status["restartHistory"]) == 1
    # Once all are gone, the whole slice is created again under the same names.
    gone = [p for p in observed if not p["metadata"]["name"].startswith("tj-s1-")]
    later = plan_reconcile(_tpu_job(), again.status, gone, _tpu_desired(), NOW)
    assert sorted(p["metadata"]["name"] for p in later.create) == [f"tj-s1-h{h}" for h in range(4)]


def test_a_disrupted_or_deleted_host_replaces_its_slice() -> None:
    observed = _tpu_running()
    _disrupted(observed[-1], terminating=False)  # tj-s1-h3
    plan = plan_reconcile(_tpu_job(), {"phase": "Running"}, observed, _tpu_desired(), NOW)
    assert _deleted(plan) == [f"tj-s1-h{h}" for h in range(4)]
    assert "disrupted (DisruptionTarget)" in plan.status["restartHistory"][0]["message"]

    observed = _tpu_running()
    observed[-5]["metadata"]["deletionTimestamp"] = "2026-12-01T11:59:59Z"  # tj-s0-h3
    plan = plan_reconcile(_tpu_job(), {"phase": "Running"}, observed, _tpu_desired(), NOW)
    assert _deleted(plan) == [f"tj-s0-h{h}" for h in range(3)]  # h3 is already going
    assert "tj-s0-h3 is being deleted" in plan.status["restartHistory"][0]["message"]


def test_a_host_that_disappeared_replaces_its_slice_once_the_job_ran() -> None:
    observed = [p for p in _tpu_running() if p["metadata"]["name"] != "tj-s0-h1"]
    plan = plan_reconcile(_tpu_job(), {"phase": "Running"}, observed, _tpu_desired(), NOW)
    assert _deleted(plan) == ["tj-s0-h0", "tj-s0-h2", "tj-s0-h3"]
    assert "tj-s0-h1 disappeared" in plan.events[-1].message or any(
        "tj-s0-h1 disappeared" in e.message for e in plan.events
    )
    # While Starting a missing host is only being created: no recovery.
    starting = plan_reconcile(_tpu_job(), {"phase": "Starting"}, observed, _tpu_desired(), NOW)
    assert starting.delete == []
    assert [p["metadata"]["name"] for p in starting.create] == ["tj-s0-h1"]


def test_single_host_slices_are_replaced_pod_by_pod() -> None:
    job = _tpu_job(num_slices=2, topology="2x2")  # 1 host per slice
    observed = _tpu_running(hosts=1)
    _terminated(observed[-1], 1, "ray-worker")
    plan = plan_reconcile(job, {"phase": "Running"}, observed, _tpu_desired(hosts=1), NOW)
    assert _deleted(plan) == ["tj-s1-h0"]
    assert [e.reason for e in plan.events if e.reason != "Created"] == ["WorkerPodLost"]
    assert "restartHistory" not in plan.status


# --------------------------------------------------------------------------- dashboard Service


def _dashboard_service(name: str = "tj-dashboard") -> dict[str, Any]:
    return {
        "kind": "Service",
        "metadata": {"name": name, "labels": {"trainjob.dev/role": "dashboard"}},
        "spec": {"ports": [{"name": "dashboard", "port": 8265}]},
    }


def test_the_dashboard_service_is_in_status_while_desired_and_deleted_after() -> None:
    job = _job(ray={"dashboard": {"service": True}})
    desired = [*_desired(), _dashboard_service()]
    plan = plan_reconcile(job, {}, [], desired, NOW)
    assert "tj-dashboard" in [c["metadata"]["name"] for c in plan.create]
    assert plan.status["dashboard"] == {
        "service": "tj-dashboard",
        "address": "http://tj-dashboard.ns.svc:8265",
        "portForward": "kubectl -n ns port-forward svc/tj-dashboard 8265",
    }
    # Turned off: the Service goes and so does the address.
    observed = [*_running(), _dashboard_service()]
    off = plan_reconcile(_job(), plan.status, observed, _desired(), NOW)
    assert ("Service", "tj-dashboard") in off.delete
    assert off.status["dashboard"] is None
    # A finished job has no head to reach.
    done = plan_reconcile(job, {**plan.status, "phase": "Succeeded"}, [], desired, NOW)
    assert done.status["dashboard"] is None
