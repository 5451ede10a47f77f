"""The chart's admission webhook installed with Helm's SDK on a real kube-apiserver 1.20: the
API server calls the operator's webhook through the chart's own Service, with the certificate
and caBundle the chart generated, and ``helm upgrade`` keeps that certificate (``lookup``).

envtest has no kube-proxy, so a Service's cluster IP leads nowhere. This module's API server runs
with ``--enable-aggregator-routing=true``: it then resolves a webhook Service to the addresses of
its Endpoints (as it does for aggregated APIs) instead of its cluster IP. No endpoints controller
runs, so the test writes the Endpoints itself: this machine's non-loopback address (Endpoints
may not hold 127.0.0.1) and the port the webhook server listens on, under the Service port's
name ``webhook``. The API server still verifies the serving certificate for
``<service>.<namespace>.svc`` against the caBundle, as in a real cluster.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from tests.chart.helpers import REPO, chart
from tests.k8s import conftest as k8s_conftest
from tests.support import EnvTest, ensure_assets
from tests.support.ports import free_port
from tests.support.waiting import wait_for as _wait_for
from trainjob_operator import admission
from trainjob_operator.admission import AdmissionServer
from trainjob_operator.api.errors import ManifestError
from trainjob_operator.api.manifest import parse_trainjob

pytestmark = pytest.mark.k8s

QUICKSTART = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
TRAINJOBS = "/apis/trainjob.dev/v1alpha1/namespaces/{ns}/trainjobs"
WEBHOOKS = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
DENIED = 'admission webhook "validate.trainjob.dev" denied the request: '
BAD_SPEC: dict[str, Any] = {"scaling": {"tpu": {"acceleratorType": "v6e", "topology": "4x2"}}}


@pytest.fixture(scope="module")
def routed_envtest() -> Iterator[EnvTest]:
    """An API server of its own: aggregator routing on, and a webhook that (before 1.21) sees
    every namespace cannot get in the way of other tests' TrainJobs."""
    if k8s_conftest._skipped():
        pytest.skip(f"{k8s_conftest.SKIP_ENV}=1")
    assets = k8s_conftest._provisioned or ensure_assets()
    with EnvTest(assets, extra_apiserver_args=["--enable-aggregator-routing=true"]) as env:
        yield env


