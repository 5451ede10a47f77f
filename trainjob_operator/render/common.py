"""What all rendered children share: labels, owner references, security, pods, the spec hash.

The renderers are pure: ``TrainJob model (+ uid, attempt, options) -> plain dicts`` that can be
sent to the Kubernetes API as they are. Nothing here does I/O; the same input always renders the
same output (the reconciler diffs by :func:`child_key` and recreates when the
:data:`SPEC_HASH_ANNOTATION` of an observed child differs from the rendered one).
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from trainjob_operator.api.quantity import parse_quantity
from trainjob_operator.api.tpu import GKE_TPU_ACCELERATOR_LABEL, GKE_TPU_TOPOLOGY_LABEL
from trainjob_operator.api.trainjob import TrainJob
from trainjob_operator.constants import (
    API_VERSION,
    APP_LABEL,
    ATTEMPT_LABEL,
    KIND,
    KUEUE_POD_GROUP_NAME,
    KUEUE_POD_GROUP_TOTAL_COUNT,
    KUEUE_QUEUE_LABEL,
    MANAGED_BY_LABEL,
    NAME_LABEL,
    ROLE_LABEL,
    SLICE_LABEL,
    SPEC_HASH_ANNOTATION,
)
from trainjob_operator.render.names import (
    GCS_PORT,
    check_dns_label,
    head_address,
    headless_service_name,
)
from trainjob_operator.render.pod_template import PodTemplateOverrides, parse_pod_template

__all__ = [
    "APP_LABEL",
    "ATTEMPT_LABEL",
    "CLIENT_PORT",
    "DASHBOARD_PORT",
    "DEFAULTS_ENV",
    "GCS_PORT",
    "GKE_SPOT_LABEL",
    "KUEUE_POD_GROUP_NAME",
    "KUEUE_POD_GROUP_TOTAL_COUNT",
    "KUEUE_QUEUE_LABEL",
    "MANAGED_BY_LABEL",
    "MEGASCALE_PORT",
    "METRICS_PORT",
    "NAME_LABEL",
    "ROLE_LABEL",
    "SHM_VOLUME",
    "SLICE_LABEL",
    "SPEC_HASH_ANNOTATION",
    "RenderContext",
    "RenderOptions",
    "Role",
    "build_container",
    "build_context",
    "build_pod",
    "child_key",
    "common_env",
    "common_labels",
    "container_security_context",
    "cpu_cores",
    "env_var",
    "finalize",
    "object_meta",
    "owner_reference",
    "pod_group_name",
    "pod_security_context",
    "quantities",
    "ray_cpus",
    "ray_resources_arg",
    "ray_worker_command",
    "render_options_from_env",
    "spec_hash",
    "wait_for_head_script",
]

# --------------------------------------------------------------------------- constants

# The label and annotation keys live in trainjob_operator.constants (re-exported here).

DASHBOARD_PORT = 8265
CLIENT_PORT = 10001
METRICS_PORT = 8080
"""Ray's Prometheus metrics export port on every Ray node."""
MEGASCALE_PORT = 8081
"""Multislice (megascale) coordinator port, the value Ray's TPU support uses."""

SHM_VOLUME = "dshm"
"""The memory-backed ``/dev/shm`` volume of every pod (Ray's object store)."""

RUN_AS_USER = 1000

GKE_SPOT_LABEL = "cloud.google.com/gke-spot"
"""Node label of GKE spot VMs (value ``"true"``); set on validation pods by ``pool.spot``."""

Role = Literal["head", "worker", "validation", "driver"]


# --------------------------------------------------------------------------- options / context


def _default_head_resources() -> dict[str, str]:
    return {"cpu": "1", "memory": "2Gi"}


def _default_driver_resources() -> dict[str, str]:
    return {"cpu": "1", "memory": "2Gi"}


