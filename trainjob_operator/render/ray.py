"""The Ray side of the pods: ports, ``ray start`` commands and logical resources."""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from trainjob_operator.render.names import GCS_PORT

if TYPE_CHECKING:
    from trainjob_operator.render.context import RenderContext

__all__ = [
    "CLIENT_PORT",
    "DASHBOARD_PORT",
    "GCS_PORT",
    "MEGASCALE_PORT",
    "METRICS_PORT",
    "RAY_NODE_MODULE",
    "ray_resources_arg",
    "ray_worker_command",
    "wait_for_head_script",
]

DASHBOARD_PORT = 8265
CLIENT_PORT = 10001
METRICS_PORT = 8080
"""Ray's Prometheus metrics export port on every Ray node."""
MEGASCALE_PORT = 8081
"""Multislice (megascale) coordinator port, the value Ray's TPU support uses."""


def wait_for_head_script(ctx: RenderContext) -> str:
    """Shell lines that block until the Ray head's GCS answers (the head may start later)."""
    address = shlex.quote(ctx.head_address)
    return (
        f"until ray health-check --address={address} >/dev/null 2>&1; do\n"
        f"  echo waiting for the Ray head at {address}; sleep 2\n"
        "done\n"
    )


RAY_NODE_MODULE = "trainjob_operator.launcher.ray_node"
"""The worker pods' main process: ``ray start --block`` behind a drain on SIGTERM."""


def ray_worker_command(ctx: RenderContext, ray_args: Sequence[str]) -> list[str]:
    """``python -m trainjob_operator.launcher.ray_node --wait-for-head <head> -- ray start
    --address=<head>:6379 --block ...``: wait for the head, then run the Ray node, drained
    (not killed) on the kubelet's termination notice
    (:mod:`trainjob_operator.launcher.ray_node`).

    ``ray_args`` (``--num-cpus``, ``--resources``...) are appended.
    """
    return [
        "python",
        "-m",
        RAY_NODE_MODULE,
        f"--wait-for-head={ctx.head_address}",
        "--",
        "ray",
        "start",
        f"--address={ctx.head_address}",
        "--block",
        f"--metrics-export-port={METRICS_PORT}",
        "--disable-usage-stats",
        *ray_args,
    ]


def ray_resources_arg(resources: Mapping[str, float | int]) -> str:
    """``--resources=<json>`` with sorted keys (deterministic)."""
    return "--resources=" + json.dumps(dict(resources), sort_keys=True, separators=(",", ":"))
