"""The driver's Prometheus metrics: their one owner, and the thin ``note_*`` calls that feed them.

The controller, the coordinator's report rounds and the validation dispatcher call these
functions where the events already happen; nothing else names a metric. They are registered in
``prometheus_client``'s default registry of the driver process and served (``/metrics``) only
when asked: :data:`METRICS_PORT_ENV` (the operator sets it in every driver pod, and
``trainjob run`` passes ``--metrics-port`` through it) makes :func:`serve_from_env` start the
endpoint when the run's driver starts. Counting costs a few microseconds per event whether or
not anything is served.

Every series here is unlabelled or has a small fixed label set (no per-rank or per-checkpoint
labels), so a job with thousands of ranks exports as many series as a job with one. Prometheus
adds the target's labels (namespace, pod; the chart's PodMonitor also the TrainJob's name).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping
from typing import Any

from prometheus_client import Counter, Gauge, Histogram, start_http_server

from trainjob_operator.constants import METRICS_PORT_ENV

logger = logging.getLogger("trainer_runtime")

#: Keys of rank 0's metrics read as the training step, in this order (as the TrainJob's
#: ``status.progress.step``); without one, the count of reports.
STEP_KEYS = ("step", "global_step", "iteration", "epoch")

#: ``trainjob_train_restarts_total{cause}`` values.
RESTART_CAUSES = ("failure", "preemption")

_SECONDS_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)

REPORTS = Counter(
    "trainjob_train_reports_total",
    "report() rounds of rank 0 the driver received (rate: reports per second)",
)
STEP = Gauge(
    "trainjob_train_step",
    "The latest training step rank 0 reported (its metrics' step, global_step, iteration or "
    "epoch; else the number of reports); deriv() gives steps per second",
)
LAST_PROGRESS = Gauge(
    "trainjob_train_last_progress_timestamp_seconds",
    "Unix time of rank 0's latest report (the driver's start until the first one)",
)
REPORT_BLOCKED = Histogram(
    "trainjob_train_report_blocked_seconds",
    "Seconds one report() call of a rank blocked its train function (a SYNC checkpoint "
    "upload, waiting for an ASYNC upload slot), every rank",
    buckets=_SECONDS_BUCKETS,
)
UPLOAD_SECONDS = Histogram(
    "trainjob_train_checkpoint_upload_seconds",
    "Seconds one rank took to store its files of a checkpoint",
    buckets=_SECONDS_BUCKETS,
)
UPLOAD_BYTES = Counter(
    "trainjob_train_checkpoint_upload_bytes_total",
    "Checkpoint bytes the ranks stored",
)
COMMIT_SECONDS = Histogram(
    "trainjob_train_checkpoint_commit_seconds",
    "Seconds from the first report() of a checkpoint's round to its commit (every rank "
    "reported and stored its files, the files checked, the marker written)",
    buckets=_SECONDS_BUCKETS,
)
CHECKPOINTS = Counter(
    "trainjob_train_checkpoints_committed_total",
    "Checkpoints committed",
)
LAST_CHECKPOINT = Gauge(
    "trainjob_train_last_checkpoint_timestamp_seconds",
    "Unix time the latest checkpoint was committed (restored ones included); 0 before any",
)
VALIDATIONS = Gauge(
    "trainjob_train_validations",
    "Validations of committed checkpoints, by state: queued for a concurrency slot, or "
    "running (holding one, started or waiting for a node)",
    ["state"],
)
VALIDATION_LAG = Histogram(
    "trainjob_train_validation_lag_seconds",
    "Seconds from a checkpoint's validation being queued (at its commit) to its result",
    buckets=_SECONDS_BUCKETS,
)
RESTARTS = Counter(
    "trainjob_train_restarts_total",
    "Worker group restarts within this driver, by cause",
    ["cause"],
)
PREEMPTIONS = Counter(
    "trainjob_train_preemptions_total",
    "Preemptions the run restarted from or stopped for",
)

# Series that exist from the start (0), so queries and alerts see them before any event.
for _state in ("queued", "running"):
    VALIDATIONS.labels(_state)
for _cause in RESTART_CAUSES:
    RESTARTS.labels(_cause)


def step_of(metrics: Mapping[str, Any] | None, fallback: int) -> int:
    """The training step in rank 0's ``metrics`` (:data:`STEP_KEYS`), else ``fallback``."""
    for key in STEP_KEYS:
        value = (metrics or {}).get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return fallback


