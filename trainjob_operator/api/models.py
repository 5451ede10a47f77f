"""The TrainJob API (``trainjob.dev/v1alpha1``) as pydantic v2 models.

These models are the single source of truth: the CRD schema (:mod:`trainjob_operator.api.crd`),
``trainjob validate``, ``trainjob run`` and the operator all use them. Field names are snake_case
in Python and camelCase in YAML/JSON (aliases). Manifests are parsed by the camelCase names
only (:func:`parse_trainjob`), as the API server does: its structural schema would silently drop
a snake_case key, so ``trainjob validate``/``run`` reject one, naming the camelCase spelling.
Python code may still construct the models by field name. Unknown fields are rejected
everywhere except in the free-form fields (``spec.config``, ``spec.podTemplate``,
``spec.validation.config``, tolerations, ``valueFrom`` and metrics).

Besides the models this module provides the manifest loading helpers:

- :func:`load_documents` / :func:`load_trainjobs` parse (multi-document) YAML;
- :func:`parse_trainjob` validates one already-parsed object (e.g. a kopf body);
- :func:`field_errors` turns a pydantic ``ValidationError`` into :class:`FieldError` tuples with
  camelCase paths such as ``spec.scaling.tpu.topology``, a message and an optional hint.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import sys
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple, Union

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    ValidationError,
    WithJsonSchema,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from trainjob_operator.api.quantity import QUANTITY_PATTERN, QUANTITY_RE
from trainjob_operator.api.tpu import (
    ACCELERATOR_ALIASES,
    GKE_TPU_RESOURCE,
    TpuSliceShape,
    get_generation,
    slice_shape,
)
from trainjob_operator.constants import API_VERSION, GROUP, KIND, PLURAL

__all__ = [
    "API_GROUP",
    "API_VERSION",
    "DEFAULT_IMAGE",
    "DEFAULT_RAY_VERSION",
    "ENTRYPOINT_PATTERN",
    "KIND",
    "MAX_NAME_LENGTH",
    "PLURAL",
    "QUANTITY_PATTERN",
    "ApiModel",
    "BestCheckpointSummary",
    "CheckpointConfig",
    "CheckpointSummary",
    "Condition",
    "ConditionType",
    "EnvVar",
    "FailureConfig",
    "FieldError",
    "LoadedDocument",
    "ManifestError",
    "ObjectMeta",
    "Phase",
    "ProgressStatus",
    "RayConfig",
    "RayHeadConfig",
    "Reason",
    "ScalingConfig",
    "StorageConfig",
    "TpuConfig",
    "TrainJob",
    "TrainJobSpec",
    "TrainJobStatus",
    "ValidationConfig",
    "ValidationPoolConfig",
    "ValidationPoolStatus",
    "ValidationsStatus",
    "WorkersStatus",
    "field_errors",
    "load_documents",
    "load_trainjobs",
    "parse_trainjob",
    "split_entrypoint",
]

API_GROUP = GROUP
"""The API group of the TrainJob resource (``trainjob_operator.constants.GROUP``)."""
DEFAULT_IMAGE = "ghcr.io/trainjob-dev/trainjob-runtime:0.1.0"
"""Container image used for the Ray head, workers and validation pool when ``spec.image`` is
omitted: Python 3.11 with ``trainjob-operator[runtime]`` (Ray 2.60) installed."""
DEFAULT_RAY_VERSION = "2.60.0"
"""Ray version the runtime image ships; ``spec.ray.version`` defaults to it."""
MAX_NAME_LENGTH = 40
"""Longest TrainJob name accepted: child objects append suffixes such as ``-s0-h15`` and
``-headless`` and must stay within the 63-character DNS label limit."""

_DOTTED = r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*"
ENTRYPOINT_PATTERN = rf"^{_DOTTED}:{_DOTTED}$"
"""``package.module:function`` (the attribute part may be dotted: ``pkg.mod:Class.method``)."""
_RESOURCE_NAME_PATTERN = (
    r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
_NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
_ENV_NAME_PATTERN = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
_GCS_BUCKET = r"[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]"
STORAGE_PATH_PATTERN = rf"^(gs://{_GCS_BUCKET}(/.*)?|/.*)$"
"""``gs://bucket[/prefix]`` or an absolute path."""
_CONDITION_REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"

_ENTRYPOINT_RE = re.compile(ENTRYPOINT_PATTERN)
_RESOURCE_NAME_RE = re.compile(_RESOURCE_NAME_PATTERN)
_NAME_RE = re.compile(_NAME_PATTERN)
_ENV_NAME_RE = re.compile(_ENV_NAME_PATTERN)
_GCS_BUCKET_RE = re.compile(rf"^{_GCS_BUCKET}$")


# --------------------------------------------------------------------------- helpers / types


def _error(message: str, hint: str | None = None, field: str | None = None) -> PydanticCustomError:
    """A validation error with a clean message, an optional hint and an optional sub-field.

    ``field`` (a camelCase name relative to the model being validated) is appended to the error
    location by :func:`field_errors`, so model-level checks can point at the offending field.
    """
    ctx: dict[str, Any] = {"message": message}
    if hint:
        ctx["hint"] = hint
    if field:
        ctx["field"] = field
    return PydanticCustomError("trainjob", "{message}", ctx)


def split_entrypoint(entrypoint: str) -> tuple[str, str]:
    """Split ``package.module:function`` into ``("package.module", "function")``.

    Raises:
        ValueError: if ``entrypoint`` does not have that form.
    """
    if not _ENTRYPOINT_RE.match(entrypoint):
        raise ValueError(f"entrypoint must look like 'package.module:function', got {entrypoint!r}")
    module, _, attr = entrypoint.partition(":")
    return module, attr