_TOLERATION_KEYS = frozenset({"key", "operator", "value", "effect", "tolerationSeconds"})
_OPERATOR_OWNED_SELECTORS: dict[str, dict[str, str]] = {
    "tpu_node_selector": {
        GKE_TPU_ACCELERATOR_LABEL: "derived from spec.scaling.tpu.acceleratorType",
        GKE_TPU_TOPOLOGY_LABEL: "derived from spec.scaling.tpu.topology",
    },
    "validation_node_selector": {
        GKE_SPOT_LABEL: "set per TrainJob by spec.validation.pool.spot",
    },
}


def _check_node_selector(value: object, what: str) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise ValueError(
            f"{what}: expected an object of label: value strings, got {type(value).__name__}"
        )
    for key, item in value.items():
        if not isinstance(key, str) or not isinstance(item, str):
            raise ValueError(
                f"{what}[{key!r}]: node selector values must be strings, got {item!r} "
                "(quote numbers and booleans)"
            )
    return dict(value)


def _check_tolerations(value: object, what: str) -> list[dict[str, Any]]:
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise ValueError(f"{what}: expected a list of tolerations, got {type(value).__name__}")
    out = []
    for index, item in enumerate(value):
        if not isinstance(item, Mapping):
            raise ValueError(
                f"{what}[{index}]: a toleration must be an object, got {type(item).__name__}"
            )
        unknown = sorted(set(item) - _TOLERATION_KEYS)
        if unknown:
            raise ValueError(
                f"{what}[{index}]: unknown toleration field(s) {', '.join(unknown)}; valid: "
                f"{', '.join(sorted(_TOLERATION_KEYS))}"
            )
        out.append(dict(item))
    return out


def _toleration_id(toleration: Mapping[str, Any]) -> tuple[Any, Any]:
    return toleration.get("key"), toleration.get("effect")


@dataclass(frozen=True)
class RenderOptions:
    """Operator-level settings of the renderers (the same for every reconcile of a job).

    Attributes:
        default_namespace: namespace used when ``metadata.namespace`` is unset (local manifests).
        head_resources: resources of the Ray head when ``spec.ray.head.resources`` is empty.
        driver_resources: resources of the driver pod (in local mode, ``numWorkers: 0``, the
            driver runs the train function and gets ``resourcesPerWorker`` instead).
        validation_slots: ``validation`` Ray resource (and logical CPUs) of each validation pod,
            i.e. validations one pod runs at a time. The reconciler sizes the pool from demand in
            validations, so the default of 1 keeps "one pod per validation".
        image_pull_policy: ``imagePullPolicy`` of every container.
        tpu_node_selector: operator-wide default node selector of TPU worker pods (the chart's
            ``defaults.tpu.nodeSelector``); ``spec.podTemplate.nodeSelector`` wins key by key.
            The TPU accelerator and topology labels are the operator's and may not be set here.
        tpu_tolerations: operator-wide default tolerations of TPU worker pods
            (``defaults.tpu.tolerations``); one is left out when the TrainJob's podTemplate
            has a toleration with the same ``key`` and ``effect``.
        validation_node_selector: default node selector of validation pool pods
            (``defaults.validationPool.nodeSelector``); ``spec.podTemplate.nodeSelector`` and
            ``spec.validation.pool.nodeSelector`` win key by key. ``cloud.google.com/gke-spot``
            may not be set here (``pool.spot`` decides it per TrainJob).
        validation_tolerations: default tolerations of validation pool pods
            (``defaults.validationPool.tolerations``); one is left out when the pool's or the
            podTemplate's tolerations have one with the same ``key`` and ``effect``.
    """

    default_namespace: str = "default"
    head_resources: Mapping[str, int | str] = field(default_factory=_default_head_resources)
    driver_resources: Mapping[str, int | str] = field(default_factory=_default_driver_resources)
    validation_slots: int = 1
    image_pull_policy: str = "IfNotPresent"
    tpu_node_selector: Mapping[str, str] = field(default_factory=dict)
    tpu_tolerations: Sequence[Mapping[str, Any]] = ()
    validation_node_selector: Mapping[str, str] = field(default_factory=dict)
    validation_tolerations: Sequence[Mapping[str, Any]] = ()

    def __post_init__(self) -> None:
        if self.validation_slots < 1:
            raise ValueError(
                f"RenderOptions.validation_slots must be >= 1, got {self.validation_slots}"
            )
        for attr in ("tpu_node_selector", "validation_node_selector"):
            selector = _check_node_selector(getattr(self, attr), f"RenderOptions.{attr}")
            for key, why in _OPERATOR_OWNED_SELECTORS[attr].items():
                if key in selector:
                    raise ValueError(
                        f"RenderOptions.{attr}[{key!r}]: the operator sets this label ({why}); "
                        "remove it from the defaults"
                    )
        for attr in ("tpu_tolerations", "validation_tolerations"):
            _check_tolerations(getattr(self, attr), f"RenderOptions.{attr}")


