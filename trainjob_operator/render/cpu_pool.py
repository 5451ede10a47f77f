"""The pods of a CPU pool (validation, data): Ray nodes with a pool label and the CPUs of their
``resources.cpu``, shared by :mod:`.validation_pool` and :mod:`.data_pool`.

Each pod runs ``ray start --address=<head>:6379 --block --num-cpus=<cpu, rounded up>
--num-gpus=0 [--resources=...] --labels=trainjob.dev/pool=<pool>``; no training worker actor
is placed there (the train workers select ``trainjob.dev/pool=train``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from trainjob_operator.render.context import RenderContext, Role, common_env
from trainjob_operator.render.placement import Placement
from trainjob_operator.render.pods import build_container, build_pod
from trainjob_operator.render.ray import (
    METRICS_PORT,
    ray_labels_arg,
    ray_resources_arg,
    ray_worker_command,
)

__all__ = ["cpu_pool_pods"]


def cpu_pool_pods(
    ctx: RenderContext,
    *,
    replicas: int,
    role: Role,
    container_name: str,
    pod_name: Callable[[str, int], str],
    cpus: int,
    labels: Mapping[str, str],
    placement: Placement,
    resources: Mapping[str, float | int] | None = None,
    env: Sequence[dict[str, Any]] = (),
) -> list[dict[str, Any]]:
    """``replicas`` pods ``pod_name(job, i)`` whose Ray nodes advertise ``cpus`` CPUs, no GPU,
    the Ray ``resources`` (when given) and the node ``labels``; ``env`` is added after the
    common env. They run as ``spec.storage.serviceAccountName`` when set and are not part of
    the Kueue gang."""
    args = [f"--num-cpus={cpus}", "--num-gpus=0"]
    if resources:
        args.append(ray_resources_arg(resources))
    args.append(ray_labels_arg(labels))
    command = ray_worker_command(ctx, args)
    pods = []
    for index in range(replicas):
        container = build_container(
            ctx,
            name=container_name,
            command=command,
            env=[*common_env(ctx), *env],
            resources=placement.resources,
            ports=(("metrics", METRICS_PORT),),
        )
        pods.append(
            build_pod(
                ctx,
                name=pod_name(ctx.name, index),
                role=role,
                container=container,
                placement=placement,
                service_account=ctx.storage_service_account,
            )
        )
    return pods
