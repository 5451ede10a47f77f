"""``trainjob operator --webhook-port ... --webhook-cert-dir DIR`` with a missing or unusable
certificate: a one-line error naming the flag, the file and the fix, exit status 2, and no
traceback (run as the container runs it: a subprocess)."""

from __future__ import annotations

import base64
import datetime as dt
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from trainjob_operator.admission import AdmissionServer

REPO_ROOT = Path(__file__).resolve().parents[1]
FIX = "mount the chart's webhook TLS Secret (tls.crt, tls.key) there, or pass --webhook-port 0"


def _pair() -> tuple[bytes, bytes]:
    """A self-signed certificate and its key, PEM."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "webhook")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def _missing_folder(folder: Path) -> None:
    folder.rmdir()


def _empty(folder: Path) -> None:
    pass


def _no_key(folder: Path) -> None:
    (folder / "tls.crt").write_bytes(_pair()[0])


def _not_pem(folder: Path) -> None:
    (folder / "tls.crt").write_text("not a certificate\n")
    (folder / "tls.key").write_bytes(_pair()[1])


def _base64_not_pem(folder: Path) -> None:
    """The Secret's base64 data written as is (a common mistake when mounting by hand)."""
    cert, key = _pair()
    (folder / "tls.crt").write_bytes(base64.b64encode(cert))
    (folder / "tls.key").write_bytes(base64.b64encode(key))


def _key_not_pem(folder: Path) -> None:
    (folder / "tls.crt").write_bytes(_pair()[0])
    (folder / "tls.key").write_bytes(_pair()[0])  # the certificate again


def _broken_pem(folder: Path) -> None:
    cert, key = _pair()
    (folder / "tls.crt").write_bytes(cert[:40] + b"garbage" + cert[40:])
    (folder / "tls.key").write_bytes(key)


def _key_of_another_certificate(folder: Path) -> None:
    (folder / "tls.crt").write_bytes(_pair()[0])
    (folder / "tls.key").write_bytes(_pair()[1])


CASES: dict[str, tuple[Callable[[Path], None], str]] = {
    # case: (how the folder is made, what the line says after "--webhook-cert-dir DIR: ")
    "no-folder": (_missing_folder, "tls.crt is missing"),
    "empty-folder": (_empty, "tls.crt is missing"),
    "no-key": (_no_key, "tls.key is missing"),
    "not-pem": (_not_pem, "tls.crt is not a PEM certificate (no -----BEGIN CERTIFICATE-----"),
    "base64": (_base64_not_pem, "tls.crt is not a PEM certificate"),
    "key-not-pem": (_key_not_pem, "tls.key is not a PEM private key (no PRIVATE KEY----- line"),
    "broken-pem": (
        _broken_pem,
        "tls.crt and tls.key are not a usable PEM certificate and private key (",
    ),
    "mismatch": (
        _key_of_another_certificate,
        "tls.key is not the private key of tls.crt (KEY_VALUES_MISMATCH;",
    ),
}


def _operator(cert_dir: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, KUBECONFIG=str(cert_dir / "no-kubeconfig"))
    env.pop("KUBERNETES_SERVICE_HOST", None)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "trainjob_operator.cli",
            "operator",
            "--webhook-port=9443",
            f"--webhook-cert-dir={cert_dir}",
            "--metrics-port=0",
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _assert_one_line_error(
    result: subprocess.CompletedProcess[str], cert_dir: Path, says: str
) -> None:
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith(f"trainjob operator: --webhook-cert-dir {cert_dir}: {says}"), line
    assert FIX in line, line


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_unusable_webhook_certificate_stops_the_operator_with_one_line(
    tmp_path: Path, case: str
) -> None:
    cert_dir = tmp_path / "webhook"
    cert_dir.mkdir()
    make, says = CASES[case]
    make(cert_dir)
    _assert_one_line_error(_operator(cert_dir), cert_dir, says)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_an_unreadable_key_stops_the_operator_with_one_line(tmp_path: Path) -> None:
    cert_dir = tmp_path / "webhook"
    cert_dir.mkdir()
    cert, key = _pair()
    (cert_dir / "tls.crt").write_bytes(cert)
    (cert_dir / "tls.key").write_bytes(key)
    (cert_dir / "tls.key").chmod(0)
    _assert_one_line_error(_operator(cert_dir), cert_dir, "tls.key cannot be read (")


def test_a_matching_pem_pair_is_accepted(tmp_path: Path) -> None:
    cert, key = _pair()
    (tmp_path / "tls.crt").write_bytes(cert)
    (tmp_path / "tls.key").write_bytes(key)
    server = AdmissionServer.from_dir(9443, tmp_path, namespaces=["team-a"])
    assert server.certfile == str(tmp_path / "tls.crt")
    assert server.keyfile == str(tmp_path / "tls.key")
    assert server.namespaces == frozenset({"team-a"})
