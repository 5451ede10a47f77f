"""The desired state of a TrainJob (``spec``): image, entrypoint, environment, validation,
checkpoints, storage, failure budgets and the Ray cluster. The workers are in
:mod:`trainjob_operator.api.scaling`."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, model_validator

from trainjob_operator.api.fields import (
    ApiModel,
    Entrypoint,
    FreeForm,
    ImageReference,
    ResourceMap,
    api_error,
)
from trainjob_operator.api.quantity import logical_cpus
from trainjob_operator.api.scaling import ScalingConfig
from trainjob_operator.constants import DRIVER_INVALID_INPUT_EXIT_CODE, DRIVER_PREEMPTED_EXIT_CODE

__all__ = [
    "DEFAULT_FAILURE_RULES",
    "DEFAULT_IMAGE",
    "DEFAULT_RAY_VERSION",
    "STORAGE_PATH_PATTERN",
    "CheckpointConfig",
    "DataPoolConfig",
    "DatasetsConfig",
    "EnvVar",
    "ExitCodesRule",
    "FailureConfig",
    "FailureRule",
    "FailureRuleAction",
    "PodConditionPattern",
    "RayConfig",
    "RayDashboardConfig",
    "RayDriverConfig",
    "RayHeadConfig",
    "RestartBackoff",
    "RuntimeEnvConfig",
    "StorageConfig",
    "TrainJobSpec",
    "ValidationConfig",
    "ValidationPoolConfig",
]

DEFAULT_IMAGE = "ghcr.io/trainjob-dev/trainjob-runtime:0.1.0"
"""Container image used for the Ray head, workers and validation pool when ``spec.image`` is
omitted: Python 3.11 with ``trainjob-operator[runtime]`` (Ray 2.60) installed."""
DEFAULT_RAY_VERSION = "2.60.0"
"""Ray version the runtime image ships; ``spec.ray.version`` defaults to it."""
_ENV_NAME_PATTERN = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
_GCS_BUCKET = r"[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]"
_S3_BUCKET = r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]"
STORAGE_PATH_PATTERN = rf"^(gs://{_GCS_BUCKET}(/.*)?|s3://{_S3_BUCKET}(/.*)?|/.*)$"
"""``gs://bucket[/prefix]``, ``s3://bucket[/prefix]`` or an absolute path."""
_ENV_NAME_RE = re.compile(_ENV_NAME_PATTERN)
_ENV_SOURCES = frozenset({"configMapKeyRef", "fieldRef", "resourceFieldRef", "secretKeyRef"})
"""The sources of a Kubernetes EnvVarSource (``valueFrom``)."""
#: The object stores ``spec.storage.path`` may name: scheme -> (store name, bucket name
#: pattern, the rule it checks).
_BUCKETS = {
    "gs": (
        "GCS",
        re.compile(rf"^{_GCS_BUCKET}$"),
        "3-222 lowercase letters, digits, '-', '_' and '.'",
    ),
    "s3": ("S3", re.compile(rf"^{_S3_BUCKET}$"), "3-63 lowercase letters, digits, '-' and '.'"),
}
_STORAGE_FORMS = "gs://bucket/prefix (GCS), s3://bucket/prefix (S3) or an absolute path"


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
            raise api_error(
                f"{self.name!r} is not a valid environment variable name",
                hint="use letters, digits, '_', '-' and '.'; do not start with a digit",
                field="name",
            )
        if self.value is not None and self.value_from is not None:
            raise api_error("set either value or valueFrom, not both", field="valueFrom")
        if self.value_from is not None:
            sources = sorted(self.value_from)
            if len(sources) != 1 or sources[0] not in _ENV_SOURCES:
                raise api_error(
                    "valueFrom must name exactly one source, got "
                    + (", ".join(repr(s) for s in sources) or "none"),
                    hint=f"use one of {', '.join(sorted(_ENV_SOURCES))}",
                    field="valueFrom",
                )
        return self


