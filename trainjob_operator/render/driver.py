"""The driver pod ``<job>-driver`` and its ServiceAccount, Role and RoleBinding.

The driver container runs ``python -m trainjob_operator.launcher.driver_start``, which waits for
the head, joins the Ray cluster and becomes ``python -m trainjob_operator.launcher.driver``: it
builds the trainer from the TrainJob (:mod:`trainjob_operator.launcher.trainer`), drives the
workers on the Ray cluster, and patches ``status.progress``/checkpoints/validations of its own
TrainJob.

Design choices:

- **Ray address.** ``RAY_ADDRESS`` is the head's GCS address ``<job>-head.<job>-headless:6379``
  (not ``ray://...:10001``). The driver is then a regular Ray driver: full API (placement groups,
  actors, threads, object transfers without the Ray Client proxy and its size and reconnect
  limits). A driver attached by GCS address needs a raylet on its own node, so the pod first
  joins the cluster as a zero-resource node (``ray start --address=$RAY_ADDRESS --num-cpus=0
  --num-gpus=0``; nothing is scheduled there) and then ``exec``\\ s the driver, whose exit status
  becomes the pod's (``restartPolicy: Never``: Succeeded/Failed is the run's outcome).
- **Spec transport.** The TrainJob is passed as compact JSON in the env var
  :data:`DRIVER_MANIFEST_ENV` (``parse_trainjob(json.loads(...))`` restores it). An env var is
  part of the pod spec: it is immutable for the pod's life (the driver runs exactly the spec the
  pod, and its spec hash, were rendered from), needs no extra object, RBAC or propagation
  delay, and is there before the container starts. A ConfigMap would add a child to reconcile
  and update under a running driver. The limit is the kernel's 128 KiB per env string: larger
  specs are rejected (keep ``spec.config`` small; load big configs from storage). Fields only the
  operator acts on (:data:`OPERATOR_ONLY_FIELDS`) are left out, so e.g. changing
  ``ttlSecondsAfterFinished`` or ``suspend`` does not change the driver's spec hash.
- **ServiceAccount.** The per-job ServiceAccount ``<job>-driver`` is bound to a Role that allows
  only ``get``/``patch`` of ``trainjobs/status`` and ``get`` of ``trainjobs``, both restricted to
  this job (``resourceNames``); nothing else is ever bound to it. When
  ``spec.storage.serviceAccountName`` is set (Workload Identity for GCS) the driver runs as
  that account, because it writes the checkpoint manifest and deletes evicted checkpoints, but
  its Kubernetes rights stay the per-job account's: the storage account gets no binding, the
  pod mounts no token of it (``automountServiceAccountToken: false``; GKE's metadata server
  identifies the pod by its account, not by a token), and the Secret ``<job>-driver-token``
  (type ``kubernetes.io/service-account-token`` for ``<job>-driver``, filled by the token
  controller) is mounted where the in-cluster client reads its token. A shared storage account
  thus never gains rights on any TrainJob. Everything is owned by the TrainJob and goes away
  with it.
"""

from __future__ import annotations

import json
from typing import Any

from trainjob_operator.api.trainjob import TrainJob
from trainjob_operator.constants import (
    API_VERSION,
    DATA_LABELS_ENV,
    DRIVER_METRICS_PORT,
    GROUP,
    KIND,
    METRICS_PORT_ENV,
    PLURAL,
    WORKER_LABEL_SELECTOR_ENV,
)
from trainjob_operator.render.context import (
    RenderContext,
    build_context,
    common_env,
    common_labels,
    object_meta,
)
from trainjob_operator.render.hashing import finalize
from trainjob_operator.render.names import driver_name
from trainjob_operator.render.options import RenderOptions
from trainjob_operator.render.pod_template import OPERATOR_VOLUMES
from trainjob_operator.render.pods import build_container, build_pod, env_var
from trainjob_operator.render.ray import DATA_POOL_LABELS, TRAIN_POOL_LABELS, label_selector_json

