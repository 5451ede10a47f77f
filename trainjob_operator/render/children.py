"""The complete set of children of a TrainJob, in creation order."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from trainjob_operator.api.trainjob import TrainJob
from trainjob_operator.render.context import build_context
from trainjob_operator.render.data_pool import data_pods
from trainjob_operator.render.driver import (
    driver_pod,
    driver_role,
    driver_role_binding,
    driver_service_account,
    driver_token_secret,
)
from trainjob_operator.render.hashing import child_key
from trainjob_operator.render.head import dashboard_service, head_pod, headless_service
from trainjob_operator.render.options import RenderOptions
from trainjob_operator.render.security import network_policy, ray_auth_secret
from trainjob_operator.render.validation_pool import validation_pods
from trainjob_operator.render.workers import worker_pods

__all__ = ["check_pod_budget", "render_children", "render_for_reconcile", "renderer_for"]


def check_pod_budget(job: TrainJob, options: RenderOptions) -> None:
    """Refuse a job that may ask for more pods than ``options.max_pods_per_job``.

    Counted before anything is rendered: the head, the driver, ``numWorkers``, the
    validation pool's ``maxReplicas`` and the data pool's ``replicas``. The reconciler fails
    such a job (its message is the condition's); the operator and the other jobs go on.

    Raises:
        ValueError: naming ``spec.scaling.numWorkers``, the count and the limit.
    """
    spec = job.spec
    pool = spec.validation.pool.max_replicas if spec.validation is not None else 0
    data = spec.data.pool.replicas if spec.data is not None else 0
    pods = 2 + spec.scaling.num_workers + pool + data
    if pods > options.max_pods_per_job:
        raise ValueError(
            f"spec.scaling.numWorkers: this TrainJob asks for up to {pods} pods (head, driver, "
            f"{spec.scaling.num_workers} worker(s), {pool} validation pod(s)"
            + (f", {data} data pod(s)" if data else "")
            + "), more than the "
            f"{options.max_pods_per_job} pods per TrainJob this operator allows (hint: use fewer "
            "workers, or ask the cluster admin to raise the chart value "
            "limits.maxPodsPerTrainJob)"
        )


def render_children(
    job: TrainJob,
    *,
    uid: str,
    attempt: int = 0,
    validation_replicas: int = 0,
    options: RenderOptions | None = None,
) -> list[dict[str, Any]]:
    """Every child object of ``job`` as plain dicts, in the order to create them.

    ServiceAccount, Role, RoleBinding (``<job>-driver``), the Ray token Secret
    (``<job>-ray-auth``), the NetworkPolicy (``<job>-ray``), the headless Service, the Ray
    dashboard's Service (``<job>-dashboard``, when ``spec.ray.dashboard.service``), the Ray head,
    the workers, ``validation_replicas`` validation pods, the data pool's pods
    (``spec.data``), and the driver (last: it needs the
    RBAC objects and waits for the head).

    Args:
        job: the TrainJob model (e.g. ``parse_trainjob(body)``).
        uid: ``metadata.uid`` of the TrainJob (owner references).
        attempt: whole-cluster restart counter (``status.restarts``); it labels every pod
            (``trainjob.dev/attempt``), so a restart renders pods with a new spec hash.
        validation_replicas: size of the validation pool, decided by the reconciler from
            ``status.validations`` demand (``0 <= n <= pool.maxReplicas``).
        options: operator-level settings (:class:`RenderOptions`).

    The output is deterministic (same input, identical dicts) and every object carries the
    ``trainjob.dev/spec-hash`` annotation. Keys (:func:`child_key`) are unique.

    Raises:
        ValueError: for an invalid ``spec.podTemplate`` (naming ``spec.podTemplate.<key>``),
            ``spec.env`` overriding an operator variable, a bad ``validation_replicas``, an
            oversized spec, or a name that is not a valid DNS label.
    """
    # One context for every child: the podTemplate, names, TPU shape, placements and the
    # driver's manifest are resolved once.
    ctx = build_context(job, uid=uid, attempt=attempt, options=options)
    check_pod_budget(job, ctx.options)
    children: list[dict[str, Any]] = [
        driver_service_account(ctx),
        driver_role(ctx),
        driver_role_binding(ctx),
        *[s for s in (driver_token_secret(ctx),) if s is not None],
        ray_auth_secret(ctx),
        network_policy(ctx),
        headless_service(ctx),
        *[s for s in (dashboard_service(ctx),) if s is not None],
        head_pod(ctx),
        *worker_pods(ctx),
        *validation_pods(ctx, validation_replicas),
        *data_pods(ctx),
        driver_pod(ctx),
    ]
    # Linear in the number of children (a count per key would be quadratic).
    counts = Counter(child_key(obj) for obj in children)
    duplicates = sorted(key for key, count in counts.items() if count > 1)
    if duplicates:
        raise ValueError(f"rendered children collide: {duplicates}")
    return children


def render_for_reconcile(
    job: TrainJob, uid: str, attempt: int, validation_replicas: int
) -> list[dict[str, Any]]:
    """:func:`render_children` with default options, in the positional form the reconciler's
    ``Renderer`` type uses: ``(job, uid, attempt, validation replicas) -> children``."""
    return render_children(job, uid=uid, attempt=attempt, validation_replicas=validation_replicas)


def renderer_for(
    options: RenderOptions,
) -> Callable[[TrainJob, str, int, int], list[dict[str, Any]]]:
    """:func:`render_for_reconcile` with ``options`` (e.g. :func:`render_options_from_env`):
    the operator's renderer, ``(job, uid, attempt, validation replicas) -> children``."""

    def render(
        job: TrainJob, uid: str, attempt: int, validation_replicas: int
    ) -> list[dict[str, Any]]:
        return render_children(
            job,
            uid=uid,
            attempt=attempt,
            validation_replicas=validation_replicas,
            options=options,
        )

    return render