class ValidationPoolConfig(ApiModel):
    """The autoscaled pool of pods that run validation tasks (Ray resource ``validation``)."""

    min_replicas: int = Field(default=0, ge=0, description="Pods kept while idle.")
    max_replicas: int = Field(default=1, ge=1, description="Upper bound of validation pods.")
    resources: ResourceMap = Field(
        default_factory=dict,
        description=(
            "Resources of each validation pod. Its Ray node advertises the cpu (rounded up, "
            "at least 1) to the tasks a validation starts, such as Ray Data's; the "
            "validation task itself takes none."
        ),
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

    def cpus_per_pod(self) -> int:
        """Logical CPUs a validation pod's Ray node advertises: its ``cpu`` rounded up, at
        least 1 (1 without). The validation task asks for none (only the ``validation``
        resource), so they are free for the Ray Data tasks a validation starts; the train
        workers never use them (they select the worker pods' Ray node label)."""
        return logical_cpus(self.resources.get("cpu"))

    @model_validator(mode="after")
    def _check(self) -> ValidationPoolConfig:
        if self.min_replicas > self.max_replicas:
            raise api_error(
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


_DATASET_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.-]*$"


class DataPoolConfig(ApiModel):
    """CPU-only pods ``<job>-data-<i>`` for the training datasets' Ray Data work (reads,
    ``map_batches``): Ray nodes labelled ``trainjob.dev/pool=data`` that the datasets'
    execution selects, so the preprocessing never takes the train workers' CPUs."""

    replicas: int = Field(default=1, ge=1, description="Data pods, kept for the whole run.")
    resources: ResourceMap = Field(
        default_factory=dict,
        description=(
            "Resources of each data pod. Its Ray node advertises the cpu (rounded up, at "
            "least 1): the Ray Data tasks of the training datasets run there, one CPU each "
            "by default."
        ),
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Node selector of the data pods."
    )
    tolerations: list[FreeForm] = Field(
        default_factory=list, description="Tolerations of the data pods."
    )
    spot: bool = Field(
        default=False,
        description=(
            "Schedule data pods on spot (preemptible) nodes (Ray Data retries the tasks of a "
            "lost node)."
        ),
    )

    def cpus_per_pod(self) -> int:
        """Logical CPUs a data pod's Ray node advertises: its ``cpu`` rounded up, at least 1."""
        return logical_cpus(self.resources.get("cpu"))


class DatasetsConfig(ApiModel):
    """Training datasets (Ray Train's ``datasets=`` and ``DataConfig``): a function builds
    them on the driver, each worker reads its shard with ``get_dataset_shard(name)``."""

    datasets: Entrypoint = Field(
        description=(
            "The datasets function, 'package.module:function': called on the driver with "
            "spec.config, it returns a dict of name -> ray.data.Dataset (the trainer's "
            "datasets=)."
        )
    )
    datasets_to_split: (
        list[Annotated[str, Field(min_length=1, pattern=_DATASET_NAME_PATTERN)]] | None
    ) = Field(
        default=None,
        max_length=64,
        description=(
            "Names of the datasets split equally among the workers (DataConfig's "
            "datasets_to_split); the others go whole to every worker. All when omitted."
        ),
    )
    pool: DataPoolConfig = Field(
        default_factory=DataPoolConfig,
        description=(
            "The CPU-only pods <job>-data-<i> that run the datasets' Ray Data work (reads, "
            "map_batches) in a TrainJob (their Ray nodes carry the data pool's label): the "
            "worker pods' Ray nodes advertise only the CPUs their worker holds. One pod when "
            "omitted; `trainjob run` uses the local Ray node instead."
        ),
    )

    @model_validator(mode="after")
    def _check(self) -> DatasetsConfig:
        names = self.datasets_to_split or []
        for index, name in enumerate(names):
            if name in names[:index]:
                raise api_error(
                    f"dataset {name!r} is named twice",
                    field=f"datasetsToSplit[{index}]",
                )
        return self


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
    scheme, sep, rest = value.partition("://")
    if sep and scheme in _BUCKETS:
        store, bucket_re, rule = _BUCKETS[scheme]
        bucket, _, prefix = rest.partition("/")
        if not bucket_re.match(bucket):
            raise api_error(
                f"{bucket!r} is not a valid {store} bucket name",
                hint=f"bucket names are {rule}",
            )
        prefix = prefix.rstrip("/")
        if prefix and any(part in ("", ".", "..") for part in prefix.split("/")):
            clean = "/".join(p for p in prefix.split("/") if p not in ("", ".", ".."))
            root = f"{scheme}://{bucket}"
            raise api_error(
                f"{value!r} has an empty, '.' or '..' folder: {store} object names would "
                "contain it literally",
                hint=f"write {root}/{clean}" if clean else f"write {root}",
            )
        return value
    if sep:
        hint = f"use {_STORAGE_FORMS} on a mounted volume"
        if scheme == "file":
            hint = f"write the absolute path itself: {value.removeprefix('file://')!r}"
        raise api_error(f"storage scheme {scheme + '://'!r} is not supported", hint=hint)
    if not value.startswith("/"):
        raise api_error(
            f"{value!r} must be {_STORAGE_FORMS}",
            hint="use an absolute path such as /tmp/trainjob-runs or /mnt/checkpoints",
        )
    return value


_ARCHIVE_FORMS = "gs://bucket/path.zip, s3://bucket/path.zip or an absolute path in the image"
_MAX_RUNTIME_ENV_ITEMS = 64


def _check_archive_location(value: str, what: str) -> str:
    """``gs://``/``s3://`` zip URI or absolute path (``workingDir`` and each of ``pyModules``)."""
    scheme, sep, rest = value.partition("://")
    if sep and scheme in _BUCKETS:
        store, bucket_re, rule = _BUCKETS[scheme]
        bucket, _, key = rest.partition("/")
        if not bucket_re.match(bucket):
            raise api_error(
                f"{bucket!r} is not a valid {store} bucket name",
                hint=f"bucket names are {rule}",
            )
        if not key.endswith(".zip") or key.endswith("/.zip"):
            raise api_error(
                f"{value!r}: a remote {what} must be a .zip archive (Ray downloads and unpacks "
                "it; it does not sync folders)",
                hint="let `trainjob submit --working-dir DIR` package and upload the folder, or "
                "zip it yourself (the files at the archive's top level or in one top folder)",
            )
        if any(part in ("", ".", "..") for part in key.split("/")[:-1]):
            raise api_error(
                f"{value!r} has an empty, '.' or '..' folder",
                hint="write the object name without //, ./ or ../",
            )
        return value
    if sep:
        hint = f"use {_ARCHIVE_FORMS}"
        if scheme == "file":
            hint = f"write the absolute path itself: {value.removeprefix('file://')!r}"
        elif scheme in ("http", "https"):
            hint = (
                "copy the archive to gs:// or s3:// (the pods read those with their own "
                "credentials), or bake it into the image"
            )
        raise api_error(f"{what} scheme {scheme + '://'!r} is not supported", hint=hint)
    if not value.startswith("/"):
        raise api_error(
            f"{value!r} is a relative path: {what} must be {_ARCHIVE_FORMS}",
            hint=(
                "a folder on your machine is uploaded by `trainjob submit --working-dir DIR` "
                "(or TrainJobClient.submit(..., working_dir=DIR)), which sets this field"
                if what == "workingDir"
                else "zip the package to gs:// or s3://, or give its absolute folder in the image"
            ),
        )
    if any(part in (".", "..") for part in value.split("/")):
        raise api_error(
            f"{value!r} has a '.' or '..' component", hint="write the normalized absolute path"
        )
    return value


def _check_working_dir(value: str) -> str:
    return _check_archive_location(value, "workingDir")


def _check_py_module(value: str) -> str:
    return _check_archive_location(value, "pyModules entry")


def _check_requirement(value: str) -> str:
    text = value.strip()
    if not text or text != value or "\n" in value:
        raise api_error(
            f"{value!r} is not a requirement",
            hint="one requirement per item, e.g. 'torchmetrics==1.4.0', without spaces around it",
        )
    if text.startswith("-"):
        raise api_error(
            f"{value!r}: pip options are not supported here",
            hint="list requirements only; the index the pods install from is pip's "
            "configuration in the image (PIP_INDEX_URL in spec.env)",
        )
    return value


class RuntimeEnvConfig(ApiModel):
    """Code and packages for this run without rebuilding the image: the subset of Ray's
    ``runtime_env`` that makes sense in a manifest. It is the runtime environment of the
    driver's Ray job, so the train workers and the validation tasks all see it.

    A ``gs://``/``s3://`` archive is read by the driver with the pods' storage credentials
    (as ``spec.storage.path``); ``trainjob submit --working-dir DIR`` packages and uploads a
    folder and sets ``workingDir``.
    """

    working_dir: Annotated[str, AfterValidator(_check_working_dir)] | None = Field(
        default=None,
        description=(
            "The code of the run: a .zip archive at gs://bucket/path.zip or "
            "s3://bucket/path.zip, or an absolute folder in the image. The train workers and "
            "validation tasks run in it (it is their current folder and on their sys.path); "
            "the driver imports spec.entrypoint from it."
        ),
    )
    py_modules: list[Annotated[str, AfterValidator(_check_py_module)]] = Field(
        default_factory=list,
        max_length=_MAX_RUNTIME_ENV_ITEMS,
        description=(
            "Extra importable packages: .zip archives at gs:// or s3:// (a package folder at "
            "the archive's top level) or absolute package folders in the image."
        ),
    )
    env_vars: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "Environment of the train workers and validation tasks (Ray's env_vars; string "
            "values). spec.env sets the containers' environment instead."
        ),
    )
    excludes: list[str] = Field(
        default_factory=list,
        max_length=_MAX_RUNTIME_ENV_ITEMS,
        description=(
            ".gitignore-style patterns of files left out of workingDir and pyModules (e.g. "
            "'data/', '*.ckpt')."
        ),
    )
    pip: list[Annotated[str, AfterValidator(_check_requirement)]] = Field(
        default_factory=list,
        max_length=_MAX_RUNTIME_ENV_ITEMS,
        description=(
            "Requirements pip installs for the workers and validation tasks at start (Ray's "
            "pip). The pods must reach a package index (PyPI or the one pip is configured "
            "with in the image): on a cluster without egress, bake packages into the image."
        ),
    )
    uv_packages: list[Annotated[str, AfterValidator(_check_requirement)]] = Field(
        default_factory=list,
        max_length=_MAX_RUNTIME_ENV_ITEMS,
        description=(
            "Requirements uv installs instead (Ray's uv; uv must be in the image). The same "
            "index requirement as pip; set pip or uvPackages, not both."
        ),
    )

    @model_validator(mode="after")
    def _check(self) -> RuntimeEnvConfig:
        for name in self.env_vars:
            if not _ENV_NAME_RE.match(name):
                raise api_error(
                    f"{name!r} is not a valid environment variable name",
                    hint="use letters, digits, '_', '-' and '.'; do not start with a digit",
                    field="envVars",
                )
        if self.pip and self.uv_packages:
            raise api_error(
                "set either pip or uvPackages, not both (Ray refuses both at run time)",
                hint="move the requirements into one of them",
                field="uvPackages",
            )
        if self.excludes and self.working_dir is None and not self.py_modules:
            raise api_error(
                "excludes applies to workingDir and pyModules, and neither is set",
                hint="set workingDir, or remove excludes",
                field="excludes",
            )
        for index, pattern in enumerate(self.excludes):
            if not pattern.strip():
                raise api_error(
                    "an empty exclude pattern", hint="remove it", field=f"excludes[{index}]"
                )
        seen: set[str] = set()
        for index, module in enumerate(self.py_modules):
            if module in seen:
                raise api_error(
                    f"{module!r} is listed twice", hint="remove one", field=f"pyModules[{index}]"
                )
            seen.add(module)
        return self

    def is_empty(self) -> bool:
        """Whether it changes nothing (no code, packages or environment)."""
        return not (
            self.working_dir or self.py_modules or self.env_vars or self.pip or self.uv_packages
        )


