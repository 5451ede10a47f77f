"""Worker pods: CPU/GPU workers ``<job>-w<i>`` and TPU hosts ``<job>-s<slice>-h<host>``.

Each worker is one Ray node joining the head (``ray start --address=<head>:6379 --block``) and
advertising what the trainer's worker actors ask for: ``--num-cpus`` from
``resourcesPerWorker.cpu`` (rounded up, default 1, the driver's default request), ``--num-gpus``
for GPU workers, and ``{"TPU": chips per host}`` on TPU hosts (Ray then adds the ``TPU_NAME``
slice resource and ``TPU-<pod type>-head`` on host 0 from the TPU env set here).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from trainjob_operator.api.tpu import TpuSliceShape
from trainjob_operator.api.trainjob import TrainJob
from trainjob_operator.constants import ATTEMPT_LABEL, NAME_LABEL, ROLE_LABEL, SLICE_LABEL
from trainjob_operator.render.context import RenderContext, build_context, common_env
from trainjob_operator.render.names import (
    cpu_worker_pod_name,
    megascale_coordinator_host,
    tpu_slice_name,
    tpu_worker_hostnames,
    tpu_worker_pod_name,
)
from trainjob_operator.render.options import RenderOptions
from trainjob_operator.render.pods import build_container, build_pod, env_var
from trainjob_operator.render.ray import (
    MEGASCALE_PORT,
    METRICS_PORT,
    ray_cpus,
    ray_resources_arg,
    ray_worker_command,
)

__all__ = ["GKE_NODEPOOL_LABEL", "render_worker_pods", "worker_pods"]

GKE_NODEPOOL_LABEL = "cloud.google.com/gke-nodepool"
"""Node label naming the GKE node pool; a multi-host TPU slice is one node pool."""


def _cpu_gpu_workers(ctx: RenderContext) -> list[dict[str, Any]]:
    placement = ctx.worker_placement
    gpus = ctx.job.spec.scaling.gpus_per_worker()
    args = [f"--num-cpus={ray_cpus(placement.resources.get('cpu'))}", f"--num-gpus={gpus}"]
    command = ray_worker_command(ctx, args)
    pods = []
    for index in range(ctx.job.spec.scaling.num_workers):
        container = build_container(
            ctx,
            name="ray-worker",
            command=command,
            env=common_env(ctx),
            resources=placement.resources,
            ports=(("metrics", METRICS_PORT),),
        )
        pods.append(
            build_pod(
                ctx,
                name=cpu_worker_pod_name(ctx.name, index),
                role="worker",
                container=container,
                placement=placement,
                service_account=ctx.storage_service_account,
                gang=True,
            )
        )
    return pods


def _slice_affinity(ctx: RenderContext, slice_index: int, num_slices: int) -> dict[str, Any]:
    """Keep a multi-host slice in one node pool; keep different slices in different pools."""
    same_job = {
        NAME_LABEL: ctx.name,
        ROLE_LABEL: "worker",
        ATTEMPT_LABEL: str(ctx.attempt),
    }
    affinity: dict[str, Any] = {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {
                        "matchLabels": {**same_job, SLICE_LABEL: str(slice_index)},
                    },
                    "topologyKey": GKE_NODEPOOL_LABEL,
                }
            ]
        }
    }
    if num_slices > 1:
        affinity["podAntiAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {
                        "matchLabels": dict(same_job),
                        "matchExpressions": [
                            {"key": SLICE_LABEL, "operator": "Exists"},
                            {
                                "key": SLICE_LABEL,
                                "operator": "NotIn",
                                "values": [str(slice_index)],
                            },
                        ],
                    },
                    "topologyKey": GKE_NODEPOOL_LABEL,
                }
            ]
        }
    return affinity


def _tpu_env(
    ctx: RenderContext, shape: TpuSliceShape, slice_index: int, host: int, num_slices: int
) -> list[dict[str, Any]]:
    env = [
        *common_env(ctx),
        env_var("TPU_WORKER_ID", str(host)),
        env_var(
            "TPU_WORKER_HOSTNAMES",
            ",".join(tpu_worker_hostnames(ctx.name, slice_index, shape.hosts)),
        ),
        env_var("TPU_NAME", tpu_slice_name(ctx.name, slice_index)),
        env_var("TPU_ACCELERATOR_TYPE", shape.pod_type),
        env_var("TPU_TOPOLOGY", shape.topology),
    ]
    if num_slices > 1:
        env += [
            env_var("MEGASCALE_NUM_SLICES", str(num_slices)),
            env_var("MEGASCALE_SLICE_ID", str(slice_index)),
            env_var("MEGASCALE_COORDINATOR_ADDRESS", megascale_coordinator_host(ctx.name)),
            env_var("MEGASCALE_PORT", str(MEGASCALE_PORT)),
        ]
    return env


def _tpu_workers(ctx: RenderContext) -> list[dict[str, Any]]:
    tpu = ctx.job.spec.scaling.tpu
    assert tpu is not None
    shape = ctx.tpu_shape
    assert shape is not None
    placement = ctx.worker_placement
    args = [
        f"--num-cpus={ray_cpus(placement.resources.get('cpu'))}",
        "--num-gpus=0",
        ray_resources_arg({"TPU": shape.chips_per_host}),
    ]
    command = ray_worker_command(ctx, args)
    ports: tuple[tuple[str, int], ...] = (("metrics", METRICS_PORT),)
    if tpu.num_slices > 1:
        ports += (("megascale", MEGASCALE_PORT),)
    pods = []
    for slice_index in range(tpu.num_slices):
        slice_placement = placement
        if shape.multi_host:
            affinity = _slice_affinity(ctx, slice_index, tpu.num_slices)
            slice_placement = replace(placement, affinity=affinity)
        for host in range(shape.hosts):
            container = build_container(
                ctx,
                name="ray-worker",
                command=command,
                env=_tpu_env(ctx, shape, slice_index, host, tpu.num_slices),
                resources=placement.resources,
                ports=ports,
            )
            pods.append(
                build_pod(
                    ctx,
                    name=tpu_worker_pod_name(ctx.name, slice_index, host),
                    role="worker",
                    container=container,
                    extra_labels={SLICE_LABEL: str(slice_index)},
                    placement=slice_placement,
                    service_account=ctx.storage_service_account,
                    gang=True,
                )
            )
    return pods


def render_worker_pods(
    job: TrainJob, *, uid: str, attempt: int = 0, options: RenderOptions | None = None
) -> list[dict[str, Any]]:
    """The worker pods of ``job`` (none in local mode, ``numWorkers: 0``).

    CPU/GPU: ``numWorkers`` pods ``<job>-w<i>`` with ``resourcesPerWorker`` (plus
    ``nvidia.com/gpu`` for ``useGpu``). TPU: per slice ``k`` one pod per host ``i``,
    ``<job>-s<k>-h<i>``, with ``google.com/tpu`` = chips per host, the GKE accelerator/topology
    node selectors and TPU toleration, ``TPU_WORKER_ID``/``TPU_WORKER_HOSTNAMES``/``TPU_NAME``
    (plus ``MEGASCALE_*`` for multislice), the operator-wide TPU defaults
    (``options.tpu_node_selector``/``tpu_tolerations``, below the TrainJob's podTemplate), and
    for multi-host slices pod affinity on the node pool within a slice and anti-affinity
    between slices. Workers run as
    ``spec.storage.serviceAccountName`` when set (they upload checkpoints) and belong to the
    Kueue pod group.

    Raises:
        ValueError: for an invalid ``spec.podTemplate``/``spec.env``, a fractional GPU count or
            a podTemplate nodeSelector that conflicts with the TPU selectors.
    """
    return worker_pods(build_context(job, uid=uid, attempt=attempt, options=options))


def worker_pods(ctx: RenderContext) -> list[dict[str, Any]]:
    """:func:`render_worker_pods` from a render context."""
    if ctx.job.spec.scaling.tpu is not None:
        return _tpu_workers(ctx)
    return _cpu_gpu_workers(ctx)
