"""Preemption notices: Ray Train 2.60's ``PreemptionInfo`` and how a termination notice
reaches the train function.

A worker process that gets SIGTERM (Kubernetes' termination notice: spot reclaim, node
drain, TPU maintenance) records a notice with a deadline ``now + grace period`` instead of
exiting; the grace period is ``TRAINJOB_TERMINATION_GRACE_PERIOD_S`` (default 30 s,
Kubernetes' default ``terminationGracePeriodSeconds``). A second SIGTERM terminates at once.
With Ray workers the controller also sees Ray node drains (``get_draining_nodes()``, as Ray
Train's watcher), and a notice to the driver process itself (the in-cluster driver installs
the handler: its pod deleted or evicted, :func:`driver_stop_time`) preempts every rank.
:func:`trainer_runtime.get_preemption_info` gathers every rank's view and gives every rank
the same answer.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from dataclasses import dataclass
from types import FrameType
from typing import Any

from trainjob_operator.constants import DEFAULT_TERMINATION_GRACE_S, TERMINATION_GRACE_ENV

__all__ = ["PreemptionInfo"]

#: The collective name ``get_preemption_info()`` uses (the coordinator merges its payloads).
PREEMPTION_CALLER = "trainer_runtime.get_preemption_info"
#: The pod's grace period, set by the operator (the name is the operator's, in its
#: dependency-free leaf :mod:`trainjob_operator.constants`).
GRACE_ENV = TERMINATION_GRACE_ENV
DEFAULT_GRACE_S = float(DEFAULT_TERMINATION_GRACE_S)


@dataclass(frozen=True)
class PreemptionInfo:
    """An imminent preemption (``ray.train.PreemptionInfo``).

    Attributes:
        deadline_ms: earliest deadline (UNIX time in milliseconds) across the preempted
            nodes; ``None`` if none was given.
        preempted_node_to_ranks: each preempted node id -> the world ranks running on it.
    """

    deadline_ms: int | None
    preempted_node_to_ranks: dict[str, list[int]]

    @property
    def preempted_node_ids(self) -> list[str]:
        """Preempted node ids, sorted."""
        return sorted(self.preempted_node_to_ranks)

    @property
    def preempted_ranks(self) -> list[int]:
        """Every affected rank, ascending."""
        return sorted({r for ranks in self.preempted_node_to_ranks.values() for r in ranks})


_lock = threading.Lock()  # guards the two below; never taken by the SIGTERM handler
_notice_deadline_ms: int | None = None
_noticed = False
#: The deadline of the notice the SIGTERM handler recorded (None: no SIGTERM yet). Written
#: only by the handler, without a lock: a handler runs on the main thread between two
#: bytecodes, possibly while that thread holds ``_lock`` (``local_notice()`` in the driver's
#: poll loop), and waiting on it there would hang the process until the kubelet's SIGKILL.
_sigterm_deadline_ms: int | None = None


def grace_period_s() -> float:
    """The grace period this process assumes (``TRAINJOB_TERMINATION_GRACE_PERIOD_S``)."""
    raw = os.environ.get(GRACE_ENV, "")
    try:
        return float(raw) if raw else DEFAULT_GRACE_S
    except ValueError:
        return DEFAULT_GRACE_S


def notify(deadline_ms: int | None) -> None:
    """Record a termination notice for this process other than its own SIGTERM (which the
    handler records without a lock). Not for signal handlers: it takes a lock."""
    global _notice_deadline_ms, _noticed
    with _lock:
        if not _noticed or (
            deadline_ms is not None
            and (_notice_deadline_ms is None or deadline_ms < _notice_deadline_ms)
        ):
            _notice_deadline_ms = deadline_ms
        _noticed = True


def local_notice() -> tuple[bool, int | None]:
    """Whether this process got a termination notice, and its deadline (ms): the earliest of
    the deadlines given, None if none was."""
    with _lock:
        noticed, deadline_ms = _noticed, _notice_deadline_ms
    sigterm_deadline_ms = _sigterm_deadline_ms  # one read: the handler may set it any time
    if sigterm_deadline_ms is None:
        return noticed, deadline_ms
    if deadline_ms is None or sigterm_deadline_ms < deadline_ms:
        deadline_ms = sigterm_deadline_ms
    return True, deadline_ms


def clear() -> None:
    """Forget the notice (tests; a process reused for a new run)."""
    global _notice_deadline_ms, _noticed, _sigterm_deadline_ms
    with _lock:
        _notice_deadline_ms, _noticed = None, False
        _sigterm_deadline_ms = None


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    """The first SIGTERM records a notice; the next terminates the process. Takes no lock
    (see :data:`_sigterm_deadline_ms`)."""
    global _sigterm_deadline_ms
    if _sigterm_deadline_ms is not None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    _sigterm_deadline_ms = int((time.time() + grace_period_s()) * 1000)


def install_sigterm_handler() -> bool:
    """Turn the first SIGTERM into a notice. Only possible on the main thread (Python's
    rule); returns whether it was installed."""
    if threading.current_thread() is not threading.main_thread():
        return False
    signal.signal(signal.SIGTERM, _on_sigterm)
    return True


#: A Ray head (its GCS port) that has not answered for this long is gone: the cluster is
#: being torn down (every pod of the job deleted, a restart, a suspension), so nothing more can
#: be committed and a process waiting out its grace period for a commit stops instead.
HEAD_GONE_S = 5.0


def head_reachable(address: str, timeout_s: float = 2.0) -> bool:
    """Whether a TCP connection to a Ray head's GCS ``host:port`` opens (its Service resolves
    and something listens). Cheap: ``ray health-check`` against an address where nothing
    answers takes about 40 seconds to fail."""
    host, _, port = address.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")  # an IPv6 literal, "[::1]:6379"
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False


class HeadWatch:
    """Whether the Ray head at ``address`` has been unreachable (:func:`head_reachable`) for
    ``gone_after_s``, looking at most every ``poll_s`` seconds; call :meth:`gone` in a loop."""

    def __init__(
        self, address: str, *, gone_after_s: float = HEAD_GONE_S, poll_s: float = 1.0
    ) -> None:
        self.address = address
        self.gone_after_s = gone_after_s
        self.poll_s = poll_s
        self._checked_at: float | None = None
        self._lost_at: float | None = None

    def gone(self) -> bool:
        """Whether the head has not answered for ``gone_after_s`` (checks it when due)."""
        now = time.monotonic()
        if self._checked_at is None or now - self._checked_at >= self.poll_s:
            self._checked_at = now
            if head_reachable(self.address, timeout_s=min(1.0, self.poll_s)):
                self._lost_at = None
            elif self._lost_at is None:
                self._lost_at = now
        return self._lost_at is not None and now - self._lost_at >= self.gone_after_s


#: The most a driver keeps for shutting down after it stops for its own termination notice.
DRIVER_SHUTDOWN_MARGIN_S = 10.0


def driver_stop_time() -> float | None:
    """When a driver process that got a termination notice (SIGTERM, with
    :func:`install_sigterm_handler`: its pod deleted, evicted or drained) stops its run,
    as UNIX seconds: the notice's deadline less a margin for shutting down before the
    kubelet's SIGKILL (a third of the grace period, at most
    :data:`DRIVER_SHUTDOWN_MARGIN_S`). None without a notice."""
    noticed, deadline_ms = local_notice()
    if not noticed:
        return None
    grace = grace_period_s()
    deadline = deadline_ms / 1000 if deadline_ms is not None else time.time() + grace
    return deadline - min(DRIVER_SHUTDOWN_MARGIN_S, grace / 3)


def node_id() -> str:
    """The Ray node id of this process when it runs in Ray, else the host name."""
    try:
        import ray

        if ray.is_initialized():
            return str(ray.get_runtime_context().get_node_id())
    except Exception:  # noqa: BLE001 - fall back to the host name
        pass
    return socket.gethostname()


def merge(reports: dict[int, Any], drained: dict[str, int] | None = None) -> PreemptionInfo | None:
    """One answer from every rank's ``(node_id, noticed, deadline_ms)`` and the drained
    Ray nodes (``node_id -> deadline_ms``, 0 = no deadline)."""
    node_ranks: dict[str, list[int]] = {}
    for rank, (node, _, _) in sorted(reports.items()):
        node_ranks.setdefault(node, []).append(rank)
    preempted: dict[str, int | None] = {}
    for node, noticed, deadline in reports.values():
        if noticed:
            preempted[node] = _earliest(preempted.get(node), deadline)
    for node, deadline in (drained or {}).items():
        if node in node_ranks:
            preempted[node] = _earliest(preempted.get(node), deadline or None)
    if not preempted:
        return None
    deadlines = [d for d in preempted.values() if d is not None]
    return PreemptionInfo(
        min(deadlines) if deadlines else None, {n: node_ranks[n] for n in sorted(preempted)}
    )


def combine(a: PreemptionInfo | None, b: PreemptionInfo | None) -> PreemptionInfo | None:
    """Two notices as one: every preempted node with its ranks, the earliest deadline (Ray
    Train's ``merge_preemption_info``)."""
    if a is None or b is None:
        return a or b
    nodes = {
        n: sorted(set(a.preempted_node_to_ranks.get(n, [])) | set(r))
        for n, r in b.preempted_node_to_ranks.items()
    }
    merged = {**a.preempted_node_to_ranks, **nodes}
    return PreemptionInfo(_earliest(a.deadline_ms, b.deadline_ms), dict(sorted(merged.items())))


def _earliest(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)