class StorageConfig(ApiModel):
    """Where checkpoints, the checkpoint manifest and results are written."""

    path: Annotated[str, AfterValidator(_check_storage_path)] = Field(
        description=(
            "gs://bucket/prefix, s3://bucket/prefix (credentials and endpoint from the "
            "pods' AWS_* environment) or an absolute path (a mounted volume in a cluster)."
        ),
        json_schema_extra={"pattern": STORAGE_PATH_PATTERN},
    )
    service_account_name: str | None = Field(
        default=None,
        description=(
            "ServiceAccount of the pods (bind it to a GCP service account for GCS, or an "
            "IAM role for S3)."
        ),
    )


class RestartBackoff(ApiModel):
    """Exponential back-off between whole-cluster restarts (as a Kubernetes Job's pods).

    The n-th counted restart waits ``min(maxSeconds, initialSeconds * 2**(n-1))`` before the
    next attempt's pods are created; a restart not counted against ``maxRestarts`` (a
    disruption, an ``Ignore`` rule) does not wait.
    """

    initial_seconds: int = Field(
        default=10, ge=0, description="Wait before the first counted restart (0: no back-off)."
    )
    max_seconds: int = Field(default=300, ge=0, description="Longest wait between restarts.")

    @model_validator(mode="after")
    def _check(self) -> RestartBackoff:
        if self.initial_seconds > self.max_seconds:
            raise api_error(
                f"initialSeconds ({self.initial_seconds}) is greater than maxSeconds "
                f"({self.max_seconds})",
                hint="raise maxSeconds or lower initialSeconds",
                field="initialSeconds",
            )
        return self

    def delay(self, counted: int) -> int:
        """Seconds to wait before the ``counted``-th counted restart (1-based; 0 for none)."""
        if counted <= 0 or self.initial_seconds == 0:
            return 0
        return int(min(self.max_seconds, self.initial_seconds * 2 ** min(counted - 1, 32)))


