"""Validation pool pods ``<job>-val-<i>``: Ray nodes that alone advertise ``validation``.

Validation tasks ask for ``{"validation": 1}`` and no CPU (``trainer_runtime.ValidationConfig``),
so each pod advertises ``validation`` = ``options.validation_slots``, and its ``cpu`` (rounded
up, at least 1) for the Ray Data tasks a validation starts. No training worker actor is placed
there: the worker pods' Ray nodes carry the label ``trainjob.dev/pool=train``, which the
driver's workers select; the pool's carry ``trainjob.dev/pool=validation``, which the pool's
env (:data:`~trainjob_operator.constants.VALIDATION_DATA_LABELS_ENV`) makes Ray Data's tasks
select. How many pods exist is the reconciler's decision (from ``status.validations`` demand,
between ``pool.minReplicas`` and ``pool.maxReplicas``); it passes it as ``validation_replicas``.
"""

from __future__ import annotations

from typing import Any

from trainjob_operator.api.trainjob import TrainJob
from trainjob_operator.constants import VALIDATION_DATA_LABELS_ENV
from trainjob_operator.render.context import RenderContext, build_context
from trainjob_operator.render.cpu_pool import cpu_pool_pods
from trainjob_operator.render.names import validation_pod_name
from trainjob_operator.render.options import RenderOptions
from trainjob_operator.render.pods import env_var
from trainjob_operator.render.ray import VALIDATION_POOL_LABELS, label_selector_json

__all__ = ["VALIDATION_RESOURCE", "render_validation_pods", "validation_pods"]
VALIDATION_RESOURCE = "validation"
"""The Ray resource validation tasks ask for."""


def render_validation_pods(
    job: TrainJob,
    *,
    uid: str,
    validation_replicas: int,
    attempt: int = 0,
    options: RenderOptions | None = None,
) -> list[dict[str, Any]]:
    """``validation_replicas`` validation pool pods ``<job>-val-0`` ... ``<job>-val-<n-1>``.

    Each runs ``ray start --address=<head>:6379 --block --resources={"validation": slots}``
    ``--num-cpus=<pool cpu, rounded up>`` (free for the Ray Data tasks a validation starts:
    the validation task takes none, the train workers select the worker pods' Ray node label)
    with ``pool.resources``, the node selector ``options.validation_node_selector`` (the
    operator-wide default) <- ``spec.podTemplate.nodeSelector`` <- ``pool.nodeSelector`` <-
    ``cloud.google.com/gke-spot: "true"`` (when ``pool.spot``), and the pool tolerations (plus
    the spot toleration), the default ``options.validation_tolerations`` whose key and effect
    the TrainJob does not set, and the podTemplate's tolerations. The pods run as
    ``spec.storage.serviceAccountName`` when set (they read checkpoints); they are not part of
    the Kueue gang (each is admitted on its own, the pool scales while the job runs).

    Raises:
        ValueError: when ``validation_replicas`` is negative, above ``pool.maxReplicas``, or
            non-zero without ``spec.validation``; when ``pool.nodeSelector`` contradicts
            ``pool.spot``; for an invalid ``spec.podTemplate``/``spec.env``.
    """
    ctx = build_context(job, uid=uid, attempt=attempt, options=options)
    return validation_pods(ctx, validation_replicas)


def validation_pods(ctx: RenderContext, validation_replicas: int) -> list[dict[str, Any]]:
    """:func:`render_validation_pods` from a render context."""
    validation = ctx.job.spec.validation
    if validation_replicas < 0:
        raise ValueError(f"validation_replicas must be >= 0, got {validation_replicas}")
    if validation is None:
        if validation_replicas:
            raise ValueError(
                f"validation_replicas is {validation_replicas} but spec.validation is not set"
            )
        return []
    pool = validation.pool
    if validation_replicas > pool.max_replicas:
        raise ValueError(
            f"validation_replicas ({validation_replicas}) exceeds "
            f"spec.validation.pool.maxReplicas ({pool.max_replicas})"
        )
    return cpu_pool_pods(
        ctx,
        replicas=validation_replicas,
        role="validation",
        container_name="ray-validation",
        pod_name=validation_pod_name,
        cpus=pool.cpus_per_pod(),  # for Ray Data's tasks; the validation takes none
        labels=VALIDATION_POOL_LABELS,
        placement=ctx.validation_placement,
        resources={VALIDATION_RESOURCE: ctx.options.validation_slots},
        env=[env_var(VALIDATION_DATA_LABELS_ENV, label_selector_json(VALIDATION_POOL_LABELS))],
    )
