"""The kopf operator: every trigger runs the same level-based reconcile.

Triggers: TrainJob create / spec update / resume (operator restart), a
periodic timer per TrainJob (deadlines, TTL, validation pool idling), and
events of pods the operator manages (so pod phases are seen at once).

Run with ``trainjob operator`` (or :func:`run_operator` in-process, as the tests do).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import kopf
from prometheus_client import Counter, Gauge, Histogram, start_http_server

from trainjob_operator.api.models import TrainJob
from trainjob_operator.kube import KubeClient, KubeConfig
from trainjob_operator.reconcile.apply import NAME_LABEL, Renderer, reconcile_trainjob

logger = logging.getLogger("trainjob_operator")

GROUP, VERSION, PLURAL = "trainjob.dev", "v1alpha1", "trainjobs"
MANAGED = {"app.kubernetes.io/managed-by": "trainjob-operator"}

RECONCILES = Counter("trainjob_reconciles_total", "Reconcile runs", ["trigger"])
ERRORS = Counter("trainjob_reconcile_errors_total", "Reconcile runs that raised", ["trigger"])
DURATION = Histogram("trainjob_reconcile_seconds", "Reconcile duration")
PHASES = Gauge("trainjob_jobs", "TrainJobs by phase", ["phase"])


def default_renderer() -> Renderer:
    """The manifest renderer (``trainjob_operator.render``)."""
    from trainjob_operator.render import render_for_reconcile

    return render_for_reconcile


class Operator:
    """Holds the API client and renderer the handlers share."""

    def __init__(self, client: KubeClient, render: Renderer) -> None:
        self.client = client
        self.render = render
        self._phases: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()

    def reconcile(self, namespace: str, name: str, trigger: str) -> None:
        """Run one reconcile; errors are retried by kopf with backoff."""
        RECONCILES.labels(trigger).inc()
        start = time.perf_counter()
        try:
            plan = reconcile_trainjob(self.client, namespace, name, self.render)
        except Exception:
            ERRORS.labels(trigger).inc()
            raise
        finally:
            DURATION.observe(time.perf_counter() - start)
        with self._lock:
            if plan is None:
                self._phases.pop((namespace, name), None)
            else:
                self._phases[(namespace, name)] = str(plan.status.get("phase"))
            counts: dict[str, int] = {}
            for phase in self._phases.values():
                counts[phase] = counts.get(phase, 0) + 1
            for phase in (
                "Pending",
                "Starting",
                "Running",
                "Restarting",
                "Suspended",
                "Succeeded",
                "Failed",
            ):
                PHASES.labels(phase).set(counts.get(phase, 0))


def register(
    registry: kopf.OperatorRegistry, operator: Operator, timer_interval: float = 5.0
) -> None:
    """Register the handlers on ``registry``."""

    def on_trainjob(trigger: str) -> Callable[..., None]:
        def handler(name: str, namespace: str, **_: Any) -> None:
            operator.reconcile(namespace, name, trigger)

        return handler

    kopf.on.create(GROUP, VERSION, PLURAL, registry=registry)(on_trainjob("create"))
    kopf.on.update(GROUP, VERSION, PLURAL, field="spec", registry=registry)(on_trainjob("update"))
    kopf.on.resume(GROUP, VERSION, PLURAL, registry=registry)(on_trainjob("resume"))
    kopf.timer(GROUP, VERSION, PLURAL, interval=timer_interval, registry=registry)(
        on_trainjob("timer")
    )

    def on_pod(labels: Any, namespace: Any, **_: Any) -> None:
        job = labels.get(NAME_LABEL)
        if job and namespace:
            operator.reconcile(str(namespace), str(job), "pod")

    kopf.on.event("", "v1", "pods", labels=MANAGED, registry=registry)(on_pod)


def configure(settings: kopf.OperatorSettings) -> None:
    """Watch timeouts, posting and persistence suited to one operator replica."""
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 30
    settings.posting.level = logging.WARNING
    settings.persistence.finalizer = "trainjob.dev/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="trainjob.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="trainjob.dev", key="last-handled-configuration"
    )
    settings.queueing.error_delays = [1, 2, 5, 10, 30]


def run_operator(
    config: KubeConfig,
    namespaces: list[str] | None,
    stop_flag: threading.Event | None = None,
    ready_flag: threading.Event | None = None,
    liveness_endpoint: str | None = None,
    timer_interval: float = 5.0,
    render: Renderer | None = None,
) -> None:
    """Run the operator until ``stop_flag`` is set (blocking; call it in a thread to embed)."""
    registry = kopf.OperatorRegistry()
    operator = Operator(KubeClient(config), render or default_renderer())
    register(registry, operator, timer_interval)

    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(
            server=config.host,
            token=config.token,
            ca_path=config.ca_file,
            certificate_path=config.client_cert,
            private_key_path=config.client_key,
            insecure=config.insecure,
            default_namespace="default",
        )

    kopf.on.login(registry=registry)(login)

    def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure(settings)

    kopf.on.startup(registry=registry)(startup)
    asyncio.run(
        kopf.operator(
            registry=registry,
            standalone=True,
            clusterwide=not namespaces,
            namespaces=namespaces or [],
            stop_flag=stop_flag,
            ready_flag=ready_flag,
            liveness_endpoint=liveness_endpoint,
        )
    )


def operator_command(args: argparse.Namespace) -> int:
    """``trainjob operator``: run until interrupted."""
    logging.basicConfig(
        level=logging.DEBUG if getattr(args, "verbose", False) else logging.INFO,
        format='{"time":"%(asctime)s","level":"%(levelname)s","logger":"%(name)s",'
        '"message":"%(message)s"}',
    )
    if getattr(args, "metrics_port", None):
        start_http_server(int(args.metrics_port))
    namespaces = getattr(args, "namespace", None) or None
    run_operator(KubeConfig.load(), namespaces, liveness_endpoint=getattr(args, "liveness", None))
    return 0


__all__ = ["Operator", "TrainJob", "configure", "operator_command", "register", "run_operator"]