class FailureRuleAction(StrEnum):
    """What a matching :class:`FailureRule` does with a failed head or driver pod."""

    #: fail the TrainJob at once (no restart can fix it).
    FAIL_JOB = "FailJob"
    #: restart the cluster without counting it against ``maxRestarts`` (and without back-off).
    IGNORE = "Ignore"
    #: restart the cluster, counted against ``maxRestarts`` (what happens when no rule matches).
    COUNT = "Count"


class ExitCodesRule(ApiModel):
    """Matches a pod by the exit codes of its terminated containers (``podFailurePolicy``)."""

    container_name: str | None = Field(
        default=None,
        description="Only this container (driver, ray-head); any container when omitted.",
    )
    operator: Literal["In", "NotIn"] = Field(description="In or NotIn the values.")
    values: list[int] = Field(
        min_length=1, max_length=255, description="Exit codes (0 is not allowed)."
    )

    @model_validator(mode="after")
    def _check(self) -> ExitCodesRule:
        if 0 in self.values:
            raise api_error(
                "exit code 0 is a success, not a failure",
                hint="remove 0 from values",
                field="values",
            )
        return self


class PodConditionPattern(ApiModel):
    """Matches a pod that has a condition of this type and status."""

    type: str = Field(description="Pod condition type, e.g. DisruptionTarget.")
    status: Literal["True", "False", "Unknown"] = Field(default="True", description="Its status.")


