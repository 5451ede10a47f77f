"""The Ray head pod and the headless Service of a TrainJob."""

from __future__ import annotations

from typing import Any

from trainjob_operator.api.trainjob import TrainJob
from trainjob_operator.constants import NAME_LABEL, ROLE_LABEL
from trainjob_operator.render.context import (
    RenderContext,
    build_context,
    common_env,
    common_labels,
    object_meta,
)
from trainjob_operator.render.hashing import finalize
from trainjob_operator.render.names import dashboard_service_name, head_pod_name
from trainjob_operator.render.options import RenderOptions
from trainjob_operator.render.pods import build_container, build_pod
from trainjob_operator.render.ray import CLIENT_PORT, DASHBOARD_PORT, GCS_PORT, METRICS_PORT

__all__ = [
    "HEAD_PORTS",
    "head_pod",
    "headless_service",
    "render_head_pod",
    "render_headless_service",
]

HEAD_PORTS: tuple[tuple[str, int], ...] = (
    ("gcs", GCS_PORT),
    ("client", CLIENT_PORT),
    ("metrics", METRICS_PORT),
)
"""Named ports of the Ray head: GCS, Ray client, Prometheus metrics. The dashboard (and its
Jobs API) listens on the pod's loopback only: reach it with ``kubectl port-forward``."""


def head_command() -> list[str]:
    """``ray start --head --block`` with fixed ports and no logical CPUs/GPUs (no work there);
    the dashboard on loopback only (``kubectl port-forward <job>-head 8265`` reaches it)."""
    return [
        "ray",
        "start",
        "--head",
        "--block",
        f"--port={GCS_PORT}",
        "--dashboard-host=127.0.0.1",
        f"--dashboard-port={DASHBOARD_PORT}",
        f"--ray-client-server-port={CLIENT_PORT}",
        f"--metrics-export-port={METRICS_PORT}",
        "--num-cpus=0",
        "--num-gpus=0",
        "--disable-usage-stats",
    ]


def render_head_pod(
    job: TrainJob, *, uid: str, attempt: int = 0, options: RenderOptions | None = None
) -> dict[str, Any]:
    """The Ray head pod ``<job>-head``.

    It runs ``ray start --head --block`` with ``--num-cpus=0`` so that no task or actor lands on
    it, exposes the GCS (6379), client (10001) and metrics (8080) ports (the dashboard, 8265,
    listens on loopback), requires Ray's token (:mod:`~trainjob_operator.render.security`), is
    Ready once the GCS accepts connections, and gets ``spec.ray.head.resources`` (or
    ``options.head_resources``). It runs no user code, so it gets neither the storage
    ServiceAccount nor an API token. It belongs to the Kueue pod group with the workers.

    Raises:
        ValueError: for an invalid ``spec.podTemplate``/``spec.env`` or bad names.
    """
    return head_pod(build_context(job, uid=uid, attempt=attempt, options=options))


def head_pod(ctx: RenderContext) -> dict[str, Any]:
    """:func:`render_head_pod` from a render context."""
    placement = ctx.head_placement
    container = build_container(
        ctx,
        name="ray-head",
        command=head_command(),
        env=common_env(ctx),
        resources=placement.resources,
        ports=HEAD_PORTS,
        readiness_probe={
            "tcpSocket": {"port": GCS_PORT},
            "periodSeconds": 5,
            "failureThreshold": 3,
        },
    )
    return build_pod(
        ctx,
        name=head_pod_name(ctx.name),
        role="head",
        container=container,
        placement=placement,
        gang=True,
    )


def render_headless_service(
    job: TrainJob, *, uid: str, options: RenderOptions | None = None
) -> dict[str, Any]:
    """The headless Service ``<job>-headless``.

    ``clusterIP: None`` and ``publishNotReadyAddresses: true``, selecting every pod of the job
    (label ``trainjob.dev/name``), so each pod gets the stable DNS name
    ``<hostname>.<job>-headless`` as soon as it has an IP (Ray and the TPU runtime need their
    peers before anything is Ready).
    """
    return headless_service(build_context(job, uid=uid, options=options))


def headless_service(ctx: RenderContext) -> dict[str, Any]:
    """:func:`render_headless_service` from a render context."""
    return finalize(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": object_meta(ctx, ctx.subdomain, common_labels(ctx, "head")),
            "spec": {
                "clusterIP": "None",
                "publishNotReadyAddresses": True,
                "selector": {NAME_LABEL: ctx.name},
                "ports": [
                    {"name": name, "port": port, "targetPort": port, "protocol": "TCP"}
                    for name, port in HEAD_PORTS
                ],
            },
        }
    )


def dashboard_service(ctx: RenderContext) -> dict[str, Any] | None:
    """The ClusterIP Service ``<job>-dashboard`` selecting the Ray head on the dashboard port
    (8265), when ``spec.ray.dashboard.service``; None otherwise.

    The dashboard listens on the head's loopback only (its Jobs API runs code), so the Service
    is what ``kubectl port-forward svc/<job>-dashboard 8265`` resolves to the head pod; it does
    not open the dashboard to other pods.
    """
    if not ctx.job.spec.ray.dashboard.service:
        return None
    return finalize(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": object_meta(
                ctx, dashboard_service_name(ctx.name), common_labels(ctx, "dashboard")
            ),
            "spec": {
                "type": "ClusterIP",
                "selector": {NAME_LABEL: ctx.name, ROLE_LABEL: "head"},
                "ports": [
                    {
                        "name": "dashboard",
                        "port": DASHBOARD_PORT,
                        "targetPort": DASHBOARD_PORT,
                        "protocol": "TCP",
                    }
                ],
            },
        }
    )
