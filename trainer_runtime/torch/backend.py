"""Process-group set-up for torch workers (env:// rendezvous at rank 0)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from trainer_runtime.backend import Backend

if TYPE_CHECKING:
    from trainer_runtime.config import ScalingConfig
    from trainer_runtime.context import TrainContext
    from trainer_runtime.worker_group import WorkerGroup

logger = logging.getLogger(__name__)


@dataclass
class TorchConfig:
    """``backend``: ``gloo`` or ``nccl`` (default: nccl with GPUs, else gloo)."""

    backend: str | None = None
    timeout_s: int = 1800

    def resolve_backend(self, use_gpu: bool) -> str:
        """The process-group backend to use."""
        if self.backend is not None:
            if self.backend not in ("gloo", "nccl", "mpi"):
                raise ValueError(
                    f"TorchConfig.backend={self.backend!r} is not valid; use gloo or nccl"
                )
            return self.backend
        return "nccl" if use_gpu else "gloo"


def _init_process_group(
    master_addr: str, master_port: int, backend: str, rank: int, world_size: int, timeout_s: int
) -> None:
    import torch.distributed as dist

    os.environ["MASTER_ADDR"] = master_addr
    os.environ["MASTER_PORT"] = str(master_port)
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group(
        backend=backend,
        init_method="env://",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
    )


def _destroy_process_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


class TorchBackend(Backend):
    """Creates the torch.distributed process group on every worker."""

    supports_torchrun = True

    def __init__(self, config: TorchConfig | None = None) -> None:
        self.config = config or TorchConfig()
        self._local_initialized = False

    def on_start(self, group: WorkerGroup, scaling: ScalingConfig) -> None:
        """Rank 0 picks the rendezvous address; all workers join the process group."""
        import ray

        backend = self.config.resolve_backend(scaling.use_gpu)
        addr, port = ray.get(group.workers[0].actor.address_and_port.remote())
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
