"""The operator's vocabulary, each string once: the API's names, label and annotation keys, times.

Like KubeRay's ``utils/constant.go`` and Kubeflow Trainer's ``constants.py``: every label and
annotation key the operator writes or reads is defined here, with what it means, and every other
module imports it from here. Standard library only (``tests/test_import_graph.py``).
"""

from __future__ import annotations

import datetime as dt
from typing import Final

__all__ = [
    "API_VERSION",
    "APP_LABEL",
    "ATTEMPT_LABEL",
    "DATA_LABELS_ENV",
    "DEFAULT_TERMINATION_GRACE_S",
    "DRIVER_INVALID_INPUT_EXIT_CODE",
    "DRIVER_METRICS_PORT",
    "DRIVER_PREEMPTED_EXIT_CODE",
    "FINALIZER",
    "GROUP",
    "KIND",
    "KUEUE_POD_GROUP_NAME",
    "KUEUE_POD_GROUP_TOTAL_COUNT",
    "KUEUE_QUEUE_LABEL",
    "LABEL_PREFIX",
    "LAST_DEMAND_ANNOTATION",
    "MANAGED_BY_LABEL",
    "METRICS_PORT_ENV",
    "NAME_LABEL",
    "PLURAL",
    "RAY_POOL_LABEL",
    "ROLE_LABEL",
    "SLICE_ID_LABEL",
    "SLICE_LABEL",
    "SPEC_GENERATION_ANNOTATION",
    "SPEC_HASH_ANNOTATION",
    "TERMINATION_GRACE_ENV",
    "TIMESTAMP_FORMAT",
    "VALIDATION_DATA_LABELS_ENV",
    "VERSION",
    "WORKER_LABEL_SELECTOR_ENV",
    "format_time",
    "now",
    "parse_time",
]

# --------------------------------------------------------------------------- the API

GROUP = "trainjob.dev"
"""The API group of the TrainJob resource."""
VERSION = "v1alpha1"
"""The served (and stored) version of the TrainJob resource."""
API_VERSION = f"{GROUP}/{VERSION}"
"""``apiVersion`` of TrainJob objects."""
KIND: Final = "TrainJob"
"""``kind`` of TrainJob objects."""
PLURAL = "trainjobs"
"""Plural resource name (``kubectl get trainjobs``)."""

# --------------------------------------------------------------------------- the pods' environment

TERMINATION_GRACE_ENV = "TRAINJOB_TERMINATION_GRACE_PERIOD_S"
"""Set on every pod to its ``terminationGracePeriodSeconds`` (Kubernetes' default 30 when the
podTemplate gives none): the seconds between a termination notice (SIGTERM) and SIGKILL. The
runtime (:mod:`trainer_runtime.preemption`) and the Ray node process
(:mod:`trainjob_operator.launcher.ray_node`) read it to date a preemption notice."""
DEFAULT_TERMINATION_GRACE_S = 30
"""Kubernetes' default ``terminationGracePeriodSeconds``."""
METRICS_PORT_ENV = "TRAINJOB_METRICS_PORT"
"""The port the driver serves its training metrics on (``/metrics``; unset or 0: not served).
The operator sets it in every driver pod (:data:`DRIVER_METRICS_PORT`); ``trainjob run
--metrics-port`` sets it too; :mod:`trainer_runtime._driver_metrics` reads it."""
DRIVER_METRICS_PORT = 9091
"""The driver pod's metrics port (its container port named ``metrics``)."""
WORKER_LABEL_SELECTOR_ENV = "TRAINJOB_WORKER_LABEL_SELECTOR"
"""Set in the driver pod: the Ray node labels (JSON) each train worker's node must have, the
trainer's ``ScalingConfig.label_selector`` (``{RAY_POOL_LABEL: "train"}``): the workers are
placed on the worker pods' Ray nodes only, never on a validation pool node that has CPUs free."""
VALIDATION_DATA_LABELS_ENV = "TRAINJOB_VALIDATION_DATA_LABEL_SELECTOR"
"""Set on the validation pool's pods (their Ray workers inherit it): the Ray node labels (JSON)
the Ray Data tasks of a validation must run on, the pool's own (``{RAY_POOL_LABEL:
"validation"}``). :mod:`trainer_runtime._validation` sets it as Ray Data's
``DataContext.execution_options.label_selector`` before it calls the validate function, so
they stay on the pool also once training ended and the worker pods' CPUs are free."""
DATA_LABELS_ENV = "TRAINJOB_DATA_LABEL_SELECTOR"
"""Set in the driver pod when ``spec.data`` is: the Ray node labels (JSON) the training
datasets' Ray Data tasks must run on, the data pool's (``{RAY_POOL_LABEL: "data"}``). The
launcher (:func:`trainjob_operator.launcher.trainer.build_trainer`) makes it the datasets'
``ExecutionOptions.label_selector`` and the driver's ``DataContext``'s, so the preprocessing
never takes the train workers' (or the validation pool's) CPUs."""
DRIVER_INVALID_INPUT_EXIT_CODE = 2
"""The driver's exit status when its own checks of the TrainJob failed (entrypoint not
importable, bad config): no restart can fix it, so by default the job fails at once."""
DRIVER_PREEMPTED_EXIT_CODE = 3
"""The driver's exit status when training stopped on a preemption notice after committing
its last checkpoint (``PreemptionError``): by default a restart not counted against
``maxRestarts``, resuming from that checkpoint."""

