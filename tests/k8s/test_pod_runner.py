"""PodRunner, the test kubelet: real Pods on a real kube-apiserver, run as local processes."""

from __future__ import annotations

import os
import shutil
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.k8s.test_operator import wait_for
from tests.support import EnvTest
from tests.support.pod_runner import (
    PodRunner,
    _Network,
    container_argv,
    expand_env_refs,
    host_folders_under_tmp,
    namespaces_available,
)
from trainjob_operator.kube import KubeClient, KubeConfig

# --------------------------------------------------------------------------- pure parts


def test_env_refs_expand_like_kubernetes() -> None:
    env = {"A": "1", "B.C": "x"}
    assert expand_env_refs("$(A)-$(B.C)-$(MISSING)-$$(A)-$$", env) == "1-x-$(MISSING)-$(A)-$"
    assert expand_env_refs("$A ${A} $(A", env) == "$A ${A} $(A"


def test_stable_names_become_localhost_with_mapped_ports() -> None:
    net = _Network()
    services = {"job-headless"}
    text = (
        "until ray health-check --address=job-head.job-headless:6379; do\n"
        "  echo waiting for job-head.job-headless:6379; sleep 2\n"
        "done\n"
    )
    out = net.rewrite_names(text, services, "ns")
    port = net.host_port("job-head.job-headless", 6379)
    assert out.count(f"127.0.0.1:{port}") == 2 and "job-headless" not in out
    # Longer forms of the name, and names without a port.
    assert net.rewrite_names("job-w0.job-headless.ns.svc.cluster.local", services, "ns") == (
        "127.0.0.1"
    )
    assert net.rewrite_names("a.job-headless,b.job-headless.ns.svc", services, "ns") == (
        "127.0.0.1,127.0.0.1"
    )
    # Not a pod of a known Service, or part of a longer name: left alone.
    for text in ("job-head.other:6379", "x.job-head.job-headless-2:1", "gs://bucket/job-headless"):
        assert net.rewrite_names(text, services, "ns") == text
    # The same name and port always map to the same host port; another port to another.
    assert net.host_port("job-head.job-headless", 6379) == port
    assert net.host_port("job-head.job-headless", 8265) != port


def test_own_port_flags_are_mapped() -> None:
    net = _Network()
    argv = ["ray", "start", "--port=6379", "--dashboard-port", "8265", "--num-cpus=6379"]
    out = net.rewrite_own_ports(argv, "h.svc", [6379, 8265])
    assert out == [
        "ray",
        "start",
        f"--port={net.host_port('h.svc', 6379)}",
        "--dashboard-port",
        str(net.host_port("h.svc", 8265)),
        "--num-cpus=6379",  # not a port flag
    ]
    script = ["sh", "-c", "exec ray start --metrics-export-port=8080 --block"]
    assert net.rewrite_own_ports(script, "w.svc", [8080])[2] == (
        f"exec ray start --metrics-export-port={net.host_port('w.svc', 8080)} --block"
    )


# --------------------------------------------------------------------------- on kube-apiserver


@pytest.fixture
def kube(envtest: EnvTest) -> KubeClient:
    return KubeClient(
        KubeConfig(host=envtest.host, token=envtest.token, ca_file=str(envtest.ca_file))
    )


@pytest.fixture
def runner(envtest: EnvTest, k8s_namespace: str) -> Iterator[PodRunner]:
    config = KubeConfig(host=envtest.host, token=envtest.token, ca_file=str(envtest.ca_file))
    pods = PodRunner(config, k8s_namespace, poll_interval=0.1, max_grace_seconds=5).start()
    try:
        yield pods
    finally:
        pods.stop()
        assert pods.all_processes() == []
        assert pods.errors == []


def pod(name: str, command: list[str], **spec: Any) -> dict[str, Any]:
    container = {"name": "main", "image": "ignored", "command": command}
    container.update(spec.pop("container", {}))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "t"}},
        "spec": {"restartPolicy": "Never", "containers": [container], **spec},
    }


