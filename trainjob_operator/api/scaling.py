"""The workers of a TrainJob: ``spec.scaling`` and its TPU slices (``spec.scaling.tpu``)."""

from __future__ import annotations

import math
import re
from typing import Literal

from pydantic import Field, model_validator

from trainjob_operator.api.fields import ApiModel, ResourceMap, api_error, no_default
from trainjob_operator.api.quantity import logical_cpus, parse_quantity
from trainjob_operator.api.tpu import GKE_TPU_RESOURCE, TpuSliceShape, get_generation, slice_shape

__all__ = ["GPU_RESOURCE", "ScalingConfig", "TpuConfig"]

GPU_RESOURCE = "nvidia.com/gpu"
"""Extended resource of NVIDIA GPUs."""


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


MAX_WORKERS = 5000
"""Most workers one TrainJob may ask for (the CRD's ``maximum``): one job cannot make the
operator render, create and watch an unbounded number of pods."""
MAX_SLICES = 64
"""Most TPU slices of one TrainJob (64 slices of the largest v6e topology are 4096 hosts)."""


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
    num_slices: int = Field(
        default=1,
        ge=1,
        le=MAX_SLICES,
        description=f"Number of slices (multislice when > 1; at most {MAX_SLICES}).",
    )
    min_slices: int | None = Field(
        default=None,
        ge=1,
        le=MAX_SLICES,
        description=(
            "Elastic training on TPUs, a whole slice at a time (Ray Train's "
            "num_workers=(min, max) in hosts): the run starts once this many slices are "
            "reserved, continues with as few as this when slices are lost, and grows back "
            "towards numSlices, which the operator keeps requested. Unset: a fixed size."
        ),
    )

    @property
    def elastic(self) -> bool:
        """Whether ``minSlices`` makes the slice count elastic."""
        return self.min_slices is not None

    @model_validator(mode="after")
    def _check_topology(self) -> TpuConfig:
        try:
            shape = slice_shape(self.accelerator_type, self.topology)
        except ValueError as exc:
            raise api_error(str(exc), hint=_topology_hint(self), field="topology") from None
        self.topology = shape.topology
        if self.min_slices is not None and self.min_slices > self.num_slices:
            raise api_error(
                f"minSlices is {self.min_slices} but numSlices is {self.num_slices}: numSlices "
                "is the most slices the job runs on, minSlices the fewest",
                hint=f"set minSlices to at most {self.num_slices}, or raise numSlices",
                field="minSlices",
            )
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
        le=MAX_WORKERS,
        description=(
            f"Number of workers (at most {MAX_WORKERS}). 0 runs the train function in the "
            "driver process (local mode). "
            "With tpu set it is one worker per TPU host: omit it (or set 0) to derive "
            "hosts per slice x numSlices; any other value must equal that. Default: 1 without "
            "tpu."
        ),
        json_schema_extra=no_default,
    )
    min_workers: int | None = Field(
        default=None,
        ge=1,
        le=MAX_WORKERS,
        description=(
            "Elastic training (Ray Train's num_workers=(min, max), numWorkers being the "
            "maximum): the run starts as soon as this many workers fit, continues with as few "
            "as this when workers are lost instead of waiting for replacements, and grows "
            "back towards numWorkers (whose pods the operator keeps requested) when they "
            "return, each resize restarting the worker group from the latest checkpoint. The "
            "job is Running with at least this many workers ready. Unset: a fixed size. With "
            "tpu, use tpu.minSlices."
        ),
    )
    elastic_resize_interval_seconds: int | None = Field(
        default=None,
        ge=1,
        description=(
            "Elastic training: how often the driver looks for room to grow the running worker "
            "group (Ray Train's elastic_resize_monitor_interval_s). Default 60."
        ),
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
        cpu = self.resources_per_worker.get("cpu")
        if cpu is not None and parse_quantity(cpu) < 0.001:
            raise api_error(
                f"cpu must be at least 1m (0.001 CPU), got {cpu!r}: each worker is a Ray actor "
                "that reserves its CPUs",
                hint="omit cpu for 1 CPU per worker, or give a positive quantity such as '500m'",
                field='resourcesPerWorker["cpu"]',
            )
        if self.tpu is None:
            return self._check_elastic()
        if self.use_gpu:
            raise api_error(
                "useGpu and tpu are mutually exclusive",
                hint="remove useGpu for TPU workers, or remove tpu for GPU workers",
                field="useGpu",
            )
        shape = self.tpu.shape
        expected = self.tpu.total_hosts
        if "num_workers" not in self.model_fields_set or self.num_workers == 0:
            self.num_workers = expected
        elif self.num_workers != expected:
            raise api_error(
                f"numWorkers is {self.num_workers} but tpu {self.tpu.accelerator_type} "
                f"{shape.topology} has {shape.hosts} host(s) per slice x numSlices "
                f"{self.tpu.num_slices} = {expected} (one worker per TPU host)",
                hint=f"set numWorkers: {expected} or omit it",
                field="numWorkers",
            )
        tpu_request = self.resources_per_worker.get(GKE_TPU_RESOURCE)
        if tpu_request is not None and str(tpu_request) != str(shape.chips_per_host):
            raise api_error(
                f"{GKE_TPU_RESOURCE} is {tpu_request} but each {shape.topology} host has "
                f"{shape.chips_per_host} chip(s)",
                hint=f"omit {GKE_TPU_RESOURCE}: it is derived from the topology",
                field=f'resourcesPerWorker["{GKE_TPU_RESOURCE}"]',
            )
        if self.min_workers is not None:
            raise api_error(
                "minWorkers counts workers; an elastic TPU job grows and shrinks by whole slices",
                hint=f"remove minWorkers and set tpu.minSlices (1 to {self.tpu.num_slices})",
                field="minWorkers",
            )
        return self._check_elastic()

    def _check_elastic(self) -> ScalingConfig:
        minimum = self.elastic_min_workers
        if minimum is None:
            if self.elastic_resize_interval_seconds is not None:
                raise api_error(
                    "elasticResizeIntervalSeconds applies to elastic jobs only",
                    hint="set minWorkers (tpu.minSlices with tpu), or remove it",
                    field="elasticResizeIntervalSeconds",
                )
            return self
        if self.num_workers == 0:
            raise api_error(
                "minWorkers needs workers: numWorkers 0 runs the train function in the driver "
                "(local mode)",
                hint="set numWorkers to the most workers the job may use, or remove minWorkers",
                field="minWorkers",
            )
        if minimum > self.num_workers:
            raise api_error(
                f"minWorkers is {minimum} but numWorkers is {self.num_workers}: numWorkers is "
                "the most workers the job runs with, minWorkers the fewest",
                hint=f"set minWorkers to at most {self.num_workers}, or raise numWorkers",
                field="minWorkers",
            )
        return self

    @property
    def elastic_min_workers(self) -> int | None:
        """The fewest workers an elastic job runs with (``minWorkers``, or ``tpu.minSlices`` x
        hosts per slice); None for a fixed size."""
        if self.tpu is not None:
            if self.tpu.min_slices is None:
                return None
            return self.tpu.min_slices * self.tpu.shape.hosts
        return self.min_workers

    @property
    def tpu_shape(self) -> TpuSliceShape | None:
        """The TPU slice shape, or ``None`` without TPUs."""
        return None if self.tpu is None else self.tpu.shape

    def pod_resources(self) -> dict[str, int | str]:
        """Container resources of one worker pod: ``resourcesPerWorker`` plus the accelerators.

        ``useGpu`` adds ``nvidia.com/gpu: 1`` unless a count is given; TPU workers get
        ``google.com/tpu`` = chips per host.
        """
        resources: dict[str, int | str] = dict(self.resources_per_worker)
        if self.use_gpu and GPU_RESOURCE not in resources:
            resources[GPU_RESOURCE] = 1
        shape = self.tpu_shape
        if shape is not None:
            resources[GKE_TPU_RESOURCE] = shape.chips_per_host
        return resources

    def cpus_per_worker(self) -> int:
        """Logical CPUs of one worker: its pod's ``cpu`` rounded up, at least 1 (1 without).

        The worker pod's Ray node advertises this many CPUs and the driver's trainer asks each
        worker actor for the same count, so exactly one worker runs on each worker pod (with
        a fractional request, Ray's default PACK strategy put several workers on one pod and
        left the others idle).
        """
        return logical_cpus(self.pod_resources().get("cpu"))

    def gpus_per_worker(self) -> int:
        """GPUs of one worker pod (``nvidia.com/gpu`` of :meth:`pod_resources`; 0 without).

        The worker's Ray node advertises this many GPUs and the driver's trainer asks each
        worker actor for the same count, so the two always agree.

        Raises:
            ValueError: for a fractional ``resourcesPerWorker["nvidia.com/gpu"]``.
        """
        quantity = self.pod_resources().get(GPU_RESOURCE)
        if quantity is None:
            return 0
        count = parse_quantity(quantity)
        if count != math.floor(count) or count < 0:
            raise ValueError(
                f'spec.scaling.resourcesPerWorker["{GPU_RESOURCE}"]: must be a whole number of '
                f"GPUs, got {quantity!r}"
            )
        return int(count)
