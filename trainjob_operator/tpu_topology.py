"""GKE TPU generations and slice shapes: the one TPU table, a leaf with no project imports.

A TPU *slice* is a set of TPU VMs (hosts; on GKE one node and one worker pod each) wired
together by ICI. GKE describes a slice with two node labels,
``cloud.google.com/gke-tpu-accelerator`` (the generation, e.g. ``tpu-v6e-slice``) and
``cloud.google.com/gke-tpu-topology`` (the chip grid, e.g. ``4x4``). The number of hosts per
slice is ``product(topology) / chips per host``; multi-host slices always use 4-chip hosts, while
the small v5e/v6e topologies (1x1, 2x2, 2x4) fit on one host with 1, 4 or 8 chips.

The pod type counts chips for v5e/v6e and TensorCores (2 per chip) for v4/v5p, as in
Ray's ``get_tpu_cores_per_chip`` and the Cloud TPU naming (``v6e-16``, ``v5litepod-16``,
``v5p-8``, ``v4-16``).

Both sides import this module: the operator (``trainjob_operator.api.tpu``: API validation and
renderers) and the runtime (``trainer_runtime.tpu``: ``ScalingConfig`` and the worker group).
It imports only the standard library, so the operator can use the table without loading the
runtime (whose package ``__init__`` loads the controller, the uploader and Ray's helpers), and
the runtime loads nothing of the operator but this file (``trainjob_operator/__init__.py`` is
empty). ``tests/test_import_graph.py`` guards both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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

GKE_TPU_ACCELERATOR_LABEL = "cloud.google.com/gke-tpu-accelerator"
"""Node label holding the TPU generation (``tpu-v6e-slice``...)."""
GKE_TPU_TOPOLOGY_LABEL = "cloud.google.com/gke-tpu-topology"
"""Node label holding the slice topology (``4x4``...)."""
GKE_TPU_RESOURCE = "google.com/tpu"
"""Extended resource name for TPU chips on a GKE node."""
GKE_TPU_TOLERATION: dict[str, str] = {
    "key": "google.com/tpu",
    "operator": "Exists",
    "effect": "NoSchedule",
}
"""Toleration for the ``google.com/tpu=present:NoSchedule`` taint of GKE TPU node pools."""


@dataclass(frozen=True)
class TpuGeneration:
    """Static facts about one TPU generation on GKE.

    Attributes:
        name: the ``acceleratorType`` value used in TrainJob specs (``v6e``...).
        gke_accelerator: value of the ``cloud.google.com/gke-tpu-accelerator`` node label.
        pod_type_prefix: prefix of the Cloud TPU pod type (``v6e`` -> ``v6e-16``).
        cores_per_chip: TensorCores counted per chip in the pod type name (v4/v5p: 2).
        topologies: valid topologies mapped to the chips per host (VM) for that topology.
    """

    name: str
    gke_accelerator: str
    pod_type_prefix: str
    cores_per_chip: int
    topologies: dict[str, int]

    @property
    def dimensions(self) -> int:
        """Number of topology dimensions (2 for v5e/v6e, 3 for v4/v5p)."""
        return len(next(iter(self.topologies)).split("x"))

    @property
    def ray_accelerator_type(self) -> str:
        """Ray's accelerator type of this generation (``TPU-V6E``, ``TPU-V5LITEPOD``...)."""
        return "TPU-" + self.pod_type_prefix.upper()


def _multi_host(*topologies: str) -> dict[str, int]:
    return dict.fromkeys(topologies, 4)


_SMALL_2D = {"1x1": 1, "2x2": 4, "2x4": 8}
_LARGE_2D = _multi_host("4x4", "4x8", "8x8", "8x16", "16x16")
_3D = _multi_host(
    "2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x8x8", "8x8x8", "8x8x16", "8x16x16"
)

TPU_GENERATIONS: dict[str, TpuGeneration] = {
    "v6e": TpuGeneration(
        name="v6e",
        gke_accelerator="tpu-v6e-slice",
        pod_type_prefix="v6e",
        cores_per_chip=1,
        topologies={**_SMALL_2D, **_LARGE_2D},
    ),
    "v5e": TpuGeneration(
        name="v5e",
        gke_accelerator="tpu-v5-lite-podslice",
        pod_type_prefix="v5litepod",
        cores_per_chip=1,
        topologies={**_SMALL_2D, **_LARGE_2D},
    ),
    "v5p": TpuGeneration(
        name="v5p",
        gke_accelerator="tpu-v5p-slice",
        pod_type_prefix="v5p",
        cores_per_chip=2,
        topologies=dict(_3D),
    ),
    "v4": TpuGeneration(
        name="v4",
        gke_accelerator="tpu-v4-podslice",
        pod_type_prefix="v4",
        cores_per_chip=2,
        topologies=dict(_3D),
    ),
}
"""The supported generations, keyed by ``acceleratorType``."""

