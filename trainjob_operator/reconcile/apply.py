"""The side-effecting half of reconciliation: read, plan (pure), execute the plan.

:func:`reconcile_trainjob` is what every operator trigger calls (create, update, resume,
timer, child pod events): it reads the TrainJob and its children, asks the state machine
(:func:`~trainjob_operator.reconcile.state_machine.plan_trainjob`, or
:func:`~trainjob_operator.reconcile.state_machine.plan_invalid_spec` for a spec that does not
parse) for a :class:`~trainjob_operator.reconcile.plan.Plan`, and :func:`execute_plan`
carries it out: deletes, creates, then one status write (only when the operator's keys
changed), the annotation patch, and the Events. Nothing here decides anything; the one
result that changes what is written, a child the API server rejects, is handed to the plan,
which answers with the failed plan to write instead
(:meth:`~trainjob_operator.reconcile.plan.Plan.failed_by_rejected_child`). What was done comes
back as values (:class:`Applied`, :class:`ReconcileOutcome`), never written onto the plan.
It is idempotent: running it twice, or after an operator restart mid-way, converges to the
same children.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from trainjob_operator.api.errors import ManifestError
from trainjob_operator.api.manifest import parse_trainjob
from trainjob_operator.api.status import TrainJobStatus, status_defaults
from trainjob_operator.constants import API_VERSION, KIND, NAME_LABEL, TIMESTAMP_FORMAT
from trainjob_operator.kube import ApiError, KubeClient
from trainjob_operator.reconcile.fingerprint import fingerprint_after_writes
from trainjob_operator.reconcile.plan import (
    OPERATOR_STATUS_KEYS,
    Event,
    Plan,
    Renderer,
    invalid_child_message,
)
from trainjob_operator.reconcile.state_machine import plan_invalid_spec, plan_trainjob

logger = logging.getLogger(__name__)

# Not the job's Ray token Secret: the operator may create Secrets but never read them (list
# would let it read every Secret of the namespace), so each reconcile re-creates it (409).
CHILD_KINDS = (
    "Pod",
    "Service",
    "ServiceAccount",
    "Role",
    "RoleBinding",
    "NetworkPolicy",
)
#: Longest Event message posted (the API server keeps it; kubectl describe shows it).
EVENT_MESSAGE_LIMIT = 2048
#: Creates, child LISTs and Events in flight at once, shared by every reconcile. Each waits
#: mostly on the API server (an etcd write), not on this process's CPU: sent one after
#: another, a TrainJob's ten children took ten round trips. As many as the operator's
#: handler threads (``operator_main.HANDLER_THREADS``): with fewer, the handler threads queue
#: for them and a burst of new TrainJobs waits far longer for its children, at the same
#: throughput. The threads keep their kept-alive connections (``KubeClient`` holds one per
#: thread).
CREATE_CONCURRENCY = 16
_create_pool: ThreadPoolExecutor | None = None
#: Status keys that read the same absent and with this value (see ``fingerprint_after_writes``).
STATUS_DEFAULTS = status_defaults()


def _pool() -> ThreadPoolExecutor:
    global _create_pool
    if _create_pool is None:
        _create_pool = ThreadPoolExecutor(CREATE_CONCURRENCY, thread_name_prefix="trainjob-create")
    return _create_pool


#: Kinds created in the second wave: they name a child of the first. A Pod names its
#: ServiceAccount (the API server's admission looks it up); a RoleBinding names its Role (the
#: API server resolves it to check that the operator does not grant more than it holds, and
#: answers 404 while the Role does not exist yet).
SECOND_WAVE_KINDS = frozenset({"Pod", "RoleBinding"})


def create_waves(manifests: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """``manifests`` in the order they can be sent concurrently: every child but those of
    :data:`SECOND_WAVE_KINDS` first, then those (the Pods and the RoleBinding); each wave in
    the plan's order."""
    first = [m for m in manifests if m.get("kind") not in SECOND_WAVE_KINDS]
    second = [m for m in manifests if m.get("kind") in SECOND_WAVE_KINDS]
    return [wave for wave in (first, second) if wave]