DEFAULTS_ENV: dict[str, tuple[str, str]] = {
    "TRAINJOB_DEFAULT_TPU_NODE_SELECTOR": ("tpu_node_selector", "defaults.tpu.nodeSelector"),
    "TRAINJOB_DEFAULT_TPU_TOLERATIONS": ("tpu_tolerations", "defaults.tpu.tolerations"),
    "TRAINJOB_DEFAULT_VALIDATION_NODE_SELECTOR": (
        "validation_node_selector",
        "defaults.validationPool.nodeSelector",
    ),
    "TRAINJOB_DEFAULT_VALIDATION_TOLERATIONS": (
        "validation_tolerations",
        "defaults.validationPool.tolerations",
    ),
}
"""Env var (JSON, set by the Helm chart) -> (:class:`RenderOptions` field, chart value)."""


def render_options_from_env(environ: Mapping[str, str] | None = None) -> RenderOptions:
    """:class:`RenderOptions` with the operator-wide pod defaults of :data:`DEFAULTS_ENV`.

    The Helm chart renders ``defaults.tpu`` and ``defaults.validationPool`` into these env vars
    as JSON (an object for node selectors, a list for tolerations). Unset or empty variables
    keep the built-in defaults (none).

    Args:
        environ: the environment to read (default ``os.environ``).

    Raises:
        ValueError: naming the variable (and the chart value it comes from) when it is not
            valid JSON, has the wrong shape, or sets a label the operator owns.
    """
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for var, (attr, chart_value) in DEFAULTS_ENV.items():
        text = env.get(var, "").strip()
        if not text:
            continue
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise ValueError(
                f"{var}: not valid JSON ({exc}); set it to a JSON "
                f"{'list' if attr.endswith('tolerations') else 'object'}, e.g. through the "
                f"chart value {chart_value}"
            ) from None
        if value is None:
            continue
        try:
            if attr.endswith("tolerations"):
                values[attr] = tuple(_check_tolerations(value, var))
            else:
                values[attr] = _check_node_selector(value, var)
            RenderOptions(**{attr: values[attr]})  # the ownership checks
        except ValueError as exc:
            message = str(exc).replace(f"RenderOptions.{attr}", var)
            raise ValueError(f"{message} (chart value {chart_value})") from None
    return RenderOptions(**values)


@dataclass(frozen=True)
class RenderContext:
    """Everything a renderer needs, resolved once: the job, its uid, namespace and attempt."""

    job: TrainJob
    uid: str
    attempt: int
    namespace: str
    options: RenderOptions
    overrides: PodTemplateOverrides

    @property
    def name(self) -> str:
        """The TrainJob's name."""
        return self.job.metadata.name

    @property
    def head_address(self) -> str:
        """GCS address of the Ray head (``<job>-head.<job>-headless:6379``)."""
        return head_address(self.name)

    @property
    def storage_service_account(self) -> str | None:
        """``spec.storage.serviceAccountName`` (Workload Identity), if set."""
        storage = self.job.spec.storage
        return storage.service_account_name if storage is not None else None


