"""The operator, in-process (kopf), against a real kube-apiserver + etcd.

There is no kubelet: tests play it by patching pod status (phases, readiness).
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import EnvTest
from tests.support.waiting import DEFAULT_TIMEOUT_S, wait_for
from trainjob_operator.kube import KubeClient, KubeConfig
from trainjob_operator.operator_main import run_operator

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "crds" / "trainjob.dev_trainjobs.yaml"
QUICKSTART = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())


def reconciles(trigger: str) -> float:
    """The operator's reconciles (this process's) started by ``trigger``."""
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value("trainjob_reconciles_total", {"trigger": trigger}) or 0.0


def timer_passes() -> float:
    """Timer ticks that reached a TrainJob: reconciled, or skipped (unchanged, busy, coalesced)."""
    from prometheus_client import REGISTRY

    total = reconciles("timer")
    for why in ("unchanged", "busy", "coalesced"):
        labels = {"trigger": "timer", "why": why}
        total += REGISTRY.get_sample_value("trainjob_reconciles_skipped_total", labels) or 0.0
    return total


def wait_for_timer_passes(count: int) -> None:
    """Wait until the operator's timer has looked at TrainJobs ``count`` more times, so that
    an assertion that nothing changed comes after the operator had its chance to change it
    (a fixed sleep could pass before a tick on a slow machine)."""
    before = timer_passes()
    wait_for(f"{count} timer ticks", lambda: timer_passes() >= before + count, timeout=60)


class RunningOperator:
    """An operator thread that can be stopped and started again (an operator restart)."""

    def __init__(
        self,
        envtest: EnvTest,
        namespace: str,
        liveness: str | None = None,
        client: KubeClient | None = None,
    ) -> None:
        self.config = KubeConfig(
            host=envtest.host, token=envtest.token, ca_file=str(envtest.ca_file)
        )
        self.namespace = namespace
        self.liveness = liveness
        self.client = client  # the reconciler's API client (default: a plain KubeClient)
        self.thread: threading.Thread | None = None
        self.stop_flag = threading.Event()

    def start(self) -> None:
        self.stop_flag = threading.Event()
        ready = threading.Event()
        self.thread = threading.Thread(
            target=run_operator,
            args=(self.config, [self.namespace]),
            kwargs={
                "stop_flag": self.stop_flag,
                "ready_flag": ready,
                "timer_interval": 1.0,
                "liveness_endpoint": self.liveness,
                "client": self.client,
            },
            daemon=True,
        )
        self.thread.start()
        assert ready.wait(60), "operator did not become ready"

    def stop(self) -> None:
        self.stop_flag.set()
        if self.thread is not None:
            self.thread.join(60)


@pytest.fixture
def operator(envtest: EnvTest, crd: None, k8s_namespace: str) -> Iterator[RunningOperator]:
    op = RunningOperator(envtest, k8s_namespace)
    op.start()
    try:
        yield op
    finally:
        remove_trainjobs(envtest, k8s_namespace)
        op.stop()


def remove_trainjobs(envtest: EnvTest, namespace: str) -> None:
    """Delete the namespace's TrainJobs (and wait until they are gone)."""
    kube = KubeClient(
        KubeConfig(host=envtest.host, token=envtest.token, ca_file=str(envtest.ca_file))
    )
    for job in kube.list("TrainJob", namespace):
        kube.delete("TrainJob", namespace, job["metadata"]["name"])
    wait_for("TrainJobs deleted", lambda: not kube.list("TrainJob", namespace), timeout=120)


def make_job(
    kube: KubeClient, namespace: str, name: str = "quickstart", **spec: Any
) -> dict[str, Any]:
    body = copy.deepcopy(QUICKSTART)
    body["metadata"] = {"name": name, "namespace": namespace}
    for key, value in spec.items():
        if value is None:
            body["spec"].pop(key, None)
        else:
            body["spec"][key] = value
    created = kube.create(body, namespace)
    assert created is not None
    return created


def pods(kube: KubeClient, namespace: str, job: str = "quickstart") -> dict[str, dict[str, Any]]:
    return {
        p["metadata"]["name"]: p
        for p in kube.list("Pod", namespace, f"trainjob.dev/name={job}")
        if not p["metadata"].get("deletionTimestamp")
    }


def role(pod: dict[str, Any]) -> str:
    return str(pod["metadata"]["labels"]["trainjob.dev/role"])