ACCELERATOR_ALIASES: dict[str, str] = {
    "v5litepod": "v5e",
    "v5lite": "v5e",
    "tpu-v6e-slice": "v6e",
    "tpu-v5-lite-podslice": "v5e",
    "tpu-v5p-slice": "v5p",
    "tpu-v4-podslice": "v4",
}
"""Other spellings (Cloud TPU pod type prefixes, GKE label values) and the canonical name.

Ray's spelling (``TPU-V6E``, ``TPU-V5LITEPOD``) is accepted too: see
:func:`normalize_accelerator_type`.
"""


@dataclass(frozen=True)
class TpuSliceShape:
    """The derived shape of one TPU slice.

    Attributes:
        generation: canonical accelerator type (``v6e``, ``v5e``, ``v5p``, ``v4``).
        topology: the normalized topology string (``4x4``).
        chips: chips in the slice (product of the topology).
        chips_per_host: chips per VM, i.e. the ``google.com/tpu`` request of each worker pod.
        hosts: VMs (worker pods) in the slice.
        gke_accelerator: ``cloud.google.com/gke-tpu-accelerator`` node label value.
        pod_type: Cloud TPU pod type as Ray sees it (``v6e-16``, ``v5litepod-16``, ``v5p-8``).
    """

    generation: str
    topology: str
    chips: int
    chips_per_host: int
    hosts: int
    gke_accelerator: str
    pod_type: str

    @property
    def multi_host(self) -> bool:
        """True when the slice spans more than one VM."""
        return self.hosts > 1

    def node_selector(self) -> dict[str, str]:
        """The GKE node selector that schedules a pod onto a node of this slice shape."""
        return {
            GKE_TPU_ACCELERATOR_LABEL: self.gke_accelerator,
            GKE_TPU_TOPOLOGY_LABEL: self.topology,
        }

    @property
    def ray_accelerator_type(self) -> str:
        """Ray's accelerator type (``TPU-V6E``); Ray's resource is ``accelerator_type:<it>``."""
        return TPU_GENERATIONS[self.generation].ray_accelerator_type

    @property
    def head_resource(self) -> str:
        """The Ray resource only worker 0 of such a slice has, e.g. ``TPU-v6e-16-head``."""
        return f"TPU-{self.pod_type}-head"


def accelerator_types() -> list[str]:
    """The canonical ``acceleratorType`` values, in the order used in messages."""
    return list(TPU_GENERATIONS)


def normalize_accelerator_type(accelerator_type: str) -> str:
    """The canonical generation name of any accepted spelling.

    Accepts the canonical names (``v6e``, ``v5e``, ``v5p``, ``v4``, any case), Ray's accelerator
    types (``TPU-V6E``, ``TPU-V5LITEPOD``, ``TPU-V5P``, ``TPU-V4``), Cloud TPU pod type
    prefixes (``v5litepod``) and GKE node label values (``tpu-v6e-slice``).

    Raises:
        ValueError: for an unknown generation; the message lists the valid ones.
    """
    key = accelerator_type.strip().lower()
    for candidate in (key, key.removeprefix("tpu-")):
        candidate = ACCELERATOR_ALIASES.get(candidate, candidate)
        if candidate in TPU_GENERATIONS:
            return candidate
    valid = ", ".join(accelerator_types())
    raise ValueError(
        f"unknown TPU accelerator type {accelerator_type!r}; valid types: {valid} "
        "(also accepted: Ray's TPU-V6E, TPU-V5LITEPOD, TPU-V5P, TPU-V4 and v5litepod)"
    )


def get_generation(accelerator_type: str) -> TpuGeneration:
    """Look up a TPU generation by its canonical name or an alias (``v5litepod`` -> ``v5e``).

    Raises:
        ValueError: for an unknown generation; the message lists the valid ones.
    """
    return TPU_GENERATIONS[normalize_accelerator_type(accelerator_type)]


def slice_shape(accelerator_type: str, topology: str) -> TpuSliceShape:
    """Derive hosts per slice and chips per host from ``(acceleratorType, topology)``.

    ``topology`` is case-insensitive and may contain spaces (``"4 x 4"``); the returned shape
    carries the normalized form.

    Raises:
        ValueError: for an unknown generation or a topology GKE does not offer for it; the
            message names the valid topologies of that generation.
    """
    gen = get_generation(accelerator_type)
    normalized = "".join(topology.split()).lower()
    chips_per_host = gen.topologies.get(normalized)
    if chips_per_host is None:
        valid = ", ".join(gen.topologies)
        raise ValueError(
            f"topology {topology!r} is not a valid {gen.name} topology; valid {gen.name} "
            f"topologies: {valid}"
        )
    chips = math.prod(int(d) for d in normalized.split("x"))
    return TpuSliceShape(
        generation=gen.name,
        topology=normalized,
        chips=chips,
        chips_per_host=chips_per_host,
        hosts=chips // chips_per_host,
        gke_accelerator=gen.gke_accelerator,
        pod_type=f"{gen.pod_type_prefix}-{chips * gen.cores_per_chip}",
    )