def _check_entrypoint(value: str) -> str:
    if _ENTRYPOINT_RE.match(value):
        return value
    hint = "the module must be importable in the image; the function takes (config)"
    module, sep, attr = value.partition(":")
    if sep and ("/" in module or module.endswith(".py")):
        dotted = module.removesuffix(".py").strip("./").replace("/", ".")
        hint = f"write a module path, not a file path: '{dotted}:{attr}'"
    elif not sep and "." in value:
        mod, _, func = value.rpartition(".")
        hint = f"separate the function with a colon: '{mod}:{func}'"
    raise _error(
        f"must look like 'package.module:function', got {value!r}",
        hint=hint,
    )


Entrypoint = Annotated[
    str,
    AfterValidator(_check_entrypoint),
    WithJsonSchema({"type": "string", "pattern": ENTRYPOINT_PATTERN}),
]
"""A ``package.module:function`` reference."""

_QUANTITY_HINT = "use a Kubernetes quantity such as 2, '500m', '4Gi' or '1.5G'"


def _check_quantity(value: object) -> int | str:
    if isinstance(value, bool):
        raise _error(f"{value!r} is not a resource quantity", hint=_QUANTITY_HINT)
    if isinstance(value, int):
        if value < 0:
            raise _error(f"quantity must not be negative, got {value}")
        return value
    if isinstance(value, float):
        raise _error(
            f"fractional numbers must be quoted strings, got {value!r}",
            hint=f"write '{value:g}' or use milli-units such as '{round(value * 1000)}m'",
        )
    if isinstance(value, str):
        if QUANTITY_RE.match(value):
            return value
        if value.startswith("-"):
            raise _error(f"quantity must not be negative, got {value!r}")
        match = re.fullmatch(r"([0-9.]+)\s*([KMGTPE])i?B", value, flags=re.IGNORECASE)
        hint = _QUANTITY_HINT
        if match:
            hint = f"write '{match.group(1)}{match.group(2).upper()}i' (binary) or "
            hint += f"'{match.group(1)}{match.group(2).upper()}' (decimal)"
        raise _error(f"{value!r} is not a Kubernetes resource quantity", hint=hint)
    raise _error(f"expected a resource quantity, got {type(value).__name__}", hint=_QUANTITY_HINT)


Quantity = Annotated[
    int | str,
    PlainValidator(_check_quantity),
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": QUANTITY_PATTERN,
            "x-kubernetes-int-or-string": True,
        }
    ),
]
"""A Kubernetes resource quantity: a non-negative integer or a string like ``"500m"``."""


def _check_resource_name(value: str) -> str:
    if _RESOURCE_NAME_RE.match(value):
        return value
    raise _error(
        f"{value!r} is not a valid resource name",
        hint="use names such as cpu, memory, nvidia.com/gpu or google.com/tpu",
    )


ResourceName = Annotated[str, AfterValidator(_check_resource_name)]
ResourceMap = dict[ResourceName, Quantity]
"""Resource name -> quantity, e.g. ``{cpu: "4", memory: 16Gi}``."""

FreeForm = Annotated[
    dict[str, Any],
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]
"""An arbitrary mapping, kept as is (``x-kubernetes-preserve-unknown-fields``)."""


def _no_default(schema: dict[str, Any]) -> None:
    """``json_schema_extra`` hook: keep a Python default out of the CRD (no server defaulting)."""
    schema.pop("default", None)


class ApiModel(BaseModel):
    """Base of all TrainJob API models: camelCase aliases, unknown fields rejected."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        serialize_by_alias=True,
        extra="forbid",
    )

    def to_dict(self) -> dict[str, Any]:
        """JSON-compatible camelCase dict without ``None`` fields (for YAML, patches, the API)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


# --------------------------------------------------------------------------- metadata


class ObjectMeta(BaseModel):
    """The subset of Kubernetes ObjectMeta the TrainJob tooling reads; other fields are kept."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        serialize_by_alias=True,
        extra="allow",
    )

    name: str = Field(description="Object name; also the prefix of every child object.")
    namespace: str | None = Field(
        default=None, description="Namespace (the current one when omitted)."
    )
    labels: dict[str, str] = Field(default_factory=dict, description="Labels.")
    annotations: dict[str, str] = Field(default_factory=dict, description="Annotations.")
    uid: str | None = Field(default=None, description="Set by the API server.")
    generation: int | None = Field(default=None, description="Set by the API server.")
    resource_version: str | None = Field(default=None, description="Set by the API server.")
    creation_timestamp: str | None = Field(default=None, description="Set by the API server.")

    @model_validator(mode="after")
    def _check_name(self) -> ObjectMeta:
        if len(self.name) > MAX_NAME_LENGTH:
            raise _error(
                f"name {self.name!r} is {len(self.name)} characters long; at most "
                f"{MAX_NAME_LENGTH} are allowed",
                hint="child pods and services append suffixes and must fit in 63 characters",
                field="name",
            )
        if not _NAME_RE.match(self.name):
            raise _error(
                f"name {self.name!r} must consist of lowercase letters, digits and '-', start "
                "with a letter and end with a letter or digit",
                field="name",
            )
        return self

    def to_dict(self) -> dict[str, Any]:
        """JSON-compatible camelCase dict without ``None`` fields."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


# --------------------------------------------------------------------------- spec


class EnvVar(ApiModel):
    """An environment variable set in the head, worker and validation containers."""

    name: str = Field(
        description="Variable name.", json_schema_extra={"pattern": _ENV_NAME_PATTERN}
    )
    value: str | None = Field(default=None, description="Literal value (a string: quote numbers).")
    value_from: FreeForm | None = Field(
        default=None,
        description="A Kubernetes EnvVarSource (secretKeyRef, configMapKeyRef, fieldRef...).",
    )

    @model_validator(mode="after")
    def _check(self) -> EnvVar:
        if not _ENV_NAME_RE.match(self.name):
            raise _error(
                f"{self.name!r} is not a valid environment variable name",
                hint="use letters, digits, '_', '-' and '.'; do not start with a digit",
                field="name",
            )
        if self.value is not None and self.value_from is not None:
            raise _error("set either value or valueFrom, not both", field="valueFrom")
        return self