def set_pod_phase(
    kube: KubeClient, namespace: str, name: str, phase: str, ready: bool = False
) -> None:
    status: dict[str, Any] = {"phase": phase}
    if phase == "Running":
        status["conditions"] = [{"type": "Ready", "status": "True" if ready else "False"}]
    kube.patch("Pod", namespace, name, {"status": status}, subresource="status")


def job_status(kube: KubeClient, namespace: str, name: str = "quickstart") -> dict[str, Any]:
    obj = kube.get("TrainJob", namespace, name)
    assert obj is not None
    return dict(obj.get("status") or {})


def make_all_ready(kube: KubeClient, namespace: str, job: str = "quickstart") -> None:
    for name in pods(kube, namespace, job):
        set_pod_phase(kube, namespace, name, "Running", ready=True)


def test_trainjob_becomes_a_ray_cluster_and_succeeds(
    kube: KubeClient, operator: RunningOperator
) -> None:
    ns = operator.namespace
    make_job(kube, ns)
    found = wait_for(
        "head, 2 workers and the driver",
        lambda: (
            (p := pods(kube, ns))
            and sorted(map(role, p.values())) == ["driver", "head", "worker", "worker"]
            and p
        ),
    )
    assert all(p["metadata"]["ownerReferences"][0]["kind"] == "TrainJob" for p in found.values())
    for kind in ("Service", "ServiceAccount", "Role", "RoleBinding"):
        assert kube.list(kind, ns, "trainjob.dev/name=quickstart"), kind
    status = wait_for(
        "Starting", lambda: job_status(kube, ns).get("phase") == "Starting" and job_status(kube, ns)
    )
    assert status["observedGeneration"] == 1
    # the kstatus conditions (Flux): InProgress while it starts
    kstatus = {c["type"]: c["status"] for c in status["conditions"]}
    assert (kstatus["Ready"], kstatus["Reconciling"], kstatus["Stalled"]) == (
        "False",
        "True",
        "False",
    )

    make_all_ready(kube, ns)
    status = wait_for(
        "Running", lambda: (s := job_status(kube, ns)).get("phase") == "Running" and s
    )
    assert status["workers"] == {"ready": 2, "desired": 2}
    kstatus = {c["type"]: c["status"] for c in status["conditions"]}
    assert (kstatus["Ready"], kstatus["Reconciling"]) == ("True", "False")
    assert status["startTime"]

    driver = next(n for n, p in pods(kube, ns).items() if role(p) == "driver")
    set_pod_phase(kube, ns, driver, "Succeeded")
    status = wait_for(
        "Succeeded", lambda: (s := job_status(kube, ns)).get("phase") == "Succeeded" and s
    )
    assert {c["type"]: c["status"] for c in status["conditions"]}["Succeeded"] == "True"
    assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "True"
    assert status["observedGeneration"] == 1
    remaining = wait_for(
        "cluster pods deleted", lambda: (p := pods(kube, ns)) and len(p) == 1 and p
    )
    assert list(remaining) == [driver]  # the driver pod stays for its logs
    events = kube.list("Event", ns)
    reasons = {e["reason"] for e in events if e["involvedObject"]["name"] == "quickstart"}
    assert {"Created", "Running", "Succeeded"} <= reasons


def fail_first_worker_and_wait_for_its_replacement(
    kube: KubeClient, namespace: str, timeout: float = DEFAULT_TIMEOUT_S
) -> None:
    """Play the kubelet: the first worker pod failed; wait until the operator recreated it
    under the same name (a new uid)."""
    worker = sorted(n for n, p in pods(kube, namespace).items() if role(p) == "worker")[0]
    old_uid = pods(kube, namespace)[worker]["metadata"]["uid"]
    set_pod_phase(kube, namespace, worker, "Failed")
    wait_for(
        "worker recreated under the same name",
        lambda: worker in (p := pods(kube, namespace)) and p[worker]["metadata"]["uid"] != old_uid,
        timeout=timeout,
    )


