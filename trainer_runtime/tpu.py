"""TPU generations and slice shapes: the single table used by the runtime and the operator.

A TPU *slice* is a set of TPU VMs (hosts; on GKE one node and one worker pod each) wired
together by ICI. GKE describes a slice with two node labels,
``cloud.google.com/gke-tpu-accelerator`` (the generation, e.g. ``tpu-v6e-slice``) and
``cloud.google.com/gke-tpu-topology`` (the chip grid, e.g. ``4x4``). The number of hosts per
slice is ``product(topology) / chips per host``; multi-host slices always use 4-chip hosts, while
the small v5e/v6e topologies (1x1, 2x2, 2x4) fit on one host with 1, 4 or 8 chips.

On a Ray node that runs on a TPU host, Ray (``ray/_private/accelerators/tpu.py``,
``TPUAcceleratorManager.get_current_node_additional_resources``) advertises:

* ``TPU``: the chips of the host;
* ``{TPU_NAME: 1}``: a resource named after the slice, on every host of the slice;
* ``TPU-<pod type>-head: 1`` (e.g. ``TPU-v6e-16-head``) on worker 0 of the slice only;
* ``accelerator_type:TPU-V6E: 1`` (the generation);
* and the node labels ``ray.io/tpu-slice-name``, ``ray.io/tpu-worker-id``,
  ``ray.io/tpu-pod-type``, ``ray.io/tpu-topology``.

The pod type counts chips for v5e/v6e and TensorCores (2 per chip) for v4/v5p, as in
Ray's ``get_tpu_cores_per_chip`` and the Cloud TPU naming (``v6e-16``, ``v5litepod-16``,
``v5p-8``, ``v4-16``).

The table itself (generations, topologies, :func:`slice_shape`) lives in the dependency-free
leaf :mod:`trainjob_operator.tpu_topology`, which the operator imports too; this module
re-exports it and adds the runtime's side: Ray's TPU resource and labels, the
:class:`~trainer_runtime.config.ScalingConfig` checks and the worker resources.
"""

from __future__ import annotations

from collections.abc import Mapping

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
    "RAY_TPU_POD_TYPE_LABEL",
    "RAY_TPU_RESOURCE",
    "RAY_TPU_SLICE_NAME_LABEL",
    "RAY_TPU_WORKER_ID_LABEL",
    "TPU_GENERATIONS",
    "TpuGeneration",
    "TpuSliceShape",
    "accelerator_types",
    "get_generation",
    "normalize_accelerator_type",
    "slice_shape",
    "tpu_worker_resources",
    "validate_tpu_scaling",
]

RAY_TPU_RESOURCE = "TPU"
"""Ray resource counting the TPU chips of a node."""
RAY_TPU_SLICE_NAME_LABEL = "ray.io/tpu-slice-name"
"""Ray node label holding the slice name (``ray._raylet.RAY_NODE_TPU_SLICE_NAME_KEY``)."""
RAY_TPU_WORKER_ID_LABEL = "ray.io/tpu-worker-id"
"""Ray node label holding the host's worker id in its slice (``RAY_NODE_TPU_WORKER_ID_KEY``)."""
RAY_TPU_POD_TYPE_LABEL = "ray.io/tpu-pod-type"
"""Ray node label holding the pod type, e.g. ``v6e-16`` (``RAY_NODE_TPU_POD_TYPE_KEY``)."""


