"""The kopf operator: every trigger runs the same level-based reconcile.

Triggers: TrainJob create / spec update / resume (operator restart), a
periodic timer per TrainJob (deadlines, TTL, validation pool idling, the
driver's status updates), and changes of pods the operator manages (so pod
phases are seen at once; a pod's creation is not one, see :func:`pod_event_triggers`).

Cost control, so that hundreds of TrainJobs stay cheap: a trigger that finds
a reconcile of the same TrainJob already waiting to start is dropped (the
waiting one reads the state after it); and a timer tick reconciles only when
the TrainJob changed since the last timer reconcile (its ``resourceVersion``:
the driver's status updates, annotations), when the last plan asked to be
called back by now (a deadline, the TTL, a pool scale-down, a pod being
replaced), or at least every ``resync_seconds`` as a safety net.

Metrics: reconciles, skipped triggers, errors, durations, and ``trainjob_jobs{phase}``: the
TrainJobs by the phase of their last plan, one series per :class:`~trainjob_operator.api.Phase`.

Run with ``trainjob operator`` (or :func:`run_operator` in-process, as the tests do).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import datetime as dt
import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import kopf
from prometheus_client import Counter, Gauge, Histogram, start_http_server

from trainjob_operator import admission as admission_webhook
from trainjob_operator.admission import AdmissionServer, WebhookCertificateError
from trainjob_operator.api.status import Phase
from trainjob_operator.api.trainjob import TrainJob
from trainjob_operator.constants import FINALIZER, GROUP, MANAGED_BY_LABEL, PLURAL, VERSION
from trainjob_operator.kube import KubeClient, KubeConfig
from trainjob_operator.leader import (
    HealthServer,
    LeaderElector,
    elector_from_args,
    run_with_leader_election,
)
from trainjob_operator.reconcile.apply import NAME_LABEL, Renderer, reconcile_trainjob

logger = logging.getLogger("trainjob_operator")

MANAGED = {MANAGED_BY_LABEL: "trainjob-operator"}

#: Longest a TrainJob goes without a reconcile when nothing happens to it.
DEFAULT_RESYNC_SECONDS = 60.0

RECONCILES = Counter("trainjob_reconciles_total", "Reconcile runs", ["trigger"])
SKIPPED = Counter(
    "trainjob_reconciles_skipped_total",
    "Triggers that needed no reconcile: coalesced into one already waiting, or a timer tick "
    "with nothing changed or due",
    ["trigger", "why"],
)
ERRORS = Counter("trainjob_reconcile_errors_total", "Reconcile runs that raised", ["trigger"])
DURATION = Histogram("trainjob_reconcile_seconds", "Reconcile duration")
PHASES = Gauge("trainjob_jobs", "TrainJobs by phase", ["phase"])


def default_renderer() -> Renderer:
    """The manifest renderer (``trainjob_operator.render``) with the operator-wide pod
    defaults from the environment (``TRAINJOB_DEFAULT_*``, the Helm chart's ``defaults``).

    Raises:
        ValueError: naming the variable, when one of them is not valid (read at startup).
    """
    from trainjob_operator.render import render_options_from_env, renderer_for

    return renderer_for(render_options_from_env())


class KeyedLocks:
    """One lock per key, kept only while someone holds or waits for it.

    A lock entry is dropped when its last user leaves, so the map does not grow with every
    TrainJob ever seen, and an entry is never replaced while a thread waits on it (which would
    let two threads hold "the" lock of one key at once).
    """

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._locks: dict[Any, tuple[threading.Lock, int]] = {}

    @contextlib.contextmanager
    def hold(self, key: Any) -> Iterator[None]:
        """Hold ``key``'s lock for the ``with`` block."""
        with self._mutex:
            lock, users = self._locks.get(key, (threading.Lock(), 0))
            self._locks[key] = (lock, users + 1)
        try:
            with lock:
                yield
        finally:
            with self._mutex:
                lock, users = self._locks[key]
                if users == 1:
                    del self._locks[key]
                else:
                    self._locks[key] = (lock, users - 1)

    def __len__(self) -> int:
        with self._mutex:
            return len(self._locks)


class Operator:
    """Holds the API client and renderer the handlers share."""

    def __init__(
        self,
        client: KubeClient,
        render: Renderer,
        resync_seconds: float = DEFAULT_RESYNC_SECONDS,
    ) -> None:
        self.client = client
        self.render = render
        self.resync_seconds = resync_seconds
        self._phases: dict[tuple[str, str], Phase | None] = {}
        self._lock = threading.Lock()
        self._job_locks = KeyedLocks()
        self._waiting: set[tuple[str, str]] = set()
        #: per TrainJob: (monotonic time its next timer reconcile is due, resourceVersion the
        #: last timer-triggered reconcile was started for)
        self._timer_state: dict[tuple[str, str], tuple[float, str | None]] = {}

    def on_timer(self, namespace: str, name: str, resource_version: str | None) -> None:
        """A timer tick: reconcile only if the TrainJob changed, a callback is due, or the
        resync period passed (see the module docstring)."""
        key = (namespace, name)
        with self._lock:
            due, seen_version = self._timer_state.get(key, (0.0, None))
        unchanged = resource_version is not None and resource_version == seen_version
        if unchanged and time.monotonic() < due:
            SKIPPED.labels("timer", "unchanged").inc()
            return
        self.reconcile(namespace, name, "timer", resource_version=resource_version)

    def reconcile(
        self, namespace: str, name: str, trigger: str, resource_version: str | None = None
    ) -> None:
        """Run one reconcile; errors are retried by kopf with backoff.

        kopf runs the handlers of different objects concurrently (the TrainJob's timer, its
        pods' events), so reconciles of one TrainJob are serialized here: each one reads the
        status and children the previous one wrote. Two at once would both act on the same
        stale status (duplicate events, one's status patch undoing the other's). A trigger
        arriving while another reconcile of the job waits for the lock is dropped: the waiting
        one has not read anything yet, so it sees whatever this trigger was about.
        """
        key = (namespace, name)
        with self._lock:
            if key in self._waiting:
                SKIPPED.labels(trigger, "coalesced").inc()
                return
            self._waiting.add(key)
        try:
            with self._job_locks.hold(key):
                with self._lock:
                    self._waiting.discard(key)
                self._reconcile_locked(namespace, name, trigger, resource_version)
        finally:
            with self._lock:
                self._waiting.discard(key)

    def _reconcile_locked(
        self, namespace: str, name: str, trigger: str, resource_version: str | None
    ) -> None:
        RECONCILES.labels(trigger).inc()
        key = (namespace, name)
        start = time.perf_counter()
        started = time.monotonic()
        try:
            plan = reconcile_trainjob(self.client, namespace, name, self.render)
        except Exception:
            ERRORS.labels(trigger).inc()
            with self._lock:
                self._timer_state.pop(key, None)  # the next tick reconciles again
            raise
        finally:
            DURATION.observe(time.perf_counter() - start)
        with self._lock:
            if plan is None:
                self._phases.pop(key, None)
                self._timer_state.pop(key, None)
            else:
                self._phases[key] = plan.new_status.phase
                wait = self.resync_seconds
                if plan.requeue_after is not None:
                    wait = min(wait, plan.requeue_after)
                _, seen_version = self._timer_state.get(key, (0.0, None))
                if trigger == "timer":
                    seen_version = resource_version
                self._timer_state[key] = (started + wait, seen_version)
            counts = collections.Counter(self._phases.values())
            for phase in Phase:
                PHASES.labels(phase.value).set(counts[phase])


def pod_event_triggers(event_type: str | None) -> bool:
    """Whether a watch event of a managed pod asks for a reconcile of its TrainJob.

    ``ADDED`` does not: only the operator creates these pods, and the reconcile that created
    one already planned with it (each pod's creation echoing back as a reconcile was 3 of the
    ~6 reconciles per new TrainJob in ``benchmarks/bench_operator.py``, issue 20). A change
    (``MODIFIED``: scheduled, running, failed, being evicted), a deletion, and kopf's initial
    listing (``None``: pods that existed before the operator started) do.
    """
    return event_type != "ADDED"


def register(
    registry: kopf.OperatorRegistry, operator: Operator, timer_interval: float = 5.0
) -> None:
    """Register the handlers on ``registry``."""

    def on_trainjob(trigger: str) -> Callable[..., None]:
        def handler(name: str, namespace: str, **_: Any) -> None:
            operator.reconcile(namespace, name, trigger)

        return handler

    def on_timer(name: str, namespace: str | None, meta: Any, **_: Any) -> None:
        # meta: kopf's latest view of the TrainJob from its watch (no API call)
        version = meta.get("resourceVersion")
        operator.on_timer(str(namespace or ""), name, str(version) if version else None)

    kopf.on.create(GROUP, VERSION, PLURAL, registry=registry)(on_trainjob("create"))
    kopf.on.update(GROUP, VERSION, PLURAL, field="spec", registry=registry)(on_trainjob("update"))
    kopf.on.resume(GROUP, VERSION, PLURAL, registry=registry)(on_trainjob("resume"))
    kopf.timer(GROUP, VERSION, PLURAL, interval=timer_interval, registry=registry)(on_timer)

    def on_pod(labels: Any, namespace: Any, type: Any = None, **_: Any) -> None:
        job = labels.get(NAME_LABEL)
        if job and namespace and pod_event_triggers(type):
            operator.reconcile(str(namespace), str(job), "pod")

    kopf.on.event("", "v1", "pods", labels=MANAGED, registry=registry)(on_pod)


def configure(settings: kopf.OperatorSettings) -> None:
    """Watch timeouts, posting and persistence suited to one operator replica."""
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 30
    settings.posting.level = logging.WARNING
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="trainjob.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="trainjob.dev", key="last-handled-configuration"
    )
    settings.queueing.error_delays = [1, 2, 5, 10, 30]
    # A TrainJob deleted from inside its own timer (ttlSecondsAfterFinished) still has that
    # timer running when kopf sees the deletion; kopf keeps its finalizer until the timer
    # exits and re-checks every cancellation_polling seconds (60 by default).
    settings.background.cancellation_polling = 2