def test_a_pod_change_is_reconciled_at_once_through_the_pod_watch(
    kube: KubeClient, operator: RunningOperator
) -> None:
    # The TrainJob itself does not change, so its timer ticks skip it until the resync (10 min):
    # only the pod watch (trainjob_operator.pod_watch) can bring the reconcile within 15 s.
    from prometheus_client import REGISTRY

    def pod_reconciles() -> float:
        return REGISTRY.get_sample_value("trainjob_reconciles_total", {"trigger": "pod"}) or 0.0

    ns = operator.namespace
    make_job(kube, ns)
    wait_for("4 pods", lambda: len(pods(kube, ns)) == 4)
    make_all_ready(kube, ns)  # Running: no deadline or callback due, nothing for a tick to do
    wait_for("Running", lambda: job_status(kube, ns).get("phase") == "Running")
    wait_for_timer_passes(2)  # the ticks of the Running status pass
    before = pod_reconciles()
    fail_first_worker_and_wait_for_its_replacement(kube, ns, timeout=15)
    assert pod_reconciles() > before


def test_lost_worker_is_recreated_and_driver_failure_restarts_the_cluster(
    kube: KubeClient, operator: RunningOperator
) -> None:
    ns = operator.namespace
    make_job(
        kube,
        ns,
        failure={"maxFailures": 1, "maxRestarts": 1, "restartBackoff": {"initialSeconds": 0}},
    )
    wait_for("4 pods", lambda: len(pods(kube, ns)) == 4)
    make_all_ready(kube, ns)
    wait_for("Running", lambda: job_status(kube, ns).get("phase") == "Running")
    fail_first_worker_and_wait_for_its_replacement(kube, ns)

    driver = next(n for n, p in pods(kube, ns).items() if role(p) == "driver")
    set_pod_phase(kube, ns, driver, "Failed")
    status = wait_for("restart 1", lambda: (s := job_status(kube, ns)).get("restarts") == 1 and s)
    # status.message moves on with the next reconcile (pods recreated); the Restarting
    # condition and the Event keep the restart's reason.
    restarting = {c["type"]: c for c in status["conditions"]}["Restarting"]
    assert restarting["status"] == "True"
    assert "restart 1 of 1" in restarting["message"]
    wait_for(
        "Restarting event",
        lambda: any(
            "restart 1 of 1" in e["message"]
            for e in kube.list("Event", ns)
            if e["reason"] == restarting["reason"]
        ),
    )
    fresh = wait_for(
        "attempt-1 pods",
        lambda: (
            (p := pods(kube, ns))
            and len(p) == 4
            and all(x["metadata"]["labels"]["trainjob.dev/attempt"] == "1" for x in p.values())
            and p
        ),
    )
    assert len(fresh) == 4


def test_suspend_tears_down_and_resume_recreates(
    kube: KubeClient, operator: RunningOperator
) -> None:
    ns = operator.namespace
    make_job(kube, ns)
    wait_for("4 pods", lambda: len(pods(kube, ns)) == 4)
    kube.patch("TrainJob", ns, "quickstart", {"spec": {"suspend": True}})
    wait_for("Suspended", lambda: job_status(kube, ns).get("phase") == "Suspended")
    wait_for("pods gone", lambda: len(pods(kube, ns)) == 0)
    kube.patch("TrainJob", ns, "quickstart", {"spec": {"suspend": False}})
    wait_for("pods back", lambda: len(pods(kube, ns)) == 4)
    wait_for("Starting again", lambda: job_status(kube, ns)["phase"] == "Starting")


def test_spec_update_scales_workers_and_replaces_changed_pods(
    kube: KubeClient, operator: RunningOperator
) -> None:
    ns = operator.namespace
    make_job(kube, ns)
    wait_for("4 pods", lambda: len(pods(kube, ns)) == 4)
    kube.patch("TrainJob", ns, "quickstart", {"spec": {"scaling": {"numWorkers": 3}}})
    wait_for("3 workers", lambda: sorted(map(role, pods(kube, ns).values())).count("worker") == 3)
    assert job_status(kube, ns)["observedGeneration"] == 2
    kube.patch("TrainJob", ns, "quickstart", {"spec": {"image": "example.test/runtime:2"}})
    wait_for(
        "pods on the new image",
        lambda: (
            (p := pods(kube, ns))
            and len(p) == 5
            and all(
                x["spec"]["containers"][0]["image"] == "example.test/runtime:2" for x in p.values()
            )
        ),
    )


