"""``prepare_data_loader`` and ``prepare_model`` as Ray Train 2.60 behaves (its
``ray.train.torch.train_loop_utils``): which loaders get a DistributedSampler, whether it
shuffles, what it keeps, and whose ``set_epoch`` wins. No Ray: the worker's world is set."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import (
    DataLoader,
    DistributedSampler,
    IterableDataset,
    Sampler,
    TensorDataset,
)

from trainer_runtime.torch import prepare_data_loader, prepare_model, train_loop_utils


@pytest.fixture
def rank_1_of_2(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process is world rank 1 of 2 workers (local rank 1)."""
    monkeypatch.setattr(train_loop_utils, "_world", lambda: (1, 2, 1))


def _data(n: int = 8) -> TensorDataset:
    return TensorDataset(torch.arange(n))


class _Stream(IterableDataset[int]):
    def __iter__(self) -> Iterator[int]:
        return iter(range(6))


class _EveryOther(Sampler[int]):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[int]:
        return iter(range(0, self.n, 2))

    def __len__(self) -> int:
        return (self.n + 1) // 2


def _values(loader: Any) -> list[int]:
    return [int(x) for batch in loader for x in (batch[0] if isinstance(batch, list) else batch)]


def test_an_iterable_dataset_gets_no_sampler(rank_1_of_2: None) -> None:
    loader = prepare_data_loader(DataLoader(_Stream(), batch_size=2))
    assert not isinstance(loader.sampler, DistributedSampler)
    assert _values(loader) == list(range(6))  # it shards itself; nothing is dropped


def test_the_sampler_shuffles_unless_the_loader_read_in_order(rank_1_of_2: None) -> None:
    in_order = prepare_data_loader(DataLoader(_data(), batch_size=2))
    assert isinstance(in_order.sampler, DistributedSampler)
    assert (in_order.sampler.rank, in_order.sampler.num_replicas) == (1, 2)
    assert not in_order.sampler.shuffle
    assert _values(in_order) == [1, 3, 5, 7]  # rank 1's half, in order

    shuffled = prepare_data_loader(DataLoader(_data(), batch_size=2, shuffle=True))
    assert shuffled.sampler.shuffle

    # A custom sampler is replaced by a shuffling DistributedSampler, with Ray's warning
    # (on rank 0 only: this is rank 1).
    custom = prepare_data_loader(DataLoader(_data(), batch_size=2, sampler=_EveryOther(8)))
    assert isinstance(custom.sampler, DistributedSampler) and custom.sampler.shuffle


def test_a_custom_sampler_replaced_is_warned_about_on_rank_0(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(train_loop_utils, "_world", lambda: (0, 2, 0))
    with caplog.at_level(logging.WARNING, logger=train_loop_utils.__name__):
        prepare_data_loader(DataLoader(_data(), batch_size=2, sampler=_EveryOther(8)))
    assert "The _EveryOther will be overwritten with a DistributedSampler" in caplog.text


def test_the_generator_is_kept_and_auto_transfer_is_accepted(rank_1_of_2: None) -> None:
    generator = torch.Generator().manual_seed(7)
    loader = prepare_data_loader(
        DataLoader(_data(), batch_size=2, shuffle=True, generator=generator),
        auto_transfer=False,
    )
    assert loader.generator is generator


def test_the_epoch_advances_per_pass_until_the_user_sets_it(rank_1_of_2: None) -> None:
    loader = prepare_data_loader(DataLoader(_data(), batch_size=2, shuffle=True))
    _values(loader)
    _values(loader)
    assert loader.sampler.epoch == 1  # one per pass, from 0
    # The train function sets the epoch itself (Ray's docs ask for it): it wins, every pass.
    for epoch in (10, 11, 11):
        loader.sampler.set_epoch(epoch)
        _values(loader)
        assert loader.sampler.epoch == epoch


def test_prepare_model_moves_to_the_device_given() -> None:
    model = prepare_model(torch.nn.Linear(2, 2), move_to_device=torch.device("meta"))
    assert {p.device.type for p in model.parameters()} == {"meta"}
    kept = prepare_model(torch.nn.Linear(2, 2), move_to_device=False)
    assert {p.device.type for p in kept.parameters()} == {"cpu"}
