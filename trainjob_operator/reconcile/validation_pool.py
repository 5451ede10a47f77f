"""The validation pool: how many validation pods a TrainJob should have now.

The pool follows the demand the driver publishes (``status.validations.pending + running``)
up at once and down only after ``pool.idleSeconds`` without demand
(:func:`validation_replicas`); the last time there was demand is kept in the TrainJob's
``trainjob.dev/validation-last-demand`` annotation. :func:`plan_validation_pool` is one
reconcile's decision (:class:`PoolSize`); the state machine
(:mod:`~trainjob_operator.reconcile.state_machine`) makes it when a reconcile starts, renders
the pool's pods from it, and ends with :func:`check_validation_pool_if_needed` (the annotation
and the scale-down callback).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trainjob_operator.api.status import Phase, TrainJobStatus
from trainjob_operator.api.trainjob import TrainJob
from trainjob_operator.constants import LAST_DEMAND_ANNOTATION, format_time, parse_time
from trainjob_operator.reconcile.plan import Plan, StatusInput, read_status


def _parse_ts(value: Any) -> dt.datetime | None:
    if not value:
        return None
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    return parse_time(str(value))


def _validation_demand(status: TrainJobStatus) -> int:
    counts = status.validations
    return (counts.pending + counts.running) if counts is not None else 0


def _pool_replicas(status: TrainJobStatus) -> int:
    return status.validation_pool.replicas if status.validation_pool is not None else 0


def validation_replicas(
    job: TrainJob, status: StatusInput, annotations: Mapping[str, str], now: dt.datetime
) -> tuple[int, str | None]:
    """Validation pool size from the driver's demand, and the new last-demand timestamp.

    Demand is ``status.validations.pending + running`` (published by the driver). Rules:

    - scale up at once to the demand, capped by ``pool.maxReplicas`` and by
      ``validation.maxConcurrent`` (more pods than concurrent validations would sit idle);
    - never scale down while any validation is pending or running: pods are numbered and a
      scale-down deletes the highest numbers, which may be the ones still validating;
    - after ``pool.idleSeconds`` without demand, go to ``pool.minReplicas``.

    The pool never exceeds ``maxReplicas`` (a lowered ``maxReplicas`` applies at once) and is
    never below ``minReplicas``. The timestamp is kept in the TrainJob's
    ``trainjob.dev/validation-last-demand`` annotation (:func:`check_validation_pool_if_needed`).
    """
    validation = job.spec.validation
    if validation is None:
        return 0, None
    typed = read_status(status)
    pool = validation.pool
    demand = _validation_demand(typed)
    current = _pool_replicas(typed)
    last = _parse_ts(annotations.get(LAST_DEMAND_ANNOTATION))
    wanted = min(pool.max_replicas, validation.max_concurrent, demand)

    def bounded(replicas: int) -> int:
        return min(pool.max_replicas, max(pool.min_replicas, replicas))

    if demand > 0:
        return bounded(max(current, wanted)), format_time(now)
    stamp = annotations.get(LAST_DEMAND_ANNOTATION)
    if last is not None and (now - last).total_seconds() < pool.idle_seconds:
        return bounded(current), stamp
    return bounded(pool.min_replicas), stamp


def validation_scale_down_in(
    job: TrainJob, status: StatusInput, annotations: Mapping[str, str], now: dt.datetime
) -> float | None:
    """Seconds until :func:`validation_replicas` would shrink an idle pool to
    ``pool.minReplicas`` (None when no scale-down is waiting)."""
    validation = job.spec.validation
    if validation is None:
        return None
    typed = read_status(status)
    if _validation_demand(typed) > 0:
        return None
    last = _parse_ts(annotations.get(LAST_DEMAND_ANNOTATION))
    if _pool_replicas(typed) <= validation.pool.min_replicas or last is None:
        return None
    return max(0.0, validation.pool.idle_seconds - (now - last).total_seconds())


@dataclass(frozen=True)
class PoolSize:
    """The validation pool decision of one reconcile (:func:`plan_validation_pool`)."""

    #: validation pods to render.
    replicas: int
    #: the ``trainjob.dev/validation-last-demand`` annotation's new value (None: leave it).
    last_demand: str | None
    #: seconds until an idle pool shrinks to ``minReplicas`` (None: none waiting).
    scale_down_in: float | None


def plan_validation_pool(
    job: TrainJob, status: StatusInput, annotations: Mapping[str, str], now: dt.datetime
) -> PoolSize:
    """Size the validation pool (:func:`validation_replicas`) and say when it shrinks next."""
    typed = read_status(status)
    replicas, stamp = validation_replicas(job, typed, annotations, now)
    return PoolSize(replicas, stamp, validation_scale_down_in(job, typed, annotations, now))


def check_validation_pool_if_needed(
    plan: Plan, pool: PoolSize, annotations: Mapping[str, str]
) -> None:
    """Store a new last-demand time in the annotation, and be called back when an idle pool
    is due to shrink; both only while the job's cluster exists (the plan's phase is an active
    one). A finished or suspended job has no pool left to size: its status keeps the last
    ``validationPool.replicas`` (and maybe the driver's last demand), so a callback or a new
    timestamp there would come back on every reconcile."""
    phase = plan.new_status.phase
    if phase is not None and (phase.finished or phase == Phase.SUSPENDED):
        return
    if pool.scale_down_in is not None:
        plan.requeue_at_most(pool.scale_down_in + 1.0)
    if pool.last_demand and pool.last_demand != annotations.get(LAST_DEMAND_ANNOTATION):
        plan.annotations[LAST_DEMAND_ANNOTATION] = pool.last_demand
