"""Containers and pods of a job: ``spec.image`` and env, requests = limits, ``/dev/shm``,
restricted security, the placement and the ``spec.podTemplate`` overrides merged in."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from trainjob_operator.constants import (
    ATTEMPT_LABEL,
    KUEUE_POD_GROUP_NAME,
    KUEUE_POD_GROUP_TOTAL_COUNT,
    KUEUE_QUEUE_LABEL,
)
from trainjob_operator.render.context import (
    RenderContext,
    Role,
    common_labels,
    object_meta,
    pod_group_name,
)
from trainjob_operator.render.hashing import finalize
from trainjob_operator.render.placement import Placement
from trainjob_operator.render.pod_template import OPERATOR_VOLUMES
from trainjob_operator.render.security import ray_auth_env

__all__ = [
    "RUN_AS_USER",
    "SHM_VOLUME",
    "TMP_VOLUME",
    "build_container",
    "build_pod",
    "container_security_context",
    "env_var",
    "pod_security_context",
    "quantities",
]

SHM_VOLUME = "dshm"
"""The memory-backed ``/dev/shm`` volume of every pod (Ray's object store)."""
TMP_VOLUME = "tmp"
"""The ``/tmp`` emptyDir of every pod: Ray's session folder on a read-only root filesystem."""

RUN_AS_USER = 1000


def quantities(resources: Mapping[str, int | str]) -> dict[str, Any]:
    """A container ``resources`` block with requests equal to limits, quantities as strings."""
    if not resources:
        return {}
    values = {name: str(q) for name, q in resources.items()}
    return {"requests": dict(values), "limits": dict(values)}


def pod_security_context(ctx: RenderContext) -> dict[str, Any]:
    """Pod-level security: non-root uid 1000, RuntimeDefault seccomp (podTemplate may tune ids)."""
    sc: dict[str, Any] = {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_USER,
        "runAsGroup": RUN_AS_USER,
        "fsGroup": RUN_AS_USER,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    sc.update(copy.deepcopy(ctx.overrides.security_context))
    return sc


def container_security_context(read_only_root_filesystem: bool = True) -> dict[str, Any]:
    """Container-level security: the Pod Security Standard "restricted" profile, and a
    read-only root filesystem unless the operator is configured otherwise."""
    sc: dict[str, Any] = {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if read_only_root_filesystem:
        sc["readOnlyRootFilesystem"] = True
    return sc


def env_var(name: str, value: str) -> dict[str, Any]:
    """A literal environment variable."""
    return {"name": name, "value": value}


def _check_env_conflicts(ctx: RenderContext, operator_env: Sequence[Mapping[str, Any]]) -> None:
    reserved = {e["name"] for e in operator_env}
    for index, var in enumerate(ctx.job.spec.env):
        if var.name in reserved:
            raise ValueError(
                f"spec.env[{index}].name: {var.name!r} is set by the operator; remove it"
            )


def build_container(
    ctx: RenderContext,
    *,
    name: str,
    command: list[str],
    env: Sequence[Mapping[str, Any]],
    resources: Mapping[str, int | str],
    ports: Sequence[tuple[str, int]] = (),
    readiness_probe: Mapping[str, Any] | None = None,
    extra_mounts: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The main container: ``spec.image``, operator env (with Ray's token authentication) then
    ``spec.env``, requests = limits, ``/dev/shm`` and ``/tmp`` plus the podTemplate mounts,
    restricted security context, and
    ``terminationMessagePolicy: FallbackToLogsOnError`` (the log tail of a failed container is
    its termination message in the pod status).

    Raises:
        ValueError: when ``spec.env`` sets a variable the operator sets for this pod.
    """
    env = [*env, *ray_auth_env(ctx)]
    _check_env_conflicts(ctx, env)
    container: dict[str, Any] = {
        "name": name,
        "image": ctx.job.spec.image,
        "imagePullPolicy": ctx.options.image_pull_policy,
        "command": list(command),
        "env": [dict(e) for e in env] + [var.to_dict() for var in ctx.job.spec.env],
        "resources": quantities(resources),
        "volumeMounts": [
            {"name": SHM_VOLUME, "mountPath": OPERATOR_VOLUMES[SHM_VOLUME]},
            {"name": TMP_VOLUME, "mountPath": OPERATOR_VOLUMES[TMP_VOLUME]},
            *(dict(m) for m in extra_mounts),
            *copy.deepcopy(ctx.overrides.volume_mounts),
        ],
        "securityContext": container_security_context(ctx.options.read_only_root_filesystem),
        # A container that fails without writing /dev/termination-log gets the tail of its log
        # as its termination message, so a failed driver's error shows in the pod status.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if ports:
        container["ports"] = [
            {"name": port_name, "containerPort": number, "protocol": "TCP"}
            for port_name, number in ports
        ]
    if ctx.overrides.env_from:
        container["envFrom"] = copy.deepcopy(ctx.overrides.env_from)
    if readiness_probe is not None:
        container["readinessProbe"] = dict(readiness_probe)
    return container


def build_pod(
    ctx: RenderContext,
    *,
    name: str,
    role: Role,
    container: dict[str, Any],
    placement: Placement,
    extra_labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    service_account: str | None = None,
    gang: bool = False,
    api_token: bool = False,
    extra_volumes: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """A pod of the job with everything common applied and the podTemplate merged in.

    Node selector, tolerations and affinity come from ``placement`` merged with
    ``spec.podTemplate`` (:class:`~trainjob_operator.render.placement.Placement`). ``gang``
    adds the Kueue pod-group metadata (head and workers). The pod runs as ``service_account``
    (else the namespace's default ServiceAccount); only with ``api_token`` does the kubelet
    mount that account's API token (``automountServiceAccountToken`` is false otherwise: only
    pods that call the API server get a token). ``extra_volumes`` follow the operator's own.

    Raises:
        ValueError: when the TrainJob's node selector contradicts the operator's.
    """
    spec = ctx.job.spec
    overrides = ctx.overrides
    labels = dict(overrides.labels)
    labels.update(common_labels(ctx, role))
    labels.update(extra_labels or {})
    labels[ATTEMPT_LABEL] = str(ctx.attempt)
    pod_annotations = dict(overrides.annotations)
    pod_annotations.update(annotations or {})
    if spec.queue_name:
        labels[KUEUE_QUEUE_LABEL] = spec.queue_name
        if gang:
            group = pod_group_name(ctx)
            labels[KUEUE_POD_GROUP_NAME] = group
            pod_annotations[KUEUE_POD_GROUP_NAME] = group
            pod_annotations[KUEUE_POD_GROUP_TOTAL_COUNT] = str(1 + spec.scaling.num_workers)

    pod_spec: dict[str, Any] = {
        "hostname": name,
        "subdomain": ctx.subdomain,
        "restartPolicy": "Never",
        "enableServiceLinks": False,
        "securityContext": pod_security_context(ctx),
        "containers": [container],
        "volumes": [
            {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory"}},
            {"name": TMP_VOLUME, "emptyDir": {}},
            *(dict(v) for v in extra_volumes),
            *copy.deepcopy(overrides.volumes),
        ],
    }
    if service_account:
        pod_spec["serviceAccountName"] = service_account
    if not api_token:
        pod_spec["automountServiceAccountToken"] = False
    selector = placement.node_selector_for(overrides)
    if selector:
        pod_spec["nodeSelector"] = selector
    tolerations = placement.tolerations_for(overrides)
    if tolerations:
        pod_spec["tolerations"] = tolerations
    affinity = placement.affinity_for(overrides)
    if affinity:
        pod_spec["affinity"] = affinity
    if overrides.image_pull_secrets:
        pod_spec["imagePullSecrets"] = copy.deepcopy(overrides.image_pull_secrets)
    if overrides.priority_class_name:
        pod_spec["priorityClassName"] = overrides.priority_class_name
    if overrides.scheduler_name:
        pod_spec["schedulerName"] = overrides.scheduler_name
    if overrides.termination_grace_period_seconds is not None:
        pod_spec["terminationGracePeriodSeconds"] = overrides.termination_grace_period_seconds
    return finalize(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": object_meta(ctx, name, labels, pod_annotations),
            "spec": pod_spec,
        }
    )