def _topology_hint(tpu: TpuConfig) -> str:
    gen = get_generation(tpu.accelerator_type)
    dims = re.findall(r"[0-9]+", tpu.topology)
    if len(dims) != gen.dimensions:
        example = next(iter(gen.topologies))
        return f"{gen.name} topologies have {gen.dimensions} dimensions, e.g. {example}"
    chips = math.prod(int(d) for d in dims)
    same = [t for t in gen.topologies if math.prod(int(d) for d in t.split("x")) == chips]
    if same:
        return f"{chips} chips: use {' or '.join(same)}"
    return "multi-host slices have 4 chips per host; pick a listed topology"


class TpuConfig(ApiModel):
    """TPU slices for the workers (GKE). Hosts per slice and chips per host are derived."""

    accelerator_type: Literal["v6e", "v5e", "v5p", "v4"] = Field(
        description="TPU generation: v6e (Trillium), v5e (v5litepod), v5p or v4."
    )
    topology: str = Field(
        description=(
            "Chip topology of one slice, as in the GKE node label "
            "cloud.google.com/gke-tpu-topology: v5e/v6e 1x1, 2x2, 2x4, 4x4, 4x8, 8x8, 8x16, "
            "16x16; v4/v5p 2x2x1, 2x2x2, 2x2x4, 2x4x4, 4x4x4, 4x4x8, ..."
        )
    )
    num_slices: int = Field(default=1, ge=1, description="Number of slices (multislice when > 1).")

    @model_validator(mode="after")
    def _check_topology(self) -> TpuConfig:
        try:
            shape = slice_shape(self.accelerator_type, self.topology)
        except ValueError as exc:
            raise _error(str(exc), hint=_topology_hint(self), field="topology") from None
        self.topology = shape.topology
        return self

    @property
    def shape(self) -> TpuSliceShape:
        """The derived shape of one slice (hosts, chips per host, GKE labels...)."""
        return slice_shape(self.accelerator_type, self.topology)

    @property
    def total_hosts(self) -> int:
        """Hosts over all slices: the number of workers."""
        return self.shape.hosts * self.num_slices


class ScalingConfig(ApiModel):
    """How many workers run the train function and what each one gets."""

    num_workers: int = Field(
        default=1,
        ge=0,
        description=(
            "Number of workers. 0 runs the train function in the driver process (local mode). "
            "With tpu set it is one worker per TPU host: omit it (or set 0) to derive "
            "hosts per slice x numSlices; any other value must equal that. Default: 1 without "
            "tpu."
        ),
        json_schema_extra=_no_default,
    )
    resources_per_worker: ResourceMap = Field(
        default_factory=dict,
        description="Resources of each worker (e.g. cpu: '4', memory: 16Gi, nvidia.com/gpu: 1).",
    )
    use_gpu: bool = Field(default=False, description="Give each worker a GPU (nvidia.com/gpu).")
    tpu: TpuConfig | None = Field(default=None, description="Run the workers on GKE TPU slices.")
    placement_timeout_seconds: int | None = Field(
        default=None,
        ge=1,
        description=(
            "Seconds the driver waits for the cluster to grant every worker's resources (with "
            "tpu: to reserve every slice) each time the worker group starts, including restarts "
            "after a worker failure. Past it the run fails at once, without retries (a "
            "configuration error). Default 600; raise it when worker nodes are provisioned on "
            "demand (GKE TPU node pools can take longer). Not failure.startupDeadlineSeconds: "
            "that is the operator's deadline for the job to reach Running and does not cover "
            "worker-group restarts later in the run."
        ),
    )

    @model_validator(mode="after")
    def _check(self) -> ScalingConfig:
        if self.tpu is None:
            return self
        if self.use_gpu:
            raise _error(
                "useGpu and tpu are mutually exclusive",
                hint="remove useGpu for TPU workers, or remove tpu for GPU workers",
                field="useGpu",
            )
        shape = self.tpu.shape
        expected = self.tpu.total_hosts
        if "num_workers" not in self.model_fields_set or self.num_workers == 0:
            self.num_workers = expected
        elif self.num_workers != expected:
            raise _error(
                f"numWorkers is {self.num_workers} but tpu {self.tpu.accelerator_type} "
                f"{shape.topology} has {shape.hosts} host(s) per slice x numSlices "
                f"{self.tpu.num_slices} = {expected} (one worker per TPU host)",
                hint=f"set numWorkers: {expected} or omit it",
                field="numWorkers",
            )
        tpu_request = self.resources_per_worker.get(GKE_TPU_RESOURCE)
        if tpu_request is not None and str(tpu_request) != str(shape.chips_per_host):
            raise _error(
                f"{GKE_TPU_RESOURCE} is {tpu_request} but each {shape.topology} host has "
                f"{shape.chips_per_host} chip(s)",
                hint=f"omit {GKE_TPU_RESOURCE}: it is derived from the topology",
                field=f'resourcesPerWorker["{GKE_TPU_RESOURCE}"]',
            )
        return self

    @property
    def tpu_shape(self) -> TpuSliceShape | None:
        """The TPU slice shape, or ``None`` without TPUs."""
        return None if self.tpu is None else self.tpu.shape


