"""Idle Ray worker processes for the next worker group, asked of the raylets ahead of it.

Every worker actor runs in a Ray worker process of its own. A process the raylet starts
for an actor imports Ray, and on nodes started with ``RAY_preload_python_modules`` (the
operator renders it into torch CPU worker pods) torch too, before the actor's constructor
runs: a fraction of a second bare, seconds with torch on a small machine. A raylet
prestarts idle processes only when it starts or meets its node's first driver, and a
worker group's actors take those with them when they die. So a later group of the same
driver (a restart after a worker failure, or the next ``fit()`` in the same script) would
wait for new processes.

:func:`idle_worker_requests` and :func:`send_idle_worker_requests` ask each node's raylet,
through its ``PrestartWorkers`` RPC, to start idle processes for this driver's job now.
Ray hands them to the next actors placed on that node that ask for a process of the same
job and ``runtime_env``, and keeps them past the raylet's soft limit on idle workers
(``RAY_num_workers_soft_limit``) for the keep-alive, then stops the extras; they end with
the job. The RPC is not part of Ray's public Python API: the call is best effort and
anything it raises is logged, not raised.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trainer_runtime.errors import UserConfigError

logger = logging.getLogger(__name__)

#: Seconds the raylets keep the idle processes asked for the next worker group; 0 asks none.
PRESTART_KEEP_ALIVE_ENV = "TRAINJOB_PRESTART_KEEP_ALIVE_S"
DEFAULT_PRESTART_KEEP_ALIVE_S = 60
#: How long one raylet may take to answer (a node that went away is skipped after this).
RPC_TIMEOUT_S = 2.0


def prestart_keep_alive_s(environ: Mapping[str, str] = os.environ) -> int:
    """The keep-alive of the idle processes asked for the next worker group
    (``TRAINJOB_PRESTART_KEEP_ALIVE_S``, whole seconds; 0 turns the request off)."""
    raw = environ.get(PRESTART_KEEP_ALIVE_ENV, "").strip()
    if not raw:
        return DEFAULT_PRESTART_KEEP_ALIVE_S
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise UserConfigError(
            f"{PRESTART_KEEP_ALIVE_ENV}={raw!r} is not a whole number of seconds >= 0; set "
            f"it to 0 to start no idle Ray worker processes for the next worker group, or "
            f"unset it for the default ({DEFAULT_PRESTART_KEEP_ALIVE_S})"
        )
    return value


@dataclass(frozen=True)
class IdleWorkerRequest:
    """What to ask one raylet: ``count`` idle Python worker processes of job ``job_id``
    (binary), kept ``keep_alive_s`` seconds."""

    node_id: str
    address: str
    job_id: bytes
    count: int
    keep_alive_s: int


def idle_worker_requests(per_node: Mapping[str, int], keep_alive_s: int) -> list[IdleWorkerRequest]:
    """The requests for ``per_node`` (Ray node id, hex -> process count) in the current job,
    one per alive node; none when ``keep_alive_s`` is 0, without ``ray.init()`` in this
    process, or when the job has a ``runtime_env`` (its actors inherit it, and Ray starts
    a new process for a ``runtime_env`` that an idle process lacks). Reads the job and the
    nodes' raylet addresses from Ray; a failure to read them is logged and gives none."""
    import ray

    wanted = {node: count for node, count in per_node.items() if count > 0}
    if not wanted or keep_alive_s <= 0 or not ray.is_initialized():
        return []
    try:
        context = ray.get_runtime_context()
        if context.runtime_env:
            return []
        job_id = bytes.fromhex(context.get_job_id())
        nodes = ray.nodes()
    except Exception as exc:  # noqa: BLE001 - an optimisation: nothing to ask then
        logger.debug("no idle workers asked for: %s", exc)
        return []
    return [
        IdleWorkerRequest(
            node["NodeID"],
            f"{node['NodeManagerAddress']}:{node['NodeManagerPort']}",
            job_id,
            wanted[node["NodeID"]],
            keep_alive_s,
        )
        for node in nodes
        if node.get("NodeID") in wanted and node.get("Alive", False)
    ]


def send_idle_worker_requests(requests: Sequence[IdleWorkerRequest]) -> list[str]:
    """Send each request to its raylet (``PrestartWorkers``, at most ``RPC_TIMEOUT_S`` each;
    Ray's own gRPC channel set-up, so its token authentication and TLS apply). Returns the
    node ids whose raylet accepted; a raylet that is gone or refuses is logged and skipped.
    Talks to the raylets only, not to this process's Ray worker, so any thread may call it."""
    from ray._private.grpc_utils import init_grpc_channel

    # Generated protobuf modules (no type information).
    common_pb2: Any = importlib.import_module("ray.core.generated.common_pb2")
    node_manager_pb2: Any = importlib.import_module("ray.core.generated.node_manager_pb2")
    node_manager_grpc: Any = importlib.import_module("ray.core.generated.node_manager_pb2_grpc")

    accepted = []
    for request in requests:
        message = node_manager_pb2.PrestartWorkersRequest(
            language=common_pb2.Language.PYTHON,
            job_id=request.job_id,
            num_workers=request.count,
            keep_alive_duration_secs=request.keep_alive_s,
        )
        try:
            channel = init_grpc_channel(request.address)
        except Exception as exc:  # noqa: BLE001 - as below
            logger.debug("no channel to raylet %s: %s", request.address, exc)
            continue
        try:
            stub = node_manager_grpc.NodeManagerServiceStub(channel)
            stub.PrestartWorkers(message, timeout=RPC_TIMEOUT_S)
            accepted.append(request.node_id)
        except Exception as exc:  # noqa: BLE001 - an optimisation: the next group starts anyway
            logger.debug("raylet %s did not prestart workers: %s", request.address, exc)
        finally:
            channel.close()
    if accepted:
        logger.debug("asked %d raylet(s) for idle workers for the next worker group", len(accepted))
    return accepted