__all__ = [
    "DRIVER_MANIFEST_ENV",
    "DRIVER_SCRAPE_ANNOTATIONS",
    "DRIVER_START_MODULE",
    "MAX_ENV_VALUE_BYTES",
    "OPERATOR_ONLY_FIELDS",
    "driver_manifest",
    "driver_manifest_json",
    "driver_pod",
    "driver_role",
    "driver_role_binding",
    "driver_service_account",
    "driver_service_account_name",
    "driver_token_secret",
    "render_driver_pod",
    "render_driver_role",
    "render_driver_role_binding",
    "render_driver_service_account",
]

DRIVER_START_MODULE = "trainjob_operator.launcher.driver_start"
"""The module the driver container runs with ``python -m``: it waits for the head, joins the Ray
cluster (retrying ``ray start``) and execs the driver (:mod:`trainjob_operator.launcher.driver`),
leaving at once on SIGTERM while it waits."""
DRIVER_MANIFEST_ENV = "TRAINJOB_MANIFEST"
"""Env var holding the TrainJob (apiVersion, kind, name/namespace/uid, spec) as JSON."""
MAX_ENV_VALUE_BYTES = 128 * 1024 - len(DRIVER_MANIFEST_ENV) - 2
"""Linux limits one ``NAME=value`` env string to 128 KiB (``MAX_ARG_STRLEN``)."""
OPERATOR_ONLY_FIELDS: dict[str, tuple[str, ...]] = {
    "": ("suspend", "ttlSecondsAfterFinished", "queueName"),
    "failure": (
        "maxRestarts",
        "activeDeadlineSeconds",
        "startupDeadlineSeconds",
        "restartBackoff",
        "rules",
    ),
    "ray": ("dashboard",),
}
"""camelCase spec fields (by parent, ``""`` = spec) left out of the driver's copy."""


DRIVER_SCRAPE_ANNOTATIONS = {
    "prometheus.io/scrape": "true",
    "prometheus.io/port": str(DRIVER_METRICS_PORT),
    "prometheus.io/path": "/metrics",
}
"""The driver pod's training metrics (:mod:`trainer_runtime._driver_metrics`, served on the
container port ``metrics``), for a Prometheus that discovers pods by these annotations; the
chart's PodMonitor (``monitoring.driverPodMonitor``) selects the same pods by label."""

DRIVER_TOKEN_VOLUME = "driver-api-token"
"""The driver's API token volume (the ``<job>-driver-token`` Secret) when it runs as the
storage ServiceAccount; mounted at the in-cluster client's token folder."""


def driver_token_secret_name(job: str) -> str:
    """``<job>-driver-token``: the API token of ``<job>-driver`` (see the module notes)."""
    return f"{job}-driver-token"


def driver_service_account_name(job: TrainJob) -> str:
    """The ServiceAccount the driver pod runs as: ``spec.storage.serviceAccountName`` (its
    storage identity) or ``<job>-driver``. Its Kubernetes rights are always ``<job>-driver``'s."""
    storage = job.spec.storage
    if storage is not None and storage.service_account_name:
        return storage.service_account_name
    return driver_name(job.metadata.name)


def _manifest(ctx: RenderContext) -> dict[str, Any]:
    spec = ctx.job.spec.to_dict()
    for parent, keys in OPERATOR_ONLY_FIELDS.items():
        target = spec if not parent else spec.get(parent, {})
        for key in keys:
            target.pop(key, None)
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": ctx.name, "namespace": ctx.namespace, "uid": ctx.uid},
        "spec": spec,
    }


def driver_manifest(
    job: TrainJob, *, uid: str, options: RenderOptions | None = None
) -> dict[str, Any]:
    """The TrainJob as the driver receives it (without status and operator-only fields)."""
    return _manifest(build_context(job, uid=uid, options=options))


