"""``spec.podTemplate``: the user's overrides merged into every pod the operator creates.

``spec.podTemplate`` is free-form in the CRD (``x-kubernetes-preserve-unknown-fields``), so it is
checked here: only the keys in :data:`POD_TEMPLATE_KEYS` are accepted (flat, not nested under
``metadata``/``spec``), and anything else is rejected with a ``ValueError`` naming
``spec.podTemplate.<key>``. The overrides apply to all pods of the job (head, workers, validation
pool, driver):

- ``labels``, ``annotations``: added to the pod metadata. Keys the operator owns
  (``trainjob.dev/*``, ``kueue.x-k8s.io/*``, ``app.kubernetes.io/name``,
  ``app.kubernetes.io/managed-by``) are rejected.
- ``nodeSelector``: merged; a key the operator sets to another value (the TPU selectors, the spot
  selector of the validation pool) is rejected.
- ``tolerations``, ``imagePullSecrets``, ``volumes``: appended (volume names must be unique; the
  operator's volumes, :data:`OPERATOR_VOLUMES`, are reserved). A volume's type must be in the
  allow-list (:data:`~trainjob_operator.render.options.DEFAULT_ALLOWED_VOLUME_TYPES`:
  configMap, secret, emptyDir, persistentVolumeClaim, projected, downwardAPI, csi, ephemeral;
  the cluster admin widens it with the chart value ``podSecurity.allowedVolumeTypes``):
  ``hostPath`` and the other node-level types are refused by default.
- ``volumeMounts``, ``envFrom``: appended to the main container; mounts must name a volume from
  ``volumes``; the operator's mount paths (``/dev/shm``, ``/tmp``) are reserved.
- ``affinity``: ``nodeAffinity`` is taken as is; ``podAffinity`` and ``podAntiAffinity`` terms are
  appended to the operator's (TPU slice placement).
- ``priorityClassName``, ``schedulerName``, ``terminationGracePeriodSeconds``: set as is.
- ``securityContext``: pod-level ``runAsUser``, ``runAsGroup``, ``fsGroup`` (none of them 0),
  ``fsGroupChangePolicy``, ``supplementalGroups`` (not containing 0) override the defaults; the
  container stays ``runAsNonRoot``, without privilege escalation and capabilities.

Control-plane nodes are out of reach: ``nodeSelector`` keys, toleration keys and
``nodeAffinity`` ``In``/``Exists`` expressions naming :data:`CONTROL_PLANE_LABELS` are refused,
and so is a toleration without a ``key`` and with ``operator: Exists`` (it tolerates every
taint, the control plane's included).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trainjob_operator.api.errors import yaml_type
from trainjob_operator.constants import LABEL_PREFIX
from trainjob_operator.render.options import DEFAULT_ALLOWED_VOLUME_TYPES

__all__ = [
    "CONTROL_PLANE_LABELS",
    "OPERATOR_VOLUMES",
    "POD_TEMPLATE_KEYS",
    "RESERVED_LABEL_KEYS",
    "RESERVED_LABEL_PREFIXES",
    "PodTemplateOverrides",
    "parse_pod_template",
    "validate_pod_template",
]

POD_TEMPLATE_KEYS: dict[str, str] = {
    "labels": "labels added to every pod",
    "annotations": "annotations added to every pod",
    "nodeSelector": "node selector merged into every pod's",
    "tolerations": "tolerations appended to every pod's",
    "affinity": "nodeAffinity, podAffinity and podAntiAffinity merged into every pod's",
    "volumes": "volumes added to every pod",
    "volumeMounts": "volume mounts added to the main container",
    "envFrom": "envFrom sources added to the main container",
    "imagePullSecrets": "image pull secrets of every pod",
    "priorityClassName": "priority class of every pod",
    "schedulerName": "scheduler of every pod",
    "terminationGracePeriodSeconds": "termination grace period of every pod",
    "securityContext": (
        "pod securityContext: runAsUser, runAsGroup, fsGroup, fsGroupChangePolicy, "
        "supplementalGroups"
    ),
}
"""The accepted ``spec.podTemplate`` keys and what each one does."""

RESERVED_LABEL_PREFIXES = (LABEL_PREFIX, "kueue.x-k8s.io/")
"""Label and annotation key prefixes owned by the operator."""
RESERVED_LABEL_KEYS = frozenset({"app.kubernetes.io/name", "app.kubernetes.io/managed-by"})
"""Label keys owned by the operator."""

OPERATOR_VOLUMES: dict[str, str] = {
    "dshm": "/dev/shm",
    "tmp": "/tmp",
    "driver-api-token": "/var/run/secrets/kubernetes.io/serviceaccount",
}
"""Volumes the operator adds to its pods (name -> mount path): ``/dev/shm`` in memory (Ray's
object store) and ``/tmp`` (Ray's session folder; the root filesystem is read-only) in every
pod; the driver's API token where the driver runs as the storage ServiceAccount."""

CONTROL_PLANE_LABELS = ("node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master")
"""Node label (and taint) keys of control-plane nodes, which no TrainJob pod may target."""

_SECURITY_CONTEXT_KEYS = (
    "runAsUser",
    "runAsGroup",
    "fsGroup",
    "fsGroupChangePolicy",
    "supplementalGroups",
)
_AFFINITY_KEYS = ("nodeAffinity", "podAffinity", "podAntiAffinity")

_HINTS: dict[str, str] = {
    "env": "set environment variables in spec.env",
    "resources": (
        "set resources in spec.scaling.resourcesPerWorker, spec.ray.head.resources or "
        "spec.validation.pool.resources"
    ),
    "image": "set the image in spec.image",
    "serviceAccountName": "set spec.storage.serviceAccountName",
    "serviceAccount": "set spec.storage.serviceAccountName",
    "metadata": "write the keys flat, e.g. spec.podTemplate.labels",
    "spec": "write the keys flat, e.g. spec.podTemplate.tolerations",
    "containers": "the operator owns the containers; use volumeMounts or envFrom",
    "command": "the operator owns the command; the train function is spec.entrypoint",
}


@dataclass(frozen=True)
class PodTemplateOverrides:
    """A checked ``spec.podTemplate``: every field empty/``None`` when not given.

    Values are private deep copies; callers must copy them again before mutating.
    """

    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    affinity: dict[str, Any] = field(default_factory=dict)
    volumes: list[dict[str, Any]] = field(default_factory=list)
    volume_mounts: list[dict[str, Any]] = field(default_factory=list)
    env_from: list[dict[str, Any]] = field(default_factory=list)
    image_pull_secrets: list[dict[str, Any]] = field(default_factory=list)
    priority_class_name: str | None = None
    scheduler_name: str | None = None
    termination_grace_period_seconds: int | None = None
    security_context: dict[str, Any] = field(default_factory=dict)


def _where(key: str) -> str:
    return f"spec.podTemplate.{key}"


def _string_map(key: str, value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise ValueError(f"{_where(key)}: expected a mapping of strings, got {yaml_type(value)}")
    out: dict[str, str] = {}
    for k, v in value.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise ValueError(
                f"{_where(key)}[{k!r}]: keys and values must be strings, got {yaml_type(v)} "
                "(quote numbers and booleans in YAML)"
            )
        out[k] = v
    return out


def _reserved(key: str) -> bool:
    return key in RESERVED_LABEL_KEYS or key.startswith(RESERVED_LABEL_PREFIXES)


def _metadata_map(key: str, value: Any) -> dict[str, str]:
    out = _string_map(key, value)
    for k in out:
        if _reserved(k):
            hint = " (use spec.queueName for Kueue)" if k.startswith("kueue.x-k8s.io/") else ""
            raise ValueError(f"{_where(key)}[{k!r}]: this key is set by the operator{hint}")
    return out


def _map_list(key: str, value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise ValueError(f"{_where(key)}: expected a list of mappings, got {yaml_type(value)}")
    for index, item in enumerate(value):
        if not isinstance(item, Mapping):
            raise ValueError(f"{_where(key)}[{index}]: expected a mapping, got {yaml_type(item)}")
    return [copy.deepcopy(dict(item)) for item in value]


def _named_list(key: str, value: Any) -> list[dict[str, Any]]:
    items = _map_list(key, value)
    for index, item in enumerate(items):
        if not isinstance(item.get("name"), str) or not item["name"]:
            raise ValueError(f"{_where(key)}[{index}].name: required (a string)")
    return items


def _volumes(value: Any, allowed_types: frozenset[str]) -> list[dict[str, Any]]:
    items = _named_list("volumes", value)
    seen: set[str] = set()
    for index, item in enumerate(items):
        name = item["name"]
        where = f"{_where('volumes')}[{index}]"
        if name in OPERATOR_VOLUMES:
            raise ValueError(
                f"{where}.name: {name!r} is the operator's {OPERATOR_VOLUMES[name]} volume; "
                "choose another name"
            )
        if name in seen:
            raise ValueError(f"{where}.name: {name!r} is used twice")
        seen.add(name)
        types = [key for key in item if key != "name"]
        if len(types) != 1:
            raise ValueError(
                f"{where}: a volume has exactly one type besides its name, got "
                f"{', '.join(types) or 'none'}"
            )
        if types[0] not in allowed_types:
            raise ValueError(
                f"{where}.{types[0]}: this volume type is not allowed; allowed: "
                f"{', '.join(sorted(allowed_types))} (hint: a cluster admin can widen the list "
                "with the chart value podSecurity.allowedVolumeTypes)"
            )
    return items


def _volume_mounts(value: Any, volumes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    items = _named_list("volumeMounts", value)
    names = {v["name"] for v in volumes}
    for index, item in enumerate(items):
        if item["name"] not in names:
            raise ValueError(
                f"{_where('volumeMounts')}[{index}].name: no volume {item['name']!r} in "
                f"{_where('volumes')}"
            )
        path = item.get("mountPath")
        if not isinstance(path, str) or not path:
            raise ValueError(f"{_where('volumeMounts')}[{index}].mountPath: required (a string)")
        reserved = set(OPERATOR_VOLUMES.values())
        if path.rstrip("/") in reserved:
            raise ValueError(
                f"{_where('volumeMounts')}[{index}].mountPath: {path} is mounted by the operator; "
                f"use another path (reserved: {', '.join(sorted(reserved))})"
            )
    return items


def _node_selector(value: Any) -> dict[str, str]:
    out = _string_map("nodeSelector", value)
    for key in out:
        if key in CONTROL_PLANE_LABELS:
            raise ValueError(
                f"{_where('nodeSelector')}[{key!r}]: TrainJob pods may not run on control-plane "
                "nodes; remove this key"
            )
    return out


def _tolerations(value: Any) -> list[dict[str, Any]]:
    items = _map_list("tolerations", value)
    for index, item in enumerate(items):
        key = item.get("key")
        where = f"{_where('tolerations')}[{index}]"
        if key in CONTROL_PLANE_LABELS:
            raise ValueError(
                f"{where}.key: TrainJob pods may not tolerate the control-plane taint {key!r}"
            )
        if not key and item.get("operator") == "Exists":
            raise ValueError(
                f"{where}: a toleration without a key and with operator Exists tolerates every "
                "taint, the control plane's included; name the taint's key"
            )
    return items


def _check_node_affinity(node_affinity: Mapping[str, Any]) -> None:
    where = f"{_where('affinity')}.nodeAffinity"
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = list(required.get("nodeSelectorTerms") or []) if isinstance(required, Mapping) else []
    for preferred in node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution") or []:
        if isinstance(preferred, Mapping) and isinstance(preferred.get("preference"), Mapping):
            terms.append(preferred["preference"])
    for term in terms:
        if not isinstance(term, Mapping):
            continue
        for expression in term.get("matchExpressions") or []:
            if not isinstance(expression, Mapping):
                continue
            if expression.get("key") in CONTROL_PLANE_LABELS and expression.get("operator") in (
                "In",
                "Exists",
            ):
                raise ValueError(
                    f"{where}: an expression selects control-plane nodes "
                    f"({expression.get('key')} {expression.get('operator')}); TrainJob pods may "
                    "not run there (NotIn/DoesNotExist are accepted)"
                )


def _affinity(value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"{_where('affinity')}: expected a mapping, got {yaml_type(value)}")
    out: dict[str, Any] = {}
    for k, v in value.items():
        if k not in _AFFINITY_KEYS:
            raise ValueError(
                f"{_where('affinity')}.{k}: unknown key; accepted: {', '.join(_AFFINITY_KEYS)}"
            )
        if not isinstance(v, Mapping):
            raise ValueError(f"{_where('affinity')}.{k}: expected a mapping, got {yaml_type(v)}")
        if k == "nodeAffinity":
            _check_node_affinity(v)
        else:
            for term_key, terms in v.items():
                if not isinstance(terms, list):
                    raise ValueError(
                        f"{_where('affinity')}.{k}.{term_key}: expected a list, got "
                        f"{yaml_type(terms)}"
                    )
        out[k] = copy.deepcopy(dict(v))
    return out


def _security_context(value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"{_where('securityContext')}: expected a mapping, got {yaml_type(value)}")
    out: dict[str, Any] = {}
    for k, v in value.items():
        where = f"{_where('securityContext')}.{k}"
        if k not in _SECURITY_CONTEXT_KEYS:
            raise ValueError(
                f"{where}: not accepted; accepted keys: {', '.join(_SECURITY_CONTEXT_KEYS)} "
                "(pods always run as non-root without privilege escalation)"
            )
        if k == "fsGroupChangePolicy":
            if v not in ("Always", "OnRootMismatch"):
                raise ValueError(f"{where}: must be Always or OnRootMismatch, got {v!r}")
        elif k == "supplementalGroups":
            if not isinstance(v, list) or not all(_is_int(g) and g >= 0 for g in v):
                raise ValueError(f"{where}: expected a list of non-negative integers")
            if 0 in v:
                raise ValueError(f"{where}: pods must not join the root group (gid 0); remove 0")
        elif not _is_int(v) or v < 0:
            raise ValueError(f"{where}: expected a non-negative integer, got {v!r}")
        elif k == "runAsUser" and v == 0:
            raise ValueError(f"{where}: pods must not run as root (uid 0)")
        elif v == 0:
            raise ValueError(f"{where}: pods must not use the root group (gid 0)")
        out[k] = copy.deepcopy(v)
    return out


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _string(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{_where(key)}: expected a non-empty string, got {yaml_type(value)}")
    return value


def parse_pod_template(
    data: Mapping[str, Any] | None,
    allowed_volume_types: frozenset[str] = DEFAULT_ALLOWED_VOLUME_TYPES,
) -> PodTemplateOverrides:
    """Check ``spec.podTemplate`` and return it as :class:`PodTemplateOverrides`.

    ``allowed_volume_types``: the volume types ``volumes`` may use
    (``RenderOptions.allowed_volume_types``).

    Raises:
        ValueError: for an unknown key (message ``spec.podTemplate.<key>: ...`` listing the
            accepted keys, with a hint where another field is meant) or a malformed value.
    """
    data = data or {}
    for key in data:
        if key not in POD_TEMPLATE_KEYS:
            hint = _HINTS.get(str(key))
            accepted = ", ".join(POD_TEMPLATE_KEYS)
            text = f"{_where(str(key))}: unknown key; accepted keys: {accepted}"
            raise ValueError(f"{text} (hint: {hint})" if hint else text)
    volumes = _volumes(data["volumes"], allowed_volume_types) if "volumes" in data else []
    grace = data.get("terminationGracePeriodSeconds")
    if grace is not None and (not _is_int(grace) or grace < 0):
        raise ValueError(
            f"{_where('terminationGracePeriodSeconds')}: expected a non-negative integer, "
            f"got {grace!r}"
        )
    return PodTemplateOverrides(
        labels=_metadata_map("labels", data["labels"]) if "labels" in data else {},
        annotations=(
            _metadata_map("annotations", data["annotations"]) if "annotations" in data else {}
        ),
        node_selector=(_node_selector(data["nodeSelector"]) if "nodeSelector" in data else {}),
        tolerations=_tolerations(data["tolerations"]) if "tolerations" in data else [],
        affinity=_affinity(data["affinity"]) if "affinity" in data else {},
        volumes=volumes,
        volume_mounts=(
            _volume_mounts(data["volumeMounts"], volumes) if "volumeMounts" in data else []
        ),
        env_from=_map_list("envFrom", data["envFrom"]) if "envFrom" in data else [],
        image_pull_secrets=(
            _named_list("imagePullSecrets", data["imagePullSecrets"])
            if "imagePullSecrets" in data
            else []
        ),
        priority_class_name=(
            _string("priorityClassName", data["priorityClassName"])
            if "priorityClassName" in data
            else None
        ),
        scheduler_name=(
            _string("schedulerName", data["schedulerName"]) if "schedulerName" in data else None
        ),
        termination_grace_period_seconds=grace,
        security_context=(
            _security_context(data["securityContext"]) if "securityContext" in data else {}
        ),
    )


def validate_pod_template(
    data: Mapping[str, Any] | None,
    allowed_volume_types: frozenset[str] = DEFAULT_ALLOWED_VOLUME_TYPES,
) -> None:
    """Raise ``ValueError`` (naming ``spec.podTemplate.<key>``) when ``data`` is not accepted.

    The reconciler can call it to report a bad podTemplate as a condition before rendering.
    """
    parse_pod_template(data, allowed_volume_types)
