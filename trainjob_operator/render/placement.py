"""Where a pod runs and what it gets: one :class:`Placement` per role, computed once per job.

A placement gathers a role's container resources, the operator's node selector and
tolerations, the TrainJob's more specific selector (``spec.validation.pool.nodeSelector``),
the operator-wide defaults (:class:`~trainjob_operator.render.options.RenderOptions`) and the
affinity. :func:`~trainjob_operator.render.pods.build_pod` merges it with ``spec.podTemplate``
(:meth:`Placement.node_selector_for`, :meth:`Placement.tolerations_for`,
:meth:`Placement.affinity_for`). The per-role placements are cached on the
:class:`~trainjob_operator.render.context.RenderContext`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trainjob_operator.api.scaling import GPU_RESOURCE
from trainjob_operator.api.spec import DataPoolConfig, ValidationPoolConfig
from trainjob_operator.api.tpu import GKE_TPU_TOLERATION
from trainjob_operator.render.options import GKE_SPOT_LABEL
from trainjob_operator.render.pod_template import PodTemplateOverrides

if TYPE_CHECKING:
    from trainjob_operator.render.context import RenderContext

__all__ = [
    "GKE_SPOT_TOLERATION",
    "Placement",
    "data_placement",
    "driver_placement",
    "head_placement",
    "validation_placement",
    "worker_placement",
]

GKE_SPOT_TOLERATION: dict[str, str] = {
    "key": GKE_SPOT_LABEL,
    "operator": "Equal",
    "value": "true",
    "effect": "NoSchedule",
}
"""Tolerates the optional ``cloud.google.com/gke-spot=true:NoSchedule`` taint of spot pools."""


def _toleration_id(toleration: Mapping[str, Any]) -> tuple[Any, Any]:
    return toleration.get("key"), toleration.get("effect")


@dataclass(frozen=True)
class Placement:
    """A role's resources and scheduling constraints, before ``spec.podTemplate`` is merged.

    Attributes:
        resources: container resources (requests = limits).
        node_selector: the operator's node selector (TPU, spot), which the TrainJob must not
            contradict; it overrides a default.
        user_node_selector: a more specific user field than ``spec.podTemplate.nodeSelector``
            (e.g. ``spec.validation.pool.nodeSelector``); it wins over the podTemplate.
        tolerations: the operator's and the TrainJob's role-specific tolerations.
        default_node_selector: the operator-wide default (:class:`RenderOptions`), overridden
            key by key by everything else.
        default_tolerations: operator-wide defaults; one is left out when another toleration
            of the pod has the same ``key`` and ``effect``.
        affinity: the operator's affinity (TPU slices); the podTemplate's terms are appended.
    """

    resources: Mapping[str, int | str] = field(default_factory=dict)
    node_selector: Mapping[str, str] = field(default_factory=dict)
    user_node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: Sequence[Mapping[str, Any]] = ()
    default_node_selector: Mapping[str, str] = field(default_factory=dict)
    default_tolerations: Sequence[Mapping[str, Any]] = ()
    affinity: Mapping[str, Any] | None = None

    def node_selector_for(self, overrides: PodTemplateOverrides) -> dict[str, str]:
        """The pod's node selector: defaults <- podTemplate <- ``user_node_selector`` <- the
        operator's ``node_selector``.

        Raises:
            ValueError: when the TrainJob contradicts the operator's selector.
        """
        operator = dict(self.node_selector)
        merged = {**overrides.node_selector, **self.user_node_selector}
        for key, value in operator.items():
            if key in merged and merged[key] != value:
                raise ValueError(
                    f"spec.podTemplate.nodeSelector[{key!r}]: {merged[key]!r} conflicts with "
                    f"{value!r} that the operator sets; remove it"
                )
            merged[key] = value
        defaults = {k: v for k, v in self.default_node_selector.items() if k not in operator}
        return {**defaults, **merged}

    def tolerations_for(self, overrides: PodTemplateOverrides) -> list[dict[str, Any]]:
        """``tolerations``, then the defaults no other toleration has the key and effect of,
        then the podTemplate's."""
        own = [dict(t) for t in self.tolerations]
        template = copy.deepcopy(overrides.tolerations)
        taken = {_toleration_id(t) for t in own + template}
        extra = [dict(t) for t in self.default_tolerations if _toleration_id(t) not in taken]
        return own + extra + template

    def affinity_for(self, overrides: PodTemplateOverrides) -> dict[str, Any]:
        """``affinity`` with the podTemplate's terms appended section by section."""
        merged = copy.deepcopy(dict(self.affinity or {}))
        for key, value in overrides.affinity.items():
            if key not in merged:
                merged[key] = copy.deepcopy(value)
                continue
            section = merged[key]
            for term_key, terms in value.items():
                section[term_key] = list(section.get(term_key, [])) + copy.deepcopy(terms)
        return merged