# --------------------------------------------------------------------------- labels, annotations

LABEL_PREFIX = f"{GROUP}/"
"""Prefix of the operator's own label and annotation keys (reserved: users cannot set them)."""
NAME_LABEL = f"{GROUP}/name"
"""The TrainJob's name, on every child; the headless Service selects on it alone (all pods of
the job), and the reconciler lists a job's children by it."""
ROLE_LABEL = f"{GROUP}/role"
"""``head``, ``worker``, ``validation`` or ``driver``."""
SLICE_LABEL = f"{GROUP}/slice"
"""Index of the TPU slice of a TPU worker pod (``"0"``, ``"1"``...)."""
SLICE_ID_LABEL = f"{GROUP}/slice-id"
"""On the host pods of a multi-host TPU slice: ``<TrainJob uid>-a<attempt>-s<slice>``, unique
in the cluster. The slice's node-pool affinity and its anti-affinity against every other slice
(of any TrainJob) select on it: each slice gets a node pool to itself."""
ATTEMPT_LABEL = f"{GROUP}/attempt"
"""Whole-cluster restart counter (``status.restarts``) on every pod; a restart renders new pods."""
SPEC_HASH_ANNOTATION = f"{GROUP}/spec-hash"
"""Hash of the rendered object (without this annotation); a change means "recreate" when the
TrainJob's spec changed since the pod was created (:data:`SPEC_GENERATION_ANNOTATION`)."""
SPEC_GENERATION_ANNOTATION = f"{GROUP}/spec-generation"
"""On each pod: the TrainJob's ``metadata.generation`` it was created for (not hashed). A pod
whose spec hash differs although the spec did not change since (a new operator version
renders differently) is left running: an operator upgrade does not restart training."""
LAST_DEMAND_ANNOTATION = f"{GROUP}/validation-last-demand"
"""On the TrainJob: when the validation pool last had work (scale-to-zero after an idle time)."""
FINALIZER = f"{GROUP}/finalizer"
"""The finalizer earlier builds of the operator (kopf's change handlers) put on TrainJobs; the
operator sets none now, and kopf removes this one where it finds it."""
RAY_POOL_LABEL = f"{GROUP}/pool"
"""A Ray node label (``ray start --labels``), not a Kubernetes one: ``train`` on the worker
pods' Ray nodes, ``validation`` on the validation pool's. The validation pool advertises the
CPUs of its pods for the Ray Data tasks a validation starts; the train workers select
``train`` (:data:`WORKER_LABEL_SELECTOR_ENV`), so none is ever placed on a validation node."""
APP_LABEL = "app.kubernetes.io/name"
"""The recommended Kubernetes application-name label."""
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
"""The recommended "managed by" label (``trainjob-operator``)."""
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
"""Kueue's LocalQueue of the job's pods (``spec.queueName``)."""
KUEUE_POD_GROUP_NAME = "kueue.x-k8s.io/pod-group-name"
"""Kueue reads it as a label; it is also set as an annotation for tools that look there."""
KUEUE_POD_GROUP_TOTAL_COUNT = "kueue.x-k8s.io/pod-group-total-count"
"""Kueue's pod-group size annotation (all pods admitted together)."""

# --------------------------------------------------------------------------- times

TIMESTAMP_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
"""Kubernetes' RFC 3339 form, in UTC and whole seconds, of every time in a TrainJob's status."""


def format_time(moment: dt.datetime) -> str:
    """``moment`` in :data:`TIMESTAMP_FORMAT` (converted to UTC; a naive time is taken as local)."""
    return moment.astimezone(dt.UTC).strftime(TIMESTAMP_FORMAT)


def now() -> str:
    """The current time in :data:`TIMESTAMP_FORMAT`."""
    return format_time(dt.datetime.now(dt.UTC))


def parse_time(value: str) -> dt.datetime:
    """A :data:`TIMESTAMP_FORMAT` string as an aware UTC datetime.

    Raises:
        ValueError: for a string in another form.
    """
    return dt.datetime.strptime(value, TIMESTAMP_FORMAT).replace(tzinfo=dt.UTC)