def validate_tpu_scaling(
    *,
    num_workers: int,
    topology: str | None,
    accelerator_type: str | None,
    num_slices: int,
    use_gpu: bool = False,
    resources_per_worker: Mapping[str, float] | None = None,
) -> TpuSliceShape:
    """Check a TPU worker request and return the shape of one slice.

    There is one worker per TPU host, so ``num_workers`` must be ``hosts per slice x
    num_slices`` (``num_workers=0``, local mode, is accepted: the train function then runs in
    the calling process). A ``TPU`` entry in ``resources_per_worker`` must equal the chips per
    host.

    Raises:
        ValueError: naming the valid choices (accelerator types, topologies of the generation,
            the number of workers that fits, the chips per host).
    """
    if use_gpu:
        raise ValueError("ScalingConfig: use_gpu and use_tpu are mutually exclusive; set only one")
    if not accelerator_type:
        raise ValueError(
            "ScalingConfig(use_tpu=True) needs accelerator_type; valid types: "
            f"{', '.join(accelerator_types())} (or Ray's TPU-V6E, TPU-V5LITEPOD, ...)"
        )
    gen = get_generation(accelerator_type)
    if not topology:
        raise ValueError(
            f"ScalingConfig(use_tpu=True) needs topology; valid {gen.name} topologies: "
            f"{', '.join(gen.topologies)}"
        )
    shape = slice_shape(accelerator_type, topology)
    expected = shape.hosts * num_slices
    if num_workers != 0 and num_workers % shape.hosts != 0:
        # Ray Train 2.60's sentence first (users match its text), then ours.
        raise ValueError(
            f"The configured `num_workers` ({num_workers}) must be a multiple of "
            f"{shape.hosts} for the specified topology ({shape.topology}). TPU workloads "
            "typically require symmetric resource distribution across all slices to function "
            f"correctly. ScalingConfig.num_workers={num_workers} is not a multiple of the "
            f"{shape.hosts} host(s) of a {shape.generation} {shape.topology} slice (one worker "
            f"per TPU host); use num_workers={expected} for num_slices={num_slices}"
        )
    if num_workers != 0 and num_workers != expected:
        raise ValueError(
            f"ScalingConfig.num_workers={num_workers} but {num_slices} slice(s) of "
            f"{shape.generation} {shape.topology} have {shape.hosts} host(s) x {num_slices} = "
            f"{expected} (one worker per TPU host); use num_workers={expected}, or "
            f"num_slices={num_workers // shape.hosts}"
        )
    tpu = _tpu_entry(resources_per_worker)
    if tpu is not None and tpu != shape.chips_per_host:
        raise ValueError(
            f"ScalingConfig.resources_per_worker['TPU']={tpu:g} but each {shape.generation} "
            f"{shape.topology} host has {shape.chips_per_host} chip(s) and runs one worker; "
            f"omit it or use {shape.chips_per_host}"
        )
    return shape


def infer_num_slices(
    num_workers: int, accelerator_type: str | None, topology: str | None, num_slices: int
) -> int:
    """The slice count: ``num_slices`` when given (>= 1), else ``num_workers`` / hosts per
    slice when that divides evenly, as Ray Train infers it (else 1: the check that follows
    names the valid choices)."""
    if num_slices >= 1:
        return num_slices
    if not (accelerator_type and topology) or num_workers < 1:
        return 1
    try:
        hosts = slice_shape(accelerator_type, topology).hosts
    except ValueError:
        return 1  # validate_tpu_scaling names the valid choices
    return num_workers // hosts if num_workers % hosts == 0 else 1


def validate_single_host_tpu(
    accelerator_type: str | None,
    num_slices: int,
    resources_per_worker: Mapping[str, float] | None,
) -> None:
    """Check ``use_tpu=True`` with one worker and no topology (one TPU host, as in Ray)."""
    if accelerator_type:
        get_generation(accelerator_type)  # a clear error for an unknown type
    if num_slices > 1:
        raise ValueError(
            f"ScalingConfig.num_slices={num_slices} needs a topology (the slice shape); "
            "one worker without a topology runs on a single TPU host"
        )
    tpu = _tpu_entry(resources_per_worker)
    if tpu is not None and tpu <= 0:
        raise ValueError(
            f"ScalingConfig(use_tpu=True): resources_per_worker['TPU'] must be > 0, got {tpu:g}"
        )


def _tpu_entry(resources: Mapping[str, float] | None) -> float | None:
    for key, value in (resources or {}).items():
        if key.upper() == RAY_TPU_RESOURCE or key == GKE_TPU_RESOURCE:
            return float(value)
    return None


def tpu_worker_resources(
    shape: TpuSliceShape, resources_per_worker: Mapping[str, float] | None
) -> dict[str, float]:
    """The Ray resources of one TPU worker: ``{"TPU": chips per host}`` plus the user's others.

    ``google.com/tpu`` (the Kubernetes spelling) is read as ``TPU``; ``cpu``/``gpu`` are
    upper-cased as everywhere in :class:`~trainer_runtime.config.ScalingConfig`.
    """
    out: dict[str, float] = {}
    for key, value in (resources_per_worker or {}).items():
        if key.upper() == RAY_TPU_RESOURCE or key == GKE_TPU_RESOURCE:
            continue
        out["CPU" if key.lower() == "cpu" else "GPU" if key.lower() == "gpu" else key] = value
    out[RAY_TPU_RESOURCE] = float(shape.chips_per_host)
    return out
