"""Worker pods: CPU/GPU workers ``<job>-w<i>`` and TPU hosts ``<job>-s<slice>-h<host>``.

Each worker is one Ray node joining the head (``ray start --address=<head>:6379 --block``) and
advertising what the trainer's worker actors ask for: ``--num-cpus`` from
``resourcesPerWorker.cpu`` (rounded up, default 1, the driver's default request), ``--num-gpus``
for GPU workers, and ``{"TPU": chips per host}`` on TPU hosts (Ray then adds the ``TPU_NAME``
slice resource and ``TPU-<pod type>-head`` on host 0 from the TPU env set here). CPU/GPU
workers also get the raylet settings that have their worker actor start in a process started
with the pod (:func:`~trainjob_operator.render.ray.worker_prestart_env`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from trainjob_operator.api.tpu import TpuSliceShape
from trainjob_operator.api.trainjob import TrainJob
from trainjob_operator.constants import SLICE_ID_LABEL, SLICE_LABEL
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
    TRAIN_POOL_LABELS,
    ray_labels_arg,
    ray_resources_arg,
    ray_worker_command,
    worker_prestart_env,
)

__all__ = ["GKE_NODEPOOL_LABEL", "render_worker_pods", "worker_pods"]

GKE_NODEPOOL_LABEL = "cloud.google.com/gke-nodepool"
"""Node label naming the GKE node pool; a multi-host TPU slice is one node pool."""


def _cpu_gpu_workers(ctx: RenderContext) -> list[dict[str, Any]]:
    placement = ctx.worker_placement
    gpus = ctx.job.spec.scaling.gpus_per_worker()
    cpus = ctx.job.spec.scaling.cpus_per_worker()
    args = [f"--num-cpus={cpus}", f"--num-gpus={gpus}", ray_labels_arg(TRAIN_POOL_LABELS)]
    command = ray_worker_command(ctx, args)
    env = [*common_env(ctx), *worker_prestart_env(ctx)]
    pods = []
    for index in range(ctx.job.spec.scaling.num_workers):
        container = build_container(
            ctx,
            name="ray-worker",
            command=command,
            env=env,
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


def slice_id(ctx: RenderContext, slice_index: int) -> str:
    """The :data:`~trainjob_operator.constants.SLICE_ID_LABEL` value of slice ``slice_index``:
    unique in the cluster (the TrainJob's uid), new for each attempt."""
    return f"{ctx.uid}-a{ctx.attempt}-s{slice_index}"


def _slice_affinity(ctx: RenderContext, slice_index: int) -> dict[str, Any]:
    """Exclusive node-pool placement of a multi-host slice, as JobSet's
    ``alpha.jobset.sigs.k8s.io/exclusive-topology: cloud.google.com/gke-nodepool``: pod
    affinity to the slice's own hosts keeps the slice in one node pool (its first host may go
    to any pool: kube-scheduler lets a pod that matches its own affinity term start a group),
    and pod anti-affinity against the hosts of every other slice, of this TrainJob or another,
    keeps any other slice out of that pool. Without it a slice could start in a pool that
    another slice (another job's, or one still shutting down) partly holds, and its last hosts
    would wait there while a free pool stays idle; two jobs starting together could split one
    pool between them, neither slice fitting, and wait for each other forever.

    The anti-affinity term selects pods in every namespace (``namespaceSelector: {}``,
    Kubernetes 1.22+; an API server without the field drops it and the term covers the job's
    namespace).
    """
    own = slice_id(ctx, slice_index)
    return {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {
                        "matchExpressions": [
                            {"key": SLICE_ID_LABEL, "operator": "In", "values": [own]}
                        ]
                    },
                    "topologyKey": GKE_NODEPOOL_LABEL,
                }
            ]
        },
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {
                        "matchExpressions": [
                            {"key": SLICE_ID_LABEL, "operator": "Exists"},
                            {"key": SLICE_ID_LABEL, "operator": "NotIn", "values": [own]},
                        ]
                    },
                    "namespaceSelector": {},
                    "topologyKey": GKE_NODEPOOL_LABEL,
                }
            ]
        },
    }


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
        f"--num-cpus={ctx.job.spec.scaling.cpus_per_worker()}",
        "--num-gpus=0",
        ray_resources_arg({"TPU": shape.chips_per_host}),
        ray_labels_arg(TRAIN_POOL_LABELS),
    ]
    command = ray_worker_command(ctx, args)
    ports: tuple[tuple[str, int], ...] = (("metrics", METRICS_PORT),)
    if tpu.num_slices > 1:
        ports += (("megascale", MEGASCALE_PORT),)
    pods = []
    for slice_index in range(tpu.num_slices):
        slice_placement = placement
        slice_labels = {SLICE_LABEL: str(slice_index)}
        if shape.multi_host:
            affinity = _slice_affinity(ctx, slice_index)
            slice_placement = replace(placement, affinity=affinity)
            slice_labels[SLICE_ID_LABEL] = slice_id(ctx, slice_index)
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
                    extra_labels=slice_labels,
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
    for multi-host slices exclusive node-pool placement (the label ``trainjob.dev/slice-id``,
    pod affinity on the node pool within the slice, anti-affinity against every other slice:
    :func:`_slice_affinity`). Workers run as
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