class FailureRule(ApiModel):
    """One rule of ``failure.rules``: when a head or driver pod fails (or is disrupted), the
    first matching rule decides; like Kubernetes Job's ``podFailurePolicy`` and JobSet's
    failure policy. Exactly one of ``onExitCodes`` and ``onPodConditions``."""

    action: Literal["FailJob", "Ignore", "Count"] = Field(
        description="FailJob, Ignore or Count (:class:`FailureRuleAction`)."
    )
    on_exit_codes: ExitCodesRule | None = Field(
        default=None, description="Match by container exit codes."
    )
    on_pod_conditions: list[PodConditionPattern] = Field(
        default_factory=list,
        max_length=20,
        description="Match when the pod has any of these conditions.",
    )

    @model_validator(mode="after")
    def _check(self) -> FailureRule:
        if (self.on_exit_codes is None) == (not self.on_pod_conditions):
            raise api_error(
                "a failure rule needs exactly one of onExitCodes and onPodConditions",
                hint="split it into two rules",
                field="onExitCodes",
            )
        return self


DEFAULT_FAILURE_RULES: tuple[FailureRule, ...] = (
    # The driver's own validation of the TrainJob failed (its exit status 2): the same input
    # fails again, so fail at once (reason InvalidInput).
    FailureRule(
        action="FailJob",
        on_exit_codes=ExitCodesRule(
            container_name="driver", operator="In", values=[DRIVER_INVALID_INPUT_EXIT_CODE]
        ),
    ),
    # Preemption, eviction, node drain or a node that went away: not the job's fault.
    FailureRule(
        action="Ignore",
        on_pod_conditions=[PodConditionPattern(type="DisruptionTarget")],
    ),
    # The driver stopped training on a preemption notice after committing a last checkpoint
    # (its exit status 3): restart from it, not counted.
    FailureRule(
        action="Ignore",
        on_exit_codes=ExitCodesRule(
            container_name="driver", operator="In", values=[DRIVER_PREEMPTED_EXIT_CODE]
        ),
    ),
)
"""Rules that apply after ``failure.rules`` (the first match wins)."""


