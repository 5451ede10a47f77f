"""kube-apiserver and etcd restarted in the middle of a run, as a control-plane upgrade does
(issue 39): the operator's watches and the driver's status writes recover, and no job fails
or restarts because of it. Against the real API server (no kubelet: the test plays it)."""

from __future__ import annotations

import time

import pytest

from tests.k8s.test_operator import (
    RunningOperator,
    fail_first_worker_and_wait_for_its_replacement,
    job_status,
    make_all_ready,
    make_job,
    pods,
    reconciles,
    remove_trainjobs,
    role,
    set_pod_phase,
)
from tests.support import EnvTest
from tests.support.waiting import wait_for
from trainjob_operator.kube import KubeClient
from trainjob_operator.launcher.driver import StatusPublisher

pytestmark = pytest.mark.usefixtures("crd")


def test_a_control_plane_restart_mid_run_fails_nothing(
    envtest: EnvTest, kube: KubeClient, k8s_namespace: str
) -> None:
    ns = k8s_namespace
    operator = RunningOperator(envtest, ns)
    operator.start()
    publisher: StatusPublisher | None = None
    try:
        make_job(kube, ns)
        wait_for("head, 2 workers and the driver", lambda: len(pods(kube, ns)) == 4)
        make_all_ready(kube, ns)
        wait_for("Running", lambda: job_status(kube, ns).get("phase") == "Running")
        before = {n: p["metadata"]["uid"] for n, p in pods(kube, ns).items()}
        # The driver's publisher, with its own client (its connection drops with the server).
        publisher = StatusPublisher(
            KubeClient(operator.config), ns, "quickstart", "val_loss", min_interval=0.1
        )
        publisher.on_report(0, {"step": 0})
        wait_for("step 0", lambda: job_status(kube, ns).get("progress", {}).get("step") == 0)

        def while_down() -> None:
            # The last report before the server comes back: published once it is back,
            # without another report to trigger it.
            assert publisher is not None
            publisher.on_report(1, {"step": 1})

        down_s = envtest.restart_control_plane(while_down=while_down)
        assert down_s > 0
        wait_for(
            "step 1 published after the restart",
            lambda: job_status(kube, ns).get("progress", {}).get("step") == 1,
            timeout=90,
        )
        # The worker lost while the watch may still be reconnecting (its retries back off up
        # to 30 s): replaced all the same, by the timer's reconcile if not through the watch.
        fail_first_worker_and_wait_for_its_replacement(kube, ns, timeout=90)
        # The operator's pod watch is back: a pod change is reconciled through it. The pod is
        # touched until one is (a change made before the watch resumed may only be made up
        # by a relist, which reconciles through the timer).
        pod_reconciles = reconciles("pod")
        worker = sorted(n for n, p in pods(kube, ns).items() if role(p) == "worker")[0]

        def touched_and_reconciled_through_the_watch() -> bool:
            note = {"metadata": {"annotations": {"test.trainjob.dev/touched": str(time.time())}}}
            kube.patch("Pod", ns, worker, note)
            return reconciles("pod") > pod_reconciles

        wait_for(
            "a pod change reconciled through the pod watch",
            touched_and_reconciled_through_the_watch,
            timeout=90,
            every=2.0,
        )
        # Nothing else was replaced, and the job never left Running or counted a restart.
        after = {n: p["metadata"]["uid"] for n, p in pods(kube, ns).items()}
        assert sum(before[n] != after[n] for n in before) == 1
        status = job_status(kube, ns)
        assert status["phase"] == "Running", status
        assert not status.get("restartHistory"), status
        make_all_ready(kube, ns)
        driver = next(n for n, p in pods(kube, ns).items() if role(p) == "driver")
        set_pod_phase(kube, ns, driver, "Succeeded")
        wait_for("Succeeded", lambda: job_status(kube, ns).get("phase") == "Succeeded")
        assert not job_status(kube, ns).get("restartHistory")
    finally:
        if publisher is not None:
            publisher.close()
        remove_trainjobs(envtest, ns)
        operator.stop()
