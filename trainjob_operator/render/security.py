"""Who may talk to a job's Ray cluster: Ray token authentication and the job's NetworkPolicy.

- **Ray token authentication** (Ray 2.60, ``RAY_AUTH_MODE=token``). Every Ray process of the
  job (head, workers, validation pool, driver, and the ``ray health-check`` they wait with)
  gets ``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN`` from the per-job Secret
  ``<job>-ray-auth`` (:func:`ray_auth_secret`, owned by the TrainJob, so it goes away with
  it). The GCS, the Ray client server and the dashboard then refuse any caller without the
  token. The token comes through ``secretKeyRef`` (not a file) so that the pod spec holds
  only the reference. It is ``HMAC-SHA256(options.ray_auth_key, uid)``: 256 bits no one
  without the operator's key can derive, and the same on every render of one operator process
  (rendering stays deterministic). The Secret is created once and never updated, so an
  operator restart (a new key) does not change a running job's token.
- **NetworkPolicy** ``<job>-ray`` (:func:`network_policy`): the job's pods accept traffic only
  from pods of the same job (label ``trainjob.dev/name``), and on the driver's training
  metrics port (:data:`~trainjob_operator.constants.DRIVER_METRICS_PORT`, TCP) from anywhere,
  so a Prometheus in any namespace scrapes it: only the driver listens there, serving only
  ``/metrics`` (counts and timings, no secrets), and no Ray process uses that port. The
  operator never connects to Ray (it reads pod status from the API server), so it needs no
  rule. NetworkPolicies are additive: to let Prometheus scrape Ray's own metrics port, a
  cluster admin adds a policy of their own selecting ``trainjob.dev/name`` pods. A cluster
  without a NetworkPolicy implementation ignores the object; token authentication still
  applies.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from typing import Any

from trainjob_operator.constants import DRIVER_METRICS_PORT, NAME_LABEL
from trainjob_operator.render.context import RenderContext, common_labels, object_meta
from trainjob_operator.render.hashing import finalize
from trainjob_operator.render.names import network_policy_name, ray_auth_secret_name

__all__ = [
    "RAY_AUTH_MODE_ENV",
    "RAY_AUTH_SECRET_KEY",
    "RAY_AUTH_TOKEN_ENV",
    "network_policy",
    "ray_auth_env",
    "ray_auth_secret",
    "ray_auth_token",
]

RAY_AUTH_MODE_ENV = "RAY_AUTH_MODE"
"""Ray's switch for token authentication (value ``token``)."""
RAY_AUTH_TOKEN_ENV = "RAY_AUTH_TOKEN"
"""The token Ray's processes present and check."""
RAY_AUTH_SECRET_KEY = "token"
"""The key of the token in the ``<job>-ray-auth`` Secret."""


def ray_auth_token(ctx: RenderContext) -> str:
    """The job's Ray token: 64 hex characters, ``HMAC-SHA256(options.ray_auth_key, uid)``."""
    return hmac.new(ctx.options.ray_auth_key, ctx.uid.encode(), hashlib.sha256).hexdigest()


def ray_auth_env(ctx: RenderContext) -> list[dict[str, Any]]:
    """``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN`` from the job's Secret."""
    return [
        {"name": RAY_AUTH_MODE_ENV, "value": "token"},
        {
            "name": RAY_AUTH_TOKEN_ENV,
            "valueFrom": {
                "secretKeyRef": {
                    "name": ray_auth_secret_name(ctx.name),
                    "key": RAY_AUTH_SECRET_KEY,
                }
            },
        },
    ]


def ray_auth_secret(ctx: RenderContext) -> dict[str, Any]:
    """The Secret ``<job>-ray-auth`` holding the job's Ray token (:func:`ray_auth_token`)."""
    token = base64.b64encode(ray_auth_token(ctx).encode()).decode()
    return finalize(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": object_meta(
                ctx, ray_auth_secret_name(ctx.name), common_labels(ctx, "head")
            ),
            "type": "Opaque",
            "data": {RAY_AUTH_SECRET_KEY: token},
        }
    )


def network_policy(ctx: RenderContext) -> dict[str, Any]:
    """The NetworkPolicy ``<job>-ray``: ingress to the job's pods only from the job's pods,
    and to the driver's metrics port from anywhere (Prometheus)."""
    job_pods = {"matchLabels": {NAME_LABEL: ctx.name}}
    return finalize(
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": object_meta(ctx, network_policy_name(ctx.name), common_labels(ctx, "head")),
            "spec": {
                "podSelector": job_pods,
                "policyTypes": ["Ingress"],
                "ingress": [
                    {"from": [{"podSelector": job_pods}]},
                    {"ports": [{"protocol": "TCP", "port": DRIVER_METRICS_PORT}]},
                ],
            },
        }
    )