def create_children(
    client: KubeClient, namespace: str, manifests: list[dict[str, Any]]
) -> tuple[dict[str, Any], ApiError] | None:
    """Create ``manifests`` (409, already exists, is success), each wave of
    :func:`create_waves` concurrently; returns the first child in the plan's order the API
    server rejected as invalid (422) with its error, and creates no later wave then. Any other
    error is raised (the first in the plan's order) once the wave's requests are done."""
    for wave in create_waves(manifests):
        futures: list[Future[Any]] = [_pool().submit(client.ensure, m, namespace) for m in wave]
        results = [f.exception() for f in futures]
        rejected: tuple[dict[str, Any], ApiError] | None = None
        for manifest, error in zip(wave, results, strict=True):
            if error is None:
                continue
            if isinstance(error, ApiError) and error.status == 422:
                rejected = rejected or (manifest, error)
                continue
            raise error
        if rejected is not None:
            return rejected
    return None


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def read_children(client: KubeClient, namespace: str, name: str) -> list[dict[str, Any]]:
    """Every child of the TrainJob, found by its ``trainjob.dev/name`` label."""
    # From the API server's watch cache: a quorum read decodes every object of the kind in
    # the namespace (costly with hundreds of TrainJobs). The cache is at least as fresh as the
    # watch event that triggered this reconcile; anything newer is seen by the next one, and
    # creating what already exists is a harmless 409. The kinds are listed concurrently (one
    # round trip instead of six), on the threads of the creates.
    selector = f"{NAME_LABEL}={name}"
    lists = [
        _pool().submit(client.list, kind, namespace, selector, from_cache=True)
        for kind in CHILD_KINDS
    ]
    return [child for listed in lists for child in listed.result()]


def event_body(obj: Mapping[str, Any], event: Event, now: dt.datetime) -> dict[str, Any]:
    """The core/v1 Event that reports ``event`` on the TrainJob ``obj``."""
    meta = obj["metadata"]
    stamp = now.strftime(TIMESTAMP_FORMAT)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": obj.get("apiVersion", API_VERSION),
            "kind": KIND,
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta.get("uid"),
        },
        "reason": event.reason,
        "message": event.message[:EVENT_MESSAGE_LIMIT],
        "type": event.type,
        "source": {"component": "trainjob-operator"},
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


def post_event(client: KubeClient, obj: dict[str, Any], event: Event, now: dt.datetime) -> None:
    """A core/v1 Event on the TrainJob (best effort)."""
    try:
        client.ensure(event_body(obj, event, now), obj["metadata"]["namespace"])
    except ApiError as exc:
        logger.warning("could not post event %s: %s", event.reason, exc)


@dataclass
class Applied:
    """What :func:`execute_plan` did."""

    #: the plan as carried out: the one given, or, when the API server rejected a child, that
    #: plan turned into an ``InvalidChild`` failure (:meth:`Plan.failed_by_rejected_child`).
    plan: Plan
    #: the TrainJob as the last write answered it (the TrainJob read when nothing was written).
    trainjob_after: dict[str, Any]


@dataclass
class ReconcileOutcome:
    """What one reconcile did (:func:`reconcile_trainjob`'s answer): what the operator keeps
    for its next triggers. Never written back onto the plan."""

    #: the TrainJob's status as this reconcile decided it (what was written, when it changed).
    new_status: TrainJobStatus
    #: seconds after which to reconcile again even if nothing changes (the plan's request).
    requeue_after: float | None = None
    #: the TrainJob as this reconcile left it.
    trainjob_after: dict[str, Any] | None = None
    #: what the operator's timer compares the next watch events with
    #: (:func:`~trainjob_operator.reconcile.fingerprint.fingerprint_after_writes`).
    fingerprint_after: str | None = None
    #: the TrainJob's ``metadata.generation`` the plan was made from (a spec change after it
    #: asks for another reconcile).
    generation_read: int | None = None
    #: the plan as carried out.
    plan: Plan | None = None