class FailureConfig(ApiModel):
    """Retry budgets and deadlines."""

    max_failures: int = Field(
        default=0,
        ge=-1,
        description=(
            "Worker-group restarts inside one run before the run fails; -1 means unlimited."
        ),
    )
    max_preemption_failures: int = Field(
        default=-1,
        ge=-1,
        description=(
            "Worker-group restarts inside one run after a preemption notice (a worker pod's "
            "termination notice drains its Ray node; the group restarts from the checkpoint "
            "taken on it, on the recreated pod), not counted against maxFailures; -1 means "
            "unlimited (Ray Train's FailureConfig.max_preemption_failures). Past it the "
            "driver exits 3 and the operator restarts the whole job, not counted."
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
    restart_backoff: RestartBackoff = Field(
        default_factory=RestartBackoff,
        description=(
            "Exponential back-off between counted whole-cluster restarts (default 10 s, "
            "doubling, at most 300 s)."
        ),
    )
    rules: list[FailureRule] = Field(
        default_factory=list,
        max_length=20,
        description=(
            "What a failed or disrupted head or driver pod does, first match wins: FailJob, "
            "Ignore (restart, not counted against maxRestarts) or Count. Then the defaults: "
            "the driver's exit code 2 (invalid input) fails the job; a pod with the "
            "DisruptionTarget condition (preempted, evicted, drained, its node gone) is "
            "Ignore. Otherwise Count."
        ),
    )


class RayHeadConfig(ApiModel):
    """The Ray head pod (the cluster's GCS; it runs no user code)."""

    resources: ResourceMap = Field(default_factory=dict, description="Resources of the head pod.")


class RayDriverConfig(ApiModel):
    """The driver pod: it runs the trainer (and a Ray node), the datasets function of
    ``spec.data`` and Ray Data's split coordinators."""

    resources: ResourceMap = Field(
        default_factory=dict,
        description=(
            "Resources of the driver pod; empty: the operator's default (the chart's "
            "defaults.driver.resources). Raise its memory for spec.data datasets built from "
            "in-memory rows (ray.data.from_items, from_pandas): they live in the driver "
            "node's object store. In local mode (numWorkers: 0) scaling.resourcesPerWorker "
            "comes first."
        ),
    )


class RayDashboardConfig(ApiModel):
    """The Ray dashboard of the job's head (it listens on the head pod's loopback)."""

    service: bool = Field(
        default=False,
        description=(
            "Create a ClusterIP Service <job>-dashboard for the head's dashboard (port 8265) "
            "and publish it in status.dashboard; reach it with kubectl port-forward."
        ),
    )


class RayConfig(ApiModel):
    """The embedded Ray cluster."""

    version: str = Field(default=DEFAULT_RAY_VERSION, description="Ray version of the image.")
    head: RayHeadConfig = Field(default_factory=RayHeadConfig, description="The head pod.")
    driver: RayDriverConfig = Field(default_factory=RayDriverConfig, description="The driver pod.")
    dashboard: RayDashboardConfig = Field(
        default_factory=RayDashboardConfig, description="The Ray dashboard (opt-in Service)."
    )


class TrainJobSpec(ApiModel):
    """The desired state of a TrainJob."""

    image: ImageReference = Field(default=DEFAULT_IMAGE, description="Container image of all pods.")
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
    runtime_env: RuntimeEnvConfig | None = Field(
        default=None,
        description=(
            "Code and packages without an image rebuild (a subset of Ray's runtime_env): the "
            "driver's Ray job runs with it, so the train workers and validation tasks see it."
        ),
    )
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
    data: DatasetsConfig | None = Field(
        default=None,
        description=(
            "Training datasets (Ray Data), read in the train function with get_dataset_shard(name)."
        ),
    )
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
                raise api_error(
                    f"environment variable {var.name!r} is set twice", field=f"env[{index}].name"
                )
            seen.add(var.name)
        if self.runtime_env is not None:
            for name in self.runtime_env.env_vars:
                if name in seen:
                    raise api_error(
                        f"environment variable {name!r} is set in both spec.env and "
                        "spec.runtimeEnv.envVars",
                        hint="keep one: spec.env for every container, runtimeEnv.envVars for "
                        "the workers' and validation tasks' processes only",
                        field="runtimeEnv.envVars",
                    )
        return self
