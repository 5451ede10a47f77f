"""Helpers for the train function: device placement, DDP wrapping, distributed loaders."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import (
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
)

from trainer_runtime import _session

logger = logging.getLogger(__name__)


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
    move_to_device: bool | torch.device = True,
    parallel_strategy: str | None = "ddp",
    parallel_strategy_kwargs: dict[str, Any] | None = None,
) -> torch.nn.Module:
    """Move ``model`` to this worker's device (or to ``move_to_device`` when it is a
    ``torch.device``, as in Ray Train) and wrap it in DDP when there are several workers."""
    device = move_to_device if isinstance(move_to_device, torch.device) else get_device()
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
    """Wraps a DataLoader: advances the sampler's epoch per pass (until the user calls
    ``sampler.set_epoch`` themselves, as Ray Train's docs ask), moves batches to the device."""

    def __init__(self, loader: DataLoader[Any], device: torch.device | None) -> None:
        self._loader = loader
        self._device = device
        self._epoch = 0
        self._epoch_set: int | None = None  # what this wrapper last set on the sampler
        self._user_sets_epoch = False

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
        if isinstance(sampler, DistributedSampler) and not self._user_sets_epoch:
            if self._epoch_set is not None and sampler.epoch != self._epoch_set:
                self._user_sets_epoch = True  # the user's set_epoch wins from now on
            else:
                sampler.set_epoch(self._epoch)
                self._epoch_set = self._epoch
        self._epoch += 1
        for batch in self._loader:
            yield self._move(batch)


def prepare_data_loader(
    data_loader: DataLoader[Any],
    add_dist_sampler: bool = True,
    move_to_device: bool = True,
    auto_transfer: bool = True,
) -> Any:
    """Shard ``data_loader`` across workers with a DistributedSampler; move batches to device.

    As Ray Train: no sampler is added to a loader over an ``IterableDataset`` (it shards
    itself) or one that has a DistributedSampler already; the new sampler shuffles unless the
    loader read in order (a ``SequentialSampler``), and a custom sampler is replaced with a
    warning. Each pass over the returned loader advances the sampler's epoch, so shuffles
    differ per epoch, until the train function calls ``sampler.set_epoch`` itself.
    ``auto_transfer`` is accepted for Ray's signature: batches are moved with
    ``non_blocking=True`` either way (Ray copies on a second CUDA stream).
    """
    rank, world_size, _ = _world()
    loader = data_loader
    if (
        add_dist_sampler
        and world_size > 1
        and not isinstance(loader.sampler, DistributedSampler)
        and not isinstance(loader.dataset, IterableDataset)
    ):
        shuffle = not isinstance(loader.sampler, SequentialSampler)
        if not isinstance(loader.sampler, SequentialSampler | RandomSampler) and rank == 0:
            logger.warning(
                "The %s will be overwritten with a DistributedSampler. You can disable this "
                "by setting `add_dist_sampler` to False in `prepare_data_loader`.",
                type(loader.sampler).__name__,
            )
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
            generator=loader.generator,
            persistent_workers=loader.persistent_workers,
        )
    device = get_device() if move_to_device else None
    if device is not None and device.type == "cpu":
        device = None
    return _DeviceLoader(loader, device)
