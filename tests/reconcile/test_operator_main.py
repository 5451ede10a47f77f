"""The operator's own plumbing without an API server: JSON logs, per-TrainJob serialization of
reconciles, the message of a child the API server rejects."""

from __future__ import annotations

import copy
import json
import logging
import sys
import threading
import time
from typing import Any

import pytest

from trainjob_operator import operator_main
from trainjob_operator.api import Phase, TrainJobStatus
from trainjob_operator.constants import LAST_DEMAND_ANNOTATION
from trainjob_operator.operator_main import JsonFormatter, KeyedLocks, Operator
from trainjob_operator.reconcile.apply import ReconcileOutcome, invalid_child_message
from trainjob_operator.reconcile.fingerprint import trainjob_fingerprint


def _record(message: str, *args: Any, **extra: Any) -> logging.LogRecord:
    record = logging.LogRecord("kopf.objects", logging.WARNING, __file__, 1, message, args, None)
    for key, value in extra.items():
        setattr(record, key, value)
    return record


def test_json_formatter_escapes_quotes_and_newlines() -> None:
    line = JsonFormatter().format(_record('bad "value"\nsecond line\t%s', "x\\y"))
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["message"] == 'bad "value"\nsecond line\tx\\y'
    assert entry["level"] == "WARNING" and entry["logger"] == "kopf.objects"
    assert entry["time"].endswith("+00:00")
    assert "object" not in entry and "namespace" not in entry


def test_json_formatter_adds_kopf_object_and_namespace_and_exception() -> None:
    ref = {
        "apiVersion": "trainjob.dev/v1alpha1",
        "kind": "TrainJob",
        "name": "tj",
        "namespace": "n",
    }
    entry = json.loads(JsonFormatter().format(_record("Handler succeeded.", k8s_ref=ref)))
    assert entry["object"] == "tj" and entry["namespace"] == "n"
    try:
        raise ValueError('boom "quoted"')
    except ValueError:
        record = _record("failed")
        record.exc_info = sys.exc_info()
    entry = json.loads(JsonFormatter().format(record))
    assert 'ValueError: boom "quoted"' in entry["exception"]


def test_configure_logging_installs_the_json_formatter(monkeypatch: pytest.MonkeyPatch) -> None:
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    kopf_objects = logging.getLogger(operator_main.KOPF_OBJECT_LOGGER)
    monkeypatch.setattr(kopf_objects, "level", kopf_objects.level)
    operator_main.configure_logging()
    assert isinstance(root.handlers[0].formatter, JsonFormatter)
    # kopf's per-event "Handler ... succeeded." lines are dropped, its warnings kept ...
    assert not kopf_objects.isEnabledFor(logging.INFO)
    assert kopf_objects.isEnabledFor(logging.WARNING)
    # ... and --verbose shows everything.
    operator_main.configure_logging(verbose=True)
    assert kopf_objects.isEnabledFor(logging.DEBUG)


def test_kopf_keeps_and_copies_no_diff_base_of_watched_objects() -> None:
    import kopf

    settings = kopf.OperatorSettings()
    operator_main.configure(settings)
    storage = settings.persistence.diffbase_storage
    pod = kopf.Body({"metadata": {"name": "p", "labels": {"a": "b"}}, "spec": {"x": [1, 2]}})
    assert storage.build(body=pod) == {}
    assert storage.fetch(body=pod) is None
    patch = kopf.Patch()
    storage.store(body=pod, patch=patch, essence=storage.build(body=pod))
    assert not patch  # no annotation written


def _overlap_counter(
    sleep: float,
) -> tuple[dict[tuple[str, str], int], Any]:
    """A fake reconcile that records the most concurrent runs per TrainJob."""
    lock = threading.Lock()
    active: dict[tuple[str, str], int] = {}
    peak: dict[tuple[str, str], int] = {}

    def fake(
        client: Any, namespace: str, name: str, render: Any, obj: Any = None
    ) -> ReconcileOutcome:
        key = (namespace, name)
        with lock:
            active[key] = active.get(key, 0) + 1
            peak[key] = max(peak.get(key, 0), active[key])
        time.sleep(sleep)
        with lock:
            active[key] -= 1
        return ReconcileOutcome(TrainJobStatus(phase=Phase.RUNNING))

    return peak, fake


