"""The validating admission webhook: the API server asks the operator about every TrainJob
create and spec update, and the operator answers with exactly the checks ``trainjob validate``
runs (:func:`~trainjob_operator.api.manifest.parse_trainjob`): a denial lists the same
``field.path: message (hint: ...)`` lines.

The webhook is served by kopf (``@kopf.on.validate``, :class:`kopf.WebhookServer` over HTTPS)
in the operator process. Its ``ValidatingWebhookConfiguration`` is not managed by kopf: the
Helm chart creates it with the CA bundle of the certificate it provisions (tests create their
own, pointing at ``127.0.0.1``). The URL path is :data:`WEBHOOK_PATH`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kopf

from trainjob_operator.api.errors import ManifestError
from trainjob_operator.api.manifest import parse_trainjob
from trainjob_operator.constants import GROUP, PLURAL, VERSION

__all__ = [
    "HANDLER_ID",
    "WEBHOOK_PATH",
    "AdmissionServer",
    "admission_problems",
    "configure_admission",
    "register_admission",
]

HANDLER_ID = "validate-trainjob"
"""kopf's id of the validating handler; also the last segment of the webhook URL."""
WEBHOOK_PATH = f"/{HANDLER_ID}"
"""The path the ``ValidatingWebhookConfiguration`` calls (``https://SERVICE:PORT/PATH``)."""
DENIED_CODE = 422
"""The HTTP status of a denial: the same as the API server's own schema errors."""


@dataclass(frozen=True)
class AdmissionServer:
    """Where the webhook listens and the certificate it serves.

    Attributes:
        port: the HTTPS port (the chart's Service forwards 443 to it).
        certfile: PEM server certificate (the chart's Secret ``tls.crt``).
        keyfile: PEM private key of the certificate (``tls.key``).
        addr: listen address (all interfaces by default).
    """

    port: int
    certfile: str
    keyfile: str
    addr: str = "0.0.0.0"

    @classmethod
    def from_dir(cls, port: int, cert_dir: str | Path, addr: str = "0.0.0.0") -> AdmissionServer:
        """The server for the ``tls.crt``/``tls.key`` of a mounted TLS Secret.

        Raises:
            FileNotFoundError: naming the missing file.
        """
        folder = Path(cert_dir)
        for name in ("tls.crt", "tls.key"):
            if not (folder / name).is_file():
                raise FileNotFoundError(
                    f"--webhook-cert-dir {folder}: {name} is missing (mount the chart's webhook "
                    "TLS Secret there, or pass --webhook-port 0 to serve no webhook)"
                )
        return cls(port, str(folder / "tls.crt"), str(folder / "tls.key"), addr)

    def server(self) -> kopf.WebhookServer:
        """kopf's HTTPS server for this address and certificate."""
        return kopf.WebhookServer(
            addr=self.addr, port=self.port, certfile=self.certfile, pkeyfile=self.keyfile
        )


def _spec_of(body: Mapping[str, Any] | None) -> Any:
    return None if body is None else body.get("spec")


def admission_problems(
    body: Mapping[str, Any], operation: str | None, old: Mapping[str, Any] | None = None
) -> list[str]:
    """The lines a denial carries (``field.path: message (hint: ...)``), empty to admit.

    A create, and an update that changes ``spec``, must pass :func:`parse_trainjob`. Other
    updates (metadata such as the operator's finalizer, a TrainJob being deleted) are admitted
    whatever their spec, so a TrainJob created before the webhook existed can still be
    finalized and deleted.
    """
    if operation == "UPDATE" and (
        _spec_of(body) == _spec_of(old)
        or (body.get("metadata") or {}).get("deletionTimestamp") is not None
    ):
        return []
    try:
        parse_trainjob(body)
    except ManifestError as exc:
        return [error.format() for error in exc.errors]
    return []


def register_admission(registry: kopf.OperatorRegistry) -> None:
    """Register the validating handler (creates and updates of TrainJobs) on ``registry``."""

    def validate(body: kopf.Body, **kwargs: Any) -> None:
        # kopf passes the old object and the operation as keyword arguments of the cause
        problems = admission_problems(body, kwargs.get("operation"), kwargs.get("old"))
        if problems:
            raise kopf.AdmissionError("; ".join(problems), code=DENIED_CODE)

    kopf.on.validate(
        GROUP,
        VERSION,
        PLURAL,
        id=HANDLER_ID,
        operations=["CREATE", "UPDATE"],
        registry=registry,
    )(validate)


def configure_admission(settings: kopf.OperatorSettings, server: AdmissionServer) -> None:
    """Serve the webhook with ``server``; the webhook configuration is the chart's (kopf does
    not create or patch one)."""
    settings.admission.server = server.server()
    settings.admission.managed = None
