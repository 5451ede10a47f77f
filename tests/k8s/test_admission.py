"""The validating admission webhook on a real kube-apiserver: the operator serves it (kopf), the
API server calls it for every TrainJob create and spec update, and a denial carries the same
``field.path: message (hint: ...)`` lines as ``trainjob validate``.

envtest has no Service networking, so the test's ``ValidatingWebhookConfiguration`` calls the
operator on ``https://127.0.0.1:PORT`` (a ``url`` clientConfig) with a certificate for that IP
signed by a CA made here; the chart's own objects (Service, Secret, caBundle) are checked in
``tests/chart/``. The configuration only selects this test's namespace.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import datetime as dt
import io
import ipaddress
import json
import ssl
import tempfile
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.support import EnvTest
from tests.support.ports import free_port
from tests.support.waiting import wait_for as _wait_for
from trainjob_operator import cli
from trainjob_operator.admission import WEBHOOK_PATH, AdmissionServer
from trainjob_operator.api.errors import ManifestError
from trainjob_operator.api.manifest import load_documents, parse_trainjob
from trainjob_operator.kube import KubeClient, KubeConfig
from trainjob_operator.leader import LeaderElectionConfig, LeaderElector
from trainjob_operator.operator_main import run_operator

pytestmark = pytest.mark.k8s

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "crds" / "trainjob.dev_trainjobs.yaml"
QUICKSTART = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
TRAINJOBS = "/apis/trainjob.dev/v1alpha1/namespaces/{ns}/trainjobs"
WEBHOOKS = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
DENIED = 'admission webhook "validate.trainjob.dev" denied the request: '


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _certificates(folder: Path) -> tuple[bytes, Path, Path]:
    """A test CA and a server certificate for 127.0.0.1 signed by it: (CA PEM, cert, key)."""
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "trainjob-test-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    cert_path, key_path = folder / "tls.crt", folder / "tls.key"
    cert_path.write_bytes(_pem(cert))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return _pem(ca), cert_path, key_path


def _job(namespace: str, name: str, **spec: Any) -> dict[str, Any]:
    body = copy.deepcopy(QUICKSTART)
    body["metadata"] = {"name": name, "namespace": namespace}
    body["spec"].update(spec)
    return body


def _validate_lines(body: dict[str, Any]) -> list[str]:
    """What ``trainjob validate`` prints for ``body`` as a manifest (without the file name)."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "job.yaml"
        path.write_text(yaml.safe_dump(body))
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = cli.main(["validate", "--quiet", str(path)])
    lines = [line.removeprefix(f"{path}: ") for line in out.getvalue().splitlines()]
    assert (code == 0) == (lines == []), lines
    return lines


@pytest.fixture
def webhook(envtest: EnvTest, k8s_namespace: str, tmp_path: Path) -> Iterator[str]:
    """The operator with its webhook on 127.0.0.1, and a webhook configuration selecting only
    ``k8s_namespace``; yields the namespace once the API server calls the webhook."""
    with serving(envtest, k8s_namespace, tmp_path):
        yield k8s_namespace


@contextlib.contextmanager
def serving(
    envtest: EnvTest,
    k8s_namespace: str,
    tmp_path: Path,
    leader_election: LeaderElector | None = None,
) -> Iterator[None]:
    """Run the operator (with ``leader_election``: a replica waiting for the Lease) and a
    webhook configuration for ``k8s_namespace``, until the API server calls the webhook."""
    envtest.apply_crd(CRD)
    ca, cert, key = _certificates(tmp_path)
    port = free_port()
    label = {"trainjob.dev/admission-test": k8s_namespace}
    status, _ = envtest.request(
        "PATCH", f"/api/v1/namespaces/{k8s_namespace}", {"metadata": {"labels": label}}
    )
    assert status == 200
    stop, ready = threading.Event(), threading.Event()
    config = KubeConfig(host=envtest.host, token=envtest.token, ca_file=str(envtest.ca_file))
    thread = threading.Thread(
        target=run_operator,
        args=(config, [k8s_namespace]),
        kwargs={
            "stop_flag": stop,
            "ready_flag": ready,
            "admission": AdmissionServer(port, str(cert), str(key), addr="127.0.0.1"),
            "leader_election": leader_election,
        },
        daemon=True,
    )
    thread.start()
    name = f"trainjob-admission-{k8s_namespace}"
    configuration = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": "validate.trainjob.dev",
                "clientConfig": {
                    "url": f"https://127.0.0.1:{port}{WEBHOOK_PATH}",
                    "caBundle": base64.b64encode(ca).decode(),
                },
                "rules": [
                    {
                        "apiGroups": ["trainjob.dev"],
                        "apiVersions": ["v1alpha1"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["trainjobs"],
                        "scope": "Namespaced",
                    }
                ],
                "namespaceSelector": {"matchLabels": label},
                "failurePolicy": "Fail",
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": 10,
            }
        ],
    }
    status, answer = envtest.request("POST", WEBHOOKS, configuration)
    assert status == 201, answer
    try:
        if leader_election is None:
            assert ready.wait(60), "operator did not become ready"
        probe = _job(k8s_namespace, "probe", image="Not An Image")

        def denied() -> bool:
            code, reply = envtest.request("POST", TRAINJOBS.format(ns=k8s_namespace), probe)
            assert code != 201, "an invalid TrainJob was admitted"
            return isinstance(reply, dict) and DENIED in str(reply.get("message"))

        # The API server picks the configuration up, and kopf starts its server, a moment later.
        _wait_for("the API server to call the webhook", denied)
        yield
    finally:
        envtest.request("DELETE", f"{WEBHOOKS}/{name}")
        stop.set()
        thread.join(60)


