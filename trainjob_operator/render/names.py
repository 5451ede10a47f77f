"""Names of a TrainJob's child objects, stable pod hostnames and the Ray head address.

Every child is named ``<job>-<suffix>``. Pods set ``hostname`` to their own name and
``subdomain`` to the headless Service, so each pod is reachable at the stable DNS name
``<pod>.<job>-headless`` (``<pod>.<job>-headless.<namespace>.svc.<cluster domain>`` in full)
from anywhere in the namespace, across pod restarts. TPU hosts use these names for
``TPU_WORKER_HOSTNAMES`` and the Ray workers and the driver use the head's name as the GCS address.

All names must be DNS labels (RFC 1123, at most 63 characters); :func:`check_dns_label` asserts it.
"""

from __future__ import annotations

import re

__all__ = [
    "DNS_LABEL_MAX_LENGTH",
    "GCS_PORT",
    "check_dns_label",
    "cpu_worker_pod_name",
    "data_pod_name",
    "driver_name",
    "head_address",
    "head_host",
    "head_pod_name",
    "headless_service_name",
    "megascale_coordinator_host",
    "network_policy_name",
    "pod_fqdn",
    "ray_auth_secret_name",
    "tpu_slice_name",
    "tpu_worker_hostnames",
    "tpu_worker_pod_name",
    "validation_pod_name",
]

DNS_LABEL_MAX_LENGTH = 63
"""Longest RFC 1123 label: the limit for pod names, hostnames, Service names and label values."""
GCS_PORT = 6379
"""Port of the Ray GCS on the head (``ray start --head --port``)."""

_DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def check_dns_label(value: str, what: str) -> str:
    """Return ``value`` when it is a valid DNS label (RFC 1123, <= 63 characters).

    Raises:
        ValueError: naming ``what`` (e.g. ``"pod name"``) and the offending value.
    """
    if len(value) > DNS_LABEL_MAX_LENGTH:
        raise ValueError(
            f"{what} {value!r} is {len(value)} characters long; at most "
            f"{DNS_LABEL_MAX_LENGTH} are allowed (use a shorter TrainJob name)"
        )
    if not _DNS_LABEL_RE.match(value):
        raise ValueError(
            f"{what} {value!r} is not a valid DNS label (lowercase letters, digits and '-', "
            "starting and ending with a letter or digit)"
        )
    return value


def headless_service_name(job: str) -> str:
    """``<job>-headless``: the headless Service giving every pod of the job a stable DNS name."""
    return f"{job}-headless"


def dashboard_service_name(job: str) -> str:
    """``<job>-dashboard``: the opt-in ClusterIP Service of the Ray dashboard."""
    return f"{job}-dashboard"


def head_pod_name(job: str) -> str:
    """``<job>-head``: the Ray head pod (also its hostname)."""
    return f"{job}-head"


def cpu_worker_pod_name(job: str, index: int) -> str:
    """``<job>-w<index>``: a CPU or GPU worker pod."""
    return f"{job}-w{index}"


def tpu_slice_name(job: str, slice_index: int) -> str:
    """``<job>-s<slice>``: the name of one TPU slice (``TPU_NAME``, label ``trainjob.dev/slice``
    holds just the index)."""
    return f"{job}-s{slice_index}"


def tpu_worker_pod_name(job: str, slice_index: int, host: int) -> str:
    """``<job>-s<slice>-h<host>``: the worker pod on one host of a TPU slice."""
    return f"{tpu_slice_name(job, slice_index)}-h{host}"


def validation_pod_name(job: str, index: int) -> str:
    """``<job>-val-<index>``: a validation pool pod."""
    return f"{job}-val-{index}"


def data_pod_name(job: str, index: int) -> str:
    """``<job>-data-<index>``: a data pool pod (``spec.data.pool``)."""
    return f"{job}-data-{index}"


def driver_name(job: str) -> str:
    """``<job>-driver``: the driver pod and its ServiceAccount, Role and RoleBinding."""
    return f"{job}-driver"


def ray_auth_secret_name(job: str) -> str:
    """``<job>-ray-auth``: the Secret holding the job's Ray authentication token."""
    return f"{job}-ray-auth"


def network_policy_name(job: str) -> str:
    """``<job>-ray``: the NetworkPolicy admitting only the job's own pods to its pods."""
    return f"{job}-ray"


def pod_fqdn(job: str, pod: str) -> str:
    """The stable DNS name of a pod of ``job``: ``<pod>.<job>-headless``.

    The short form resolves through the pod's DNS search path (``<namespace>.svc.<domain>``), so
    it does not depend on the cluster domain.
    """
    return f"{pod}.{headless_service_name(job)}"


def head_host(job: str) -> str:
    """Stable DNS name of the Ray head: ``<job>-head.<job>-headless``."""
    return pod_fqdn(job, head_pod_name(job))


def head_address(job: str) -> str:
    """The GCS address of the Ray head, ``<job>-head.<job>-headless:6379``.

    It is what workers pass to ``ray start --address`` and the driver's ``RAY_ADDRESS``.
    """
    return f"{head_host(job)}:{GCS_PORT}"


def tpu_worker_hostnames(job: str, slice_index: int, hosts: int) -> list[str]:
    """The stable hostnames of one slice's hosts, in ``TPU_WORKER_ID`` order."""
    return [pod_fqdn(job, tpu_worker_pod_name(job, slice_index, h)) for h in range(hosts)]


def megascale_coordinator_host(job: str) -> str:
    """Host 0 of slice 0: the multislice (megascale) coordinator."""
    return pod_fqdn(job, tpu_worker_pod_name(job, 0, 0))
