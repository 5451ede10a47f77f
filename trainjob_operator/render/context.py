"""A job's render context: the inputs every renderer shares, resolved and checked once.

:func:`build_context` turns ``(TrainJob, uid, attempt, options)`` into a :class:`RenderContext`;
whatever several children need (the parsed podTemplate, the TPU slice shape, each role's
:class:`~trainjob_operator.render.placement.Placement`, the driver's manifest) is computed on
first use and kept on the context, so rendering all children of a reconcile computes it once.
Also here: the metadata every child carries (labels, owner reference).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

from trainjob_operator.api.tpu import TpuSliceShape
from trainjob_operator.api.trainjob import TrainJob
from trainjob_operator.constants import (
    API_VERSION,
    APP_LABEL,
    DEFAULT_TERMINATION_GRACE_S,
    KIND,
    MANAGED_BY_LABEL,
    NAME_LABEL,
    ROLE_LABEL,
    TERMINATION_GRACE_ENV,
)
from trainjob_operator.render import placement as placements
from trainjob_operator.render.names import check_dns_label, head_address, headless_service_name
from trainjob_operator.render.options import RenderOptions
from trainjob_operator.render.placement import Placement
from trainjob_operator.render.pod_template import PodTemplateOverrides, parse_pod_template

__all__ = [
    "RenderContext",
    "Role",
    "build_context",
    "common_env",
    "common_labels",
    "object_meta",
    "owner_reference",
    "pod_group_name",
]

Role = Literal["head", "worker", "validation", "data", "driver", "dashboard"]


@dataclass(frozen=True)
class RenderContext:
    """Everything a renderer needs, resolved once: the job, its uid, namespace and attempt.

    The cached properties (:attr:`tpu_shape`, :attr:`worker_resources`, the per-role
    placements) are computed on first use and then shared by every child rendered from this
    context.
    """

    job: TrainJob
    uid: str
    attempt: int
    namespace: str
    options: RenderOptions
    overrides: PodTemplateOverrides

    @property
    def name(self) -> str:
        """The TrainJob's name."""
        return self.job.metadata.name

    @cached_property
    def head_address(self) -> str:
        """GCS address of the Ray head (``<job>-head.<job>-headless:6379``)."""
        return head_address(self.name)

    @cached_property
    def subdomain(self) -> str:
        """The headless Service every pod's hostname lives under (``<job>-headless``)."""
        return headless_service_name(self.name)

    @property
    def storage_service_account(self) -> str | None:
        """``spec.storage.serviceAccountName`` (Workload Identity), if set."""
        storage = self.job.spec.storage
        return storage.service_account_name if storage is not None else None

    @cached_property
    def tpu_shape(self) -> TpuSliceShape | None:
        """The TPU slice shape of the workers, or ``None`` without TPUs."""
        return self.job.spec.scaling.tpu_shape

    @cached_property
    def worker_resources(self) -> dict[str, int | str]:
        """Container resources of one worker pod (``ScalingConfig.pod_resources``)."""
        return self.job.spec.scaling.pod_resources()

    @cached_property
    def head_placement(self) -> Placement:
        """Where the Ray head runs and what it gets."""
        return placements.head_placement(self)

    @cached_property
    def worker_placement(self) -> Placement:
        """Where every worker runs and what it gets (a TPU slice adds its affinity)."""
        return placements.worker_placement(self)

    @cached_property
    def validation_placement(self) -> Placement:
        """Where the validation pool pods run and what they get (needs ``spec.validation``).

        Raises:
            ValueError: when ``pool.nodeSelector`` contradicts ``pool.spot``.
        """
        return placements.validation_placement(self)

    @cached_property
    def data_placement(self) -> Placement:
        """Where the data pool pods run and what they get (needs ``spec.data``).

        Raises:
            ValueError: when ``pool.nodeSelector`` contradicts ``pool.spot``.
        """
        return placements.data_placement(self)

    @cached_property
    def driver_placement(self) -> Placement:
        """Where the driver runs and what it gets."""
        return placements.driver_placement(self)

    @cached_property
    def owner_reference(self) -> dict[str, Any]:
        """The controller owner reference to the TrainJob (see :func:`owner_reference`)."""
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


def build_context(
    job: TrainJob, *, uid: str, attempt: int = 0, options: RenderOptions | None = None
) -> RenderContext:
    """Resolve and check the inputs shared by all renderers.

    Raises:
        ValueError: for an empty ``uid``, a negative ``attempt``, an invalid
            ``spec.podTemplate`` or a name that cannot make valid child names.
    """
    if not uid:
        raise ValueError("uid is required: the owner references need the TrainJob's uid")
    if attempt < 0:
        raise ValueError(f"attempt must be >= 0, got {attempt}")
    opts = options or RenderOptions()
    check_dns_label(job.metadata.name, "TrainJob name")
    check_dns_label(headless_service_name(job.metadata.name), "Service name")
    return RenderContext(
        job=job,
        uid=uid,
        attempt=attempt,
        namespace=job.metadata.namespace or opts.default_namespace,
        options=opts,
        overrides=parse_pod_template(job.spec.pod_template, opts.allowed_volume_types),
    )


def common_labels(ctx: RenderContext, role: Role | None = None) -> dict[str, str]:
    """Labels of every child: app, managed-by, the job name, and the role when given."""
    labels = {
        APP_LABEL: "trainjob",
        MANAGED_BY_LABEL: "trainjob-operator",
        NAME_LABEL: ctx.name,
    }
    if role is not None:
        labels[ROLE_LABEL] = role
    return labels


def owner_reference(ctx: RenderContext) -> dict[str, Any]:
    """The controller owner reference to the TrainJob (garbage collection, watches)."""
    return dict(ctx.owner_reference)


def object_meta(
    ctx: RenderContext,
    name: str,
    labels: Mapping[str, str],
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """``metadata`` of a child: name, namespace, labels, annotations, owner reference."""
    return {
        "name": name,
        "namespace": ctx.namespace,
        "labels": dict(labels),
        "annotations": dict(annotations or {}),
        "ownerReferences": [owner_reference(ctx)],
    }


def pod_group_name(ctx: RenderContext) -> str:
    """Kueue pod group of the head and workers of this attempt: ``<job>-attempt-<n>``.

    A whole-cluster restart is a new gang (admitted anew); a replaced worker joins the same one.
    """
    return check_dns_label(f"{ctx.name}-attempt-{ctx.attempt}", "Kueue pod group name")


def common_env(ctx: RenderContext) -> list[dict[str, Any]]:
    """Environment of every container: the job's name, namespace and attempt, and the pod's
    termination grace period (:data:`~trainjob_operator.constants.TERMINATION_GRACE_ENV`)."""
    grace = ctx.overrides.termination_grace_period_seconds
    return [
        {"name": "TRAINJOB_NAME", "value": ctx.name},
        {"name": "TRAINJOB_NAMESPACE", "value": ctx.namespace},
        {"name": "TRAINJOB_ATTEMPT", "value": str(ctx.attempt)},
        {
            "name": TERMINATION_GRACE_ENV,
            "value": str(DEFAULT_TERMINATION_GRACE_S if grace is None else grace),
        },
    ]