class ValidationPoolConfig(ApiModel):
    """The autoscaled pool of pods that run validation tasks (Ray resource ``validation``)."""

    min_replicas: int = Field(default=0, ge=0, description="Pods kept while idle.")
    max_replicas: int = Field(default=1, ge=1, description="Upper bound of validation pods.")
    resources: ResourceMap = Field(
        default_factory=dict, description="Resources of each validation pod."
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Node selector of the validation pods."
    )
    tolerations: list[FreeForm] = Field(
        default_factory=list, description="Tolerations of the validation pods."
    )
    spot: bool = Field(
        default=True, description="Schedule validation pods on spot (preemptible) nodes."
    )
    idle_seconds: int = Field(
        default=300, ge=0, description="Scale down to minReplicas after this many idle seconds."
    )

    @model_validator(mode="after")
    def _check(self) -> ValidationPoolConfig:
        if self.min_replicas > self.max_replicas:
            raise _error(
                f"minReplicas ({self.min_replicas}) is greater than maxReplicas "
                f"({self.max_replicas})",
                field="minReplicas",
            )
        return self


class ValidationConfig(ApiModel):
    """Checkpoint validation: ``validate(checkpoint, config) -> metrics`` as Ray tasks."""

    entrypoint: Entrypoint = Field(description="The validate function, 'package.module:function'.")
    config: FreeForm | None = Field(
        default=None, description="Passed to the validate function (spec.config when omitted)."
    )
    pool: ValidationPoolConfig = Field(
        default_factory=ValidationPoolConfig, description="The validation pod pool."
    )
    max_concurrent: int = Field(
        default=1, ge=1, description="Validations running at the same time."
    )
    timeout_seconds: int | None = Field(
        default=None, ge=1, description="A validation running longer is recorded as failed."
    )


class CheckpointConfig(ApiModel):
    """How checkpoints are uploaded and which are kept."""

    upload_mode: Literal["async", "sync", "none"] = Field(
        default="async",
        description=(
            "async: report() returns while the checkpoint uploads in the background; sync: "
            "report() waits for the upload; none: the train function writes checkpoints straight "
            "to their storage location (CheckpointUploadMode.NO_UPLOAD)."
        ),
    )
    num_to_keep: int | None = Field(
        default=None, ge=1, description="Keep this many checkpoints (all when omitted)."
    )
    score_attribute: str | None = Field(
        default=None,
        description=(
            "Metric that ranks checkpoints (validation metrics included); the most recent "
            "ones are kept when omitted."
        ),
    )
    score_order: Literal["max", "min"] = Field(
        default="max", description="Whether a higher (max) or lower (min) score is better."
    )


def _check_storage_path(value: str) -> str:
    if value.startswith("gs://"):
        bucket = value.removeprefix("gs://").split("/", 1)[0]
        if not _GCS_BUCKET_RE.match(bucket):
            raise _error(
                f"{bucket!r} is not a valid GCS bucket name",
                hint="bucket names are 3-222 lowercase letters, digits, '-', '_' and '.'",
            )
        return value
    if "://" in value:
        scheme = value.split("://", 1)[0]
        hint = "use gs://bucket/prefix (GCS) or an absolute path on a mounted volume"
        if scheme == "file":
            hint = f"write the absolute path itself: {value.removeprefix('file://')!r}"
        raise _error(f"storage scheme {scheme + '://'!r} is not supported", hint=hint)
    if not value.startswith("/"):
        raise _error(
            f"{value!r} must be gs://bucket/prefix or an absolute path",
            hint="use an absolute path such as /tmp/trainjob-runs or /mnt/checkpoints",
        )
    return value


class StorageConfig(ApiModel):
    """Where checkpoints, the checkpoint manifest and results are written."""

    path: Annotated[str, AfterValidator(_check_storage_path)] = Field(
        description="gs://bucket/prefix or an absolute path (a mounted volume in a cluster).",
        json_schema_extra={"pattern": STORAGE_PATH_PATTERN},
    )
    service_account_name: str | None = Field(
        default=None,
        description="ServiceAccount of the pods (bind it to a GCP service account for GCS).",
    )


class FailureConfig(ApiModel):
    """Retry budgets and deadlines."""

    max_failures: int = Field(
        default=0,
        ge=-1,
        description=(
            "Worker-group restarts inside one run before the run fails; -1 means unlimited."
        ),
    )
    max_restarts: int = Field(
        default=0,
        ge=0,
        description=(
            "Whole-cluster restarts by the operator, resuming from the latest checkpoint."
        ),
    )
    active_deadline_seconds: int | None = Field(
        default=None,
        ge=1,
        description=(
            "The job fails (reason DeadlineExceeded) when this many seconds have passed since "
            "status.startTime, the time its pods were first created, whether it is Starting, "
            "Running or Restarting (as for a Kubernetes Job). Suspended time does not count: "
            "startTime is set again when a suspended job resumes."
        ),
    )
    startup_deadline_seconds: int | None = Field(
        default=None,
        ge=1,
        description=(
            "The job fails when it is not Running this many seconds after status.startTime."
        ),
    )


class RayHeadConfig(ApiModel):
    """The Ray head pod (it runs the driver)."""

    resources: ResourceMap = Field(default_factory=dict, description="Resources of the head pod.")


class RayConfig(ApiModel):
    """The embedded Ray cluster."""

    version: str = Field(default=DEFAULT_RAY_VERSION, description="Ray version of the image.")
    head: RayHeadConfig = Field(default_factory=RayHeadConfig, description="The head pod.")


