"""Leader election on a real kube-apiserver (issue 19, item 4): the Lease algorithm step by step
(two electors, a controlled clock), and two real operator processes of which the leader is
killed with SIGKILL while it creates a TrainJob's children: the standby takes over once the
lease expires and the job ends up with exactly one of each child."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.k8s.test_operator import (
    job_status,
    make_all_ready,
    make_job,
    pods,
    role,
    wait_for,
)
from tests.support import EnvTest
from tests.support.ports import free_port
from trainjob_operator.kube import KubeClient, KubeConfig
from trainjob_operator.leader import (
    HealthServer,
    LeaderElectionConfig,
    LeaderElector,
    run_with_leader_election,
)

REPO = Path(__file__).resolve().parents[2]


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _elector(kube: KubeClient, ns: str, identity: str, clock: Clock) -> LeaderElector:
    config = LeaderElectionConfig(
        namespace=ns, identity=identity, lease_duration=15, renew_deadline=10, retry_period=2
    )
    return LeaderElector(kube, config, clock=clock)


def test_the_lease_goes_to_one_replica_and_to_a_standby_only_after_it_expired(
    kube: KubeClient, k8s_namespace: str
) -> None:
    ns = k8s_namespace
    clock_a, clock_b = Clock(), Clock()
    a = _elector(kube, ns, "a", clock_a)
    b = _elector(kube, ns, "b", clock_b)
    assert a.try_acquire_or_renew()  # creates the Lease
    assert not b.try_acquire_or_renew()  # held by a, seen just now
    lease = kube.get("Lease", ns, "trainjob-operator")
    assert lease is not None and lease["spec"]["holderIdentity"] == "a"
    assert lease["spec"]["leaseDurationSeconds"] == 15
    # a renews: b's observation restarts; 14 s on b's clock later it is still a's.
    clock_a.now += 5
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    clock_b.now += 14
    assert not b.try_acquire_or_renew()
    # a stops renewing: b takes over 15 s after it last saw the record change, by its clock.
    clock_b.now += 15
    assert b.try_acquire_or_renew()
    lease = kube.get("Lease", ns, "trainjob-operator")
    assert lease is not None and lease["spec"]["holderIdentity"] == "b"
    assert lease["spec"]["leaseTransitions"] == 1
    # a comes back: it sees b's lease and does not take it.
    assert not a.try_acquire_or_renew()
    assert a.holder() == "b"


def test_a_stale_write_loses_on_the_resource_version(kube: KubeClient, k8s_namespace: str) -> None:
    ns = k8s_namespace
    clock = Clock()
    a = _elector(kube, ns, "a", clock)
    assert a.try_acquire_or_renew()
    stale = kube.get("Lease", ns, "trainjob-operator")
    assert stale is not None
    assert a.try_acquire_or_renew()  # a new resourceVersion
    b = _elector(kube, ns, "b", clock)
    b.client = _Replaying(kube, stale)  # b acts on the lease as it was before a's renewal
    clock.now += 100  # and thinks it expired
    assert not b.try_acquire_or_renew()  # 409 Conflict: no second holder
    lease = kube.get("Lease", ns, "trainjob-operator")
    assert lease is not None and lease["spec"]["holderIdentity"] == "a"


class _Replaying(KubeClient):
    """Answers GET of the Lease with an old copy (a replica that read before another wrote)."""

    def __init__(self, real: KubeClient, lease: dict[str, Any]) -> None:
        super().__init__(real.config)
        self.lease = lease

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.lease if kind == "Lease" else super().get(kind, namespace, name)


def test_a_clean_stop_releases_the_lease_and_health_endpoints_follow_it(
    kube: KubeClient, k8s_namespace: str
) -> None:
    ns = k8s_namespace
    config = LeaderElectionConfig(
        namespace=ns, identity="a", lease_duration=3, renew_deadline=2, retry_period=0.2
    )
    elector = LeaderElector(kube, config)
    health = HealthServer(elector, 0, addr="127.0.0.1").start()
    stop = threading.Event()
    ran = threading.Event()

    def operator(flag: threading.Event) -> None:
        ran.set()
        flag.wait()

    thread = threading.Thread(target=run_with_leader_election, args=(elector, stop, operator))
    thread.start()
    try:
        assert ran.wait(30)
        assert _get(health.port, "/leader") == 200
        assert _get(health.port, "/readyz") == 200
        assert _get(health.port, "/healthz") == 200
    finally:
        stop.set()
        thread.join(30)
    assert not thread.is_alive()
    lease = kube.get("Lease", ns, "trainjob-operator")
    assert lease is not None and not lease["spec"].get("holderIdentity")
    assert _get(health.port, "/leader") == 503
    assert _get(health.port, "/healthz") == 503  # the elector is no longer running
    health.stop()


def _get(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


# --------------------------------------------------------------------------- two operators


class OperatorProcess:
    """``trainjob operator --leader-elect`` as a real process."""

    def __init__(self, envtest: EnvTest, namespace: str, log: Path) -> None:
        self.port = free_port()
        env = {
            **os.environ,
            "KUBECONFIG": str(envtest.kubeconfig),
            "POD_NAMESPACE": namespace,
            "PYTHONPATH": str(REPO),
        }
        env.pop("KUBERNETES_SERVICE_HOST", None)
        self.log = log
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "trainjob_operator.cli",
                "operator",
                "--namespace",
                namespace,
                "--leader-elect",
                "--health-port",
                str(self.port),
                "--metrics-port",
                "0",
            ],
            env=env,
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
        )

    def status(self, path: str) -> int:
        try:
            return _get(self.port, path)
        except OSError:
            return 0

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)


@pytest.fixture
def two_operators(
    envtest: EnvTest, crd: None, k8s_namespace: str, tmp_path: Path
) -> Iterator[list[OperatorProcess]]:
    procs = [
        OperatorProcess(envtest, k8s_namespace, tmp_path / f"operator-{i}.log") for i in (0, 1)
    ]
    try:
        yield procs
    finally:
        kube = KubeClient(
            KubeConfig(host=envtest.host, token=envtest.token, ca_file=str(envtest.ca_file))
        )
        for job in kube.list("TrainJob", k8s_namespace):
            kube.delete("TrainJob", k8s_namespace, job["metadata"]["name"])
        alive = [p for p in procs if p.proc.poll() is None]
        if alive:
            wait_for("TrainJobs deleted", lambda: not kube.list("TrainJob", k8s_namespace), 120)
        for p in procs:
            p.stop()


BURST = 8
"""TrainJobs created at once, just before the leader is killed (issue 39: mid-burst)."""


def test_killing_the_leader_mid_burst_hands_over_without_duplicates_or_restarts(
    kube: KubeClient, two_operators: list[OperatorProcess], k8s_namespace: str
) -> None:
    ns = k8s_namespace
    leader = wait_for(
        "one leader",
        lambda: [p for p in two_operators if p.status("/leader") == 200],
        timeout=90,
    )
    assert len(leader) == 1
    (first,) = leader
    (standby,) = [p for p in two_operators if p is not first]
    wait_for("the standby ready to take over", lambda: standby.status("/readyz") == 200)
    assert standby.status("/leader") == 503
    lease = kube.get("Lease", ns, "trainjob-operator")
    assert lease is not None
    holder = lease["spec"]["holderIdentity"]

    # A job already running when the leader goes: the new leader must leave it alone.
    make_job(kube, ns, "steady")
    wait_for("steady's 4 pods", lambda: len(pods(kube, ns, "steady")) == 4, timeout=60)
    make_all_ready(kube, ns, "steady")
    wait_for("steady Running", lambda: job_status(kube, ns, "steady").get("phase") == "Running")
    steady_uids = {n: p["metadata"]["uid"] for n, p in pods(kube, ns, "steady").items()}

    # A burst: the leader starts creating children; kill it at the first one of the first job.
    burst = ["quickstart"] + [f"burst-{i}" for i in range(BURST - 1)]
    for name in burst:
        make_job(kube, ns, name)
    wait_for(
        "the leader's first child",
        lambda: kube.list("ServiceAccount", ns, "trainjob.dev/name=quickstart") or pods(kube, ns),
        timeout=60,
    )
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait(30)
    created_before = sum(len(pods(kube, ns, name)) for name in burst)

    # The standby takes over once the lease expired (15 s by its clock; 2 s retries).
    killed_at = time.monotonic()
    wait_for("the standby leads", lambda: standby.status("/leader") == 200, timeout=60)
    took = time.monotonic() - killed_at
    lease = kube.get("Lease", ns, "trainjob-operator")
    assert lease is not None and lease["spec"]["holderIdentity"] not in (None, holder)
    assert lease["spec"]["leaseTransitions"] >= 1
    for name in burst:
        wait_for(f"{name}'s 4 pods", lambda n=name: len(pods(kube, ns, n)) == 4, timeout=90)
        make_all_ready(kube, ns, name)
    for name in burst:
        wait_for(
            f"{name} Running",
            lambda n=name: job_status(kube, ns, n).get("phase") == "Running",
            timeout=60,
        )
    for name in [*burst, "steady"]:
        found = kube.list("Pod", ns, f"trainjob.dev/name={name}")
        names = sorted(p["metadata"]["name"] for p in found)
        assert len(names) == len(set(names)) == 4, (name, names)
        assert sorted(map(role, found)) == ["driver", "head", "worker", "worker"], name
        for kind in ("Service", "ServiceAccount", "Role", "RoleBinding"):
            assert len(kube.list(kind, ns, f"trainjob.dev/name={name}")) == 1, (name, kind)
        status = job_status(kube, ns, name)
        assert status["restarts"] == 0 and not status.get("restartHistory"), (name, status)
    # The running job's pods are the ones it had: not recreated by the new leader.
    assert {n: p["metadata"]["uid"] for n, p in pods(kube, ns, "steady").items()} == steady_uids
    print(f"burst pods before the kill: {created_before}; takeover after {took:.1f}s")

    # SIGTERM, as the kubelet sends on a rollout: the leader stops within the grace period
    # and hands the Lease back (it hung until SIGKILL, its Lease held, before this fix).
    stopping = time.monotonic()
    standby.proc.send_signal(signal.SIGTERM)
    assert standby.proc.wait(20) == 0
    lease = kube.get("Lease", ns, "trainjob-operator")
    assert lease is not None and not lease["spec"].get("holderIdentity"), lease
    print(f"the leader stopped {time.monotonic() - stopping:.1f}s after SIGTERM")