def test_liveness_endpoint_and_metrics(
    envtest: EnvTest, crd: None, k8s_namespace: str, kube: KubeClient
) -> None:
    import socket
    import urllib.request

    from trainjob_operator.operator_main import RECONCILES

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    op = RunningOperator(envtest, k8s_namespace, liveness=f"http://127.0.0.1:{port}/healthz")
    before = RECONCILES.labels("create")._value.get()
    op.start()
    try:

        def healthy() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
                    return bool(r.status == 200)
            except OSError:
                return False

        wait_for("liveness endpoint answering 200", healthy, timeout=30)
        make_job(kube, k8s_namespace)
        wait_for(
            "a create reconcile counted", lambda: RECONCILES.labels("create")._value.get() > before
        )
    finally:
        remove_trainjobs(envtest, k8s_namespace)
        op.stop()


def test_operator_restart_creates_no_duplicates(
    kube: KubeClient, operator: RunningOperator
) -> None:
    ns = operator.namespace
    make_job(kube, ns)
    wait_for("4 pods", lambda: len(pods(kube, ns)) == 4)
    before = {n: p["metadata"]["uid"] for n, p in pods(kube, ns).items()}
    resumed = reconciles("resume")
    operator.stop()
    operator.start()
    wait_for("the resume reconcile", lambda: reconciles("resume") > resumed)
    wait_for_timer_passes(3)
    after = {n: p["metadata"]["uid"] for n, p in pods(kube, ns).items()}
    assert after == before


def test_no_finalizer_or_kopf_bookkeeping_and_an_old_finalizer_is_released(
    kube: KubeClient, operator: RunningOperator
) -> None:
    """The operator writes nothing on a TrainJob but its status (and its own annotation when
    a validation pool idles): no finalizer, no kopf diff-base or progress annotations (issue
    20: two PATCHes per TrainJob). A TrainJob an earlier build left with kopf's finalizer,
    and created while the operator was down, is reconciled when the operator starts, and its
    finalizer is released, so it can be deleted."""
    ns = operator.namespace
    make_job(kube, ns)
    wait_for("Starting", lambda: job_status(kube, ns).get("phase") == "Starting")
    wait_for_timer_passes(2)  # and any bookkeeping kopf would do with them
    meta = kube.get("TrainJob", ns, "quickstart")["metadata"]  # type: ignore[index]
    assert not meta.get("finalizers"), meta
    assert not [k for k in meta.get("annotations") or {} if k.startswith("trainjob.dev/")], meta

    operator.stop()
    body = copy.deepcopy(QUICKSTART)
    body["metadata"] = {
        "name": "legacy",
        "namespace": ns,
        "finalizers": ["trainjob.dev/finalizer"],
        "annotations": {"trainjob.dev/last-handled-configuration": "{}"},
    }
    kube.create(body, ns)
    operator.start()
    wait_for("legacy reconciled", lambda: len(pods(kube, ns, "legacy")) == 4)
    wait_for(
        "finalizer released",
        lambda: not kube.get("TrainJob", ns, "legacy")["metadata"].get("finalizers"),  # type: ignore[index]
    )
    kube.delete("TrainJob", ns, "legacy")
    wait_for("legacy deleted", lambda: kube.get("TrainJob", ns, "legacy") is None)


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        # Valid for the CRD schema, invalid for the models (a topology v6e does not have).
        (
            {"scaling": {"numWorkers": 4, "tpu": {"acceleratorType": "v6e", "topology": "3x3"}}},
            "spec.scaling.tpu",
        ),
        # Free-form for the CRD, rejected by the renderers.
        ({"podTemplate": {"colour": "blue"}}, "spec.podTemplate.colour"),
    ],
)
def test_invalid_spec_is_failed_with_the_field(
    kube: KubeClient, operator: RunningOperator, spec: dict[str, Any], field: str
) -> None:
    ns = operator.namespace
    make_job(kube, ns, **spec)
    status = wait_for("Failed", lambda: (s := job_status(kube, ns)).get("phase") == "Failed" and s)
    assert field in status["message"]
    assert next(c for c in status["conditions"] if c["type"] == "Failed")["reason"] == (
        "InvalidSpec"
    )
    # kstatus (Flux) reads it as Failed, for the generation it was computed from
    stalled = next(c for c in status["conditions"] if c["type"] == "Stalled")
    assert (stalled["status"], stalled["reason"]) == ("True", "InvalidSpec")
    assert status["observedGeneration"] == 1
    assert pods(kube, ns) == {}