def test_reconciles_of_one_trainjob_never_overlap(monkeypatch: pytest.MonkeyPatch) -> None:
    peak, fake = _overlap_counter(0.02)
    monkeypatch.setattr(operator_main, "reconcile_trainjob", fake)
    op = Operator(client=None, render=lambda *a: [])  # type: ignore[arg-type]
    threads = [
        threading.Thread(target=op.reconcile, args=("ns", f"job-{i % 2}", "timer"))
        for i in range(12)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert peak == {("ns", "job-0"): 1, ("ns", "job-1"): 1}
    assert len(op._job_locks) == 0  # entries go away with their last user


def test_reconciles_of_different_trainjobs_run_concurrently(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started = threading.Barrier(2, timeout=5)

    def fake(
        client: Any, namespace: str, name: str, render: Any, obj: Any = None
    ) -> ReconcileOutcome:
        started.wait()  # both must be inside at once, or this times out
        return ReconcileOutcome(TrainJobStatus(phase=Phase.RUNNING))

    monkeypatch.setattr(operator_main, "reconcile_trainjob", fake)
    op = Operator(client=None, render=lambda *a: [])  # type: ignore[arg-type]
    threads = [threading.Thread(target=op.reconcile, args=("ns", n, "pod")) for n in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not started.broken


def _operator_whose_first_reconcile_blocks(
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[Operator, threading.Event, threading.Event, list[str]]:
    """An Operator whose first reconcile sets ``inside`` and waits for ``release``; ``runs``
    lists the TrainJob names reconciled (each later reconcile returns at once)."""
    inside = threading.Event()
    release = threading.Event()
    runs: list[str] = []

    def fake(
        client: Any, namespace: str, name: str, render: Any, obj: Any = None
    ) -> ReconcileOutcome:
        runs.append(name)
        if len(runs) == 1:
            inside.set()
            release.wait(5)
        return ReconcileOutcome(TrainJobStatus(phase=Phase.RUNNING))

    monkeypatch.setattr(operator_main, "reconcile_trainjob", fake)
    op = Operator(client=None, render=lambda *a: [])  # type: ignore[arg-type]
    return op, inside, release, runs


def test_a_trigger_is_dropped_while_a_reconcile_of_the_same_job_waits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    op, inside, release, runs = _operator_whose_first_reconcile_blocks(monkeypatch)
    first = threading.Thread(target=op.reconcile, args=("ns", "a", "pod"))
    first.start()
    assert inside.wait(5)
    second = threading.Thread(target=op.reconcile, args=("ns", "a", "pod"))
    second.start()
    deadline = time.monotonic() + 5
    while ("ns", "a") not in op._waiting and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ("ns", "a") in op._waiting  # the second waits for the lock
    op.reconcile("ns", "a", "pod")  # a third: returns at once, the second covers it
    op.reconcile("ns", "b", "pod")  # another TrainJob is never coalesced with it
    release.set()
    first.join()
    second.join()
    assert runs == ["a", "b", "a"]
    assert op._waiting == set()


def test_timer_reconciles_only_on_change_when_due_or_at_resync(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runs: list[str] = []
    requeue: list[float | None] = [None]

    def fake(
        client: Any, namespace: str, name: str, render: Any, obj: Any = None
    ) -> ReconcileOutcome:
        runs.append(name)
        return ReconcileOutcome(TrainJobStatus(phase=Phase.RUNNING), requeue_after=requeue[0])

    monkeypatch.setattr(operator_main, "reconcile_trainjob", fake)
    op = Operator(client=None, render=lambda *a: [], resync_seconds=3600)  # type: ignore[arg-type]
    op.on_timer("ns", "a", "100")
    op.on_timer("ns", "a", "100")  # nothing changed, nothing due
    assert len(runs) == 1
    op.on_timer("ns", "a", "101")  # changed (e.g. the driver's status update)
    assert len(runs) == 2
    requeue[0] = 0.0  # the plan asks to be called back at once (a deadline passes)
    op.on_timer("ns", "a", "102")
    op.on_timer("ns", "a", "102")
    assert len(runs) == 4
    requeue[0] = None
    op.reconcile("ns", "a", "pod")  # another trigger: the timer still knows version 102
    op.on_timer("ns", "a", "102")
    assert len(runs) == 5
    op.on_timer("ns", "b", None)  # no version known: always reconcile
    op.on_timer("ns", "b", None)
    assert runs[-2:] == ["b", "b"]
    resync = Operator(client=None, render=lambda *a: [], resync_seconds=0)  # type: ignore[arg-type]
    resync.on_timer("ns", "a", "100")
    resync.on_timer("ns", "a", "100")  # the resync period (0 s) has passed
    assert runs[-2:] == ["a", "a"]


def test_the_timer_ignores_the_operators_own_writes_and_kopfs_bookkeeping(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A reconcile records the TrainJob as its writes left it; kopf's patch of its own
    annotations afterwards (a new resourceVersion) is no change for the timer, nor is the
    driver's progress, while its validation demand, a user's annotation or a spec change
    is."""
    left: dict[str, Any] = {
        "metadata": {"generation": 1, "resourceVersion": "7", "labels": {"team": "a"}},
        "status": {"phase": "Running", "progress": {"step": 1}},
    }
    runs: list[str] = []

    def fake(
        client: Any, namespace: str, name: str, render: Any, obj: Any = None
    ) -> ReconcileOutcome:
        runs.append(name)
        plan = ReconcileOutcome(TrainJobStatus(phase=Phase.RUNNING))
        plan.trainjob_after = copy.deepcopy(left)
        plan.fingerprint_after = trainjob_fingerprint(left)
        return plan

    def variant(**changes: Any) -> str:
        body = copy.deepcopy(left)
        meta = body["metadata"]
        meta["resourceVersion"] = "8"
        for key, value in changes.items():
            if key == "status":
                body["status"].update(value)
            else:
                meta[key] = value
        return trainjob_fingerprint(body)

    monkeypatch.setattr(operator_main, "reconcile_trainjob", fake)
    op = Operator(client=None, render=lambda *a: [], resync_seconds=3600)  # type: ignore[arg-type]
    op.reconcile("ns", "a", "create")
    kopf = {"trainjob.dev/last-handled-configuration": "{}", "trainjob.dev/create": "{}"}
    op.on_timer("ns", "a", variant(annotations=kopf))
    op.on_timer("ns", "a", variant())
    assert runs == ["a"]
    # The driver's progress is no plan's business (UNPLANNED_STATUS_KEYS).
    op.on_timer("ns", "a", variant(status={"progress": {"step": 2}}))
    assert runs == ["a"]
    for change in (
        {"status": {"validations": {"pending": 1}}},  # the driver's validation demand
        {"annotations": {**kopf, "example.com/owner": "b"}},
        {"annotations": {LAST_DEMAND_ANNOTATION: "2026-12-04T00:00:00Z"}},  # planning reads it
        {"labels": {"team": "b"}},
        {"generation": 2},
    ):
        before = len(runs)
        op.on_timer("ns", "a", variant(**change))
        assert len(runs) == before + 1, change


def test_keyed_locks_keep_a_waited_on_lock_after_its_holder_leaves() -> None:
    locks = KeyedLocks()
    inside = threading.Event()
    release = threading.Event()
    order: list[str] = []

    def first() -> None:
        with locks.hold("k"):
            inside.set()
            release.wait(5)
            order.append("first")

    def second() -> None:
        with locks.hold("k"):
            order.append("second")

    t1 = threading.Thread(target=first)
    t1.start()
    inside.wait(5)
    t2 = threading.Thread(target=second)
    t2.start()
    time.sleep(0.05)
    assert order == []  # second waits
    release.set()
    t1.join()
    t2.join()
    assert order == ["first", "second"]
    assert len(locks) == 0


def test_invalid_child_message_names_each_field() -> None:
    pod = {"kind": "Pod", "metadata": {"name": "tj-head"}}
    body = {
        "kind": "Status",
        "reason": "Invalid",
        "message": 'Pod "tj-head" is invalid: spec.tolerations[0].value: Invalid value: "b"',
        "details": {
            "causes": [
                {
                    "reason": "FieldValueInvalid",
                    "message": 'Invalid value: "b": value must be empty when `operator` is '
                    "'Exists'",
                    "field": "spec.tolerations[0].value",
                }
            ]
        },
    }
    message = invalid_child_message(pod, body)
    assert message.startswith("the API server rejected Pod tj-head: spec.tolerations[0].value:")
    assert "value must be empty" in message
    assert invalid_child_message(pod, {"message": "nope"}) == (
        "the API server rejected Pod tj-head: nope"
    )


def test_jobs_gauge_has_a_series_for_every_phase(monkeypatch: pytest.MonkeyPatch) -> None:
    from prometheus_client import REGISTRY

    def fake(
        client: Any, namespace: str, name: str, render: Any, obj: Any = None
    ) -> ReconcileOutcome:
        return ReconcileOutcome(TrainJobStatus(phase=Phase.SUSPENDED))

    monkeypatch.setattr(operator_main, "reconcile_trainjob", fake)
    op = Operator(client=None, render=lambda *a: [])  # type: ignore[arg-type]
    op.reconcile("ns", "a", "pod")
    op.reconcile("ns", "b", "pod")
    values = {p: REGISTRY.get_sample_value("trainjob_jobs", {"phase": p.value}) for p in Phase}
    assert values == {p: (2.0 if p == Phase.SUSPENDED else 0.0) for p in Phase}


def test_timer_schedule_ticks_each_trainjob_an_interval_after_it_was_seen_and_after_each_tick() -> (
    None
):
    schedule = operator_main.TimerSchedule(5.0)
    schedule.observe(("ns", "a"), "1", now=100.0)
    schedule.observe(("ns", "b"), "7", now=102.0)
    schedule.observe(("ns", "a"), "2", now=103.0)  # a newer version; not rescheduled
    assert len(schedule) == 2
    assert schedule.pop_due(104.9) == []  # the create handler reconciled it at once
    assert schedule.sleep_time(104.9) == pytest.approx(0.1)
    assert schedule.pop_due(105.0) == [(("ns", "a"), "2")]
    assert schedule.pop_due(200.0) == [(("ns", "b"), "7")]  # a's tick still runs: not again
    schedule.done(("ns", "a"), now=210.0)
    assert schedule.pop_due(214.9) == []
    assert schedule.pop_due(215.0) == [(("ns", "a"), "2")]
    schedule.done(("ns", "a"), now=215.0)
    schedule.forget(("ns", "a"))  # deleted: its pending tick is dropped
    schedule.done(("ns", "b"), now=216.0)
    schedule.forget(("ns", "b"))
    assert schedule.pop_due(1000.0) == [] and len(schedule) == 0
    assert schedule.sleep_time(1000.0) == 1.0  # nothing scheduled: look again in a second
    schedule.done(("ns", "b"), now=1000.0)  # a tick finishing after the deletion
    assert schedule.pop_due(2000.0) == []


def test_run_timers_calls_on_timer_with_the_latest_version_and_survives_errors() -> None:
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    calls: list[tuple[str, str, str | None]] = []

    class FakeOperator:
        def on_timer(self, namespace: str, name: str, version: str | None) -> None:
            calls.append((namespace, name, version))
            if name == "bad":
                raise RuntimeError("API server unreachable")

    async def scenario() -> None:
        schedule = operator_main.TimerSchedule(0.05)
        now = asyncio.get_running_loop().time()
        schedule.observe(("ns", "a"), "1", now)
        schedule.observe(("ns", "bad"), "9", now)
        with ThreadPoolExecutor(2) as pool:
            task = asyncio.create_task(
                operator_main.run_timers(FakeOperator(), schedule, pool)  # type: ignore[arg-type]
            )
            while calls.count(("ns", "a", "1")) < 2:
                await asyncio.sleep(0.01)
            schedule.observe(("ns", "a"), "2", asyncio.get_running_loop().time())
            while ("ns", "a", "2") not in calls or calls.count(("ns", "bad", "9")) < 3:
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_watch_events_reconcile_new_trainjobs_and_spec_changes_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """kopf's change handlers are gone (issue 20): a TrainJob's watch events ask for a
    reconcile when this process has not reconciled it yet (created, or listed at start-up,
    or its last reconcile failed) or its generation moved since the last reconcile read it;
    the operator's own writes and status updates are left to the timer."""
    generation = [1]
    fail = [False]
    bodies: list[Any] = []

    def fake(
        client: Any, namespace: str, name: str, render: Any, obj: Any = None
    ) -> ReconcileOutcome:
        bodies.append(obj)
        if fail[0]:
            raise RuntimeError("API server unavailable")
        plan = ReconcileOutcome(TrainJobStatus(phase=Phase.RUNNING))
        plan.generation_read = generation[0]
        return plan

    monkeypatch.setattr(operator_main, "reconcile_trainjob", fake)
    op = Operator(client=None, render=lambda *a: [])  # type: ignore[arg-type]
    key = ("ns", "a")
    assert op.event_trigger(key, 1, "ADDED") == "create"
    assert op.event_trigger(key, 1, None) == "resume"  # kopf's listing at start-up
    watched = {"metadata": {"name": "a", "generation": 1}}
    op.on_event("ns", "a", "create", body=watched)
    assert bodies == [watched]  # the first reconcile plans from the watch event (no GET)
    assert op.event_trigger(key, 1, "MODIFIED") is None  # e.g. its own status write
    assert op.event_trigger(key, 2, "MODIFIED") == "update"
    generation[0] = 2
    op.on_event("ns", "a", "update", body=watched)
    assert bodies[-1] is None  # reconciled before: it reads the TrainJob
    assert op.event_trigger(key, 2, "MODIFIED") is None

    fail[0] = True
    op.on_event("ns", "a", "update")  # logged, not raised (kopf would not retry it)
    assert op.event_trigger(key, 2, "MODIFIED") == "resume"  # the next event retries
    with pytest.raises(RuntimeError):  # and so does the next timer tick (run_timers logs it)
        op.on_timer("ns", "a", "fingerprint")
    assert len(bodies) == 4
    fail[0] = False
    op.forget(key)
    assert op.event_trigger(key, 1, "ADDED") == "create"  # deleted and created again


def test_triggers_while_a_reconcile_waits_for_a_thread_are_coalesced_into_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """During a burst a new TrainJob's first reconcile can wait for a thread of the pool
    longer than a timer interval: its tick and its pods' events must not queue reconciles of
    their own (each would read it and its children again; issue 20), and the waiting one plans
    from the newest watch body."""
    bodies: list[Any] = []

    def fake(
        client: Any, namespace: str, name: str, render: Any, obj: Any = None
    ) -> ReconcileOutcome:
        bodies.append(obj)
        return ReconcileOutcome(TrainJobStatus(phase=Phase.RUNNING))

    monkeypatch.setattr(operator_main, "reconcile_trainjob", fake)
    op = Operator(client=None, render=lambda *a: [])  # type: ignore[arg-type]
    key = ("ns", "a")
    created = {"metadata": {"name": "a", "generation": 1}}
    edited = {"metadata": {"name": "a", "generation": 2}}
    assert op.enqueue(key, "create", created)  # the watch handler, before the pool runs it
    op.on_timer("ns", "a", "fingerprint")  # its first tick comes while it still waits
    op.reconcile("ns", "a", "pod")  # and a pod event
    assert op.enqueue(key, "resume", edited) is False  # and an edit (a newer watch body)
    assert op.enqueue(("ns", "b"), "create", created)  # another TrainJob is not coalesced
    assert bodies == []
    op.on_event("ns", "a", "create", enqueued=True)  # the pool gets to it
    assert bodies == [edited]
    assert op._waiting == {("ns", "b")} and list(op._bodies) == [("ns", "b")]
    op.on_timer("ns", "a", "changed")  # nothing waits any more: ticks reconcile again
    assert bodies == [edited, None]


def test_a_timer_tick_while_a_reconcile_of_the_trainjob_runs_does_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    op, inside, release, runs = _operator_whose_first_reconcile_blocks(monkeypatch)
    first = threading.Thread(target=op.on_event, args=("ns", "a", "create", {"metadata": {}}))
    first.start()
    assert inside.wait(5)
    op.on_timer("ns", "a", None)  # no fingerprint recorded yet, but a reconcile runs
    op.on_timer("ns", "b", None)  # another TrainJob's tick is not held back
    release.set()
    first.join()
    assert runs == ["a", "b"]
    op.on_timer("ns", "a", None)  # idle again: the tick decides as usual
    assert runs == ["a", "b", "a"]


def test_fingerprint_after_writes_ignores_own_writes_but_not_changes_in_between() -> None:
    from trainjob_operator.reconcile.fingerprint import fingerprint_after_writes
    from trainjob_operator.reconcile.plan import OPERATOR_STATUS_KEYS

    read = {
        "metadata": {"generation": 1, "annotations": {"team": "a"}},
        "status": {"phase": "Starting", "progress": {"step": 1}},
    }

    def written(**changes: Any) -> dict[str, Any]:
        body = copy.deepcopy(read)
        body["status"]["phase"] = "Running"  # the reconcile's own status write
        body["metadata"]["annotations"][LAST_DEMAND_ANNOTATION] = "t1"  # and its annotation
        for key, value in changes.items():
            if key == "status":
                body["status"].update(value)
            else:
                body["metadata"][key] = value
        return body

    def after(body: dict[str, Any]) -> str:
        return fingerprint_after_writes(read, body, OPERATOR_STATUS_KEYS, [LAST_DEMAND_ANNOTATION])

    own = written()
    assert after(own) == trainjob_fingerprint(own) != trainjob_fingerprint(read)
    assert fingerprint_after_writes(read, read, OPERATOR_STATUS_KEYS, []) == (
        trainjob_fingerprint(read)
    )
    # Someone else's change landed between the read and the write: the next tick must see a
    # change, so the fingerprint stays the read's.
    for other in (
        written(status={"validations": {"pending": 1}}),  # the driver's validation demand
        written(generation=2),  # a spec edit
        written(annotations={"team": "b", LAST_DEMAND_ANNOTATION: "t1"}),  # a user's edit
    ):
        assert after(other) == trainjob_fingerprint(read)
    # The driver's progress and checkpoints are no plan's business (UNPLANNED_STATUS_KEYS):
    # an update of them in between is no change, nor is one after the write.
    progressed = written(status={"progress": {"step": 2}, "latestCheckpoint": {"path": "p"}})
    assert after(progressed) == trainjob_fingerprint(own) == trainjob_fingerprint(progressed)


def test_status_defaults_the_api_server_adds_are_not_someone_elses_change() -> None:
    # A new TrainJob (no status) gets its first status write; the CRD's schema defaults
    # workerFailures (a driver-owned key) to 0, so the answer holds it though the operator
    # did not write it. Absent and 0 read the same: the next tick must not reconcile again.
    from trainjob_operator.api.status import status_defaults
    from trainjob_operator.reconcile.fingerprint import fingerprint_after_writes
    from trainjob_operator.reconcile.plan import OPERATOR_STATUS_KEYS

    read = {"metadata": {"generation": 1}}
    written = {
        "metadata": {"generation": 1},
        "status": {"phase": "Starting", "restarts": 0, "workerFailures": 0},
    }
    defaults = status_defaults()
    assert defaults["workerFailures"] == 0 and defaults["conditions"] == []
    assert fingerprint_after_writes(read, written, OPERATOR_STATUS_KEYS, [], defaults) == (
        trainjob_fingerprint(written)
    )
    # workerFailures is also a key no plan reads (UNPLANNED_STATUS_KEYS): no change either
    # way. A driver update a plan reads still is one.
    assert fingerprint_after_writes(read, written, OPERATOR_STATUS_KEYS, []) == (
        trainjob_fingerprint(written)
    )
    driver = {**written, "status": {**written["status"], "validations": {"pending": 1}}}
    assert fingerprint_after_writes(read, driver, OPERATOR_STATUS_KEYS, [], defaults) == (
        trainjob_fingerprint(read)
    )