def head_placement(ctx: RenderContext) -> Placement:
    """The Ray head: ``spec.ray.head.resources`` or ``options.head_resources``."""
    return Placement(resources=ctx.job.spec.ray.head.resources or ctx.options.head_resources)


def worker_placement(ctx: RenderContext) -> Placement:
    """Workers: ``resourcesPerWorker`` plus accelerators; on TPU the GKE accelerator/topology
    selector, the TPU toleration and the operator-wide TPU defaults (per-slice affinity is
    added by the worker renderer)."""
    shape = ctx.tpu_shape
    if shape is None:
        return Placement(resources=ctx.worker_resources)
    return Placement(
        resources=ctx.worker_resources,
        node_selector=shape.node_selector(),
        tolerations=(GKE_TPU_TOLERATION,),
        default_node_selector=ctx.options.tpu_node_selector,
        default_tolerations=ctx.options.tpu_tolerations,
    )


def validation_placement(ctx: RenderContext) -> Placement:
    """Validation pool pods: ``pool.resources``, ``pool.nodeSelector`` and ``pool.tolerations``,
    the spot selector and toleration when ``pool.spot``, the operator-wide validation defaults.

    Raises:
        ValueError: without ``spec.validation``, or when ``pool.nodeSelector`` contradicts
            ``pool.spot``.
    """
    validation = ctx.job.spec.validation
    if validation is None:
        raise ValueError("spec.validation is not set")
    return _cpu_pool_placement(
        validation.pool,
        "spec.validation.pool",
        default_node_selector=ctx.options.validation_node_selector,
        default_tolerations=ctx.options.validation_tolerations,
    )


def data_placement(ctx: RenderContext) -> Placement:
    """Data pool pods: ``pool.resources``, ``pool.nodeSelector`` and ``pool.tolerations``, the
    spot selector and toleration when ``pool.spot`` (no operator-wide defaults).

    Raises:
        ValueError: without ``spec.data``, or when ``pool.nodeSelector`` contradicts
            ``pool.spot``.
    """
    data = ctx.job.spec.data
    if data is None:
        raise ValueError("spec.data is not set")
    return _cpu_pool_placement(data.pool, "spec.data.pool")


def _cpu_pool_placement(
    pool: ValidationPoolConfig | DataPoolConfig,
    field: str,
    *,
    default_node_selector: Mapping[str, str] | None = None,
    default_tolerations: Sequence[Mapping[str, Any]] = (),
) -> Placement:
    """A CPU pool's pods (validation or data): its resources, selector and tolerations, plus
    the GKE spot selector and toleration when ``pool.spot``."""
    node_selector: dict[str, str] = {}
    tolerations: list[dict[str, Any]] = [dict(t) for t in pool.tolerations]
    if pool.spot:
        current = pool.node_selector.get(GKE_SPOT_LABEL)
        if current is not None and current != "true":
            raise ValueError(
                f"{field}.nodeSelector[{GKE_SPOT_LABEL!r}]: {current!r} "
                "contradicts spot: true; set spot: false for on-demand nodes"
            )
        node_selector[GKE_SPOT_LABEL] = "true"
        tolerations.append(dict(GKE_SPOT_TOLERATION))
    return Placement(
        resources=pool.resources,
        node_selector=node_selector,
        user_node_selector=pool.node_selector,
        tolerations=tuple(tolerations),
        default_node_selector=default_node_selector if default_node_selector is not None else {},
        default_tolerations=default_tolerations,
    )


def driver_placement(ctx: RenderContext) -> Placement:
    """The driver: ``spec.ray.driver.resources`` or ``options.driver_resources``; in local
    mode (``numWorkers: 0``, the train function runs in the driver) ``resourcesPerWorker``
    first, plus a GPU for ``useGpu``."""
    scaling = ctx.job.spec.scaling
    configured = dict(ctx.job.spec.ray.driver.resources or ctx.options.driver_resources)
    if scaling.num_workers > 0:
        return Placement(resources=configured)
    resources: dict[str, int | str] = dict(scaling.resources_per_worker or {}) or configured
    if scaling.use_gpu and GPU_RESOURCE not in resources:
        resources[GPU_RESOURCE] = 1
    return Placement(resources=resources)