# ------------------------------------------------------------------------------ the feed


def note_run_start() -> None:
    """The driver's run loop started: progress is counted from now."""
    LAST_PROGRESS.set(time.time())


def note_report(rank: int, round_index: int, metrics: Mapping[str, Any]) -> None:
    """A report of ``rank`` arrived (only rank 0's count as progress)."""
    if rank != 0:
        return
    REPORTS.inc()
    STEP.set(step_of(metrics, round_index))
    LAST_PROGRESS.set(time.time())


def note_report_blocked(seconds: float | None) -> None:
    """How long a rank's previous ``report()`` call took (None: no previous call)."""
    if seconds is not None and seconds >= 0:
        REPORT_BLOCKED.observe(seconds)


def note_upload(seconds: float, nbytes: int) -> None:
    """A rank stored its files of a checkpoint."""
    UPLOAD_SECONDS.observe(max(0.0, seconds))
    UPLOAD_BYTES.inc(max(0, nbytes))


def note_commit(first_report_time: float, committed_at: float) -> None:
    """A checkpoint was committed at ``committed_at`` (Unix time); its round's first report
    was sent at ``first_report_time``."""
    COMMIT_SECONDS.observe(max(0.0, committed_at - first_report_time))
    CHECKPOINTS.inc()
    LAST_CHECKPOINT.set(committed_at)


def note_restored(committed_at: float | None) -> None:
    """The run resumed with its latest checkpoint committed at ``committed_at`` (None: none)."""
    if committed_at is not None:
        LAST_CHECKPOINT.set(committed_at)


def note_validation_queue(queued: int, running: int) -> None:
    """The validation queue changed."""
    VALIDATIONS.labels("queued").set(queued)
    VALIDATIONS.labels("running").set(running)


def note_validation_done(queued_for_s: float) -> None:
    """A validation ended (any outcome) ``queued_for_s`` seconds after it was queued."""
    VALIDATION_LAG.observe(max(0.0, queued_for_s))


def note_restart(cause: str) -> None:
    """The run loop restarts the worker group for ``cause`` (:data:`RESTART_CAUSES`)."""
    RESTARTS.labels(cause).inc()


def note_preemption() -> None:
    """The run restarts from, or stops for, a preemption."""
    PREEMPTIONS.inc()


# ------------------------------------------------------------------------------ serving

_served: dict[int, Any] = {}
_serve_lock = threading.Lock()


def serve(port: int, addr: str = "0.0.0.0") -> int:
    """Serve this process's metrics (``/metrics``) on ``addr:port`` from a daemon thread, once
    per process and port; returns the port (the one chosen for ``port=0``)."""
    with _serve_lock:
        if port and port in _served:
            return port
        server, _thread = start_http_server(port, addr=addr)
        bound = int(server.server_address[1])
        _served[bound] = server
        return bound


def serve_from_env() -> int | None:
    """Serve on :data:`METRICS_PORT_ENV` when it is set (not 0); returns the port, or None.

    A port that cannot be bound (taken, not a number) is logged, never fatal: training does
    not depend on its metrics.
    """
    value = os.environ.get(METRICS_PORT_ENV, "").strip()
    if not value or value == "0":
        return None
    try:
        port = serve(int(value))
    except (ValueError, OSError) as exc:
        logger.warning("Not serving metrics on %s=%s: %s", METRICS_PORT_ENV, value, exc)
        return None
    logger.info("Serving training metrics on port %d (/metrics)", port)
    return port
