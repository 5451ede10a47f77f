"""Helpers for the train function: device placement, DDP wrapping, distributed loaders."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler

from trainer_runtime import _session


def _world() -> tuple[int, int, int]:
    """(world rank, world size, local rank) of this worker."""
    if _session.has_session():
        ctx = _session.get_session("prepare_model").context
        return ctx.world_rank, ctx.world_size, ctx.local_rank
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), dist.get_rank()
    return 0, 1, 0


def get_device() -> torch.device:
    """The device this worker should use: its GPU when one is visible, else the CPU."""
    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        _, _, local_rank = _world()
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def prepare_model(
    model: torch.nn.Module,
    move_to_device: bool = True,
    parallel_strategy: str | None = "ddp",
    parallel_strategy_kwargs: dict[str, Any] | None = None,
) -> torch.nn.Module:
    """Move ``model`` to this worker's device and wrap it in DDP when there are several workers."""
    device = get_device()
    if move_to_device:
        model = model.to(device)
    _, world_size, _ = _world()
    if parallel_strategy is None or world_size <= 1:
        return model
    if parallel_strategy != "ddp":
        raise ValueError(f"parallel_strategy={parallel_strategy!r} is not supported; use 'ddp'")
    if not dist.is_initialized():
        raise RuntimeError(
            "prepare_model: torch.distributed is not initialised; run the train "
            "function through TorchTrainer or torchrun"
        )
    from torch.nn.parallel import DistributedDataParallel

    kwargs = dict(parallel_strategy_kwargs or {})
    if device.type == "cuda":
        kwargs.setdefault("device_ids", [device.index])
    return DistributedDataParallel(model, **kwargs)


class _DeviceLoader:
    """Wraps a DataLoader: advances the sampler's epoch per pass, moves batches to the device."""

    def __init__(self, loader: DataLoader[Any], device: torch.device | None) -> None:
        self._loader = loader
        self._device = device
        self._epoch = 0

    def __len__(self) -> int:
        return len(self._loader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)

    def _move(self, batch: Any) -> Any:
        if self._device is None:
            return batch
        if isinstance(batch, torch.Tensor):
            return batch.to(self._device, non_blocking=True)
        if isinstance(batch, list | tuple):
            return type(batch)(self._move(b) for b in batch)
        if isinstance(batch, dict):
            return {k: self._move(v) for k, v in batch.items()}
        return batch

    def __iter__(self) -> Iterator[Any]:
        sampler = self._loader.sampler
        if isinstance(sampler, DistributedSampler):
            sampler.set_epoch(self._epoch)
        self._epoch += 1
        for batch in self._loader:
            yield self._move(batch)


def prepare_data_loader(
    data_loader: DataLoader[Any], add_dist_sampler: bool = True, move_to_device: bool = True
) -> Any:
    """Shard ``data_loader`` across workers with a DistributedSampler; move batches to device.

    Shuffling is kept when the original loader shuffled. Each pass over the
    returned loader advances the sampler's epoch, so shuffles differ per epoch.
    """
    _, world_size, _ = _world()
    loader = data_loader
    if add_dist_sampler and world_size > 1 and not isinstance(loader.sampler, DistributedSampler):
        shuffle = isinstance(loader.sampler, RandomSampler)
        rank = _world()[0]
        sampler: DistributedSampler[Any] = DistributedSampler(
            loader.dataset, num_replicas=world_size, rank=rank, shuffle=shuffle
        )
        loader = DataLoader(
            loader.dataset,
            batch_size=loader.batch_size,
            sampler=sampler,
            num_workers=loader.num_workers,
            collate_fn=loader.collate_fn,
            pin_memory=loader.pin_memory,
            drop_last=loader.drop_last,
            timeout=loader.timeout,
            worker_init_fn=loader.worker_init_fn,
            persistent_workers=loader.persistent_workers,
        )
    device = get_device() if move_to_device else None
    if device is not None and device.type == "cpu":
        device = None
    return _DeviceLoader(loader, device)
