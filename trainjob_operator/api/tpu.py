"""GKE TPU generations and slice shapes (re-exported from :mod:`trainjob_operator.tpu_topology`).

There is one TPU table, in the dependency-free leaf ``trainjob_operator/tpu_topology.py``: the
runtime (``trainer_runtime.tpu``) and the operator's API validation and renderers import it,
the latter from here.
"""

from __future__ import annotations

from trainjob_operator.tpu_topology import (
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