def test_fifty_trainjobs_are_all_reconciled(kube: KubeClient, operator: RunningOperator) -> None:
    ns = operator.namespace
    for i in range(50):
        make_job(kube, ns, name=f"job-{i:02d}", validation=None)
    wait_for("200 pods", lambda: len(kube.list("Pod", ns, "trainjob.dev/role")) == 200, timeout=240)
    statuses = wait_for(
        "all Starting",
        lambda: (
            (s := [(o.get("status") or {}).get("phase") for o in kube.list("TrainJob", ns)])
            and all(p == "Starting" for p in s)
            and s
        ),
        timeout=120,
    )
    assert len(statuses) == 50


# --------------------------------------------------------------------------- more helpers


def set_terminated(
    kube: KubeClient,
    namespace: str,
    pod: str,
    container: str,
    exit_code: int,
    reason: str,
    msg: str,
) -> None:
    """Play the kubelet: the pod failed, its container ended with ``exit_code``."""
    terminated = {"exitCode": exit_code, "reason": reason, "message": msg}
    status = {
        "phase": "Failed",
        "containerStatuses": [
            {
                "name": container,
                "ready": False,
                "restartCount": 0,
                "image": "example.test/runtime",
                "imageID": "",
                "state": {"terminated": terminated},
            }
        ],
    }
    kube.patch("Pod", namespace, pod, {"status": status}, subresource="status")


def by_role(kube: KubeClient, namespace: str, wanted: str, job: str = "quickstart") -> list[str]:
    return sorted(n for n, p in pods(kube, namespace, job).items() if role(p) == wanted)


def failed_condition(status: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == "Failed")


def events(kube: KubeClient, namespace: str, reason: str, job: str = "quickstart") -> list[Any]:
    return [
        e
        for e in kube.list("Event", namespace)
        if e["reason"] == reason and e["involvedObject"]["name"] == job
    ]


def wait_phase(kube: KubeClient, namespace: str, phase: str, timeout: float = 60) -> dict[str, Any]:
    status: dict[str, Any] = wait_for(
        phase,
        lambda: (s := job_status(kube, namespace)).get("phase") == phase and s,
        timeout=timeout,
    )
    return status


# --------------------------------------------------------------------------- validation pool


def test_validation_pool_scales_up_holds_while_validating_and_idles_to_min(
    kube: KubeClient, operator: RunningOperator
) -> None:
    ns = operator.namespace
    validation = {
        "entrypoint": "examples.quickstart.train:validate_func",
        "maxConcurrent": 2,
        "pool": {"minReplicas": 0, "maxReplicas": 3, "idleSeconds": 3},
    }
    make_job(kube, ns, validation=validation)
    wait_for("4 pods", lambda: len(pods(kube, ns)) == 4)

    def demand(pending: int, running: int, done: int) -> None:  # what the driver publishes
        counts = {"pending": pending, "running": running, "done": done, "failed": 0}
        kube.patch(
            "TrainJob", ns, "quickstart", {"status": {"validations": counts}}, subresource="status"
        )

    demand(3, 0, 0)
    wait_for("2 validation pods (maxConcurrent)", lambda: len(by_role(kube, ns, "validation")) == 2)
    vals = by_role(kube, ns, "validation")
    uids = {n: pods(kube, ns)[n]["metadata"]["uid"] for n in vals}
    # val-0's validation finished first; val-1's still runs: the pool must not shrink.
    demand(0, 1, 1)
    deadline = time.monotonic() + 5  # longer than idleSeconds, several timer ticks
    while time.monotonic() < deadline:
        current = pods(kube, ns)
        assert {n: current[n]["metadata"]["uid"] for n in vals if n in current} == uids
        time.sleep(0.5)
    assert job_status(kube, ns)["validationPool"] == {"replicas": 2}
    demand(0, 0, 2)
    wait_for("pool back to minReplicas=0", lambda: by_role(kube, ns, "validation") == [])
    wait_for(
        "status.validationPool.replicas 0",
        lambda: job_status(kube, ns)["validationPool"] == {"replicas": 0},
    )


# --------------------------------------------------------------------------- invalid children


