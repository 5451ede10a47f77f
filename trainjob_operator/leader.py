"""Leader election on a ``coordination.k8s.io/v1`` Lease, so that two or more operator
replicas can run with one reconciling and the others on standby.

The algorithm is client-go's ``leaderelection`` package:

- A replica holds the lease while ``spec.holderIdentity`` is its identity and it renews
  ``spec.renewTime`` every ``retry_period``. Writes are optimistic (the Lease's
  ``resourceVersion``): of two replicas writing at once one gets 409 Conflict and loses.
- A standby takes over only after it has seen the lease record unchanged for
  ``lease_duration`` seconds *by its own clock* (it never compares its clock with the
  leader's ``renewTime``, so clock skew between nodes does not matter).
- A leader that has not renewed for ``renew_deadline`` (< ``lease_duration``) seconds, or sees
  another holder, stops leading at once: it stops reconciling before a standby can acquire
  the lease. That is the fencing kopf's peering lacks (kopf's peers pause on seeing a
  higher-priority peer, but nothing stops a partitioned replica that does not see it).
- On a clean stop the leader releases the lease (empty holder), so a standby takes over at
  its next retry instead of after ``lease_duration``.

:func:`run_with_leader_election` wraps the operator: it contends, runs the operator while
leading, and returns when leadership is lost (the process then exits and is restarted as a
standby). :class:`HealthServer` serves ``/healthz`` (the elector runs), ``/readyz`` (this
replica leads, or follows a live lease as a standby ready to take over) and ``/leader``
(this replica leads).
"""

from __future__ import annotations

import argparse
import datetime as dt
import http.server
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trainjob_operator.kube import ApiError, KubeClient, resource_path

logger = logging.getLogger("trainjob_operator.leader")

#: The Lease's name when none is given (one per operator installation and namespace).
DEFAULT_LEASE_NAME = "trainjob-operator"
#: Kubernetes MicroTime, as client-go writes ``acquireTime`` and ``renewTime``.
MICRO_TIME_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"