def execute_plan(client: KubeClient, obj: dict[str, Any], plan: Plan, now: dt.datetime) -> Applied:
    """Carry out ``plan`` for the TrainJob ``obj``: deletes, creates, one status write (or the
    TrainJob's deletion) and the annotation patch, with the Events alongside. Returns what was
    done (:class:`Applied`); ``plan`` itself is not changed."""
    meta = obj["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    for kind, child in plan.delete:
        client.delete(kind, namespace, child, grace_seconds=plan.delete_grace_seconds.get(child))
    rejected = create_children(client, namespace, plan.create)
    if rejected is not None:
        # Invalid: the plan fails the job (once; the next reconcile, phase Failed, deletes
        # what was created) and no later wave is created.
        manifest, exc = rejected
        plan = plan.failed_by_rejected_child(manifest, exc.body, now)
    written = obj
    # The Events go concurrently with the TrainJob's own writes (one round trip, not three
    # for a new TrainJob's), and are all posted when this returns.
    posted = [_pool().submit(post_event, client, obj, event, now) for event in plan.events]
    try:
        if plan.delete_trainjob:
            client.delete(KIND, namespace, name)
        else:
            patch = plan.status_patch()
            if patch is not None:
                written = client.patch(
                    KIND, namespace, name, {"status": patch}, subresource="status"
                )
            if plan.annotations:
                annotations = {"metadata": {"annotations": plan.annotations}}
                written = client.patch(KIND, namespace, name, annotations)
    finally:
        for future in posted:
            future.exception()  # wait (post_event logs what the API server refuses)
    for future in posted:
        future.result()
    return Applied(plan, written or obj)


def reconcile_trainjob(
    client: KubeClient,
    namespace: str,
    name: str,
    render: Renderer,
    now: dt.datetime | None = None,
    obj: dict[str, Any] | None = None,
) -> ReconcileOutcome | None:
    """Bring one TrainJob's children and status to what its spec asks for; returns what it
    did (None: the TrainJob is gone or being deleted).

    ``obj``: the TrainJob as a watch event just showed it, instead of reading it (a GET);
    only when nothing this process wrote can be newer (its first reconcile)."""
    now = now or _now()
    if obj is None:
        obj = client.get(KIND, namespace, name)
    if obj is None or obj["metadata"].get("deletionTimestamp"):
        return None  # gone: owner references let the garbage collector delete the children
    meta = obj["metadata"]
    status = dict(obj.get("status") or {})
    generation = meta.get("generation")
    try:
        job = parse_trainjob(obj)
    except ManifestError as exc:
        message = "; ".join(e.format() for e in exc.errors)
        plan = plan_invalid_spec(status, message, generation, now)
    else:
        # A TrainJob without a status was never reconciled: it has no children, save those a
        # reconcile cut off before its status write created (an operator restart); creating
        # them again answers 409, and the next reconcile, which reads them, sees their state.
        # So its first reconcile does not read them (a LIST per child kind saved).
        children = read_children(client, namespace, name) if status else []
        plan = plan_trainjob(
            job,
            meta["uid"],
            status,
            dict(meta.get("annotations") or {}),
            children,
            render,
            now,
            generation=generation,
        )
    applied = execute_plan(client, obj, plan, now)
    done = applied.plan
    return ReconcileOutcome(
        new_status=done.new_status,
        requeue_after=done.requeue_after,
        trainjob_after=applied.trainjob_after,
        fingerprint_after=fingerprint_after_writes(
            obj, applied.trainjob_after, OPERATOR_STATUS_KEYS, done.annotations, STATUS_DEFAULTS
        ),
        generation_read=generation,
        plan=done,
    )


__all__ = [
    "CREATE_CONCURRENCY",
    "NAME_LABEL",
    "OPERATOR_STATUS_KEYS",
    "Applied",
    "ReconcileOutcome",
    "Renderer",
    "create_children",
    "create_waves",
    "event_body",
    "execute_plan",
    "invalid_child_message",
    "post_event",
    "read_children",
    "reconcile_trainjob",
]
