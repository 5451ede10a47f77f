"""The validating admission webhook: the API server asks the operator about every TrainJob
create and spec update, and the operator answers with exactly the checks ``trainjob validate``
runs (:func:`~trainjob_operator.api.manifest.parse_trainjob`): a denial lists the same
``field.path: message (hint: ...)`` lines.

The webhook is served over HTTPS by kopf's :class:`kopf.WebhookServer` (aiohttp; it reloads the
certificate files when they change) from a thread of its own in every operator replica, not by
kopf's ``@kopf.on.validate`` handlers: those run inside the reconciling kopf operator, which
with leader election runs on the leader only, while the chart's Service sends reviews to any
ready replica. Its ``ValidatingWebhookConfiguration`` is the Helm chart's, with the CA bundle of
the certificate the chart provisions (tests create their own, pointing at ``127.0.0.1``). The
URL path is :data:`WEBHOOK_PATH`.

Namespaces: an operator that watches some namespaces only (``--namespace``) admits the TrainJobs
of every other namespace unchecked. The chart's namespaceSelector keeps the API server from
asking about them from Kubernetes 1.21; before 1.21 it has no selector (the namespace label it
would need does not exist yet) and the API server asks about every namespace. Those TrainJobs
are not this operator's: no replica of it will run them, another release of the operator may
watch that namespace (with its own webhook and its own ``podSecurity.allowedVolumeTypes``), and
with ``failurePolicy: Fail`` a refusal here would block it, so this webhook stays out of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainjob_operator.api.errors import ManifestError
from trainjob_operator.api.manifest import parse_trainjob
from trainjob_operator.api.trainjob import TrainJob
from trainjob_operator.render.options import DEFAULT_ALLOWED_VOLUME_TYPES, render_options_from_env
from trainjob_operator.render.pod_template import validate_pod_template

if TYPE_CHECKING:  # kopf is imported when a server starts: trainjob validate does without it
    import kopf

__all__ = [
    "WEBHOOK_PATH",
    "AdmissionServer",
    "WebhookCertificateError",
    "admission_problems",
    "pod_template_problems",
    "review",
    "serve",
    "start",
]

logger = logging.getLogger("trainjob_operator.admission")

WEBHOOK_PATH = "/validate-trainjob"
"""The path the ``ValidatingWebhookConfiguration`` calls (``https://SERVICE:PORT/PATH``)."""
DENIED_CODE = 422
"""The HTTP status of a denial: the same as the API server's own schema errors."""


class WebhookCertificateError(ValueError):
    """The webhook's certificate files are missing or unusable (a one-line message naming the
    flag, the file and the fix; ``trainjob operator`` prints it and exits with status 2)."""


@dataclass(frozen=True)
class AdmissionServer:
    """Where the webhook listens and the certificate it serves.

    Attributes:
        port: the HTTPS port (the chart's Service forwards 443 to it).
        certfile: PEM server certificate (the chart's Secret ``tls.crt``).
        keyfile: PEM private key of the certificate (``tls.key``).
        addr: listen address (all interfaces by default).
        allowed_volume_types: the volume types ``spec.podTemplate.volumes`` may use (the
            renderer's, from the chart's ``podSecurity.allowedVolumeTypes``).
        namespaces: the namespaces the operator watches (``--namespace``); the TrainJobs of
            any other namespace are admitted unchecked. ``None``: every namespace is checked.
    """

    port: int
    certfile: str
    keyfile: str
    addr: str = "0.0.0.0"
    allowed_volume_types: frozenset[str] = DEFAULT_ALLOWED_VOLUME_TYPES
    namespaces: frozenset[str] | None = None

    @classmethod
    def from_dir(
        cls,
        port: int,
        cert_dir: str | Path,
        addr: str = "0.0.0.0",
        namespaces: Iterable[str] | None = None,
    ) -> AdmissionServer:
        """The server for the ``tls.crt``/``tls.key`` of a mounted TLS Secret, allowing the
        volume types the renderer allows (``TRAINJOB_*`` environment of the chart), for the
        TrainJobs of ``namespaces`` (``None``: all).

        The certificate and key are loaded once here, so that a missing, unreadable or
        malformed file stops the operator at startup (kopf's server would otherwise fail in
        its thread, and the operator run on without a webhook).

        Raises:
            WebhookCertificateError: one line naming the flag, the file and the fix.
        """
        folder = Path(cert_dir)
        fix = (
            "mount the chart's webhook TLS Secret (tls.crt, tls.key) there, or pass "
            "--webhook-port 0 to serve no webhook"
        )
        pem_markers = {"tls.crt": b"-----BEGIN CERTIFICATE-----", "tls.key": b"PRIVATE KEY-----"}
        for name, marker in pem_markers.items():
            path = folder / name
            if not path.is_file():
                raise WebhookCertificateError(
                    f"--webhook-cert-dir {folder}: {name} is missing ({fix})"
                )
            try:
                text = path.read_bytes()
            except OSError as exc:
                raise WebhookCertificateError(
                    f"--webhook-cert-dir {folder}: {name} cannot be read "
                    f"({exc.strerror or exc}; {fix})"
                ) from None
            if marker not in text:
                what = "certificate" if name == "tls.crt" else "private key"
                raise WebhookCertificateError(
                    f"--webhook-cert-dir {folder}: {name} is not a PEM {what} (no "
                    f"{marker.decode()} line; {fix})"
                )
        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(
                folder / "tls.crt",
                folder / "tls.key",
                password=lambda: b"",  # an encrypted key fails here instead of prompting
            )
        except (ssl.SSLError, OSError, ValueError) as exc:
            reason = " ".join(str(getattr(exc, "reason", None) or exc).split())
            problem = (
                "tls.key is not the private key of tls.crt"
                if reason == "KEY_VALUES_MISMATCH"
                else "tls.crt and tls.key are not a usable PEM certificate and private key"
            )
            raise WebhookCertificateError(
                f"--webhook-cert-dir {folder}: {problem} ({reason}; {fix})"
            ) from None

        allowed = render_options_from_env().allowed_volume_types
        watched = None if namespaces is None else frozenset(namespaces)
        return cls(port, str(folder / "tls.crt"), str(folder / "tls.key"), addr, allowed, watched)

    def server(self) -> kopf.WebhookServer:
        """kopf's HTTPS server for this address and certificate."""
        import kopf

        return kopf.WebhookServer(
            addr=self.addr, port=self.port, certfile=self.certfile, pkeyfile=self.keyfile
        )


def _spec_of(body: Mapping[str, Any] | None) -> Any:
    return None if body is None else body.get("spec")


def pod_template_problems(
    job: TrainJob, allowed_volume_types: frozenset[str] = DEFAULT_ALLOWED_VOLUME_TYPES
) -> list[str]:
    """The ``spec.podTemplate`` problem of a TrainJob that passed :func:`parse_trainjob` (the
    renderer's own check, which the operator would otherwise report as ``InvalidSpec``), as
    ``spec.podTemplate.<key>: message (hint: ...)``; empty when there is none."""
    try:
        validate_pod_template(job.spec.pod_template, allowed_volume_types)
    except ValueError as exc:
        return [str(exc)]
    return []


def admission_problems(
    body: Mapping[str, Any],
    operation: str | None,
    old: Mapping[str, Any] | None = None,
    allowed_volume_types: frozenset[str] = DEFAULT_ALLOWED_VOLUME_TYPES,
) -> list[str]:
    """The lines a denial carries (``field.path: message (hint: ...)``), empty to admit.

    A create, and an update that changes ``spec``, must pass :func:`parse_trainjob`. Other
    updates (metadata such as labels or a finalizer being removed, a TrainJob being deleted)
    are admitted whatever their spec, so a TrainJob created before the webhook existed can
    still be finalized and deleted.
    """
    if operation == "UPDATE" and (
        _spec_of(body) == _spec_of(old)
        or (body.get("metadata") or {}).get("deletionTimestamp") is not None
    ):
        return []
    try:
        job = parse_trainjob(body)
    except ManifestError as exc:
        return [error.format() for error in exc.errors]
    return pod_template_problems(job, allowed_volume_types)


def review(
    request: Mapping[str, Any],
    allowed_volume_types: frozenset[str] = DEFAULT_ALLOWED_VOLUME_TYPES,
    namespaces: frozenset[str] | None = None,
) -> dict[str, Any]:
    """The ``AdmissionReview`` response to an ``AdmissionReview`` request (admission.k8s.io/v1):
    allowed, or denied with HTTP 422 and the lines of :func:`admission_problems` joined by
    ``"; "`` (the API server shows them after ``admission webhook ... denied the request:``).
    With ``namespaces``, a TrainJob of any other namespace is allowed unchecked (not this
    operator's: see the module's docstring)."""
    payload = request.get("request") or {}
    problems: list[str] = []
    if namespaces is None or payload.get("namespace") in namespaces:
        problems = admission_problems(
            payload.get("object") or {},
            payload.get("operation"),
            payload.get("oldObject"),
            allowed_volume_types,
        )
    response: dict[str, Any] = {"uid": payload.get("uid", ""), "allowed": not problems}
    if problems:
        response["status"] = {"message": "; ".join(problems), "code": DENIED_CODE}
    return {
        "apiVersion": request.get("apiVersion", "admission.k8s.io/v1"),
        "kind": "AdmissionReview",
        "response": response,
    }


async def serve(server: AdmissionServer, stop_flag: threading.Event) -> None:
    """Serve the webhook until ``stop_flag`` is set (kopf's :class:`kopf.WebhookServer`, which
    also reloads the certificate when its files change, e.g. a renewed Secret)."""

    async def webhook(request: Mapping[str, Any], **_: Any) -> dict[str, Any]:
        return review(request, server.allowed_volume_types, server.namespaces)

    async def run() -> None:
        async with server.server() as webhook_server:
            async for _config in webhook_server(webhook):  # type: ignore[arg-type]
                logger.info("admission webhook listening on %s:%d", server.addr, server.port)

    task = asyncio.create_task(run())
    try:
        while not stop_flag.is_set() and not task.done():
            await asyncio.sleep(0.2)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def start(server: AdmissionServer) -> tuple[threading.Thread, threading.Event]:
    """Serve the webhook from a daemon thread; returns it and the event that stops it.

    Every operator replica serves the webhook, the leader and the standbys alike (the chart's
    Service sends reviews to any of them): it needs no API access and no leadership.
    """
    stop_flag = threading.Event()
    thread = threading.Thread(
        target=lambda: asyncio.run(serve(server, stop_flag)),
        name="admission-webhook",
        daemon=True,
    )
    thread.start()
    return thread, stop_flag