def default_identity() -> str:
    """A unique identity for this replica: the pod name (host name) plus a random suffix, so
    a restarted container never mistakes its predecessor's lease for its own."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class LeaderElectionConfig:
    """Where the Lease lives and its timing (client-go's defaults: 15 s, 10 s, 2 s)."""

    namespace: str
    lease_name: str = DEFAULT_LEASE_NAME
    identity: str = field(default_factory=default_identity)
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if not self.namespace:
            raise ValueError(
                "leader election: the Lease's namespace is empty; pass --lease-namespace or set "
                "POD_NAMESPACE"
            )
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError(
                "leader election: need 0 < retry_period < renew_deadline < lease_duration, got "
                f"{self.retry_period}, {self.renew_deadline}, {self.lease_duration}"
            )


def _micro_time(when: dt.datetime) -> str:
    return when.astimezone(dt.UTC).strftime(MICRO_TIME_FORMAT)


class LeaderElector:
    """Acquires and renews the Lease; :meth:`run` loops until stopped.

    ``clock`` is monotonic seconds (the observation times are local, never the leader's).
    """

    def __init__(
        self,
        client: KubeClient,
        config: LeaderElectionConfig,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.config = config
        self.clock = clock
        self._leading = threading.Event()
        self._observed: tuple[Any, Any] | None = None  # (holderIdentity, renewTime)
        self._observed_at = 0.0
        self._observed_duration = config.lease_duration
        self._last_renew: float | None = None
        #: whether the elector is in its loop (``/healthz``).
        self.alive = False
        #: give the lease up when stopped cleanly (False: a standby waits for it to expire).
        self.release_on_stop = True

    @property
    def is_leader(self) -> bool:
        """Whether this replica holds the lease now."""
        return self._leading.is_set()

    def following(self) -> bool:
        """A standby that has seen a live lease (or an elector that leads): ready to take
        over when the leader's lease expires."""
        if self.is_leader:
            return True
        return self._observed is not None and self.alive

    def _path(self) -> str:
        return resource_path("Lease", self.config.namespace, self.config.lease_name)

    def _observe(self, lease: dict[str, Any]) -> None:
        spec = lease.get("spec") or {}
        record = (spec.get("holderIdentity"), spec.get("renewTime"))
        if record != self._observed:
            self._observed = record
            self._observed_at = self.clock()
        self._observed_duration = float(
            spec.get("leaseDurationSeconds") or self.config.lease_duration
        )

    def holder(self) -> str | None:
        """The holder last seen on the Lease (None when free or not read yet)."""
        return str(self._observed[0]) if self._observed and self._observed[0] else None

    def try_acquire_or_renew(self) -> bool:
        """One attempt: True when this replica holds the lease afterwards.

        Raises:
            ApiError: the API server refused for another reason than a conflict.
        """
        me = self.config.identity
        now = dt.datetime.now(dt.UTC)
        spec: dict[str, Any] = {
            "holderIdentity": me,
            "leaseDurationSeconds": int(self.config.lease_duration),
            "acquireTime": _micro_time(now),
            "renewTime": _micro_time(now),
            "leaseTransitions": 0,
        }
        lease = self.client.get("Lease", self.config.namespace, self.config.lease_name)
        if lease is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.config.lease_name, "namespace": self.config.namespace},
                "spec": spec,
            }
            created = self.client.create(body, self.config.namespace)
            if created is None:  # another replica created it first
                return False
            self._observe(created)
            return True
        self._observe(lease)
        current = lease.get("spec") or {}
        holder = current.get("holderIdentity")
        expired = self.clock() >= self._observed_at + self._observed_duration
        if holder and holder != me and not expired:
            return False
        transitions = int(current.get("leaseTransitions") or 0)
        if holder == me:
            spec["acquireTime"] = current.get("acquireTime") or spec["acquireTime"]
            spec["leaseTransitions"] = transitions
        else:
            spec["leaseTransitions"] = transitions + 1
        body = {**lease, "spec": spec}
        try:
            updated: dict[str, Any] = self.client.request("PUT", self._path(), body)
        except ApiError as exc:
            if exc.status == 409:  # someone else wrote it since we read it
                return False
            raise
        self._observe(updated)
        return True

    def release(self) -> None:
        """Give the lease up (empty holder) so that a standby takes over at once."""
        lease = self.client.get("Lease", self.config.namespace, self.config.lease_name)
        if lease is None or (lease.get("spec") or {}).get("holderIdentity") != (
            self.config.identity
        ):
            return
        spec = dict(lease.get("spec") or {})
        spec["holderIdentity"] = None
        spec["leaseDurationSeconds"] = 1
        spec["renewTime"] = _micro_time(dt.datetime.now(dt.UTC))
        try:
            self.client.request("PUT", self._path(), {**lease, "spec": spec})
        except ApiError as exc:
            logger.warning("could not release the lease: %s", exc)

    def run(
        self,
        stop: threading.Event,
        on_started_leading: Callable[[], None],
        on_stopped_leading: Callable[[], None],
        release_on_stop: bool = True,
    ) -> None:
        """Contend for and renew the lease every ``retry_period`` until ``stop`` is set.

        ``on_started_leading`` runs when the lease is acquired, ``on_stopped_leading`` when
        it is lost (not renewed within ``renew_deadline``, or another holder seen); after
        that this elector stops contending (the caller exits and restarts as a standby).
        """
        self.alive = True
        try:
            while not stop.is_set():
                try:
                    held = self.try_acquire_or_renew()
                except (ApiError, OSError) as exc:
                    logger.warning("lease %s: %s", self.config.lease_name, exc)
                    held = False
                now = self.clock()
                if held:
                    self._last_renew = now
                    if not self.is_leader:
                        logger.info("leading as %s", self.config.identity)
                        self._leading.set()
                        on_started_leading()
                elif self.is_leader:
                    other = self.holder() not in (None, self.config.identity)
                    late = self._last_renew is None or (
                        now - self._last_renew >= self.config.renew_deadline
                    )
                    if other or late:
                        logger.warning(
                            "lost the lease (%s)",
                            f"now held by {self.holder()}" if other else "renew deadline passed",
                        )
                        self._leading.clear()
                        on_stopped_leading()
                        return
                stop.wait(self.config.retry_period)
            if self.is_leader and release_on_stop:
                self._leading.clear()
                self.release()
        finally:
            self.alive = False