def build_context(
    job: TrainJob, *, uid: str, attempt: int = 0, options: RenderOptions | None = None
) -> RenderContext:
    """Resolve and check the inputs shared by all renderers.

    Raises:
        ValueError: for an empty ``uid``, a negative ``attempt``, an invalid
            ``spec.podTemplate`` or a name that cannot make valid child names.
    """
    if not uid:
        raise ValueError("uid is required: the owner references need the TrainJob's uid")
    if attempt < 0:
        raise ValueError(f"attempt must be >= 0, got {attempt}")
    opts = options or RenderOptions()
    check_dns_label(job.metadata.name, "TrainJob name")
    check_dns_label(headless_service_name(job.metadata.name), "Service name")
    return RenderContext(
        job=job,
        uid=uid,
        attempt=attempt,
        namespace=job.metadata.namespace or opts.default_namespace,
        options=opts,
        overrides=parse_pod_template(job.spec.pod_template),
    )


# --------------------------------------------------------------------------- metadata


def common_labels(ctx: RenderContext, role: Role | None = None) -> dict[str, str]:
    """Labels of every child: app, managed-by, the job name, and the role when given."""
    labels = {
        APP_LABEL: "trainjob",
        MANAGED_BY_LABEL: "trainjob-operator",
        NAME_LABEL: ctx.name,
    }
    if role is not None:
        labels[ROLE_LABEL] = role
    return labels


