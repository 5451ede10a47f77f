"""Operator-wide settings of the renderers (:class:`RenderOptions`), read from the environment
the Helm chart sets (:func:`render_options_from_env`)."""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import TypeAdapter, ValidationError

from trainjob_operator.api.fields import ResourceMap
from trainjob_operator.api.quantity import parse_quantity
from trainjob_operator.api.tpu import GKE_TPU_ACCELERATOR_LABEL, GKE_TPU_TOPOLOGY_LABEL

__all__ = [
    "ALLOWED_VOLUME_TYPES_ENV",
    "DEFAULTS_ENV",
    "DEFAULT_ALLOWED_VOLUME_TYPES",
    "GKE_SPOT_LABEL",
    "MAX_PODS_PER_JOB_ENV",
    "READ_ONLY_ROOT_FILESYSTEM_ENV",
    "RESOURCES_ENV",
    "RenderOptions",
    "check_node_selector",
    "check_tolerations",
    "render_options_from_env",
]

GKE_SPOT_LABEL = "cloud.google.com/gke-spot"
"""Node label of GKE spot VMs (value ``"true"``); set on validation pods by ``pool.spot``."""


def _default_head_resources() -> dict[str, str]:
    return {"cpu": "1", "memory": "2Gi"}


def _default_driver_resources() -> dict[str, str]:
    return {"cpu": "1", "memory": "2Gi"}


DEFAULT_ALLOWED_VOLUME_TYPES: frozenset[str] = frozenset(
    {
        "configMap",
        "secret",
        "emptyDir",
        "persistentVolumeClaim",
        "projected",
        "downwardAPI",
        "csi",
        "ephemeral",
    }
)
"""Volume types ``spec.podTemplate.volumes`` may use unless the cluster admin widens the list
(chart value ``podSecurity.allowedVolumeTypes``): the Pod Security Standard "restricted" set.
``hostPath`` (the node's files, the container runtime's socket) is not among them."""

ALLOWED_VOLUME_TYPES_ENV = "TRAINJOB_ALLOWED_VOLUME_TYPES"
"""JSON list of volume types (chart value ``podSecurity.allowedVolumeTypes``)."""
MAX_PODS_PER_JOB_ENV = "TRAINJOB_MAX_PODS_PER_JOB"
"""A positive integer (chart value ``limits.maxPodsPerTrainJob``)."""
READ_ONLY_ROOT_FILESYSTEM_ENV = "TRAINJOB_READ_ONLY_ROOT_FILESYSTEM"
"""``true``/``false`` (chart value ``podSecurity.readOnlyRootFilesystem``)."""

_PROCESS_RAY_AUTH_KEY = secrets.token_bytes(32)
"""This process's key for the per-job Ray tokens (see :mod:`trainjob_operator.render.security`).
"""

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


def check_node_selector(value: object, what: str) -> dict[str, str]:
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


def check_tolerations(value: object, what: str) -> list[dict[str, Any]]:
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
        allowed_volume_types: volume types ``spec.podTemplate.volumes`` may use
            (:data:`DEFAULT_ALLOWED_VOLUME_TYPES`; chart ``podSecurity.allowedVolumeTypes``).
        read_only_root_filesystem: containers get ``readOnlyRootFilesystem: true`` (``/tmp``,
            where Ray keeps its session, is an emptyDir); chart
            ``podSecurity.readOnlyRootFilesystem``.
        ray_auth_key: the key the per-job Ray tokens are derived from (random per process;
            never logged).
        max_pods_per_job: the most pods one TrainJob may ask for (head, driver, workers and
            the validation pool's ``maxReplicas``); a job over it fails (chart
            ``limits.maxPodsPerTrainJob``).
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
    allowed_volume_types: frozenset[str] = DEFAULT_ALLOWED_VOLUME_TYPES
    read_only_root_filesystem: bool = True
    ray_auth_key: bytes = field(default=_PROCESS_RAY_AUTH_KEY, repr=False)
    max_pods_per_job: int = 2000

    def __post_init__(self) -> None:
        if self.max_pods_per_job < 1:
            raise ValueError(
                f"RenderOptions.max_pods_per_job must be >= 1, got {self.max_pods_per_job}"
            )
        if self.validation_slots < 1:
            raise ValueError(
                f"RenderOptions.validation_slots must be >= 1, got {self.validation_slots}"
            )
        for attr in ("tpu_node_selector", "validation_node_selector"):
            selector = check_node_selector(getattr(self, attr), f"RenderOptions.{attr}")
            for key, why in _OPERATOR_OWNED_SELECTORS[attr].items():
                if key in selector:
                    raise ValueError(
                        f"RenderOptions.{attr}[{key!r}]: the operator sets this label ({why}); "
                        "remove it from the defaults"
                    )
        for attr in ("tpu_tolerations", "validation_tolerations"):
            check_tolerations(getattr(self, attr), f"RenderOptions.{attr}")


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

