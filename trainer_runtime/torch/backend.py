"""Process-group set-up for torch workers (a TCPStore rendezvous hosted by rank 0).

``init_method="env"`` (the default), as Ray Train's ``env://`` rendezvous (``MASTER_ADDR``
and ``MASTER_PORT`` set on every worker), with one difference in order: rank 0's store
server listens before any other rank connects. A client that finds no server yet retries
with a backoff (time lost at start-up whenever rank 0 was the slower to import torch).

``init_method="tcp"``, as Ray Train: every worker calls ``init_process_group`` with
``tcp://<rank 0's address>:<a free port on rank 0's node>``, and ``MASTER_ADDR`` /
``MASTER_PORT`` are not set.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from trainer_runtime.backend import Backend

if TYPE_CHECKING:
    from trainer_runtime.config import ScalingConfig
    from trainer_runtime.context import TrainContext
    from trainer_runtime.worker_group import WorkerGroup

logger = logging.getLogger(__name__)


_INIT_METHODS = ("env", "tcp")


@dataclass
class TorchConfig:
    """Ray Train's ``TorchConfig``, with its fields in its order.

    ``backend``: ``gloo`` or ``nccl`` (default: nccl with GPUs, else gloo).
    ``init_method``: how the workers find each other, ``"env"`` (the default: rank 0's
    address and port in ``MASTER_ADDR`` / ``MASTER_PORT``, ``env://``) or ``"tcp"``
    (``tcp://address:port``); another value raises Ray Train's ``ValueError`` (here when
    the config is made; Ray Train raises it when the workers start).
    ``timeout_s``: seconds for process-group operations to time out.
    """

    backend: str | None = None
    init_method: str = "env"
    timeout_s: int = 1800

    def __post_init__(self) -> None:
        if self.init_method not in _INIT_METHODS:
            raise ValueError(
                f"The provided init_method ({self.init_method}) is not supported. Must "
                f"be either 'env' or 'tcp'."
            )

    def resolve_backend(self, use_gpu: bool) -> str:
        """The process-group backend to use."""
        if self.backend is not None:
            if self.backend not in ("gloo", "nccl", "mpi"):
                raise ValueError(
                    f"TorchConfig.backend={self.backend!r} is not valid; use gloo or nccl"
                )
            return self.backend
        return "nccl" if use_gpu else "gloo"


#: Rank 0's rendezvous store server, from :func:`_start_store` until the process group
#: takes it over in :func:`_init_process_group`.
_store_server: Any = None


def _start_store(world_size: int, timeout_s: int) -> tuple[str, int]:
    """Runs on rank 0: start the rendezvous store server on a free port; its address.

    The same store ``env://`` creates on rank 0 (a multi-tenant TCPStore), on a port the
    OS picks while binding it, so no other process can take it in between.
    """
    import ray
    import torch.distributed as dist

    global _store_server
    addr = ray.util.get_node_ip_address()
    _store_server = dist.TCPStore(
        host_name=addr,
        port=0,
        world_size=world_size,
        is_master=True,
        timeout=timedelta(seconds=timeout_s),
        wait_for_workers=False,
        multi_tenant=True,
    )
    return addr, int(_store_server.port)


def _init_process_group(
    master_addr: str, master_port: int, backend: str, rank: int, world_size: int, timeout_s: int
) -> None:
    """Join the default process group through rank 0's store (rank 0 uses its server).

    ``MASTER_ADDR`` / ``MASTER_PORT`` are set as with ``env://``.
    """
    import torch.distributed as dist

    global _store_server
    os.environ["MASTER_ADDR"] = master_addr
    os.environ["MASTER_PORT"] = str(master_port)
    if dist.is_initialized():
        dist.destroy_process_group()
    timeout = timedelta(seconds=timeout_s)
    if rank == 0:
        if _store_server is None:
            raise RuntimeError("rank 0 has no rendezvous store: _start_store did not run")
        store, _store_server = _store_server, None  # the process group keeps it alive
    else:
        store = dist.TCPStore(
            host_name=master_addr,
            port=master_port,
            world_size=world_size,
            is_master=False,
            timeout=timeout,
        )
    dist.init_process_group(
        backend=backend, store=store, rank=rank, world_size=world_size, timeout=timeout
    )


def _free_port() -> tuple[str, int]:
    """Runs on rank 0: this node's address and a port free on it (as Ray Train's
    ``get_address_and_port``), for ``init_method="tcp"``."""
    import ray

    addr = ray.util.get_node_ip_address()
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        port = int(sock.getsockname()[1])
    return addr, port


def _init_process_group_tcp(
    url: str, backend: str, rank: int, world_size: int, timeout_s: int
) -> None:
    """Join the default process group with ``init_method=url`` (``tcp://...``)."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group(
        backend=backend,
        init_method=url,
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
    )


def _tcp_url(addr: str, port: int) -> str:
    host = f"[{addr}]" if ":" in addr and not addr.startswith("[") else addr
    return f"tcp://{host}:{port}"


def _destroy_process_group() -> None:
    import torch.distributed as dist

    global _store_server
    _store_server = None
    if dist.is_initialized():
        dist.destroy_process_group()


class TorchBackend(Backend):
    """Creates the torch.distributed process group on every worker."""

    supports_torchrun = True
    #: The set-up imports torch.distributed (and so torch: about a second).
    preload = ("torch.distributed",)

    def __init__(self, config: TorchConfig | None = None) -> None:
        self.config = config or TorchConfig()
        self._local_initialized = False

    def on_start(self, group: WorkerGroup, scaling: ScalingConfig) -> None:
        """Rank 0 starts the rendezvous store; then all workers join the process group."""
        import ray

        backend = self.config.resolve_backend(scaling.use_gpu)
        if self.config.init_method == "tcp":
            addr, port = ray.get(group.workers[0].actor.execute.remote(_free_port))
            url = _tcp_url(addr, port)
            ray.get(
                [
                    w.actor.execute.remote(
                        _init_process_group_tcp,
                        url,
                        backend,
                        w.rank,
                        group.world_size,
                        self.config.timeout_s,
                    )
                    for w in group.workers
                ]
            )
            logger.info(
                "torch.distributed %s process group ready (%d workers, init_method %s)",
                backend,
                group.world_size,
                url,
            )
            return
        addr, port = ray.get(
            group.workers[0].actor.execute.remote(
                _start_store, group.world_size, self.config.timeout_s
            )
        )
        ray.get(
            [
                w.actor.execute.remote(
                    _init_process_group,
                    addr,
                    port,
                    backend,
                    w.rank,
                    group.world_size,
                    self.config.timeout_s,
                )
                for w in group.workers
            ]
        )
        logger.info(
            "torch.distributed %s process group ready (%d workers, rendezvous %s:%d)",
            backend,
            group.world_size,
            addr,
            port,
        )

    def on_shutdown(self, group: WorkerGroup) -> None:
        """Destroy the process groups (bounded wait: a dead peer must not hang tear-down)."""
        group.execute(_destroy_process_group, timeout=10)

    def on_local_start(self, context: TrainContext, scaling: ScalingConfig) -> None:
        """Under torchrun: join the process group from torchrun's environment."""
        if context.world_size <= 1:
            return
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group(
                backend=self.config.resolve_backend(scaling.use_gpu),
                init_method="env://",
                timeout=timedelta(seconds=self.config.timeout_s),
            )
            self._local_initialized = True

    def on_local_shutdown(self) -> None:
        """Destroy the process group this backend created."""
        if self._local_initialized:
            _destroy_process_group()
            self._local_initialized = False