class TrainJobSpec(ApiModel):
    """The desired state of a TrainJob."""

    image: str = Field(default=DEFAULT_IMAGE, description="Container image of all pods.")
    entrypoint: Entrypoint = Field(
        description="The train function, 'package.module:function'; it receives spec.config."
    )
    config: FreeForm = Field(
        default_factory=dict, description="Free-form config passed to the train function."
    )
    framework: Literal["torch", "jax"] = Field(
        default="torch", description="Sets up torch.distributed or jax.distributed in the workers."
    )
    env: list[EnvVar] = Field(default_factory=list, description="Environment of all containers.")
    pod_template: FreeForm = Field(
        default_factory=dict,
        description=(
            "Free-form overrides merged into the pods the operator creates "
            "(e.g. tolerations, volumes, volumeMounts, nodeSelector, labels, annotations)."
        ),
    )
    queue_name: str | None = Field(
        default=None, description="Kueue LocalQueue; pods are admitted as one gang."
    )
    scaling: ScalingConfig = Field(default_factory=ScalingConfig, description="Workers.")
    validation: ValidationConfig | None = Field(default=None, description="Checkpoint validation.")
    checkpoint: CheckpointConfig = Field(
        default_factory=CheckpointConfig, description="Checkpoint upload and retention."
    )
    storage: StorageConfig | None = Field(
        default=None,
        description="Checkpoint storage (the runtime's default location when omitted).",
    )
    failure: FailureConfig = Field(
        default_factory=FailureConfig, description="Retries and deadlines."
    )
    suspend: bool = Field(
        default=False,
        description="Delete the pods (keeping the checkpoints) while true (Kueue style).",
    )
    ttl_seconds_after_finished: int | None = Field(
        default=None,
        ge=0,
        description="Delete the TrainJob this long after it succeeded or failed.",
    )
    keep_driver_pod: Literal["Always", "OnFailure", "Never"] = Field(
        default="Always",
        description=(
            "Whether the finished job keeps its driver pod (and so its logs, kubectl logs) "
            "when the rest of the cluster is deleted: Always, OnFailure (only when the job "
            "failed) or Never. It is deleted with the TrainJob (ttlSecondsAfterFinished)."
        ),
    )
    ray: RayConfig = Field(default_factory=RayConfig, description="The Ray cluster.")

    @model_validator(mode="after")
    def _check_env(self) -> TrainJobSpec:
        seen: set[str] = set()
        for index, var in enumerate(self.env):
            if var.name in seen:
                raise _error(
                    f"environment variable {var.name!r} is set twice", field=f"env[{index}].name"
                )
            seen.add(var.name)
        return self


# --------------------------------------------------------------------------- status


class Phase(StrEnum):
    """The single derived phase shown in ``kubectl get trainjobs``."""

    PENDING = "Pending"
    STARTING = "Starting"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"

    @property
    def finished(self) -> bool:
        """True for the terminal phases."""
        return self in (Phase.SUCCEEDED, Phase.FAILED)


class ConditionType(StrEnum):
    """``status.conditions[].type`` of a TrainJob (one condition per type)."""

    CREATED = "Created"
    RUNNING = "Running"
    SUSPENDED = "Suspended"
    RESTARTING = "Restarting"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class Reason(StrEnum):
    """CamelCase reasons of TrainJob conditions and of the Events posted on a TrainJob.

    Set by the operator (:mod:`trainjob_operator.reconcile`) and, for ``trainjob run`` and the
    driver's own view of a run, by :class:`trainjob_operator.driver.StatusTracker`.
    """

    # lifecycle
    CREATED = "Created"
    STARTING = "Starting"
    RUNNING = "Running"
    CLUSTER_READY = "ClusterReady"
    SUSPENDED = "Suspended"
    RESUMED = "Resumed"
    SUCCEEDED = "Succeeded"
    DRIVER_SUCCEEDED = "DriverSucceeded"
    TTL_EXPIRED = "TTLExpired"
    # whole-cluster restarts (operator)
    DRIVER_FAILED = "DriverFailed"
    HEAD_FAILED = "HeadFailed"
    HEAD_OR_DRIVER_LOST = "HeadOrDriverLost"
    # failures that no restart can fix (operator)
    INVALID_INPUT = "InvalidInput"
    INVALID_SPEC = "InvalidSpec"
    INVALID_CHILD = "InvalidChild"
    DEADLINE_EXCEEDED = "DeadlineExceeded"
    STARTUP_DEADLINE_EXCEEDED = "StartupDeadlineExceeded"
    # pods replaced in place (operator Events)
    WORKER_POD_LOST = "WorkerPodLost"
    SPEC_CHANGED = "SpecChanged"
    # the runtime's view of a run (driver)
    WORKERS_READY = "WorkersReady"
    WORKER_GROUP_FAILED = "WorkerGroupFailed"
    TRAINING_FAILED = "TrainingFailed"
    TRAINING_FINISHED = "TrainingFinished"


class Condition(ApiModel):
    """A metav1.Condition."""

    type: str = Field(description="Condition type in CamelCase (Ready, Progressing...).")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(
        description="CamelCase reason of the last transition.",
        json_schema_extra={"pattern": _CONDITION_REASON_PATTERN},
    )
    message: str = Field(default="", description="Human readable details.")
    last_transition_time: datetime = Field(description="When status last changed.")
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation the condition was computed from."
    )


class WorkersStatus(ApiModel):
    """Worker pods."""

    ready: int = Field(default=0, ge=0, description="Ready worker pods.")
    desired: int = Field(default=0, ge=0, description="Desired worker pods.")


class ValidationPoolStatus(ApiModel):
    """The validation pool."""

    replicas: int = Field(default=0, ge=0, description="Current validation pods.")


class ProgressStatus(ApiModel):
    """Training progress published by the driver."""

    step: int | None = Field(default=None, ge=0, description="Last reported step (report count).")
    metrics: FreeForm = Field(default_factory=dict, description="Last reported metrics.")
    updated_at: datetime | None = Field(
        default=None, description="When progress was last reported."
    )