RESOURCES_ENV: dict[str, tuple[str, str]] = {
    "TRAINJOB_DEFAULT_HEAD_RESOURCES": ("head_resources", "defaults.head.resources"),
    "TRAINJOB_DEFAULT_DRIVER_RESOURCES": ("driver_resources", "defaults.driver.resources"),
}
"""Env var (a JSON object of resource quantities, set by the Helm chart) -> (:class:`RenderOptions`
field, chart value). Unset, empty or ``{}`` keeps the built-in default (1 CPU, 2Gi)."""

_RESOURCE_MAP = TypeAdapter(ResourceMap)
MIN_RAY_POD_MEMORY_BYTES = 512 * 2**20
"""The least memory :data:`RESOURCES_ENV` may give a head or driver pod: both run a Ray node, and
``ray start`` refuses an object store under 75 MiB (30% of the free memory, a limit of 256Mi
was measured to fail)."""


def _resources_from_env(env: Mapping[str, str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for var, (attr, chart_value) in RESOURCES_ENV.items():
        text = env.get(var, "").strip()
        if not text:
            continue
        hint = (
            'set it to a JSON object such as {"cpu": "1", "memory": "2Gi"} '
            f"(chart value {chart_value})"
        )
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"{var}: not valid JSON ({exc}); {hint}") from None
        if not value:
            continue
        if not isinstance(value, dict):
            raise ValueError(f"{var}: expected a JSON object, got {text!r}; {hint}")
        try:
            values[attr] = dict(_RESOURCE_MAP.validate_python(value))
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
            )
            raise ValueError(f"{var}: {problems}; {hint}") from None
        memory = values[attr].get("memory")
        if memory is not None and parse_quantity(memory) < MIN_RAY_POD_MEMORY_BYTES:
            raise ValueError(
                f"{var}: memory {memory} is less than 512Mi, the least a pod running a Ray node "
                "starts with (the memory is also the pod's limit, and Ray's object store takes "
                f"30% of what is free, at least 75 MiB); {hint}"
            )
    return values


def _pod_security_from_env(env: Mapping[str, str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    text = env.get(ALLOWED_VOLUME_TYPES_ENV, "").strip()
    if text:
        try:
            types = json.loads(text)
        except ValueError:
            types = None
        if not isinstance(types, list) or not all(isinstance(t, str) and t for t in types):
            raise ValueError(
                f"{ALLOWED_VOLUME_TYPES_ENV}: expected a JSON list of volume type names such as "
                f'["configMap", "secret"], got {text!r} (chart value '
                "podSecurity.allowedVolumeTypes)"
            )
        values["allowed_volume_types"] = frozenset(types)
    flag = env.get(READ_ONLY_ROOT_FILESYSTEM_ENV, "").strip().lower()
    if flag:
        if flag not in ("true", "false"):
            raise ValueError(
                f"{READ_ONLY_ROOT_FILESYSTEM_ENV}: expected true or false, got {flag!r} "
                "(chart value podSecurity.readOnlyRootFilesystem)"
            )
        values["read_only_root_filesystem"] = flag == "true"
    budget = env.get(MAX_PODS_PER_JOB_ENV, "").strip()
    if budget:
        if not budget.isdigit() or int(budget) < 1:
            raise ValueError(
                f"{MAX_PODS_PER_JOB_ENV}: expected a positive integer, got {budget!r} (chart "
                "value limits.maxPodsPerTrainJob)"
            )
        values["max_pods_per_job"] = int(budget)
    return values


def render_options_from_env(environ: Mapping[str, str] | None = None) -> RenderOptions:
    """:class:`RenderOptions` with the operator-wide pod defaults of :data:`DEFAULTS_ENV` and
    :data:`RESOURCES_ENV`.

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
    values: dict[str, Any] = {**_pod_security_from_env(env), **_resources_from_env(env)}
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
                values[attr] = tuple(check_tolerations(value, var))
            else:
                values[attr] = check_node_selector(value, var)
            RenderOptions(**{attr: values[attr]})  # the ownership checks
        except ValueError as exc:
            message = str(exc).replace(f"RenderOptions.{attr}", var)
            raise ValueError(f"{message} (chart value {chart_value})") from None
    return RenderOptions(**values)
