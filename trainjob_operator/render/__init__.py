"""Pure renderers: ``TrainJob`` model -> the Kubernetes objects that run it (plain dicts).

No I/O and no kopf: the reconciler reads the observed children, calls :func:`render_children`
for the desired ones, diffs them by :func:`child_key` and recreates a child whose
``trainjob.dev/spec-hash`` annotation (:data:`SPEC_HASH_ANNOTATION`) differs.

Children of TrainJob ``<job>`` (all with owner references, ``app.kubernetes.io/*`` and
``trainjob.dev/name``/``role`` labels; pods also ``trainjob.dev/attempt``):

- ServiceAccount, Role, RoleBinding ``<job>-driver`` (:mod:`.driver`);
- Service ``<job>-headless`` (headless; stable pod DNS) and Pod ``<job>-head`` (:mod:`.head`);
- worker Pods ``<job>-w<i>`` or, on TPU, ``<job>-s<slice>-h<host>`` (:mod:`.workers`);
- validation pool Pods ``<job>-val-<i>`` (:mod:`.validation_pool`);
- data pool Pods ``<job>-data-<i>`` (:mod:`.data_pool`);
- the driver Pod ``<job>-driver`` (:mod:`.driver`).

Module layout: :mod:`.options` (operator-wide settings, from the chart's env vars),
:mod:`.context` (a job's :class:`~.context.RenderContext`, resolved once per render, and the
metadata of every child), :mod:`.names` (names, hostnames, head address), :mod:`.placement`
(resources, node selectors, tolerations and affinity per role), :mod:`.pods` (containers and
pods), :mod:`.ray` (ports and ``ray start``), :mod:`.hashing` (child keys, spec hash),
:mod:`.pod_template` (``spec.podTemplate`` checks) and one module per object kind;
:mod:`.children` renders the whole set from one context.
"""

from trainjob_operator.constants import (
    APP_LABEL,
    ATTEMPT_LABEL,
    KUEUE_POD_GROUP_NAME,
    KUEUE_POD_GROUP_TOTAL_COUNT,
    KUEUE_QUEUE_LABEL,
    MANAGED_BY_LABEL,
    NAME_LABEL,
    ROLE_LABEL,
    SLICE_LABEL,
    SPEC_HASH_ANNOTATION,
)
from trainjob_operator.render.children import render_children, render_for_reconcile, renderer_for
from trainjob_operator.render.context import RenderContext, build_context
from trainjob_operator.render.data_pool import render_data_pods
from trainjob_operator.render.driver import (
    DRIVER_MANIFEST_ENV,
    driver_manifest,
    driver_manifest_json,
    driver_service_account_name,
    render_driver_pod,
    render_driver_role,
    render_driver_role_binding,
    render_driver_service_account,
)
from trainjob_operator.render.hashing import child_key, spec_hash
from trainjob_operator.render.head import render_head_pod, render_headless_service
from trainjob_operator.render.names import head_address
from trainjob_operator.render.options import RenderOptions, render_options_from_env
from trainjob_operator.render.pod_template import POD_TEMPLATE_KEYS, validate_pod_template
from trainjob_operator.render.validation_pool import render_validation_pods
from trainjob_operator.render.workers import render_worker_pods

__all__ = [
    "APP_LABEL",
    "ATTEMPT_LABEL",
    "DRIVER_MANIFEST_ENV",
    "KUEUE_POD_GROUP_NAME",
    "KUEUE_POD_GROUP_TOTAL_COUNT",
    "KUEUE_QUEUE_LABEL",
    "MANAGED_BY_LABEL",
    "NAME_LABEL",
    "POD_TEMPLATE_KEYS",
    "ROLE_LABEL",
    "SLICE_LABEL",
    "SPEC_HASH_ANNOTATION",
    "RenderContext",
    "RenderOptions",
    "build_context",
    "child_key",
    "driver_manifest",
    "driver_manifest_json",
    "driver_service_account_name",
    "head_address",
    "render_children",
    "render_data_pods",
    "render_driver_pod",
    "render_driver_role",
    "render_driver_role_binding",
    "render_driver_service_account",
    "render_for_reconcile",
    "render_head_pod",
    "render_headless_service",
    "render_options_from_env",
    "render_validation_pods",
    "render_worker_pods",
    "renderer_for",
    "spec_hash",
    "validate_pod_template",
]