def _host_address() -> str:
    """A non-loopback IPv4 address of this machine (the one of its default route)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(("192.0.2.254", 9))  # UDP: sends nothing, only picks the route
        except OSError as exc:
            pytest.skip(f"no non-loopback IPv4 address for the webhook's Endpoints: {exc}")
        address = str(sock.getsockname()[0])
    if address.startswith("127."):
        pytest.skip("no non-loopback IPv4 address for the webhook's Endpoints")
    return address


def _create_namespace(env: EnvTest, name: str) -> None:
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    status, reply = env.request("POST", "/api/v1/namespaces", body)
    assert status == 201, reply


def _job(namespace: str, name: str, spec: dict[str, Any] | None = None) -> dict[str, Any]:
    body = copy.deepcopy(QUICKSTART)
    body["metadata"] = {"name": name, "namespace": namespace}
    body["spec"].update(spec or {})
    return dict(body)


def _denial(body: dict[str, Any]) -> str:
    with pytest.raises(ManifestError) as info:
        parse_trainjob(body)
    return DENIED + "; ".join(error.format() for error in info.value.errors)


class Release:
    """A release of the chart installed with Helm's SDK in a namespace of its own."""

    def __init__(self, env: EnvTest) -> None:
        self.env = env
        self.name = f"tjo-{uuid.uuid4().hex[:6]}"
        self.namespace = f"ops-{uuid.uuid4().hex[:6]}"
        self.fullname = f"{self.name}-trainjob-operator"
        self.service = f"{self.fullname}-webhook"
        self.secret = f"{self.fullname}-webhook-tls"
        self.helm = helm.Config(kubeconfig_path=env.kubeconfig, namespace=self.namespace)

    def install(self, values: dict[str, Any]) -> Any:
        return self.helm.install(
            chart(), self.name, values, namespace=self.namespace, create_namespace=True
        )

    def upgrade(self, values: dict[str, Any]) -> Any:
        return self.helm.upgrade(chart(), self.name, values, namespace=self.namespace)

    def get(self, path: str) -> dict[str, Any]:
        status, body = self.env.request("GET", path)
        assert status == 200, body
        assert isinstance(body, dict)
        return body

    def secret_data(self) -> dict[str, str]:
        secret = self.get(f"/api/v1/namespaces/{self.namespace}/secrets/{self.secret}")
        return dict(secret["data"])

    def webhook(self) -> dict[str, Any]:
        [hook] = self.get(f"{WEBHOOKS}/{self.fullname}")["webhooks"]
        return dict(hook)

    def deployment(self) -> dict[str, Any]:
        return self.get(f"/apis/apps/v1/namespaces/{self.namespace}/deployments/{self.fullname}")

    @contextlib.contextmanager
    def serving(self, tmp_path: Path, namespaces: list[str] | None) -> Iterator[None]:
        """Serve the webhook as ``trainjob operator --webhook-cert-dir`` does, with the Secret's
        certificate, behind the chart's Service (Endpoints written here); stop afterwards."""
        cert_dir = tmp_path / "webhook-cert"
        cert_dir.mkdir()
        for key, value in self.secret_data().items():
            (cert_dir / key).write_bytes(base64.b64decode(value))
        address = _host_address()
        port = free_port(address)
        server = AdmissionServer.from_dir(port, cert_dir, addr=address, namespaces=namespaces)
        endpoints = {
            "apiVersion": "v1",
            "kind": "Endpoints",
            "metadata": {"name": self.service, "namespace": self.namespace},
            "subsets": [
                {
                    "addresses": [{"ip": address}],
                    "ports": [{"name": "webhook", "port": port, "protocol": "TCP"}],
                }
            ],
        }
        path = f"/api/v1/namespaces/{self.namespace}/endpoints"
        status, reply = self.env.request("POST", path, endpoints)
        assert status == 201, reply
        thread, stop = admission.start(server)
        try:
            yield
        finally:
            stop.set()
            thread.join(30)
            self.env.request("DELETE", f"{path}/{self.service}")

    def uninstall(self) -> None:
        with contextlib.suppress(helm.HelmError):
            self.helm.uninstall(self.name, ignore_not_found=True)
        self.helm.close()
        self.env.request("DELETE", f"/api/v1/namespaces/{self.namespace}")


@pytest.fixture
def release(routed_envtest: EnvTest) -> Iterator[Release]:
    installed = Release(routed_envtest)
    try:
        yield installed
    finally:
        installed.uninstall()


def _create(env: EnvTest, body: dict[str, Any]) -> tuple[int, Any]:
    return env.request("POST", TRAINJOBS.format(ns=body["metadata"]["namespace"]), body)


def _wait_until_called(env: EnvTest, namespace: str) -> None:
    """The API server's informers see the new configuration and Endpoints a moment later."""
    probe = _job(namespace, "probe", BAD_SPEC)

    def denied() -> Any:
        status, reply = _create(env, probe)
        assert status != 201, "an invalid TrainJob was admitted"
        return isinstance(reply, dict) and DENIED in str(reply.get("message"))

    _wait_for("the API server to call the chart's webhook", denied)