def _manifest_json(ctx: RenderContext) -> str:
    text = json.dumps(_manifest(ctx), sort_keys=True, separators=(",", ":"))
    size = len(text.encode())
    if size > MAX_ENV_VALUE_BYTES:
        raise ValueError(
            f"spec: the TrainJob is {size} bytes as JSON, more than the {MAX_ENV_VALUE_BYTES} "
            f"bytes the driver's {DRIVER_MANIFEST_ENV} env var can hold; keep spec.config "
            "small and load large configuration from storage"
        )
    return text


def driver_manifest_json(job: TrainJob, *, uid: str, options: RenderOptions | None = None) -> str:
    """The value of :data:`DRIVER_MANIFEST_ENV`: compact JSON with sorted keys.

    Raises:
        ValueError: when it exceeds :data:`MAX_ENV_VALUE_BYTES`.
    """
    return _manifest_json(build_context(job, uid=uid, options=options))


DRIVER_COMMAND: tuple[str, ...] = ("python", "-m", DRIVER_START_MODULE)
"""The driver container's command, the same for every job (``RAY_ADDRESS`` comes from the
pod's env)."""


def render_driver_pod(
    job: TrainJob, *, uid: str, attempt: int = 0, options: RenderOptions | None = None
) -> dict[str, Any]:
    """The driver pod ``<job>-driver`` (``restartPolicy: Never``).

    Env: ``RAY_ADDRESS`` (head GCS address), ``TRAINJOB_NAME``, ``TRAINJOB_NAMESPACE``,
    ``TRAINJOB_ATTEMPT``, :data:`DRIVER_MANIFEST_ENV`, ``TRAINJOB_METRICS_PORT``, the train
    workers' label selector (``TRAINJOB_WORKER_LABEL_SELECTOR``) and, with ``spec.data``, the
    data pool's (``TRAINJOB_DATA_LABEL_SELECTOR``), then ``spec.env``. The training metrics
    are served on the container port ``metrics`` (:data:`DRIVER_SCRAPE_ANNOTATIONS`). Runs as
    :func:`driver_service_account_name`. Resources: ``options.driver_resources``, or
    ``resourcesPerWorker`` in local mode (``numWorkers: 0``). Not part of the Kueue gang.

    Raises:
        ValueError: for an oversized spec, an invalid ``spec.podTemplate``/``spec.env``.
    """
    return driver_pod(build_context(job, uid=uid, attempt=attempt, options=options))


def driver_pod(ctx: RenderContext) -> dict[str, Any]:
    """:func:`render_driver_pod` from a render context."""
    placement = ctx.driver_placement
    env = [
        env_var("RAY_ADDRESS", ctx.head_address),
        *common_env(ctx),
        env_var(DRIVER_MANIFEST_ENV, _manifest_json(ctx)),
        env_var("PYTHONUNBUFFERED", "1"),
        env_var(METRICS_PORT_ENV, str(DRIVER_METRICS_PORT)),
    ]
    scaling = ctx.job.spec.scaling
    if scaling.num_workers > 0 and scaling.tpu is None:
        # The train workers go to the worker pods' Ray nodes only (TPU workers are placed
        # by their TPU resources): the validation pool's CPUs are for Ray Data's tasks.
        env.append(env_var(WORKER_LABEL_SELECTOR_ENV, label_selector_json(TRAIN_POOL_LABELS)))
    data = ctx.job.spec.data
    if data is not None:
        # The training datasets' Ray Data tasks go to the data pool's Ray nodes only.
        env.append(env_var(DATA_LABELS_ENV, label_selector_json(DATA_POOL_LABELS)))
    # Under the storage account the per-job account's token comes from its Secret.
    borrowed = ctx.storage_service_account is not None
    token_path = OPERATOR_VOLUMES[DRIVER_TOKEN_VOLUME]
    container = build_container(
        ctx,
        name="driver",
        command=list(DRIVER_COMMAND),
        env=env,
        resources=placement.resources,
        ports=[("metrics", DRIVER_METRICS_PORT)],
        extra_mounts=(
            [{"name": DRIVER_TOKEN_VOLUME, "mountPath": token_path, "readOnly": True}]
            if borrowed
            else []
        ),
    )
    return build_pod(
        ctx,
        name=driver_name(ctx.name),
        role="driver",
        container=container,
        placement=placement,
        service_account=driver_service_account_name(ctx.job),
        api_token=not borrowed,
        annotations=DRIVER_SCRAPE_ANNOTATIONS,
        extra_volumes=(
            [
                {
                    "name": DRIVER_TOKEN_VOLUME,
                    "secret": {
                        "secretName": driver_token_secret_name(ctx.name),
                        "defaultMode": 0o440,
                    },
                }
            ]
            if borrowed
            else []
        ),
    )