class CheckpointSummary(ApiModel):
    """A committed checkpoint."""

    path: str = Field(description="Storage path of the checkpoint.")
    step: int | None = Field(default=None, ge=0, description="Step the checkpoint was reported at.")
    metrics: FreeForm = Field(default_factory=dict, description="Metrics of the checkpoint.")


class BestCheckpointSummary(CheckpointSummary):
    """The best checkpoint by spec.checkpoint.scoreAttribute."""

    score: float | None = Field(default=None, description="Its value of scoreAttribute.")


class ValidationsStatus(ApiModel):
    """Validation task counters."""

    pending: int = Field(default=0, ge=0, description="Waiting for a validation pod.")
    running: int = Field(default=0, ge=0, description="Running.")
    done: int = Field(default=0, ge=0, description="Finished successfully.")
    failed: int = Field(default=0, ge=0, description="Failed or timed out.")


class TrainJobStatus(ApiModel):
    """The observed state of a TrainJob (phase and conditions are owned by the operator)."""

    phase: Phase | None = Field(default=None, description="Derived phase.")
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Conditions, one per type.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
        },
    )
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation the status was computed from."
    )
    start_time: datetime | None = Field(
        default=None,
        description=(
            "When the job's pods were first created (cleared while suspended, set again on "
            "resume); activeDeadlineSeconds counts from it."
        ),
    )
    completion_time: datetime | None = Field(default=None, description="When the job finished.")
    restarts: int = Field(default=0, ge=0, description="Whole-cluster restarts so far.")
    worker_failures: int = Field(
        default=0,
        ge=0,
        description=(
            "Worker-group failures in the driver's current run, each followed by a restart of "
            "the workers from the latest committed checkpoint while failure.maxFailures allows "
            "(published by the driver)."
        ),
    )
    workers: WorkersStatus | None = Field(default=None, description="Worker pods.")
    validation_pool: ValidationPoolStatus | None = Field(
        default=None, description="Validation pool."
    )
    progress: ProgressStatus | None = Field(default=None, description="Training progress.")
    latest_checkpoint: CheckpointSummary | None = Field(
        default=None, description="Latest checkpoint."
    )
    best_checkpoint: BestCheckpointSummary | None = Field(
        default=None, description="Best checkpoint."
    )
    validations: ValidationsStatus | None = Field(default=None, description="Validation tasks.")
    message: str | None = Field(default=None, description="Human readable summary of the state.")

    def condition(self, type_: str) -> Condition | None:
        """The condition of the given type, if present."""
        return next((c for c in self.conditions if c.type == type_), None)

    def condition_true(self, type_: str) -> bool:
        """Whether the condition of the given type is present with status True."""
        found = self.condition(type_)
        return found is not None and found.status == "True"

    def set_condition(
        self,
        type_: str,
        true: bool,
        reason: str,
        message: str,
        generation: int | None,
        now: datetime,
    ) -> None:
        """Set one condition (added when missing); ``lastTransitionTime`` (``now`` in UTC,
        whole seconds) changes only when the condition's status does, ``observedGeneration``
        only when ``generation`` is given."""
        value: Literal["True", "False"] = "True" if true else "False"
        stamp = now.astimezone(UTC).replace(microsecond=0)
        found = self.condition(type_)
        if found is None:
            found = Condition(
                type=type_, status=value, reason=reason, message=message, last_transition_time=stamp
            )
            self.conditions.append(found)
        else:
            if found.status != value:
                found.last_transition_time = stamp
            found.status = value
            found.reason = reason
            found.message = message
        if generation is not None:
            found.observed_generation = generation
        self.conditions = self.conditions  # counts as set (a patch of the status includes it)


class TrainJob(ApiModel):
    """A distributed training job on Ray: train function, workers, checkpoints, validation."""

    api_version: Literal["trainjob.dev/v1alpha1"] = Field(
        default="trainjob.dev/v1alpha1", description="trainjob.dev/v1alpha1"
    )
    kind: Literal["TrainJob"] = Field(default=KIND, description=KIND)
    metadata: ObjectMeta
    spec: TrainJobSpec
    status: TrainJobStatus | None = None

    @property
    def name(self) -> str:
        """``metadata.name``."""
        return self.metadata.name


# --------------------------------------------------------------------------- errors


class FieldError(NamedTuple):
    """One problem in a manifest: a camelCase field path, a message and an optional hint.

    For YAML syntax errors ``path`` is ``"line L, column C"``; for document-level problems it is
    empty.
    """

    path: str
    message: str
    hint: str | None = None

    def format(self) -> str:
        """``path: message (hint: ...)``."""
        text = f"{self.path}: {self.message}" if self.path else self.message
        return f"{text} (hint: {self.hint})" if self.hint else text


def _unwrap(tp: Any) -> Any:
    """Strip ``Annotated`` and ``Optional`` from a type annotation."""
    while True:
        origin = typing.get_origin(tp)
        if origin is Annotated:
            tp = typing.get_args(tp)[0]
        elif origin in (Union, types.UnionType):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            if len(args) != 1:
                return tp
            tp = args[0]
        else:
            return tp


def _as_model(tp: Any) -> type[BaseModel] | None:
    tp = _unwrap(tp)
    return tp if isinstance(tp, type) and issubclass(tp, BaseModel) else None


def _find_field(model: type[BaseModel], key: str) -> tuple[str, Any] | None:
    for name, info in model.model_fields.items():
        if key in (name, info.alias):
            return info.alias or name, info.annotation
    return None


_PLAIN_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


