"""The chart's admission webhook objects, rendered with Helm's SDK: the TLS Secret made with
genCA/genSignedCert, the Service, the ValidatingWebhookConfiguration (its caBundle is the
Secret's CA, its path the operator's handler) and the operator's flags and mount."""

from __future__ import annotations

import base64
import datetime as dt
from typing import Any

import helm_python as helm
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from tests.chart.helpers import all_of, container, one, render
from trainjob_operator.admission import WEBHOOK_PATH
from trainjob_operator.cli import build_parser

CERT_DIR = "/etc/trainjob-operator/webhook"


def _webhook(objects: list[dict[str, Any]]) -> dict[str, Any]:
    configuration = one(objects, "ValidatingWebhookConfiguration")
    [hook] = configuration["webhooks"]
    return dict(hook)


def _secret(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return one(objects, "Secret", "tjo-trainjob-operator-webhook-tls")


def test_the_generated_certificate_is_signed_by_the_ca_in_the_webhook_configuration() -> None:
    objects = render()
    secret = _secret(objects)
    assert secret["type"] == "kubernetes.io/tls"
    data = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    hook = _webhook(objects)
    assert base64.b64decode(hook["clientConfig"]["caBundle"]) == data["ca.crt"]
    ca = x509.load_pem_x509_certificate(data["ca.crt"])
    cert = x509.load_pem_x509_certificate(data["tls.crt"])
    assert cert.issuer == ca.subject
    public_key = ca.public_key()
    assert isinstance(public_key, rsa.RSAPublicKey)
    assert cert.signature_hash_algorithm is not None
    public_key.verify(  # raises when the CA did not sign it
        cert.signature,
        cert.tbs_certificate_bytes,
        padding.PKCS1v15(),
        cert.signature_hash_algorithm,
    )
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    service = "tjo-trainjob-operator-webhook"
    assert set(names.get_values_for_type(x509.DNSName)) == {
        service,
        f"{service}.ops",
        f"{service}.ops.svc",
        f"{service}.ops.svc.cluster.local",
    }
    days = (cert.not_valid_after_utc - dt.datetime.now(dt.UTC)).days
    assert 3640 <= days <= 3650  # webhook.certificate.validityDays
    assert b"PRIVATE KEY" in data["tls.key"]


def test_the_webhook_calls_the_operators_handler_for_trainjob_creates_and_updates() -> None:
    objects = render()
    hook = _webhook(objects)
    assert hook["name"] == "validate.trainjob.dev"
    assert hook["clientConfig"]["service"] == {
        "name": "tjo-trainjob-operator-webhook",
        "namespace": "ops",
        "path": WEBHOOK_PATH,
        "port": 443,
    }
    assert hook["rules"] == [
        {
            "apiGroups": ["trainjob.dev"],
            "apiVersions": ["v1alpha1"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["trainjobs"],
            "scope": "Namespaced",
        }
    ]
    assert hook["failurePolicy"] == "Fail"
    assert hook["sideEffects"] == "None"
    assert hook["admissionReviewVersions"] == ["v1"]
    assert hook["timeoutSeconds"] == 5
    assert "namespaceSelector" not in hook  # every namespace, as the operator watches
    service = one(objects, "Service", "tjo-trainjob-operator-webhook")
    assert service["spec"]["ports"] == [
        {"name": "webhook", "port": 443, "targetPort": "webhook", "protocol": "TCP"}
    ]
    deployment = one(objects, "Deployment")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]


def test_the_operator_serves_the_webhook_with_the_mounted_certificate() -> None:
    objects = render()
    operator = container(objects)
    assert "--webhook-port=9443" in operator["args"]
    assert f"--webhook-cert-dir={CERT_DIR}" in operator["args"]
    assert {"name": "webhook", "containerPort": 9443, "protocol": "TCP"} in operator["ports"]
    assert {"name": "webhook-cert", "mountPath": CERT_DIR, "readOnly": True} in operator[
        "volumeMounts"
    ]
    pod = one(objects, "Deployment")["spec"]["template"]
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "webhook-cert")
    assert volume["secret"]["secretName"] == "tjo-trainjob-operator-webhook-tls"
    assert "checksum/webhook-cert" in pod["metadata"]["annotations"]
    args = build_parser().parse_args(["operator", *operator["args"]])  # the CLI accepts them
    assert args.webhook_port == 9443 and args.webhook_cert_dir == CERT_DIR


def test_webhook_disabled_renders_no_webhook_objects_or_flags() -> None:
    objects = render({"webhook": {"enabled": False}})
    assert all_of(objects, "ValidatingWebhookConfiguration") == []
    assert all_of(objects, "Secret") == []
    assert [s["metadata"]["name"] for s in all_of(objects, "Service")] == [
        "tjo-trainjob-operator-metrics"
    ]
    operator = container(objects)
    assert not [a for a in operator["args"] if a.startswith("--webhook")]
    assert "webhook" not in [p["name"] for p in operator["ports"]]


def test_an_existing_secret_and_ca_bundle_and_ignore() -> None:
    ca = base64.b64encode(b"-----BEGIN CERTIFICATE-----\n...\n").decode()
    objects = render(
        {
            "webhook": {
                "failurePolicy": "Ignore",
                "certificate": {"secretName": "from-cert-manager", "caBundle": ca},
            }
        }
    )
    assert all_of(objects, "Secret") == []
    hook = _webhook(objects)
    assert hook["failurePolicy"] == "Ignore"
    assert hook["clientConfig"]["caBundle"] == ca
    pod = one(objects, "Deployment")["spec"]["template"]
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "webhook-cert")
    assert volume["secret"]["secretName"] == "from-cert-manager"


@pytest.mark.parametrize("kube_version", [None, "v1.21.0", "1.21.0-gke.100", "v1.30.2"])
def test_watched_namespaces_select_the_webhooks_namespaces(kube_version: str | None) -> None:
    """From Kubernetes 1.21, whose API server labels every namespace with its name (and on
    Helm's default version, for `helm template` without --kube-version)."""
    values = {"watchNamespaces": ["team-a", "team-b"]}
    hook = _webhook(render(values, kube_version=kube_version))
    assert hook["namespaceSelector"] == {
        "matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a", "team-b"]}
        ]
    }


@pytest.mark.parametrize("kube_version", ["v1.20.2", "1.20.15-eks-1", "v1.19.0"])
def test_before_kubernetes_1_21_the_webhook_has_no_namespace_selector(kube_version: str) -> None:
    """The kubernetes.io/metadata.name label does not exist there: the selector would match no
    namespace, so there is none (the operator admits other namespaces' TrainJobs unchecked;
    tests/chart/test_webhook_cluster.py checks it on a real 1.20 API server)."""
    values = {"watchNamespaces": ["team-a", "team-b"]}
    hook = _webhook(render(values, kube_version=kube_version))
    assert "namespaceSelector" not in hook
    assert "namespaceSelector" not in _webhook(render(kube_version="v1.30.0"))  # all namespaces


@pytest.mark.parametrize(
    "webhook",
    [{"failurePolicy": "Sometimes"}, {"timeoutSeconds": 60}, {"certificat": {}}],
)
def test_bad_webhook_values_are_rejected(webhook: dict[str, Any]) -> None:
    with pytest.raises(helm.HelmValuesError) as raised:
        render({"webhook": webhook})
    assert "webhook" in str(raised.value)