def test_child_rejected_by_the_api_server_fails_the_job_once(
    kube: KubeClient, operator: RunningOperator
) -> None:
    ns = operator.namespace
    # Free-form for the models and renderers; the API server rejects it (value with Exists).
    bad = {"tolerations": [{"key": "example.test/x", "operator": "Exists", "value": "b"}]}
    make_job(kube, ns, podTemplate=bad)
    status = wait_phase(kube, ns, "Failed")
    failed = failed_condition(status)
    assert failed["reason"] == "InvalidChild"
    assert "spec.tolerations[0].operator" in failed["message"]
    assert "must be empty" in status["message"]
    wait_for_timer_passes(3)  # no new Event, phase stays Failed
    assert len(events(kube, ns, "InvalidChild")) == 1
    assert job_status(kube, ns)["phase"] == "Failed"
    assert pods(kube, ns) == {}


# --------------------------------------------------------------------------- failures


def test_head_or_driver_pod_deleted_by_someone_else_restarts_without_using_max_restarts(
    kube: KubeClient, operator: RunningOperator
) -> None:
    """``kubectl delete pod`` (no DisruptionTarget condition) with the default maxRestarts 0:
    the driver's deletion seen while it terminates (a finalizer holds it here, where no
    kubelet ends it), then the next attempt's head gone at once: two restarts, neither
    counted, each recorded with its cause."""
    ns = operator.namespace
    make_job(kube, ns)
    wait_for("4 pods", lambda: len(pods(kube, ns)) == 4)
    make_all_ready(kube, ns)
    wait_phase(kube, ns, "Running")
    driver = by_role(kube, ns, "driver")[0]
    kube.patch("Pod", ns, driver, {"metadata": {"finalizers": ["example.test/hold"]}})
    kube.delete("Pod", ns, driver)
    status = wait_for("restart 1", lambda: (s := job_status(kube, ns)).get("restarts") == 1 and s)
    restarting = {c["type"]: c for c in status["conditions"]}["Restarting"]
    assert restarting["reason"] == "DriverDisrupted"
    assert f"pod {driver} deleted (deletionTimestamp " in restarting["message"]
    assert "not counted against maxRestarts=0" in restarting["message"]
    # The old driver still runs (committing what it can): its head and workers wait for it.
    wait_for_timer_passes(1)
    held = pods(kube, ns)  # those not being deleted
    assert sorted(map(role, held.values())) == ["head", "worker", "worker"], held
    assert kube.get("Pod", ns, driver) is not None
    kube.patch("Pod", ns, driver, {"metadata": {"finalizers": None}})
    wait_for(
        "attempt-1 cluster",
        lambda: (
            len(p := pods(kube, ns)) == 4
            and all(x["metadata"]["labels"]["trainjob.dev/attempt"] == "1" for x in p.values())
        ),
    )
    make_all_ready(kube, ns)
    wait_phase(kube, ns, "Running")
    kube.delete("Pod", ns, by_role(kube, ns, "head")[0])
    status = wait_for("restart 2", lambda: (s := job_status(kube, ns)).get("restarts") == 2 and s)
    assert status["ignoredRestarts"] == 2
    first, second = status["restartHistory"]
    assert (first["reason"], first["counted"]) == ("DriverDisrupted", False)
    assert (second["reason"], second["counted"]) == ("HeadDisrupted", False)
    assert "disappeared while Running" in second["message"]
    wait_for("HeadDisrupted event", lambda: events(kube, ns, "HeadDisrupted"))


def test_max_restarts_exhausted_fails_with_the_reason_and_termination(
    kube: KubeClient, operator: RunningOperator
) -> None:
    ns = operator.namespace
    make_job(kube, ns, failure={"maxRestarts": 0})
    wait_for("4 pods", lambda: len(pods(kube, ns)) == 4)
    make_all_ready(kube, ns)
    wait_phase(kube, ns, "Running")
    driver = by_role(kube, ns, "driver")[0]
    set_terminated(kube, ns, driver, "driver", 137, "OOMKilled", "")
    status = wait_phase(kube, ns, "Failed")
    failed = failed_condition(status)
    assert failed["reason"] == "DriverFailed"
    assert "maxRestarts=0 exhausted" in failed["message"]
    assert "OOMKilled, exit code 137" in failed["message"]
    assert status["restarts"] == 0
    wait_for("DriverFailed event", lambda: events(kube, ns, "DriverFailed"))
    assert "OOMKilled" in events(kube, ns, "DriverFailed")[0]["message"]