def _walk_loc(model: type[BaseModel] | None, loc: Iterable[int | str]) -> tuple[str, Any]:
    """Render a pydantic ``loc`` with camelCase names; return it and the type found there."""
    path = ""
    tp: Any = model
    for item in loc:
        if isinstance(item, int):
            path += f"[{item}]"
            args = typing.get_args(_unwrap(tp))
            tp = args[0] if args else None
            continue
        cls = _as_model(tp)
        found = _find_field(cls, item) if cls is not None else None
        if found is not None:
            name, tp = found
            path += f".{name}" if path else name
            continue
        key = item if _PLAIN_KEY_RE.match(item) else f'["{item}"]'
        path += f".{key}" if path and not key.startswith("[") else key
        args = typing.get_args(_unwrap(tp))
        origin = typing.get_origin(_unwrap(tp))
        tp = args[1] if origin is dict and len(args) == 2 else None
    return path, tp


def _field_names(model: type[BaseModel]) -> list[str]:
    return [info.alias or name for name, info in model.model_fields.items()]


def _hint_for(err: Mapping[str, Any], parent: type[BaseModel] | None, key: str) -> str | None:
    kind = err["type"]
    value = err.get("input")
    if kind == "extra_forbidden" and parent is not None:
        camel = _camel_case_of(parent, key)
        if camel is not None:
            return (
                f"did you mean {camel!r}? manifests use camelCase field names; the API server "
                "silently drops snake_case ones"
            )
        names = _field_names(parent)
        close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
        listed = "valid fields: " + ", ".join(names)
        return f"did you mean {close[0]!r}? {listed}" if close else listed
    if kind == "string_type" and isinstance(value, int | float | bool):
        return f"quote the value in YAML: '{value}'"
    if kind == "literal_error" and isinstance(value, str) and value in ACCELERATOR_ALIASES:
        return f"write {ACCELERATOR_ALIASES[value]!r}"
    if kind == "literal_error" and key == "apiVersion":
        return f"use apiVersion: {API_VERSION}"
    if kind == "bool_parsing":
        return "use true or false"
    return None


def _camel_case_of(model: type[BaseModel], key: str) -> str | None:
    """The camelCase name of the field whose Python (snake_case) name is ``key``, if any."""
    info = model.model_fields.get(key)
    if info is not None and info.alias and info.alias != key:
        return info.alias
    return None


def _message_for(err: Mapping[str, Any], key: str) -> str:
    kind = err["type"]
    if kind == "extra_forbidden":
        return f"unknown field {key!r}"
    if kind == "missing":
        return "required field is missing"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return f"expected a mapping, got {_yaml_type(err.get('input'))}"
    if kind == "list_type":
        return f"expected a list, got {_yaml_type(err.get('input'))}"
    msg = str(err["msg"])
    for prefix in ("Value error, ", "Assertion failed, "):
        msg = msg.removeprefix(prefix)
    return msg


def _yaml_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


def field_errors(
    exc: ValidationError, model: type[BaseModel] | None = None, prefix: str = ""
) -> list[FieldError]:
    """Turn a pydantic ``ValidationError`` into :class:`FieldError` tuples.

    Paths use the camelCase (YAML) names, e.g. ``spec.scaling.tpu.topology`` or
    ``spec.env[0].name``; model-level checks point at the field they are about.

    Args:
        exc: the error raised by ``model.model_validate``.
        model: the model that was validated (default :class:`TrainJob`); needed to map Python
            names to camelCase and to list the valid fields of unknown-field errors.
        prefix: prepended to every path (e.g. ``"spec"`` when validating a spec alone).
    """
    root = model or TrainJob
    out: list[FieldError] = []
    for err in exc.errors():
        loc = list(err["loc"])
        ctx = err.get("ctx") or {}
        _, parent_tp = _walk_loc(root, loc[:-1])
        key = str(loc[-1]) if loc else ""
        if err["type"] == "extra_forbidden" and loc:
            # Name the unknown key as written (``num_workers``), not the field it resembles.
            path, _ = _walk_loc(root, loc[:-1])
            shown = key if _PLAIN_KEY_RE.match(key) else f'["{key}"]'
            path += f".{shown}" if path and not shown.startswith("[") else shown
        else:
            path, _ = _walk_loc(root, loc)
        sub = ctx.get("field") if err["type"] == "trainjob" else None
        if sub:
            sep = "" if str(sub).startswith("[") or not path else "."
            path = f"{path}{sep}{sub}"
        if prefix:
            path = f"{prefix}.{path}" if path else prefix
        message = _message_for(err, key)
        hint = ctx.get("hint") if err["type"] == "trainjob" else None
        hint = hint or _hint_for(err, _as_model(parent_tp), key)
        out.append(FieldError(path, message, hint))
    return out


class ManifestError(ValueError):
    """A manifest could not be loaded; ``errors`` holds one :class:`FieldError` per problem."""

    def __init__(self, errors: list[FieldError], source: str = "") -> None:
        self.errors = errors
        self.source = source
        lines = [e.format() for e in errors]
        head = f"{source}: " if source else ""
        super().__init__(head + "; ".join(lines))