def run_with_leader_election(
    elector: LeaderElector,
    stop_flag: threading.Event | None,
    run: Callable[[threading.Event], None],
) -> None:
    """Wait until this replica leads, then ``run(flag)`` (the operator, blocking) until
    ``stop_flag`` is set or leadership is lost; ``flag`` is set in either case, and the
    operator is expected to return then. Returns after the operator did."""
    stop_flag = stop_flag or threading.Event()
    config = elector.config
    leading = threading.Event()
    lost = threading.Event()
    run_flag = threading.Event()
    elector_stop = threading.Event()

    def on_lost() -> None:
        lost.set()
        run_flag.set()

    thread = threading.Thread(
        target=elector.run,
        args=(elector_stop, leading.set, on_lost, elector.release_on_stop),
        name="leader-election",
        daemon=True,
    )
    thread.start()
    try:
        while not (leading.is_set() or stop_flag.is_set() or lost.is_set()):
            stop_flag.wait(0.1)
        if not leading.is_set() or stop_flag.is_set():
            return

        def forward_stop() -> None:
            while not (stop_flag.is_set() or run_flag.is_set()):
                stop_flag.wait(0.1)
            run_flag.set()

        threading.Thread(target=forward_stop, name="leader-stop", daemon=True).start()
        run(run_flag)
    finally:
        run_flag.set()
        elector_stop.set()
        thread.join(config.retry_period + elector.client.timeout + 1.0)


class HealthServer:
    """``/healthz`` (200 while the elector runs), ``/readyz`` (200 when leading or following a
    live lease: able to take over), ``/leader`` (200 only on the leader), on ``port``."""

    def __init__(self, elector: LeaderElector, port: int, addr: str = "0.0.0.0") -> None:
        self.elector = elector
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                checks = {
                    "/healthz": lambda: outer.elector.alive,
                    "/readyz": outer.elector.following,
                    "/leader": lambda: outer.elector.is_leader,
                }
                check = checks.get(self.path.split("?", 1)[0])
                if check is None:
                    self.send_response(404)
                    self.end_headers()
                    return
                ok = bool(check())
                body = (b"ok" if ok else b"not " + self.path.strip("/").encode()) + b"\n"
                self.send_response(200 if ok else 503)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = http.server.ThreadingHTTPServer((addr, port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        """The bound port (useful with port 0)."""
        return int(self.server.server_address[1])

    def start(self) -> HealthServer:
        """Serve from a daemon thread."""
        self.thread.start()
        return self

    def stop(self) -> None:
        """Stop serving."""
        self.server.shutdown()
        self.server.server_close()


def lease_namespace(explicit: str | None) -> str:
    """The Lease's namespace: ``explicit``, else ``POD_NAMESPACE`` (set by the chart)."""
    return explicit or os.environ.get("POD_NAMESPACE", "")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``trainjob operator`` options of leader election."""
    parser.add_argument(
        "--leader-elect",
        action="store_true",
        help="run as one of several replicas: reconcile only while holding the Lease; serve "
        "/healthz, /readyz and /leader on --health-port instead of kopf's liveness endpoint",
    )
    parser.add_argument(
        "--lease-name", default=DEFAULT_LEASE_NAME, help="the Lease (default: %(default)s)"
    )
    parser.add_argument(
        "--lease-namespace",
        default=None,
        metavar="NS",
        help="the Lease's namespace (default: $POD_NAMESPACE)",
    )
    parser.add_argument(
        "--health-port",
        type=int,
        default=8080,
        metavar="PORT",
        help="port of /healthz, /readyz and /leader with --leader-elect (default: %(default)s)",
    )


def elector_from_args(args: argparse.Namespace, client: KubeClient) -> LeaderElector | None:
    """The elector ``trainjob operator --leader-elect`` asks for (None without the flag)."""
    if not getattr(args, "leader_elect", False):
        return None
    config = LeaderElectionConfig(
        namespace=lease_namespace(getattr(args, "lease_namespace", None)),
        lease_name=getattr(args, "lease_name", DEFAULT_LEASE_NAME),
    )
    return LeaderElector(client, config)