def owner_reference(ctx: RenderContext) -> dict[str, Any]:
    """The controller owner reference to the TrainJob (garbage collection, watches)."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": ctx.name,
        "uid": ctx.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def object_meta(
    ctx: RenderContext,
    name: str,
    labels: Mapping[str, str],
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """``metadata`` of a child: name, namespace, labels, annotations, owner reference."""
    return {
        "name": name,
        "namespace": ctx.namespace,
        "labels": dict(labels),
        "annotations": dict(annotations or {}),
        "ownerReferences": [owner_reference(ctx)],
    }


def pod_group_name(ctx: RenderContext) -> str:
    """Kueue pod group of the head and workers of this attempt: ``<job>-attempt-<n>``.

    A whole-cluster restart is a new gang (admitted anew); a replaced worker joins the same one.
    """
    return check_dns_label(f"{ctx.name}-attempt-{ctx.attempt}", "Kueue pod group name")


# --------------------------------------------------------------------------- hashing / keys


def spec_hash(obj: Mapping[str, Any]) -> str:
    """A stable hash of a rendered object, ignoring its own :data:`SPEC_HASH_ANNOTATION`.

    Compare the annotation of an observed child with the one of the freshly rendered child;
    never hash an object read back from the API server (server-side defaulting changes it).
    """
    body = copy.deepcopy(dict(obj))
    meta = body.get("metadata")
    if isinstance(meta, dict) and isinstance(meta.get("annotations"), dict):
        meta["annotations"].pop(SPEC_HASH_ANNOTATION, None)
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def child_key(obj: Mapping[str, Any]) -> tuple[str, str]:
    """``(kind, metadata.name)``: the identity the reconciler diffs observed and desired by."""
    return str(obj["kind"]), str(obj["metadata"]["name"])


def finalize(obj: dict[str, Any]) -> dict[str, Any]:
    """Check the names of a rendered object and stamp its spec hash; returns ``obj``."""
    meta = obj["metadata"]
    check_dns_label(meta["name"], f"{obj['kind']} name")
    for key, value in meta.get("labels", {}).items():
        if len(value) > 63:
            raise ValueError(f"label {key}={value!r} of {meta['name']} exceeds 63 characters")
    spec = obj.get("spec")
    if obj["kind"] == "Pod" and isinstance(spec, dict):
        check_dns_label(spec["hostname"], "pod hostname")
        check_dns_label(spec["subdomain"], "pod subdomain")
    meta.setdefault("annotations", {})[SPEC_HASH_ANNOTATION] = spec_hash(obj)
    return obj


# --------------------------------------------------------------------------- quantities


def cpu_cores(value: int | str) -> float:
    """A Kubernetes quantity as a number (``"500m"`` -> 0.5, ``"2"`` -> 2.0, ``4`` -> 4.0).

    Raises:
        ValueError: for a string that is not a quantity.
    """
    return parse_quantity(value)


def ray_cpus(value: int | str | None, default: int = 1) -> int:
    """Logical CPUs a Ray node advertises for a CPU quantity: rounded up, at least 1."""
    if value is None:
        return default
    return max(1, math.ceil(cpu_cores(value) - 1e-9))


def quantities(resources: Mapping[str, int | str]) -> dict[str, Any]:
    """A container ``resources`` block with requests equal to limits, quantities as strings."""
    if not resources:
        return {}
    values = {name: str(q) for name, q in resources.items()}
    return {"requests": dict(values), "limits": dict(values)}


# --------------------------------------------------------------------------- security


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


def container_security_context() -> dict[str, Any]:
    """Container-level security (Pod Security Standard "restricted")."""
    return {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


# --------------------------------------------------------------------------- containers / pods


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
) -> dict[str, Any]:
    """The main container: ``spec.image``, operator env then ``spec.env``, requests = limits,
    ``/dev/shm`` plus the podTemplate mounts, restricted security context, and
    ``terminationMessagePolicy: FallbackToLogsOnError`` (the log tail of a failed container is
    its termination message in the pod status).

    Raises:
        ValueError: when ``spec.env`` sets a variable the operator sets for this pod.
    """
    _check_env_conflicts(ctx, env)
    container: dict[str, Any] = {
        "name": name,
        "image": ctx.job.spec.image,
        "imagePullPolicy": ctx.options.image_pull_policy,
        "command": list(command),
        "env": [dict(e) for e in env] + [var.to_dict() for var in ctx.job.spec.env],
        "resources": quantities(resources),
        "volumeMounts": [
            {"name": SHM_VOLUME, "mountPath": "/dev/shm"},
            *copy.deepcopy(ctx.overrides.volume_mounts),
        ],
        "securityContext": container_security_context(),
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


def _merge_node_selector(
    user: Mapping[str, str], operator: Mapping[str, str], user_field: str
) -> dict[str, str]:
    merged = dict(user)
    for key, value in operator.items():
        if key in merged and merged[key] != value:
            raise ValueError(
                f"{user_field}[{key!r}]: {merged[key]!r} conflicts with {value!r} that the "
                "operator sets; remove it"
            )
        merged[key] = value
    return merged


def _merge_affinity(operator: Mapping[str, Any], user: Mapping[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(dict(operator))
    for key, value in user.items():
        if key not in merged:
            merged[key] = copy.deepcopy(value)
            continue
        section = merged[key]
        for term_key, terms in value.items():
            section[term_key] = list(section.get(term_key, [])) + copy.deepcopy(terms)
    return merged


def build_pod(
    ctx: RenderContext,
    *,
    name: str,
    role: Role,
    container: dict[str, Any],
    extra_labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    node_selector: Mapping[str, str] | None = None,
    user_node_selector: Mapping[str, str] | None = None,
    tolerations: Sequence[Mapping[str, Any]] = (),
    default_node_selector: Mapping[str, str] | None = None,
    default_tolerations: Sequence[Mapping[str, Any]] = (),
    affinity: Mapping[str, Any] | None = None,
    service_account: str | None = None,
    gang: bool = False,
) -> dict[str, Any]:
    """A pod of the job with everything common applied and the podTemplate merged in.

    Node selector: the operator-wide ``default_node_selector`` (:class:`RenderOptions`),
    overridden key by key by ``spec.podTemplate.nodeSelector``, then by ``user_node_selector``
    (a more specific user field, e.g. ``spec.validation.pool.nodeSelector``), then the
    operator's ``node_selector`` (TPU, spot), which the TrainJob must not contradict (it
    overrides a default). Tolerations: ``tolerations`` (the operator's and e.g. the pool's),
    then each of ``default_tolerations`` whose ``key`` and ``effect`` no other toleration of
    the pod has (the TrainJob's win), then the podTemplate's. Affinity: ``affinity`` merged
    with the podTemplate's.
    ``gang`` adds the Kueue pod-group metadata
    (head and workers). Without ``service_account`` the pod runs as the namespace's default
    ServiceAccount with no API token mounted.
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
        "subdomain": headless_service_name(ctx.name),
        "restartPolicy": "Never",
        "enableServiceLinks": False,
        "securityContext": pod_security_context(ctx),
        "containers": [container],
        "volumes": [
            {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory"}},
            *copy.deepcopy(overrides.volumes),
        ],
    }
    if service_account:
        pod_spec["serviceAccountName"] = service_account
    else:
        pod_spec["automountServiceAccountToken"] = False
    operator_selector = dict(node_selector or {})
    defaults = {
        k: v for k, v in (default_node_selector or {}).items() if k not in operator_selector
    }
    selector = _merge_node_selector(
        {**overrides.node_selector, **(user_node_selector or {})},
        operator_selector,
        "spec.podTemplate.nodeSelector",
    )
    selector = {**defaults, **selector}
    if selector:
        pod_spec["nodeSelector"] = selector
    job_tolerations = [dict(t) for t in tolerations] + copy.deepcopy(overrides.tolerations)
    taken = {_toleration_id(t) for t in job_tolerations}
    extra = [dict(t) for t in default_tolerations if _toleration_id(t) not in taken]
    all_tolerations = [dict(t) for t in tolerations] + extra + copy.deepcopy(overrides.tolerations)
    if all_tolerations:
        pod_spec["tolerations"] = all_tolerations
    merged_affinity = _merge_affinity(affinity or {}, overrides.affinity)
    if merged_affinity:
        pod_spec["affinity"] = merged_affinity
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


def common_env(ctx: RenderContext) -> list[dict[str, Any]]:
    """Environment of every container: the job's name, namespace and attempt."""
    return [
        env_var("TRAINJOB_NAME", ctx.name),
        env_var("TRAINJOB_NAMESPACE", ctx.namespace),
        env_var("TRAINJOB_ATTEMPT", str(ctx.attempt)),
    ]


def wait_for_head_script(ctx: RenderContext) -> str:
    """Shell lines that block until the Ray head's GCS answers (the head may start later)."""
    address = shlex.quote(ctx.head_address)
    return (
        f"until ray health-check --address={address} >/dev/null 2>&1; do\n"
        f"  echo waiting for the Ray head at {address}; sleep 2\n"
        "done\n"
    )


def ray_worker_command(ctx: RenderContext, ray_args: Sequence[str]) -> list[str]:
    """``sh -c``: wait for the head, then ``exec ray start --address=<head>:6379 --block``.

    ``ray_args`` (``--num-cpus``, ``--resources``...) are appended, shell-quoted.
    """
    argv = [
        "ray",
        "start",
        f"--address={ctx.head_address}",
        "--block",
        f"--metrics-export-port={METRICS_PORT}",
        "--disable-usage-stats",
        *ray_args,
    ]
    return ["/bin/sh", "-c", wait_for_head_script(ctx) + "exec " + shlex.join(argv)]


def ray_resources_arg(resources: Mapping[str, float | int]) -> str:
    """``--resources=<json>`` with sorted keys (deterministic)."""
    return "--resources=" + json.dumps(dict(resources), sort_keys=True, separators=(",", ":"))
