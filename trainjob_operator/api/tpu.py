"""GKE TPU generations and slice shapes (re-exported from :mod:`trainer_runtime.tpu`).

There is one TPU table, in ``trainer_runtime/tpu.py``: the runtime's ``ScalingConfig`` and worker
group use it, and the operator's API validation and renderers import it from here.
"""

from __future__ import annotations

from trainer_runtime.tpu import (
    ACCELERATOR_ALIASES,
    GKE_TPU_ACCELERATOR_LABEL,
    GKE_TPU_RESOURCE,
    GKE_TPU_TOLERATION,
    GKE_TPU_TOPOLOGY_LABEL,
    TPU_GENERATIONS,
    TpuGeneration,
    TpuSliceShape,
    accelerator_types,
    get_generation,
    normalize_accelerator_type,
    slice_shape,
)

__all__ = [
    "ACCELERATOR_ALIASES",
    "GKE_TPU_ACCELERATOR_LABEL",
    "GKE_TPU_RESOURCE",
    "GKE_TPU_TOLERATION",
    "GKE_TPU_TOPOLOGY_LABEL",
    "TPU_GENERATIONS",
    "TpuGeneration",
    "TpuSliceShape",
    "accelerator_types",
    "get_generation",
    "normalize_accelerator_type",
    "slice_shape",
]