def test_driver_invalid_input_fails_at_once(kube: KubeClient, operator: RunningOperator) -> None:
    ns = operator.namespace
    make_job(kube, ns, failure={"maxRestarts": 3})
    wait_for("4 pods", lambda: len(pods(kube, ns)) == 4)
    driver = by_role(kube, ns, "driver")[0]
    set_terminated(kube, ns, driver, "driver", 2, "Error", "invalid TrainJob: spec.config.lr")
    status = wait_phase(kube, ns, "Failed")
    assert failed_condition(status)["reason"] == "InvalidInput"
    assert "invalid TrainJob: spec.config.lr" in status["message"]
    assert status["restarts"] == 0
    wait_for("cluster pods deleted, driver kept", lambda: list(pods(kube, ns)) == [driver])


def test_active_deadline_fails_a_starting_job_and_deletes_its_pods(
    kube: KubeClient, operator: RunningOperator
) -> None:
    ns = operator.namespace
    make_job(kube, ns, failure={"activeDeadlineSeconds": 2}, keepDriverPod="Never")
    wait_for("4 pods", lambda: len(pods(kube, ns)) == 4)
    started = job_status(kube, ns)
    assert started["phase"] == "Starting" and started["startTime"]  # set with the pods
    status = wait_phase(kube, ns, "Failed", timeout=30)
    assert failed_condition(status)["reason"] == "DeadlineExceeded"
    wait_for("every pod deleted (keepDriverPod: Never)", lambda: pods(kube, ns) == {})


def test_keep_driver_pod_on_failure_deletes_it_after_success(
    kube: KubeClient, operator: RunningOperator
) -> None:
    ns = operator.namespace
    make_job(kube, ns, keepDriverPod="OnFailure")
    wait_for("4 pods", lambda: len(pods(kube, ns)) == 4)
    set_pod_phase(kube, ns, by_role(kube, ns, "driver")[0], "Succeeded")
    wait_phase(kube, ns, "Succeeded")
    wait_for("every pod deleted, the driver too", lambda: pods(kube, ns) == {})


def test_ttl_after_finished_deletes_the_trainjob(
    kube: KubeClient, operator: RunningOperator
) -> None:
    ns = operator.namespace
    # A TTL long enough that a busy CI machine still sees the Succeeded phase
    # before the TrainJob goes away, short enough to keep the test quick.
    ttl = 5
    make_job(kube, ns, ttlSecondsAfterFinished=ttl)
    wait_for("4 pods", lambda: len(pods(kube, ns)) == 4)
    set_pod_phase(kube, ns, by_role(kube, ns, "driver")[0], "Succeeded")
    status = wait_phase(kube, ns, "Succeeded")
    finished_at = datetime.strptime(status["completionTime"], "%Y-%m-%dT%H:%M:%SZ").replace(
        tzinfo=UTC
    )
    wait_for("TrainJob deleted", lambda: kube.get("TrainJob", ns, "quickstart") is None, timeout=30)
    deleted_after = (datetime.now(UTC) - finished_at).total_seconds()
    assert deleted_after >= ttl - 1, f"deleted {deleted_after:.1f}s after completion, TTL {ttl}s"
    wait_for("TTLExpired event", lambda: events(kube, ns, "TTLExpired"))


# --------------------------------------------------------------------------- metrics, restarts, 409


def test_prometheus_endpoint_serves_reconciles_and_jobs(
    kube: KubeClient, operator: RunningOperator, tmp_path: Path
) -> None:
    """The operator's /metrics, then (when installed) a real Prometheus server scraping it and
    answering the chart's operator dashboard and the operator's restart-loop alert: every
    panel returns series, so the names match (the drivers' side: tests/runtime/test_prometheus.py).
    """
    import socket
    import urllib.request

    from tests.chart.test_monitoring import alert_exprs, rule_groups
    from tests.support.prometheus import (
        PROMETHEUS,
        PrometheusServer,
        dashboard_queries,
    )
    from trainjob_operator.operator_main import start_metrics_server

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = start_metrics_server(port, "127.0.0.1")
    try:
        make_job(kube, operator.namespace)
        wait_phase(kube, operator.namespace, "Starting")

        def scrape() -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                return str(resp.read().decode())

        text = wait_for(
            "jobs gauge with a Starting job",
            lambda: (t := scrape()) and 'trainjob_jobs{phase="Starting"} 0.0' not in t and t,
        )
        assert 'trainjob_reconciles_total{trigger="create"}' in text
        assert 'trainjob_jobs{phase="Starting"}' in text
        assert "trainjob_reconcile_seconds_bucket" in text
        assert (
            f'trainjob_job_restarts{{namespace="{operator.namespace}",trainjob="quickstart"}} 0.0'
            in text
        )
        if PROMETHEUS is None:
            return
        prometheus = PrometheusServer(tmp_path / "prometheus", {"operator": [f"127.0.0.1:{port}"]})
        try:
            prometheus.wait_for_scrapes("operator", count=2)
            for title, expr in dashboard_queries("trainjob-operator.json"):
                assert prometheus.query(expr), f"panel {title!r}: no series for {expr}"
            restart_loop = alert_exprs(rule_groups())["TrainJobRestartLoop"]
            assert prometheus.query(restart_loop) == []  # answered: no restarts
            assert prometheus.query(
                f'trainjob_job_restarts{{namespace="{operator.namespace}",trainjob="quickstart"}}'
            )
        finally:
            prometheus.stop()
    finally:
        server.shutdown()
        server.server_close()