def _deep(levels: int) -> list[Any]:
    outer: list[Any] = []
    inner = outer
    for _ in range(levels):
        inner.append([])
        inner = inner[0]
    return outer


INVALID: dict[str, dict[str, Any]] = {
    "tpu-topology": {"scaling": {"tpu": {"acceleratorType": "v6e", "topology": "4x2"}}},
    "tpu-numWorkers": {
        "scaling": {"numWorkers": 3, "tpu": {"acceleratorType": "v6e", "topology": "4x4"}}
    },
    "image": {"image": "registry.example.com/Team/Train:1"},
    "gcs-empty-folder": {"storage": {"path": "gs://bucket//runs"}},
    "cpu-zero": {"scaling": {"numWorkers": 2, "resourcesPerWorker": {"cpu": "0"}}},
    "env-twice": {"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]},
    "two-problems": {
        "image": "not an image",
        "validation": {
            "entrypoint": "examples.quickstart.train:validate",
            "pool": {"minReplicas": 3, "maxReplicas": 1},
        },
    },
    "hostPath": {"podTemplate": {"volumes": [{"name": "root", "hostPath": {"path": "/"}}]}},
    "podTemplate-key": {"podTemplate": {"containers": []}},
    # What Ray would refuse only when the driver starts its job (issue 37): refused here.
    "runtimeEnv-pip-and-uv": {"runtimeEnv": {"pip": ["six==1.16.0"], "uvPackages": ["six"]}},
    "runtimeEnv-workingDir": {"runtimeEnv": {"workingDir": "https://example.com/code.zip"}},
    # 120 levels: the API server stores it, trainjob validate refuses it
    "deep-config": {"config": {"a": _deep(120)}},
}


@pytest.mark.parametrize("case", sorted(INVALID))
def test_invalid_trainjobs_are_denied_with_the_lines_of_trainjob_validate(
    envtest: EnvTest, webhook: str, case: str
) -> None:
    body = _job(webhook, f"bad-{case.lower()}", **INVALID[case])
    expected = _validate_lines(body)
    if case == "deep-config":
        # The same message and hint; trainjob validate stops the YAML parser there, so it
        # names the line and column, the webhook (given JSON) the field path.
        assert expected[0].startswith("line ")
        with pytest.raises(ManifestError) as info:
            parse_trainjob(body)
        expected = [error.format() for error in info.value.errors]
        assert expected[0].startswith("spec.config.a[0][0]")
    assert expected, "trainjob validate accepts it"
    status, reply = envtest.request("POST", TRAINJOBS.format(ns=webhook), body)
    assert status == 422, reply
    assert reply["message"] == DENIED + "; ".join(expected)


def test_valid_trainjobs_are_admitted(envtest: EnvTest, webhook: str) -> None:
    for path in sorted((REPO / "examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not isinstance(doc, dict) or doc.get("kind") != "TrainJob":
                continue
            doc["metadata"]["namespace"] = webhook
            assert _validate_lines(doc) == []
            status, reply = envtest.request("POST", TRAINJOBS.format(ns=webhook), doc)
            assert status == 201, (path.name, reply)


def test_spec_updates_are_validated_metadata_updates_are_not(
    envtest: EnvTest, webhook: str
) -> None:
    url = TRAINJOBS.format(ns=webhook) + "/update-me"
    status, reply = envtest.request(
        "POST", TRAINJOBS.format(ns=webhook), _job(webhook, "update-me")
    )
    assert status == 201, reply
    bad = {"spec": {"scaling": {"tpu": {"acceleratorType": "v6e", "topology": "4x2"}}}}
    status, reply = envtest.request("PATCH", url, bad)
    assert status == 422, reply
    merged = _job(webhook, "update-me")
    merged["spec"]["scaling"]["tpu"] = bad["spec"]["scaling"]["tpu"]
    assert reply["message"] == DENIED + "; ".join(_validate_lines(merged))
    status, reply = envtest.request("PATCH", url, {"metadata": {"labels": {"team": "a"}}})
    assert status == 200, reply
    assert reply["metadata"]["labels"] == {"team": "a"}


# The CRD's own schema, without the webhook: `trainjob validate` refuses everything the API
# server's schema refuses. It is stricter in one place, by choice: a float with an integral
# value (2.0, 1e0) where the CRD says integer, which the API server converts to an integer
# (JSON numbers are float64 to it) and trainjob validate refuses with the hint to write 2.
SCHEMA_CASES: list[tuple[str, str, str, bool]] = [
    # (field path, JSON value, the API server accepts, validate accepts)
    ("scaling.numWorkers", '"2"', "refused", False),
    ("scaling.numWorkers", "true", "refused", False),
    ("scaling.numWorkers", "2.5", "refused", False),
    ("scaling.numWorkers", "2.0", "accepted", False),
    ("scaling.numWorkers", "1e0", "accepted", False),
    ("scaling.numWorkers", "2", "accepted", True),
    ("suspend", '"true"', "refused", False),
    ("suspend", "1", "refused", False),
    ("suspend", "true", "accepted", True),
]


def _with(field: str, raw: str, name: str) -> str:
    body = _job("schema", name)
    body["metadata"].pop("namespace")
    *parents, leaf = field.split(".")
    node = body["spec"]
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = "__RAW__"
    return json.dumps(body).replace('"__RAW__"', raw)


def test_validate_refuses_whatever_the_api_servers_schema_refuses(
    envtest: EnvTest, k8s_namespace: str
) -> None:
    envtest.apply_crd(CRD)
    context = ssl.create_default_context(cafile=str(envtest.ca_file))
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
    )
    for index, (field, raw, server, accepted) in enumerate(SCHEMA_CASES):
        text = _with(field, raw, f"schema-{index}")
        request = urllib.request.Request(
            f"{envtest.host}{TRAINJOBS.format(ns=k8s_namespace)}",
            data=text.encode(),
            method="POST",
            headers={
                "Authorization": f"Bearer {envtest.token}",
                "Content-Type": "application/json",
            },
        )
        try:
            with opener.open(request, timeout=30) as response:
                status = int(response.status)
        except urllib.error.HTTPError as refused:
            status = int(refused.code)
        assert (status == 201) == (server == "accepted"), (field, raw, status)
        [doc] = load_documents(text)  # JSON is YAML: the bytes the API server got
        assert doc.ok == accepted, (field, raw, doc.errors)
        if not accepted:
            [problem] = doc.errors
            assert problem.path == f"spec.{field}", problem


def test_a_standby_replica_serves_the_webhook_too(
    envtest: EnvTest, k8s_namespace: str, tmp_path: Path
) -> None:
    """The chart's Service sends reviews to any ready replica: a replica waiting for the Lease
    (another replica leads) answers them too."""
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "trainjob-operator", "namespace": k8s_namespace},
        "spec": {
            "holderIdentity": "the-leader",
            "leaseDurationSeconds": 3600,
            "acquireTime": now,
            "renewTime": now,
        },
    }
    path = f"/apis/coordination.k8s.io/v1/namespaces/{k8s_namespace}/leases"
    status, reply = envtest.request("POST", path, lease)
    assert status == 201, reply
    kube = KubeClient(
        KubeConfig(host=envtest.host, token=envtest.token, ca_file=str(envtest.ca_file))
    )
    elector = LeaderElector(kube, LeaderElectionConfig(namespace=k8s_namespace, identity="standby"))
    with serving(envtest, k8s_namespace, tmp_path, leader_election=elector):
        spec = {"scaling": {"numWorkers": 2, "resourcesPerWorker": {"cpu": "0"}}}
        body = _job(k8s_namespace, "bad", **spec)
        status, reply = envtest.request("POST", TRAINJOBS.format(ns=k8s_namespace), body)
        assert status == 422, reply
        assert reply["message"] == DENIED + "; ".join(_validate_lines(body))
        assert not elector.is_leader