def test_on_kubernetes_1_20_the_webhook_covers_the_watched_namespaces(
    routed_envtest: EnvTest, release: Release, tmp_path: Path
) -> None:
    """Installed with watchNamespaces on a 1.20 API server (Helm reads its version): no
    namespaceSelector (the label it would use does not exist before 1.21), so an invalid
    TrainJob in a watched namespace is refused, and one in a namespace the operator does not
    watch is admitted unchecked by the operator, not ignored by the API server."""
    env = routed_envtest
    watched, other = f"team-a-{uuid.uuid4().hex[:6]}", f"team-b-{uuid.uuid4().hex[:6]}"
    for namespace in (watched, other):
        _create_namespace(env, namespace)
    try:
        installed = release.install({"watchNamespaces": [watched]})
        assert "namespaceSelector" not in installed["manifest"]
        version = env.request("GET", "/version")[1]
        assert (version["major"], version["minor"]) == ("1", "20")
        hook = release.webhook()
        assert hook["namespaceSelector"] == {}  # the API server's default: every namespace
        assert hook["clientConfig"]["service"]["name"] == release.service
        with release.serving(tmp_path, namespaces=[watched]):
            _wait_until_called(env, watched)
            bad = _job(watched, "bad", BAD_SPEC)
            status, reply = _create(env, bad)
            assert status == 422, reply
            assert reply["message"] == _denial(bad)
            status, reply = _create(env, _job(watched, "good"))
            assert status == 201, reply
            # Not this operator's namespace: admitted as it is.
            status, reply = _create(env, _job(other, "not-ours", BAD_SPEC))
            assert status == 201, reply
        # The API server did send that namespace's TrainJobs to the webhook: with nobody
        # serving it, failurePolicy Fail refuses them.
        status, reply = _create(env, _job(other, "unserved"))
        assert status == 500, reply
        assert 'failed calling webhook "validate.trainjob.dev"' in reply["message"]
    finally:
        for namespace in (watched, other):
            env.request("DELETE", f"/api/v1/namespaces/{namespace}")


def _checksum(deployment: dict[str, Any]) -> str:
    return str(deployment["spec"]["template"]["metadata"]["annotations"]["checksum/webhook-cert"])


def test_helm_upgrade_keeps_the_webhook_certificate(
    routed_envtest: EnvTest, release: Release, tmp_path: Path
) -> None:
    """``lookup`` sees the cluster through the SDK's upgrade: the Secret and the caBundle stay
    as installed, and the API server still trusts the operator's certificate after the
    upgrade."""
    env = routed_envtest
    release.install({})
    data = release.secret_data()
    hook = release.webhook()
    assert hook["clientConfig"]["caBundle"] == data["ca.crt"]
    release.upgrade({"logLevel": "debug"})
    deployment = release.deployment()
    assert "--verbose" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert release.secret_data() == data  # tls.crt, tls.key and ca.crt
    assert release.webhook()["clientConfig"]["caBundle"] == data["ca.crt"]
    # The Deployment's checksum/webhook-cert hashes webhook.yaml rendered a second time: on
    # install that render generates a second, unused certificate, so the first upgrade changes
    # the checksum (one restart); from then on it is the reused Secret's and stays.
    checksum = _checksum(deployment)
    release.upgrade({"logLevel": "info"})
    deployment = release.deployment()
    assert "--verbose" not in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert _checksum(deployment) == checksum
    assert release.secret_data() == data

    # The CA the API server holds signed the certificate the operator serves.
    _create_namespace(env, release.namespace + "-jobs")
    try:
        with release.serving(tmp_path, namespaces=None):
            _wait_until_called(env, release.namespace + "-jobs")
    finally:
        env.request("DELETE", f"/api/v1/namespaces/{release.namespace}-jobs")


def test_the_certificate_is_regenerated_only_when_its_secret_is_gone(
    routed_envtest: EnvTest, release: Release
) -> None:
    """Deleting the Secret and upgrading rotates the certificate (README: how to rotate), and
    the caBundle follows."""
    release.install({})
    before = release.secret_data()
    status, reply = routed_envtest.request(
        "DELETE", f"/api/v1/namespaces/{release.namespace}/secrets/{release.secret}"
    )
    assert status == 200, reply
    release.upgrade({})
    after = release.secret_data()
    assert after["ca.crt"] != before["ca.crt"] and after["tls.crt"] != before["tls.crt"]
    assert release.webhook()["clientConfig"]["caBundle"] == after["ca.crt"]