class FailingAfter(KubeClient):
    """A client that loses the API server once the non-Pod children and the head pod exist:
    every other Pod create fails (the reconcile creates the non-Pod children, then the Pods
    concurrently, so which Pods a real cut would leave is not fixed; this one is)."""

    def __init__(self, config: KubeConfig) -> None:
        super().__init__(config, attempts=1)

    def ensure(self, obj: dict[str, Any], namespace: str) -> bool:
        if obj["kind"] == "Pod" and role(obj) != "head":
            from trainjob_operator.kube import ApiError

            raise ApiError(0, {"reason": "Unreachable", "message": "test: cut off"}, "POST")
        return super().ensure(obj, namespace)


def test_operator_restart_mid_reconcile_creates_no_duplicates(
    envtest: EnvTest, crd: None, k8s_namespace: str, kube: KubeClient
) -> None:
    ns = k8s_namespace
    config = KubeConfig(host=envtest.host, token=envtest.token, ca_file=str(envtest.ca_file))
    # Every non-Pod child and the head pod: then the connection "drops".
    first = RunningOperator(envtest, ns, client=FailingAfter(config))
    first.start()
    try:
        make_job(kube, ns)
        wait_for("the head pod only", lambda: by_role(kube, ns, "head"))
        wait_for_timer_passes(2)  # the failing reconcile is retried; nothing more is created
        assert list(pods(kube, ns)) == by_role(kube, ns, "head")
    finally:
        first.stop()
    head_uid = next(iter(pods(kube, ns).values()))["metadata"]["uid"]

    second = RunningOperator(envtest, ns)
    second.start()
    try:
        wait_for("4 pods", lambda: len(pods(kube, ns)) == 4)
        wait_for_timer_passes(3)  # any duplicate would be created by now
        found = kube.list("Pod", ns, "trainjob.dev/name=quickstart")
        names = sorted(p["metadata"]["name"] for p in found)
        assert len(names) == len(set(names)) == 4
        assert sorted(map(role, found)) == ["driver", "head", "worker", "worker"]
        assert pods(kube, ns)[by_role(kube, ns, "head")[0]]["metadata"]["uid"] == head_uid
        for kind in ("Service", "ServiceAccount", "Role", "RoleBinding"):
            assert len(kube.list(kind, ns, "trainjob.dev/name=quickstart")) == 1, kind
    finally:
        remove_trainjobs(envtest, ns)
        second.stop()


def test_existing_child_on_create_is_success(kube: KubeClient, operator: RunningOperator) -> None:
    ns = operator.namespace
    # Created before the operator saw the job, without the job's labels: the operator's list
    # does not see it, its create answers 409 AlreadyExists, and that is success.
    account = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": "quickstart-driver", "namespace": ns},
    }
    assert kube.create(account, ns) is not None
    from trainjob_operator.operator_main import ERRORS

    before = sum(ERRORS.labels(t)._value.get() for t in ("create", "timer", "pod", "resume"))
    make_job(kube, ns)
    wait_for("4 pods", lambda: len(pods(kube, ns)) == 4)
    wait_phase(kube, ns, "Starting")
    wait_for_timer_passes(2)  # each create of the account answers 409
    after = sum(ERRORS.labels(t)._value.get() for t in ("create", "timer", "pod", "resume"))
    assert after == before
    assert job_status(kube, ns)["phase"] == "Starting"