def run_operator(
    config: KubeConfig,
    namespaces: list[str] | None,
    stop_flag: threading.Event | None = None,
    ready_flag: threading.Event | None = None,
    liveness_endpoint: str | None = None,
    timer_interval: float = 5.0,
    render: Renderer | None = None,
    client: KubeClient | None = None,
    resync_seconds: float = DEFAULT_RESYNC_SECONDS,
    admission: AdmissionServer | None = None,
    leader_election: LeaderElector | None = None,
) -> None:
    """Run the operator until ``stop_flag`` is set (blocking; call it in a thread to embed).

    ``client`` is the API client of the reconciler (default: ``KubeClient(config)``); kopf's
    own watches always use ``config``. ``admission``: also serve the validating admission
    webhook (:mod:`trainjob_operator.admission`) there. ``leader_election``: wait for the
    Lease and reconcile only while holding it; return when it is lost
    (:mod:`trainjob_operator.leader`).
    """
    if admission is not None:
        # Every replica serves the webhook, leading or not (the Service picks any of them).
        _thread, admission_stop = admission_webhook.start(admission)
        try:
            run_operator(
                config,
                namespaces,
                stop_flag,
                ready_flag,
                liveness_endpoint,
                timer_interval,
                render,
                client,
                resync_seconds,
                None,
                leader_election,
            )
        finally:
            admission_stop.set()
        return
    if leader_election is not None:
        run_with_leader_election(
            leader_election,
            stop_flag,
            lambda flag: run_operator(
                config,
                namespaces,
                flag,
                ready_flag,
                liveness_endpoint,
                timer_interval,
                render,
                client,
                resync_seconds,
                admission,
            ),
        )
        return
    registry = kopf.OperatorRegistry()
    operator = Operator(
        client or KubeClient(config), render or default_renderer(), resync_seconds=resync_seconds
    )
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


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time``, ``level``, ``logger``, ``message``, and for kopf's
    per-object log records ``object`` (the name) and ``namespace``; ``exception`` when the
    record carries one. Built with :func:`json.dumps`, so quotes and newlines in messages are
    escaped, never breaking the line."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as a JSON line."""
        entry: dict[str, Any] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        ref = getattr(record, "k8s_ref", None)  # set by kopf's per-object logger
        if isinstance(ref, dict):
            if ref.get("name"):
                entry["object"] = ref["name"]
            if ref.get("namespace"):
                entry["namespace"] = ref["namespace"]
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