def test_folders_under_tmp_the_runner_runs_from_stay_visible_in_containers(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A checkout or virtualenv in ``/tmp/x`` (a CI clone there) must not vanish when a
    container's own ``/tmp`` is mounted; everything else under the host's ``/tmp`` must."""
    if not namespaces_available():
        pytest.skip("needs Linux PID and mount namespaces (unshare)")
    import subprocess
    import tempfile

    host = Path(tempfile.mkdtemp(prefix="tj-host-", dir="/tmp"))
    try:
        (host / "code.txt").write_text("from the host\n")
        private = tmp_path_factory.mktemp("container-tmp")
        read = ["/bin/sh", "-c", f"cat {host}/code.txt && ls /tmp"]

        kept = subprocess.run(
            container_argv(read, private, keep=[str(host)]), capture_output=True, text=True
        )
        assert kept.returncode == 0, kept.stderr
        assert kept.stdout.splitlines() == ["from the host", host.name]

        hidden = subprocess.run(container_argv(read, private, keep=[]), capture_output=True)
        assert hidden.returncode != 0
    finally:
        shutil.rmtree(host, ignore_errors=True)

    assert str(host) not in host_folders_under_tmp()  # only what this process runs from


def phase(kube: KubeClient, ns: str, name: str) -> str | None:
    obj = kube.get("Pod", ns, name)
    return None if obj is None else str((obj.get("status") or {}).get("phase"))


def test_pod_runs_with_its_environment_and_reports_its_exit(
    kube: KubeClient, runner: PodRunner, k8s_namespace: str
) -> None:
    ns = k8s_namespace
    kube.create(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}, "data": {"k": "v"}},
        ns,
    )
    marker = f"/tmp/pod-runner-test-{ns}"
    # "$$$$": Kubernetes turns "$$" into "$" (then the shell's "$$" is its pid).
    script = f'touch {marker}; echo "$GREETING $POD $NS $IP $CPUS $FROM_CM $$$$ $HOSTNAME"; exit 3'
    kube.create(
        pod(
            "env-pod",
            ["/bin/sh", "-c", script],
            automountServiceAccountToken=False,
            container={
                "env": [
                    {"name": "WHO", "value": "world"},
                    {"name": "GREETING", "value": "hello-$(WHO)"},
                    {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {
                        "name": "NS",
                        "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
                    },
                    {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    {
                        "name": "CPUS",
                        "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}},
                    },
                    {
                        "name": "FROM_CM",
                        "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}},
                    },
                ],
                "resources": {"limits": {"cpu": "1500m"}},
            },
        ),
        ns,
    )
    wait_for("Failed", lambda: phase(kube, ns, "env-pod") == "Failed", timeout=60)
    obj = kube.get("Pod", ns, "env-pod")
    assert obj is not None
    assert obj["spec"]["nodeName"] == runner.node_name
    assert obj["status"]["podIP"] == "127.0.0.1"
    terminated = obj["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 3
    words = runner.logs("env-pod").split()
    assert words[:6] == ["hello-world", "env-pod", ns, "127.0.0.1", "2", "v"]
    assert words[-1] == "env-pod"  # HOSTNAME
    if runner.isolate:  # PID 1 of its own PID namespace, with its own /tmp
        assert words[6] == "1"
        assert not os.path.exists(marker)
    assert runner.launches("env-pod") == 1


def test_service_account_token_carries_the_accounts_rbac(
    kube: KubeClient, runner: PodRunner, k8s_namespace: str
) -> None:
    ns = k8s_namespace
    kube.create({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "reader"}}, ns)
    kube.create(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "reader"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}],
        },
        ns,
    )
    kube.create(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "reader"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": ns}],
        },
        ns,
    )
    code = textwrap.dedent(
        """
        import os
        from trainjob_operator.kube import ApiError, KubeClient, KubeConfig
        client = KubeClient(KubeConfig.load(), attempts=1)
        me = client.get("Pod", os.environ["NS"], "sa-pod")
        print("phase", me["status"]["phase"])
        try:
            client.list("Pod", os.environ["NS"])
        except ApiError as exc:
            print("list", exc.status)
        """
    )
    kube.create(
        pod(
            "sa-pod",
            [sys.executable, "-c", code],
            serviceAccountName="reader",
            container={
                "env": [
                    {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}
                ]
            },
        ),
        ns,
    )
    wait_for("Succeeded", lambda: phase(kube, ns, "sa-pod") == "Succeeded", timeout=60)
    lines = runner.logs("sa-pod").splitlines()
    assert "phase Running" in lines  # get is allowed: the token is the ServiceAccount's
    assert "list 403" in lines  # list is not


def test_ports_probe_dns_and_graceful_deletion(
    kube: KubeClient, runner: PodRunner, k8s_namespace: str
) -> None:
    ns = k8s_namespace
    kube.create(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "svc"},
            "spec": {"clusterIP": "None", "selector": {"app": "t"}},
        },
        ns,
    )
    serve = textwrap.dedent(
        """
        import socket, sys, time
        port = int(sys.argv[1].split("=")[1])
        s = socket.socket()
        s.bind(("127.0.0.1", port))
        s.listen()
        while True:
            conn, _ = s.accept()
            conn.sendall(b"pong")
            conn.close()
        """
    )
    kube.create(
        pod(
            "server",
            [sys.executable, "-c", serve, "--port=8080"],
            hostname="server",
            subdomain="svc",
            terminationGracePeriodSeconds=30,
            automountServiceAccountToken=False,
            container={
                "ports": [{"containerPort": 8080}],
                "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1},
            },
        ),
        ns,
    )

    def ready() -> bool:
        obj = kube.get("Pod", ns, "server") or {}
        conditions = (obj.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    wait_for("server Ready", ready, timeout=60)
    mapped = runner.host_port("server.svc", 8080)
    assert f"--port={mapped}" in " ".join(runner.processes("server")[0].cmdline)
    client = textwrap.dedent(
        """
        import os, socket
        host, port = os.environ["SERVER"].rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as conn:
            print(os.environ["SERVER"], conn.recv(4).decode())
        """
    )
    kube.create(
        pod(
            "client",
            [sys.executable, "-c", client],
            automountServiceAccountToken=False,
            container={"env": [{"name": "SERVER", "value": f"server.svc.{ns}.svc:8080"}]},
        ),
        ns,
    )
    wait_for("client Succeeded", lambda: phase(kube, ns, "client") == "Succeeded", timeout=60)
    assert runner.logs("client").split() == [f"127.0.0.1:{mapped}", "pong"]

    # Deleting a running Pod stops its processes and the Pod goes away.
    kube.delete("Pod", ns, "server")
    wait_for("server gone", lambda: kube.get("Pod", ns, "server") is None, timeout=30)
    wait_for("server processes gone", lambda: runner.processes("server") == [], timeout=10)
    assert runner.running() == []


def test_pod_waits_for_its_config_like_a_kubelet(
    kube: KubeClient, runner: PodRunner, k8s_namespace: str
) -> None:
    ns = k8s_namespace
    kube.create(
        pod(
            "waiter",
            ["/bin/sh", "-c", 'echo "$VALUE"'],
            automountServiceAccountToken=False,
            container={
                "env": [
                    {
                        "name": "VALUE",
                        "valueFrom": {"configMapKeyRef": {"name": "later", "key": "k"}},
                    }
                ]
            },
        ),
        ns,
    )

    def waiting() -> str | None:
        statuses = ((kube.get("Pod", ns, "waiter") or {}).get("status") or {}).get(
            "containerStatuses"
        ) or [{}]
        state = statuses[0].get("state") or {}
        return (state.get("waiting") or {}).get("message")

    message = wait_for("the reason it waits", waiting, timeout=30)
    assert "later" in message
    assert phase(kube, ns, "waiter") == "Pending" and runner.launches("waiter") == 0
    kube.create(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "later"},
            "data": {"k": "42"},
        },
        ns,
    )
    wait_for("Succeeded", lambda: phase(kube, ns, "waiter") == "Succeeded", timeout=30)
    assert runner.logs("waiter").strip() == "42"