def _plain(value: Any) -> Any:
    """Deep-copy Mapping/list views (e.g. kopf bodies) into plain dicts and lists."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def parse_trainjob(data: Mapping[str, Any]) -> TrainJob:
    """Validate one parsed TrainJob object (a YAML document or a Kubernetes API body).

    Unlike ``TrainJob.model_validate`` this also requires ``apiVersion`` and ``kind``, as
    ``kubectl apply`` does, accepts any ``Mapping`` (nested mappings included, e.g. a kopf
    ``Body``), and accepts only the camelCase field names: a snake_case key such as
    ``spec.scaling.num_workers`` is an unknown field whose hint names ``numWorkers`` (the API
    server would prune it and use the default).

    Raises:
        ManifestError: with one :class:`FieldError` per problem.
    """
    if not isinstance(data, Mapping):
        raise ManifestError(
            [FieldError("", f"a TrainJob must be a mapping, got {_yaml_type(data)}")]
        )
    errors = [
        FieldError(key, "required field is missing", f"add {key}: {value}")
        for key, value in (("apiVersion", API_VERSION), ("kind", KIND))
        if key not in data
    ]
    try:
        # By alias only: the CRD (and so the API server) knows only the camelCase names and
        # prunes any other key, so a snake_case key must be an error here too.
        job = TrainJob.model_validate(_plain(data), by_alias=True, by_name=False)
    except ValidationError as exc:
        errors.extend(field_errors(exc, TrainJob))
    if errors:
        raise ManifestError(errors)
    return job


# --------------------------------------------------------------------------- YAML loading


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate mapping keys (which YAML would silently merge)."""


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping",
                node.start_mark,
                f"found duplicate key {key!r}",
                key_node.start_mark,
            )
        seen.add(key)
    return loader.construct_mapping(node)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


@dataclass
class LoadedDocument:
    """One document of a manifest stream and its outcome.

    Attributes:
        index: position in the stream (0-based; empty documents are skipped but counted).
        trainjob: the validated model, or ``None`` when ``errors`` is non-empty.
        errors: the problems found.
        data: the raw parsed document (``None`` for a YAML syntax error).
    """

    index: int
    trainjob: TrainJob | None = None
    errors: list[FieldError] = field(default_factory=list)
    data: Any = None

    @property
    def ok(self) -> bool:
        """True when the document is a valid TrainJob."""
        return self.trainjob is not None and not self.errors

    @property
    def label(self) -> str:
        """``kind/name`` as far as known."""
        data = self.data if isinstance(self.data, Mapping) else {}
        meta = data.get("metadata")
        name = meta.get("name") if isinstance(meta, Mapping) else None
        return f"{data.get('kind') or '?'}/{name or '?'}"


def _yaml_error(exc: yaml.YAMLError) -> FieldError:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    text = (
        f"YAML syntax error: {context}: {problem}" if context else f"YAML syntax error: {problem}"
    )
    hint = None
    if "'\\t'" in str(problem) or "tab" in str(problem):
        hint = "indent with spaces; YAML does not allow tabs"
    path = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return FieldError(path, text, hint)


def _read_source(source: str | os.PathLike[str]) -> tuple[str, str]:
    """Return ``(text, name)``; ``source`` is a path, ``"-"`` (stdin) or YAML text."""
    if isinstance(source, os.PathLike):
        return Path(source).read_text(encoding="utf-8"), os.fspath(source)
    if source == "-":
        return sys.stdin.read(), "<stdin>"
    if _looks_like_path(source):
        return Path(source).read_text(encoding="utf-8"), source
    return source, "<string>"


def _looks_like_path(source: str) -> bool:
    """A one-line string naming an existing file or ending in .yaml/.yml/.json is a path."""
    if "\n" in source:
        return False
    return os.path.isfile(source) or source.strip().endswith((".yaml", ".yml", ".json"))


def _source_name(source: str | os.PathLike[str]) -> str:
    if isinstance(source, os.PathLike):
        return os.fspath(source)
    if source == "-":
        return "<stdin>"
    return source if _looks_like_path(source) else ""


def load_documents(source: str | os.PathLike[str]) -> list[LoadedDocument]:
    """Parse a (multi-document) YAML manifest and validate every TrainJob in it.

    Args:
        source: a path (a ``Path``, or a one-line string naming an existing file or ending in
            ``.yaml``/``.yml``/``.json``), ``"-"`` for stdin, or YAML text.

    Returns:
        One :class:`LoadedDocument` per non-empty document, in order. A YAML syntax error ends
        the stream with a document holding a single error whose path is ``line L, column C``.

    Raises:
        OSError: when the file cannot be read.
    """
    text, _ = _read_source(source)
    results: list[LoadedDocument] = []
    index = 0
    stream = yaml.load_all(text, Loader=_StrictLoader)  # a SafeLoader subclass
    while True:
        try:
            data = next(stream)
        except StopIteration:
            break
        except yaml.YAMLError as exc:
            results.append(LoadedDocument(index=index, errors=[_yaml_error(exc)]))
            break
        current = index
        index += 1
        if data is None:
            continue
        doc = LoadedDocument(index=current, data=data)
        if not isinstance(data, dict):
            doc.errors.append(
                FieldError("", f"a TrainJob document must be a mapping, got {_yaml_type(data)}")
            )
        else:
            try:
                doc.trainjob = parse_trainjob(data)
            except ManifestError as exc:
                doc.errors.extend(exc.errors)
        results.append(doc)
    return results


def load_trainjobs(source: str | os.PathLike[str]) -> list[TrainJob]:
    """Load every TrainJob of a (multi-document) YAML manifest.

    Args:
        source: a path (a ``Path``, or a one-line string naming an existing file or ending in
            ``.yaml``/``.yml``/``.json``), ``"-"`` for stdin, or YAML text.

    Raises:
        ManifestError: when any document is invalid (all problems of all documents, paths
            prefixed with ``#N`` for the N-th document of a multi-document stream) or when the
            stream holds no document.
        OSError: when the file cannot be read.
    """
    name = _source_name(source)
    docs = load_documents(source)
    if not docs:
        raise ManifestError([FieldError("", "no TrainJob document found")], name)
    errors: list[FieldError] = []
    multi = len(docs) > 1
    for doc in docs:
        for err in doc.errors:
            if multi and not err.path.startswith("line "):
                err = FieldError(f"#{doc.index + 1} {err.path}".rstrip(), err.message, err.hint)
            errors.append(err)
    if errors:
        raise ManifestError(errors, name)
    return [doc.trainjob for doc in docs if doc.trainjob is not None]
