"""Data pool pods ``<job>-data-<i>`` (``spec.data.pool``, there whenever ``spec.data`` is):
CPU-only Ray nodes for the training datasets' Ray Data work.

Each pod's Ray node advertises its ``cpu`` (rounded up, at least 1), no GPU, and the label
``trainjob.dev/pool=data``. The driver pod carries that label as
:data:`~trainjob_operator.constants.DATA_LABELS_ENV`, which the launcher makes the datasets'
``ExecutionOptions.label_selector``: their reads and ``map_batches`` run on these pods only,
never on the worker pods (whose Ray nodes advertise just their worker's CPUs and carry
``trainjob.dev/pool=train``) nor on the validation pool. The pool has a fixed size
(``pool.replicas``) for the whole run: Ray Data streams while the workers train.
"""

from __future__ import annotations

from typing import Any

from trainjob_operator.api.trainjob import TrainJob
from trainjob_operator.render.context import RenderContext, build_context
from trainjob_operator.render.cpu_pool import cpu_pool_pods
from trainjob_operator.render.names import data_pod_name
from trainjob_operator.render.options import RenderOptions
from trainjob_operator.render.ray import DATA_POOL_LABELS

__all__ = ["data_pods", "render_data_pods"]


def render_data_pods(
    job: TrainJob, *, uid: str, attempt: int = 0, options: RenderOptions | None = None
) -> list[dict[str, Any]]:
    """``spec.data.pool.replicas`` pods ``<job>-data-0`` ... (none without ``spec.data``).

    Each runs ``ray start --address=<head>:6379 --block --num-cpus=<pool cpu, rounded up>
    --num-gpus=0 --labels=trainjob.dev/pool=data`` with ``pool.resources``, ``pool.nodeSelector``
    (and ``cloud.google.com/gke-spot: "true"`` when ``pool.spot``) over
    ``spec.podTemplate.nodeSelector``, the pool's tolerations and the podTemplate's. They run as
    ``spec.storage.serviceAccountName`` when set (Ray Data's tasks may read the same buckets)
    and are not part of the Kueue gang.

    Raises:
        ValueError: when ``pool.nodeSelector`` contradicts ``pool.spot``; for an invalid
            ``spec.podTemplate``/``spec.env``.
    """
    return data_pods(build_context(job, uid=uid, attempt=attempt, options=options))


def data_pods(ctx: RenderContext) -> list[dict[str, Any]]:
    """:func:`render_data_pods` from a render context."""
    data = ctx.job.spec.data
    if data is None:
        return []
    return cpu_pool_pods(
        ctx,
        replicas=data.pool.replicas,
        role="data",
        container_name="ray-data",
        pod_name=data_pod_name,
        cpus=data.pool.cpus_per_pod(),
        labels=DATA_POOL_LABELS,
        placement=ctx.data_placement,
    )
