"""The Ray side of the pods: ports, ``ray start`` commands and logical resources."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from trainjob_operator.api.quantity import parse_quantity
from trainjob_operator.constants import RAY_POOL_LABEL
from trainjob_operator.render.names import GCS_PORT

if TYPE_CHECKING:
    from trainjob_operator.render.context import RenderContext

__all__ = [
    "CLIENT_PORT",
    "DASHBOARD_PORT",
    "DATA_POOL_LABELS",
    "GCS_PORT",
    "MEGASCALE_PORT",
    "METRICS_PORT",
    "PRELOAD_MEMORY_PER_CPU",
    "RAY_NODE_MODULE",
    "TORCH_PRELOAD_MODULES",
    "TRAIN_POOL_LABELS",
    "VALIDATION_POOL_LABELS",
    "WORKER_PRESTART_ENV_NAMES",
    "label_selector_json",
    "ray_labels_arg",
    "ray_resources_arg",
    "ray_worker_command",
    "worker_prestart_env",
]

DASHBOARD_PORT = 8265
CLIENT_PORT = 10001
METRICS_PORT = 8080
"""Ray's Prometheus metrics export port on every Ray node."""
MEGASCALE_PORT = 8081
"""Multislice (megascale) coordinator port, the value Ray's TPU support uses."""


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


TRAIN_POOL_LABELS: Mapping[str, str] = {RAY_POOL_LABEL: "train"}
"""Ray node labels of the worker pods; the driver's train workers select them
(:data:`~trainjob_operator.constants.WORKER_LABEL_SELECTOR_ENV`)."""
VALIDATION_POOL_LABELS: Mapping[str, str] = {RAY_POOL_LABEL: "validation"}
"""Ray node labels of the validation pool's pods."""
DATA_POOL_LABELS: Mapping[str, str] = {RAY_POOL_LABEL: "data"}
"""Ray node labels of the data pool's pods (``spec.data.pool``); the training datasets' Ray
Data tasks select them (:data:`~trainjob_operator.constants.DATA_LABELS_ENV`)."""


def ray_labels_arg(labels: Mapping[str, str]) -> str:
    """``--labels=k1=v1,k2=v2`` (Ray node labels, sorted: deterministic)."""
    return "--labels=" + ",".join(f"{key}={labels[key]}" for key in sorted(labels))


def label_selector_json(labels: Mapping[str, str]) -> str:
    """The Ray label selector ``labels`` as the env value the launcher and runtime read
    (JSON, sorted keys: deterministic), e.g. ``{"trainjob.dev/pool": "train"}``."""
    return json.dumps(dict(labels), sort_keys=True)


TORCH_PRELOAD_MODULES = "torch.distributed,torch._dynamo"
"""What a torch worker imports before its first DDP step (``torch.distributed`` for the
process group, ``torch._dynamo`` when DDP wraps the model): seconds of a fresh process's
start, which the preload moves before the worker actor is asked for."""

PRELOAD_MEMORY_PER_CPU = 512 * 2**20
"""Memory per logical CPU a worker pod needs for the preloaded prestart: the raylet prestarts
one worker per CPU, each importing torch (about 350 MiB), before it stops all but one."""

WORKER_PRESTART_ENV_NAMES = (
    "RAY_enable_worker_prestart",
    "RAY_num_workers_soft_limit",
    "RAY_preload_python_modules",
)
"""The raylet settings :func:`worker_prestart_env` renders; a TrainJob's ``spec.env`` may set
any of them, and its value then replaces the operator's."""


def worker_prestart_env(ctx: RenderContext) -> list[dict[str, str]]:
    """Raylet settings of a CPU/GPU worker pod that have its worker actor start in a Ray worker
    process started (and, for torch on CPU, imported) before ``fit()`` asks for it.

    Without them every worker actor starts a new Python process and imports the framework
    after ``fit()``, before its first step (about 3 s for torch on CPU, the start-up floor).
    With them the raylet starts its workers when the pod starts (``RAY_enable_worker_prestart``)
    and keeps one idle (``RAY_num_workers_soft_limit=1``: by default it stops idle workers
    beyond the node's free CPUs, which is none once the trainer's placement group holds the
    pod's CPUs), and Ray hands the pod's one worker actor that process. The kept process
    becomes the actor, so the pod needs no more memory than before once training runs.

    ``RAY_preload_python_modules`` (the imports) is set only for ``framework: torch`` without
    GPUs, and only when ``resourcesPerWorker.memory`` is unset or at least
    :data:`PRELOAD_MEMORY_PER_CPU` per CPU (all prestarted workers import before the raylet
    stops the extra ones). JAX reads its platform settings when imported, which may come from
    the worker's environment later, and on GPU an early import could fix which devices CUDA
    sees, so those pods get prestarted processes without imports.

    TPU hosts get none of this: their worker actors carry per-host variables in a Ray
    ``runtime_env``, and Ray starts a new process for a runtime_env. Names the TrainJob's
    ``spec.env`` sets are left out (its value applies).
    """
    scaling = ctx.job.spec.scaling
    if scaling.tpu is not None:
        return []
    env = {"RAY_enable_worker_prestart": "1", "RAY_num_workers_soft_limit": "1"}
    memory = scaling.pod_resources().get("memory")
    memory_fits = (
        memory is None
        or parse_quantity(memory) >= scaling.cpus_per_worker() * PRELOAD_MEMORY_PER_CPU
    )
    if ctx.job.spec.framework == "torch" and scaling.gpus_per_worker() == 0 and memory_fits:
        env["RAY_preload_python_modules"] = TORCH_PRELOAD_MODULES
    user_set = {var.name for var in ctx.job.spec.env}
    return [{"name": k, "value": v} for k, v in env.items() if k not in user_set]
