"""The kopf operator: every trigger runs the same level-based reconcile.

Triggers: a TrainJob's watch events when it is new to this process (created, or listed at
start-up) or its spec changed (:meth:`Operator.event_trigger`), a periodic timer per TrainJob
(deadlines, TTL, validation pool idling, the driver's status updates), and changes of pods the
operator manages (so pod phases are seen at once; a pod's creation is not one), from a plain
pod watch (:mod:`trainjob_operator.pod_watch`), not kopf's: kopf's per-event machinery ran for
every pod the operator created, only for the event to be ignored. Only kopf's
low-level event handlers are used for TrainJobs: its change
handlers would add a finalizer and a diff-base annotation to every TrainJob (two PATCHes,
and the create handler ran only once the first had echoed back), which nothing here needs:
owner references delete the children.

The timers are one :class:`TimerSchedule` for all TrainJobs (a heap of due times on kopf's
event loop, fed by the TrainJob watch), not a ``kopf.timer`` per TrainJob: kopf keeps an
asyncio task, its loggers and a live copy of the body for every timer, which was most of the
operator's memory per TrainJob.

Cost control, so that hundreds of TrainJobs stay cheap: a trigger that finds
a reconcile of the same TrainJob already waiting to start is dropped (the
waiting one reads the state after it); and a timer tick reconciles only when
the TrainJob changed since a reconcile last left it (its fingerprint, see
:mod:`trainjob_operator.reconcile.fingerprint`: the driver's validation demand,
annotations; not the operator's own writes nor kopf's, nor the driver's progress and
checkpoints, which no plan reads), when the last plan asked to be
called back by now (a deadline, the TTL, a pool scale-down, a pod being
replaced), or at least every ``resync_seconds`` as a safety net.

What the process keeps about a TrainJob between triggers (a reconcile waiting, the watch body
it may plan from, the timer's due time and fingerprint, the generation its last reconcile
read, the phase of its last plan) is one :class:`JobState` per TrainJob, dropped when it holds
nothing.

Metrics: reconciles, skipped triggers, errors, durations, and ``trainjob_jobs{phase}``: the
TrainJobs by the phase of their last plan, one series per :class:`~trainjob_operator.api.Phase`.

Run with ``trainjob operator`` (or :func:`run_operator` in-process, as the tests do).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import concurrent.futures
import contextlib
import copy
import datetime as dt
import heapq
import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
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
from trainjob_operator.memory_trim import QuietTrimmer
from trainjob_operator.pod_watch import pod_watches
from trainjob_operator.reconcile.apply import Renderer, reconcile_trainjob
from trainjob_operator.reconcile.fingerprint import trainjob_fingerprint
from trainjob_operator.render import render_options_from_env, renderer_for

logger = logging.getLogger("trainjob_operator")

MANAGED = {MANAGED_BY_LABEL: "trainjob-operator"}

#: kopf's per-object logger (handler outcomes, with the object's name and namespace).
KOPF_OBJECT_LOGGER = "kopf.objects"
#: Longest a TrainJob goes without a reconcile when nothing happens to it. A safety net only:
#: changes reach the operator through the TrainJob and pod watches (a relist after a watch gap
#: reconciles every TrainJob), and a plan that waits for a time (a deadline, the TTL, a pool
#: scale-down) asks to be called back then. Every TrainJob's resync is a reconcile with its
#: reads of the API server, so the period sets the steady load: at 60 s, 10,000 TrainJobs
#: were 167 reconciles/s, more than a 2-core API server serves (issue 40); at 10 minutes, 17.
#: What it still catches alone is a child other than a pod deleted by hand (recreated within
#: this period). controller-runtime's default is 10 hours.
DEFAULT_RESYNC_SECONDS = 600.0
#: Reconciles that run at once (kopf's synchronous handlers and the timer ticks). Each mostly
#: waits for the API server, so kopf's default pool, min(32, cores + 4), only 6 threads on 2
#: cores, bounded a burst of new TrainJobs by the thread count rather than by the CPU.
HANDLER_THREADS = 16

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
JOB_RESTARTS = Gauge(
    "trainjob_job_restarts",
    "Whole-cluster restarts of each TrainJob (its status.restarts), while this operator "
    "reconciles it",
    ["namespace", "trainjob"],
)
#: What starts a reconcile (the ``trigger`` label).
TRIGGERS = ("create", "resume", "update", "pod", "timer")
# Every trigger's series exist from the start (0), so rates and alerts see them before the
# first reconcile or error.
for _trigger in TRIGGERS:
    RECONCILES.labels(_trigger)
    ERRORS.labels(_trigger)
    SKIPPED.labels(_trigger, "coalesced")
SKIPPED.labels("timer", "busy")
SKIPPED.labels("timer", "unchanged")


def default_renderer() -> Renderer:
    """The manifest renderer (``trainjob_operator.render``) with the operator-wide pod
    defaults from the environment (``TRAINJOB_DEFAULT_*``, the Helm chart's ``defaults``).

    Raises:
        ValueError: naming the variable, when one of them is not valid (read at startup).
    """
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

    def busy(self, key: Any) -> bool:
        """Whether someone holds or waits for ``key``'s lock."""
        with self._mutex:
            return key in self._locks

    def __len__(self) -> int:
        with self._mutex:
            return len(self._locks)


JobKey = tuple[str, str]


@dataclass(slots=True)
class JobState:
    """What this process keeps about one TrainJob between triggers (one object per TrainJob,
    guarded by :attr:`Operator._lock`); dropped when it holds nothing (:attr:`empty`)."""

    #: a reconcile of it waits to start (for a thread of the pool or for the TrainJob's lock):
    #: another trigger meanwhile is coalesced into it
    waiting: bool = False
    #: the newest watch body the waiting reconcile may plan from (see
    #: :meth:`Operator.reconcile`'s ``body``)
    body: dict[str, Any] | None = None
    #: monotonic time its next timer reconcile is due (0: at once)
    timer_due: float = 0.0
    #: fingerprint of the TrainJob as the last reconcile left it (None: not known)
    timer_seen: str | None = None
    #: whether a reconcile of this process succeeded since the last failure (see
    #: :meth:`Operator.event_trigger`), and the ``metadata.generation`` it read
    reconciled: bool = False
    generation: Any = None
    #: the phase of its last plan (for ``trainjob_jobs{phase}``)
    phase: Phase | None = None

    def forget_timer(self) -> None:
        """The next timer tick reconciles (nothing known about the TrainJob's last state)."""
        self.timer_due, self.timer_seen = 0.0, None

    def forget_reconciled(self) -> None:
        """The next watch event reconciles, as for a TrainJob new to this process."""
        self.reconciled, self.generation = False, None

    @property
    def empty(self) -> bool:
        """Whether it holds nothing (the same as no entry at all)."""
        return self == JobState()


class TimerSchedule:
    """When each TrainJob's next timer tick is due: one heap for every TrainJob.

    Used on kopf's event loop only (the TrainJob watch's handler and :func:`run_timers`), so it
    needs no lock. A TrainJob's first tick is ``interval`` after it was first seen (its create
    or resume handler reconciles it at once); the next is ``interval`` after the previous tick
    finished, so ticks of one TrainJob never overlap (as with ``kopf.timer``).
    """

    def __init__(self, interval: float) -> None:
        self.interval = interval
        #: the TrainJobs known from the watch, with their latest fingerprint
        #: (:func:`~trainjob_operator.reconcile.fingerprint.trainjob_fingerprint`)
        self._fingerprints: dict[JobKey, str | None] = {}
        #: key -> when its next tick is due; absent while its tick runs
        self._due: dict[JobKey, float] = {}
        self._heap: list[tuple[float, JobKey]] = []

    def __len__(self) -> int:
        return len(self._fingerprints)

    def _schedule(self, key: JobKey, at: float) -> None:
        self._due[key] = at
        heapq.heappush(self._heap, (at, key))

    def observe(self, key: JobKey, fingerprint: str | None, now: float) -> None:
        """A watch event of the TrainJob: remember its fingerprint; schedule it when new."""
        if key not in self._fingerprints:
            self._schedule(key, now + self.interval)
        self._fingerprints[key] = fingerprint

    def forget(self, key: JobKey) -> None:
        """The TrainJob is gone or being deleted: no more ticks."""
        self._fingerprints.pop(key, None)
        self._due.pop(key, None)  # its heap entry is dropped when it comes up

    def pop_due(self, now: float) -> list[tuple[JobKey, str | None]]:
        """The TrainJobs whose tick is due, with their latest fingerprint; each is running until
        :meth:`done`."""
        due: list[tuple[JobKey, str | None]] = []
        while self._heap and self._heap[0][0] <= now:
            at, key = heapq.heappop(self._heap)
            if self._due.get(key) != at:
                continue  # forgotten, or rescheduled since
            del self._due[key]
            due.append((key, self._fingerprints.get(key)))
        return due

    def done(self, key: JobKey, now: float) -> None:
        """The tick of ``key`` finished: the next one is due ``interval`` from now."""
        if key in self._fingerprints and key not in self._due:
            self._schedule(key, now + self.interval)

    def sleep_time(self, now: float) -> float:
        """How long until the next tick may be due (at most ``interval``, at most 1 s)."""
        cap = min(self.interval, 1.0)
        while self._heap and self._due.get(self._heap[0][1]) != self._heap[0][0]:
            heapq.heappop(self._heap)  # a stale entry
        if not self._heap:
            return cap
        return max(0.0, min(self._heap[0][0] - now, cap))


async def run_timers(
    operator: Operator, schedule: TimerSchedule, executor: concurrent.futures.Executor
) -> None:
    """Run the due timer ticks (:meth:`Operator.on_timer`) on ``executor`` until cancelled.

    A tick that raises is logged; the TrainJob's next tick is an interval later (its
    ``on_timer`` reconciles again then: a failed reconcile forgets what it had seen).
    """
    loop = asyncio.get_running_loop()

    def finished(key: JobKey) -> Callable[[asyncio.Future[None]], None]:
        def callback(future: asyncio.Future[None]) -> None:
            error = None if future.cancelled() else future.exception()
            if error is not None:
                logger.warning(
                    "timer reconcile failed: %s",
                    error,
                    exc_info=error,
                    extra={"k8s_ref": {"namespace": key[0], "name": key[1]}},
                )
            schedule.done(key, loop.time())

        return callback

    while True:
        for key, fingerprint in schedule.pop_due(loop.time()):
            future = loop.run_in_executor(executor, operator.on_timer, key[0], key[1], fingerprint)
            future.add_done_callback(finished(key))
        await asyncio.sleep(schedule.sleep_time(loop.time()))


async def run_memory_trims(operator: Operator, every_s: float = 10.0) -> None:
    """Give a burst's freed memory back once no reconcile ran for
    :data:`~trainjob_operator.memory_trim.QUIET_SECONDS` (checked every ``every_s``), until
    cancelled."""
    trimmer = QuietTrimmer(lambda: operator.reconciles_run)
    while True:
        await asyncio.sleep(every_s)
        trimmer.check()


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
        self._lock = threading.Lock()
        self._job_locks = KeyedLocks()
        #: per TrainJob: what this process keeps about it (:class:`JobState`; guarded by
        #: ``_lock``; no entry: nothing kept)
        self._jobs: dict[JobKey, JobState] = {}
        #: the pool the handlers run reconciles on (kopf's, set by :func:`run_operator`; None:
        #: the event loop's default)
        self.executor: concurrent.futures.Executor | None = None
        #: reconciles run so far (what :class:`~trainjob_operator.memory_trim.QuietTrimmer`
        #: watches to give a burst's memory back once quiet)
        self.reconciles_run = 0

    def _state(self, key: JobKey) -> JobState:
        """``key``'s state, created when absent (call with ``_lock`` held, then :meth:`_tidy`)."""
        state = self._jobs.get(key)
        if state is None:
            state = self._jobs[key] = JobState()
        return state

    def _peek(self, key: JobKey) -> JobState:
        """``key``'s state, or an empty one when none is kept (not stored; ``_lock`` held)."""
        return self._jobs.get(key) or JobState()

    def _tidy(self, key: JobKey) -> None:
        """Drop ``key``'s state when it holds nothing (``_lock`` held)."""
        state = self._jobs.get(key)
        if state is not None and state.empty:
            del self._jobs[key]

    @property
    def _waiting(self) -> set[JobKey]:
        """The TrainJobs with a reconcile waiting to start (a snapshot)."""
        with self._lock:
            return {key for key, state in self._jobs.items() if state.waiting}

    @property
    def _bodies(self) -> dict[JobKey, dict[str, Any]]:
        """The watch bodies waiting reconciles may plan from (a snapshot)."""
        with self._lock:
            return {k: s.body for k, s in self._jobs.items() if s.body is not None}

    def on_timer(self, namespace: str, name: str, fingerprint: str | None) -> None:
        """A timer tick: reconcile only if the TrainJob changed, a callback is due, or the
        resync period passed (see the module docstring); never while a reconcile of it runs or
        waits (that one reads the TrainJob after whatever this tick is about, and its
        outcome decides the next tick: during a burst a new TrainJob's first tick often came
        while its first reconcile ran, and reconciled it a second time)."""
        key = (namespace, name)
        with self._lock:
            state = self._peek(key)
            due, seen, busy = state.timer_due, state.timer_seen, state.waiting
        if busy or self._job_locks.busy(key):
            SKIPPED.labels("timer", "busy").inc()
            return
        unchanged = fingerprint is not None and fingerprint == seen
        if unchanged and time.monotonic() < due:
            SKIPPED.labels("timer", "unchanged").inc()
            return
        self.reconcile(namespace, name, "timer", fingerprint=fingerprint)

    def event_trigger(
        self, key: tuple[str, str], generation: Any, event_type: Any, has_status: bool = True
    ) -> str | None:
        """Which reconcile a watch event of TrainJob ``key`` asks for, when this process has
        not reconciled it yet (or its last reconcile failed): ``create`` for a new TrainJob
        (``ADDED``, or one without a status, which no reconcile has touched, seen in the
        listing at start-up), ``resume`` for any other; once reconciled, ``update`` when its
        ``metadata.generation`` (its spec) changed since the last reconcile read it, None
        otherwise (the operator's own writes, the driver's status updates: the timer's
        business)."""
        with self._lock:
            state = self._peek(key)
            if not state.reconciled:
                return "create" if event_type == "ADDED" or not has_status else "resume"
            return "update" if state.generation != generation else None

    def on_pod_change(self, namespace: str, name: str) -> None:
        """A managed pod of TrainJob ``namespace/name`` changed or went away
        (:mod:`trainjob_operator.pod_watch`): reconcile it on the pool, unless a reconcile of
        it already waits (that one reads the pod as it is now)."""
        if self.enqueue((namespace, name), "pod"):
            assert self.executor is not None, "run_operator sets the executor"
            self.executor.submit(self.on_event, namespace, name, "pod", None, True)

    def expire_timers(self) -> None:
        """Forget what every TrainJob looked like after its last reconcile, so that its next
        timer tick reconciles it: the pod watch may have missed changes (it listed again after
        its version expired), and each tick reads the TrainJob's pods anew."""
        with self._lock:
            for key, state in list(self._jobs.items()):
                state.forget_timer()
                self._tidy(key)

    def forget(self, key: tuple[str, str]) -> None:
        """TrainJob ``key`` was deleted: drop what is kept about it."""
        with self._lock:
            state = self._jobs.get(key)
            with contextlib.suppress(KeyError):  # never reconciled here
                JOB_RESTARTS.remove(*key)
            if state is not None:  # a waiting reconcile still runs (and finds it gone)
                waiting = state.waiting
                self._jobs[key] = JobState(waiting=waiting)
                self._tidy(key)

    def enqueue(
        self, key: tuple[str, str], trigger: str, body: dict[str, Any] | None = None
    ) -> bool:
        """Note that a reconcile of TrainJob ``key`` is about to wait for a thread; False
        (the trigger is dropped, counted as coalesced) when one already waits, to start or for
        the TrainJob's lock: it has read nothing yet, so it sees whatever this trigger was
        about. A ``body`` (a newer watch event's) replaces the waiting reconcile's.

        Checked on the event loop before a reconcile is handed to the pool, so that during a
        burst a TrainJob whose first reconcile still waits for a thread gets no second one
        from its timer tick or its pods' events (each would read it and its children again,
        and the queue would grow with the load)."""
        with self._lock:
            state = self._state(key)
            if body is not None:
                state.body = body
            if state.waiting:
                SKIPPED.labels(trigger, "coalesced").inc()
                return False
            state.waiting = True
            return True

    def on_event(
        self,
        namespace: str,
        name: str,
        trigger: str,
        body: dict[str, Any] | None = None,
        enqueued: bool = False,
    ) -> None:
        """A watch event's reconcile. kopf does not retry what its event handlers raise, so a
        failure is logged here and retried by the TrainJob's next timer tick (a failed
        reconcile forgets the TrainJob's timer state, see :meth:`_reconcile_locked`)."""
        try:
            self.reconcile(namespace, name, trigger, body=body, enqueued=enqueued)
        except Exception as exc:  # logged; the next tick retries
            logger.error(
                "Reconcile of TrainJob %s/%s (%s) failed, retried at its next timer tick: %s",
                namespace,
                name,
                trigger,
                exc,
                exc_info=True,
            )

    def reconcile(
        self,
        namespace: str,
        name: str,
        trigger: str,
        fingerprint: str | None = None,
        body: dict[str, Any] | None = None,
        enqueued: bool = False,
    ) -> None:
        """Run one reconcile (what it raises, the caller logs; the next trigger retries).

        kopf runs the handlers of different objects concurrently (the TrainJob's timer, its
        pods' events), so reconciles of one TrainJob are serialized here: each one reads the
        status and children the previous one wrote. Two at once would both act on the same
        stale status (duplicate events, one's status patch undoing the other's). A trigger
        arriving while another reconcile of the job waits is dropped (:meth:`enqueue`).

        ``body``: the TrainJob as the triggering watch event showed it, used instead of a GET
        (only for a TrainJob's first reconcile, when no write of this process can be newer).
        ``enqueued``: :meth:`enqueue` was called for this reconcile already (with its body).
        """
        key = (namespace, name)
        if not enqueued and not self.enqueue(key, trigger, body):
            return
        try:
            with self._job_locks.hold(key):
                with self._lock:
                    state = self._state(key)
                    state.waiting = False
                    body, state.body = state.body, None
                    self._tidy(key)
                self._reconcile_locked(namespace, name, trigger, fingerprint, body)
        finally:
            with self._lock:
                if key in self._jobs:
                    self._jobs[key].waiting = False
                    self._tidy(key)

    def _reconcile_locked(
        self,
        namespace: str,
        name: str,
        trigger: str,
        fingerprint: str | None,
        body: dict[str, Any] | None,
    ) -> None:
        RECONCILES.labels(trigger).inc()
        self.reconciles_run += 1  # threads may lose an increment: only a change is read
        key = (namespace, name)
        start = time.perf_counter()
        started = time.monotonic()
        with self._lock:
            if self._peek(key).reconciled:
                body = None  # reconciled before: read what the last one wrote
        try:
            outcome = reconcile_trainjob(self.client, namespace, name, self.render, obj=body)
        except Exception:
            ERRORS.labels(trigger).inc()
            with self._lock:
                if key in self._jobs:
                    self._jobs[key].forget_timer()  # the next tick reconciles again
                    self._jobs[key].forget_reconciled()  # and so does the next watch event
                    self._tidy(key)
            raise
        finally:
            DURATION.observe(time.perf_counter() - start)
        with self._lock:
            state = self._state(key)
            if outcome is None:
                state.phase = None
                state.forget_timer()
                state.forget_reconciled()
            else:
                state.phase = outcome.new_status.phase
                JOB_RESTARTS.labels(*key).set(outcome.new_status.restarts)
                state.reconciled, state.generation = True, outcome.generation_read
                wait = self.resync_seconds
                if outcome.requeue_after is not None:
                    wait = min(wait, outcome.requeue_after)
                # what the next tick compares with: the TrainJob as this reconcile left it
                # (its own writes and kopf's bookkeeping are no change)
                seen = state.timer_seen
                if trigger == "timer":
                    seen = fingerprint
                if outcome.fingerprint_after is not None:
                    seen = outcome.fingerprint_after
                state.timer_due, state.timer_seen = started + wait, seen
            self._tidy(key)
            counts = collections.Counter(s.phase for s in self._jobs.values())
            for phase in Phase:
                PHASES.labels(phase.value).set(counts[phase])


def register(
    registry: kopf.OperatorRegistry, operator: Operator, timer_interval: float = 5.0
) -> TimerSchedule:
    """Register the handlers on ``registry``; returns the timer schedule the TrainJob watch
    feeds (:func:`run_timers` runs it)."""
    schedule = TimerSchedule(timer_interval)

    async def on_trainjob_event(
        name: str,
        namespace: str | None,
        meta: Any,
        body: Any,
        event: Any,
        type: Any = None,
        **_: Any,
    ) -> None:
        # Every watch event of a TrainJob: its latest fingerprint for the timer's "changed"
        # check (no API call, on the event loop), and a reconcile on the pool when it is new
        # to this process or its spec changed (Operator.event_trigger).
        key = (str(namespace or ""), str(name))
        if type == "DELETED" or meta.get("deletionTimestamp"):
            schedule.forget(key)
            operator.forget(key)
            return
        loop = asyncio.get_running_loop()
        schedule.observe(key, trainjob_fingerprint(body), loop.time())
        trigger = operator.event_trigger(
            key, meta.get("generation"), type, has_status=bool(body.get("status"))
        )
        if trigger is None:
            return
        first = trigger in ("create", "resume") and isinstance(event, dict)
        # (a copy: the reconcile runs on another thread while kopf keeps the event)
        raw = copy.deepcopy(event.get("object")) if first else None
        if operator.enqueue(key, trigger, raw):
            await loop.run_in_executor(
                operator.executor, operator.on_event, key[0], key[1], trigger, None, True
            )

    # Low-level event handlers only (no kopf.on.create/update/resume/delete): kopf's
    # change-handlers add a finalizer (a PATCH, and the create handler ran only on the event
    # that PATCH caused) and a diff-base annotation (another PATCH) to every TrainJob, two
    # writes and two watch events per TrainJob that nothing here needs. Children
    # are deleted by their owner references; a TrainJob of an earlier version still holding
    # kopf's finalizer gets it removed by kopf (no handler requires it any more).
    kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)(on_trainjob_event)
    return schedule


