"""Ray Train 2.60's ``ray.train.collective``: small synchronisations between the ranks of a run.

``from ray.train.collective import barrier, broadcast_from_rank_zero`` becomes
``from trainer_runtime.collective import barrier, broadcast_from_rank_zero``. Both go through
the run's controller (no process group is needed, so they work with any trainer, in local
mode and under torchrun too). Every rank must call the same collectives in the same order;
a rank whose train function returns while the others wait in one fails the run with the
ranks that are missing (Ray Train waits, warning every minute).
"""

from __future__ import annotations

from typing import TypeVar

from trainer_runtime._session import get_session

T = TypeVar("T")

__all__ = ["barrier", "broadcast_from_rank_zero"]


def broadcast_from_rank_zero(data: T) -> T:
    """Return rank 0's ``data`` on every rank, once every rank called this.

    Meant for small data (a warning above 1000 pickled bytes, as in Ray Train); ``data`` must
    be picklable.
    """
    return get_session("collective.broadcast_from_rank_zero").broadcast_from_rank_zero(
        data, "trainer_runtime.collective.broadcast_from_rank_zero"
    )


def barrier() -> None:
    """Wait until every rank called ``barrier()``."""
    get_session("collective.barrier").broadcast_from_rank_zero(
        None, "trainer_runtime.collective.barrier"
    )