def configure_logging(verbose: bool = False) -> None:
    """Structured (JSON lines) logs on stderr for the whole process, kopf included."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, handlers=[handler])


def start_metrics_server(port: int, addr: str = "0.0.0.0") -> Any:
    """Serve the Prometheus metrics (``/metrics``) on ``addr:port`` from a daemon thread;
    returns the HTTP server (``.shutdown()`` stops it)."""
    server, _thread = start_http_server(port, addr=addr)
    return server


def operator_command(args: argparse.Namespace) -> int:
    """``trainjob operator``: run until interrupted."""
    configure_logging(verbose=bool(getattr(args, "verbose", False)))
    namespaces = getattr(args, "namespace", None) or None
    webhook_port = int(getattr(args, "webhook_port", 0) or 0)
    try:
        admission = (
            AdmissionServer.from_dir(webhook_port, args.webhook_cert_dir, namespaces=namespaces)
            if webhook_port
            else None
        )
    except WebhookCertificateError as exc:
        print(f"trainjob operator: {exc}", file=sys.stderr)
        return 2  # cli.EXIT_INVALID
    if getattr(args, "metrics_port", None):
        start_metrics_server(int(args.metrics_port))
    config = KubeConfig.load()
    liveness = getattr(args, "liveness", None)
    # One attempt per request, short timeouts: a renewal must not outlast the renew deadline.
    elector = elector_from_args(args, KubeClient(config, attempts=1, timeout=5.0))
    if elector is not None:
        HealthServer(elector, int(args.health_port)).start()
        liveness = None  # /healthz is the HealthServer's, on every replica
    run_operator(
        config,
        namespaces,
        liveness_endpoint=liveness,
        admission=admission,
        leader_election=elector,
    )
    return 0


__all__ = [
    "JsonFormatter",
    "KeyedLocks",
    "Operator",
    "TrainJob",
    "configure",
    "configure_logging",
    "operator_command",
    "register",
    "run_operator",
    "start_metrics_server",
]
