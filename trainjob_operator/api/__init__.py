"""The TrainJob API (``trainjob.dev/v1alpha1``): pydantic models, manifest loading, TPU tables
and CRD generation.

The models are the single source of truth: the CRD schema (:mod:`trainjob_operator.api.crd`),
``trainjob validate``, ``trainjob run`` and the operator all use them. Field names are snake_case
in Python and camelCase in YAML/JSON (aliases); manifests are parsed by the camelCase names only.
Unknown fields are rejected everywhere except in the free-form fields (``spec.config``,
``spec.podTemplate``, ``spec.validation.config``, tolerations, ``valueFrom`` and metrics).

Modules:

- :mod:`~trainjob_operator.api.fields`: the models' base class, field types and error helper;
- :mod:`~trainjob_operator.api.scaling`: ``spec.scaling`` (workers, TPU slices);
- :mod:`~trainjob_operator.api.spec`: the rest of ``spec`` and :class:`TrainJobSpec`;
- :mod:`~trainjob_operator.api.status`: ``status``, :class:`Phase`, conditions and reasons;
- :mod:`~trainjob_operator.api.trainjob`: :class:`ObjectMeta` and the :class:`TrainJob` itself;
- :mod:`~trainjob_operator.api.errors`: :class:`FieldError`, :func:`field_errors`,
  :class:`ManifestError`;
- :mod:`~trainjob_operator.api.manifest`: :func:`parse_trainjob`, :func:`load_documents`,
  :func:`load_trainjobs`;
- :mod:`~trainjob_operator.api.quantity`, :mod:`~trainjob_operator.api.tpu`,
  :mod:`~trainjob_operator.api.crd`: quantities, the TPU table, the CRD.

This package re-exports the public names, so ``from trainjob_operator.api import TrainJob``
works; the operator's own modules import from the defining module.
"""

from trainjob_operator.api.errors import FieldError, ManifestError, field_errors
from trainjob_operator.api.fields import split_entrypoint
from trainjob_operator.api.manifest import (
    LoadedDocument,
    load_documents,
    load_trainjobs,
    parse_trainjob,
)
from trainjob_operator.api.scaling import ScalingConfig, TpuConfig
from trainjob_operator.api.spec import (
    DEFAULT_IMAGE,
    CheckpointConfig,
    DataPoolConfig,
    DatasetsConfig,
    EnvVar,
    FailureConfig,
    FailureRule,
    RayConfig,
    RayDriverConfig,
    RayHeadConfig,
    RestartBackoff,
    StorageConfig,
    TrainJobSpec,
    ValidationConfig,
    ValidationPoolConfig,
)
from trainjob_operator.api.status import (
    BestCheckpointSummary,
    CheckpointSummary,
    Condition,
    ConditionType,
    Phase,
    ProgressStatus,
    Reason,
    RestartRecord,
    TrainJobStatus,
    ValidationPoolStatus,
    ValidationsStatus,
    WorkersStatus,
)
from trainjob_operator.api.tpu import TpuSliceShape, slice_shape
from trainjob_operator.api.trainjob import ObjectMeta, TrainJob
from trainjob_operator.constants import API_VERSION, KIND, PLURAL
from trainjob_operator.constants import GROUP as API_GROUP

__all__ = [
    "API_GROUP",
    "API_VERSION",
    "DEFAULT_IMAGE",
    "KIND",
    "PLURAL",
    "BestCheckpointSummary",
    "CheckpointConfig",
    "CheckpointSummary",
    "Condition",
    "ConditionType",
    "DataPoolConfig",
    "DatasetsConfig",
    "EnvVar",
    "FailureConfig",
    "FailureRule",
    "FieldError",
    "LoadedDocument",
    "ManifestError",
    "ObjectMeta",
    "Phase",
    "ProgressStatus",
    "RayConfig",
    "RayDriverConfig",
    "RayHeadConfig",
    "Reason",
    "RestartBackoff",
    "RestartRecord",
    "ScalingConfig",
    "StorageConfig",
    "TpuConfig",
    "TpuSliceShape",
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
    "slice_shape",
    "split_entrypoint",
]
