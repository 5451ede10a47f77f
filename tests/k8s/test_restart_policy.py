"""Restart policy, slice-atomic recovery and the dashboard Service on a real kube-apiserver +
etcd (issue 19): the operator in-process, the tests playing the kubelet by patching pod
status."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.k8s.test_operator import (
    RunningOperator,
    by_role,
    events,
    failed_condition,
    job_status,
    make_all_ready,
    make_job,
    pods,
    remove_trainjobs,
    set_terminated,
    wait_for,
    wait_phase,
)
from tests.support import EnvTest
from trainjob_operator.constants import parse_time
from trainjob_operator.kube import KubeClient


@pytest.fixture
def operator(envtest: EnvTest, crd: None, k8s_namespace: str) -> Iterator[RunningOperator]:
    op = RunningOperator(envtest, k8s_namespace)
    op.start()
    try:
        yield op
    finally:
        remove_trainjobs(envtest, k8s_namespace)
        op.stop()


def attempt_pods(kube: KubeClient, ns: str, attempt: int, count: int) -> dict[str, Any]:
    found: dict[str, Any] = wait_for(
        f"{count} pods of attempt {attempt}",
        lambda: (
            len(p := pods(kube, ns)) == count
            and all(
                x["metadata"]["labels"]["trainjob.dev/attempt"] == str(attempt) for x in p.values()
            )
            and p
        ),
    )
    return found


def test_counted_restart_waits_for_the_backoff_and_is_in_the_history(
    kube: KubeClient, operator: RunningOperator
) -> None:
    ns = operator.namespace
    make_job(kube, ns, failure={"maxRestarts": 2, "restartBackoff": {"initialSeconds": 2}})
    wait_for("4 pods", lambda: len(pods(kube, ns)) == 4)
    make_all_ready(kube, ns)
    wait_phase(kube, ns, "Running")
    set_terminated(kube, ns, by_role(kube, ns, "driver")[0], "driver", 1, "Error", "boom")
    status = wait_for("restart 1", lambda: (s := job_status(kube, ns)).get("restarts") == 1 and s)
    assert status["phase"] == "Restarting"
    due = parse_time(status["nextAttemptTime"])
    (record,) = status["restartHistory"]
    assert record["reason"] == "DriverFailed" and record["counted"] is True
    assert record["backoffSeconds"] == 2 and record["attempt"] == 1
    fresh = attempt_pods(kube, ns, 1, 4)
    # The next attempt's pods were created no earlier than the back-off allowed.
    for pod in fresh.values():
        assert parse_time(pod["metadata"]["creationTimestamp"]) >= due
    wait_for("nextAttemptTime cleared", lambda: "nextAttemptTime" not in job_status(kube, ns))
    (event,) = events(kube, ns, "DriverFailed")
    assert "restart 1 of 2" in event["message"] and "next attempt in 2s" in event["message"]


def test_a_disrupted_head_restarts_without_using_max_restarts(
    kube: KubeClient, operator: RunningOperator
) -> None:
    ns = operator.namespace
    make_job(kube, ns, failure={"maxRestarts": 0})
    wait_for("4 pods", lambda: len(pods(kube, ns)) == 4)
    make_all_ready(kube, ns)
    wait_phase(kube, ns, "Running")
    head = by_role(kube, ns, "head")[0]
    # What the eviction API / scheduler preemption writes before deleting the pod.
    conditions = [
        {"type": "Ready", "status": "True"},
        {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"},
    ]
    kube.patch("Pod", ns, head, {"status": {"conditions": conditions}}, subresource="status")
    status = wait_for("restart 1", lambda: (s := job_status(kube, ns)).get("restarts") == 1 and s)
    assert status["ignoredRestarts"] == 1
    restarting = {c["type"]: c for c in status["conditions"]}["Restarting"]
    assert restarting["reason"] == "HeadDisrupted"
    assert "not counted against maxRestarts=0" in restarting["message"]
    assert status["restartHistory"][0]["counted"] is False
    attempt_pods(kube, ns, 1, 4)  # no back-off for a disruption
    # A real failure of the next attempt then finds maxRestarts=0 untouched: it fails.
    make_all_ready(kube, ns)
    wait_phase(kube, ns, "Running")
    set_terminated(kube, ns, by_role(kube, ns, "driver")[0], "driver", 1, "Error", "boom")
    failed = wait_phase(kube, ns, "Failed")
    assert "maxRestarts=0 exhausted" in failed["message"]


def test_a_fail_job_rule_fails_on_its_exit_code(
    kube: KubeClient, operator: RunningOperator
) -> None:
    ns = operator.namespace
    exit_codes = {"containerName": "driver", "operator": "In", "values": [42]}
    rule = {"action": "FailJob", "onExitCodes": exit_codes}
    make_job(kube, ns, failure={"maxRestarts": 3, "rules": [rule]})
    wait_for("4 pods", lambda: len(pods(kube, ns)) == 4)
    set_terminated(kube, ns, by_role(kube, ns, "driver")[0], "driver", 42, "Error", "corrupt data")
    status = wait_phase(kube, ns, "Failed")
    assert failed_condition(status)["reason"] == "PodFailurePolicy"
    assert "failure.rules[0] is FailJob" in status["message"]
    assert status["restarts"] == 0
    wait_for("PodFailurePolicy event", lambda: events(kube, ns, "PodFailurePolicy"))


def test_a_failed_tpu_host_replaces_its_whole_slice(
    kube: KubeClient, operator: RunningOperator
) -> None:
    ns = operator.namespace
    tpu = {"tpu": {"acceleratorType": "v6e", "topology": "4x4", "numSlices": 2}}
    make_job(kube, ns, scaling=tpu, framework="jax")
    wait_for("head, driver and 8 hosts", lambda: len(pods(kube, ns)) == 10)
    make_all_ready(kube, ns)
    wait_phase(kube, ns, "Running")
    before = {n: p["metadata"]["uid"] for n, p in pods(kube, ns).items()}
    env_before = {
        n: {e["name"]: e.get("value") for e in p["spec"]["containers"][0]["env"]}
        for n, p in pods(kube, ns).items()
        if "-s1-" in n
    }
    set_terminated(kube, ns, "quickstart-s1-h2", "ray-worker", 1, "Error", "ICI link down")

    def slice_replaced() -> dict[str, Any] | None:
        now = pods(kube, ns)
        hosts = [f"quickstart-s1-h{h}" for h in range(4)]
        if all(h in now and now[h]["metadata"]["uid"] != before[h] for h in hosts):
            return now
        return None

    after = wait_for("slice 1 recreated", slice_replaced)
    # The other slice, the head and the driver are the same pods.
    for name, uid in before.items():
        if "-s1-" not in name:
            assert after[name]["metadata"]["uid"] == uid, name
    # Same stable hostnames and TPU_WORKER_IDs.
    for name, env in env_before.items():
        pod = after[name]
        assert {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]} == env
        assert pod["spec"]["hostname"] == name
    (event,) = wait_for("SliceRecovered event", lambda: events(kube, ns, "SliceRecovered"))
    assert "slice 1 (4 hosts" in event["message"] and "ICI link down" in event["message"]
    history = job_status(kube, ns)["restartHistory"]
    assert [(h["scope"], h["slice"]) for h in history] == [("Slice", 1)]
    assert job_status(kube, ns)["restarts"] == 0


def test_the_opt_in_dashboard_service_and_its_address(
    kube: KubeClient, operator: RunningOperator
) -> None:
    ns = operator.namespace
    make_job(kube, ns, ray={"dashboard": {"service": True}})
    wait_for("4 pods", lambda: len(pods(kube, ns)) == 4)
    service = wait_for(
        "the dashboard Service", lambda: kube.get("Service", ns, "quickstart-dashboard")
    )
    assert service["spec"]["type"] == "ClusterIP" and service["spec"]["clusterIP"]
    assert service["spec"]["selector"] == {
        "trainjob.dev/name": "quickstart",
        "trainjob.dev/role": "head",
    }
    assert service["spec"]["ports"][0]["port"] == 8265
    status = wait_for("status.dashboard", lambda: job_status(kube, ns).get("dashboard"))
    assert status == {
        "service": "quickstart-dashboard",
        "address": f"http://quickstart-dashboard.{ns}.svc:8265",
        "portForward": f"kubectl -n {ns} port-forward svc/quickstart-dashboard 8265",
    }
    uids = {n: p["metadata"]["uid"] for n, p in pods(kube, ns).items()}
    kube.patch("TrainJob", ns, "quickstart", {"spec": {"ray": {"dashboard": {"service": False}}}})
    wait_for("Service deleted", lambda: kube.get("Service", ns, "quickstart-dashboard") is None)
    wait_for("status.dashboard cleared", lambda: "dashboard" not in job_status(kube, ns))
    assert {n: p["metadata"]["uid"] for n, p in pods(kube, ns).items()} == uids  # no restart