class NoDiffBase(kopf.DiffBaseStorage):
    """A diff-base storage that keeps nothing and copies nothing.

    kopf builds the "essence" of every object it watches on every watch event (a deep copy of
    the body, pods included) and diffs it with the stored one, for its change handlers
    (``kopf.on.create/update/...``). This operator has none (see :func:`register`), so that
    work was wasted, on the one event-loop thread every watch event goes through, and a
    visible share of the operator's CPU during a burst of new TrainJobs.
    """

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        """An empty essence: nothing is compared."""
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        """No stored essence."""
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        """Nothing is stored (no annotation is written)."""
        return None


def configure(settings: kopf.OperatorSettings) -> None:
    """Watch timeouts, posting and persistence suited to one operator replica."""
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 30
    settings.posting.level = logging.WARNING
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="trainjob.dev")
    settings.persistence.diffbase_storage = NoDiffBase()
    settings.queueing.error_delays = [1, 2, 5, 10, 30]
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
    schedule = register(registry, operator, timer_interval)
    # kopf's synchronous handlers and the timer ticks share one pool.
    executor = concurrent.futures.ThreadPoolExecutor(
        HANDLER_THREADS, thread_name_prefix="trainjob-handler"
    )
    operator.executor = executor

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
        settings.execution.executor = executor

    kopf.on.startup(registry=registry)(startup)

    async def main() -> None:
        timers = asyncio.create_task(run_timers(operator, schedule, executor))
        trims = asyncio.create_task(run_memory_trims(operator))
        selector = ",".join(f"{k}={v}" for k, v in MANAGED.items())
        try:
            async with pod_watches(
                config, namespaces, selector, operator.on_pod_change, operator.expire_timers
            ) as watches:
                # The pods are listed before kopf lists the TrainJobs: no change of a pod
                # falls between the two (kopf's ready flag then means both are watched).
                for watch in watches:
                    while not watch.listed.is_set():
                        if stop_flag is not None and stop_flag.is_set():
                            return
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(watch.listed.wait(), 0.5)
                await kopf.operator(
                    registry=registry,
                    standalone=True,
                    clusterwide=not namespaces,
                    namespaces=namespaces or [],
                    stop_flag=stop_flag,
                    ready_flag=ready_flag,
                    liveness_endpoint=liveness_endpoint,
                )
        finally:
            for task in (timers, trims):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            if stop_flag is not None:
                # kopf waits on a threading.Event in the loop's default executor; when kopf
                # stopped on its own (SIGTERM) nobody set it, and asyncio.run's shutdown then
                # waited for that thread forever: a leader-elected operator hung on SIGTERM
                # until the kubelet killed it, 30 s later, without releasing its Lease.
                stop_flag.set()

    try:
        asyncio.run(main())
    finally:
        executor.shutdown(wait=False, cancel_futures=True)


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
    # kopf logs "Handler ... succeeded." at INFO for every watch event it hands to a handler
    # (every pod and TrainJob event: thousands of lines during a burst, formatted on the event
    # loop); its warnings and errors, and everything with --verbose, still show.
    logging.getLogger(KOPF_OBJECT_LOGGER).setLevel(logging.DEBUG if verbose else logging.WARNING)


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
    "JobState",
    "JsonFormatter",
    "KeyedLocks",
    "NoDiffBase",
    "Operator",
    "TimerSchedule",
    "TrainJob",
    "configure",
    "configure_logging",
    "operator_command",
    "register",
    "run_memory_trims",
    "run_operator",
    "run_timers",
    "start_metrics_server",
]