def driver_token_secret(ctx: RenderContext) -> dict[str, Any] | None:
    """The Secret ``<job>-driver-token`` (type ``kubernetes.io/service-account-token``, for
    ``<job>-driver``) when the driver runs as ``spec.storage.serviceAccountName``; else None."""
    if ctx.storage_service_account is None:
        return None
    meta = object_meta(
        ctx,
        driver_token_secret_name(ctx.name),
        common_labels(ctx, "driver"),
        {"kubernetes.io/service-account.name": driver_name(ctx.name)},
    )
    return finalize(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": meta,
            "type": "kubernetes.io/service-account-token",
        }
    )


def render_driver_service_account(
    job: TrainJob, *, uid: str, options: RenderOptions | None = None
) -> dict[str, Any]:
    """The per-job ServiceAccount ``<job>-driver``."""
    return driver_service_account(build_context(job, uid=uid, options=options))


def driver_service_account(ctx: RenderContext) -> dict[str, Any]:
    """:func:`render_driver_service_account` from a render context."""
    return finalize(
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": object_meta(ctx, driver_name(ctx.name), common_labels(ctx, "driver")),
        }
    )


def render_driver_role(
    job: TrainJob, *, uid: str, options: RenderOptions | None = None
) -> dict[str, Any]:
    """Role ``<job>-driver``: ``get``/``patch`` ``trainjobs/status`` and ``get`` ``trainjobs``,
    only for this TrainJob (``resourceNames``)."""
    return driver_role(build_context(job, uid=uid, options=options))


def driver_role(ctx: RenderContext) -> dict[str, Any]:
    """:func:`render_driver_role` from a render context."""
    return finalize(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": object_meta(ctx, driver_name(ctx.name), common_labels(ctx, "driver")),
            "rules": [
                {
                    "apiGroups": [GROUP],
                    "resources": [f"{PLURAL}/status"],
                    "resourceNames": [ctx.name],
                    "verbs": ["get", "patch"],
                },
                {
                    "apiGroups": [GROUP],
                    "resources": [PLURAL],
                    "resourceNames": [ctx.name],
                    "verbs": ["get"],
                },
            ],
        }
    )


def render_driver_role_binding(
    job: TrainJob, *, uid: str, options: RenderOptions | None = None
) -> dict[str, Any]:
    """RoleBinding ``<job>-driver``: the Role to ``<job>-driver`` only (never to
    ``spec.storage.serviceAccountName``, which other jobs may share)."""
    return driver_role_binding(build_context(job, uid=uid, options=options))


def driver_role_binding(ctx: RenderContext) -> dict[str, Any]:
    """:func:`render_driver_role_binding` from a render context."""
    accounts = [driver_name(ctx.name)]
    return finalize(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": object_meta(ctx, driver_name(ctx.name), common_labels(ctx, "driver")),
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": driver_name(ctx.name),
            },
            "subjects": [
                {"kind": "ServiceAccount", "name": account, "namespace": ctx.namespace}
                for account in accounts
            ],
        }
    )
