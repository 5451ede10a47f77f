"""Giving the memory of a burst back once the operator is quiet.

A burst of TrainJobs (thousands created at once, or a relist after a watch gap) raises the
operator's resident memory to what the burst's peak of live objects needed: the allocators
(Python's and glibc's) keep freed memory for reuse, and only whole free pages or arenas can go
back to the system. Measured with ``benchmarks/profile_operator_memory.py`` at 2,000
TrainJobs: 103.8 MiB resident once quiet, 94.1 MiB after ``gc.collect()`` and glibc's
``malloc_trim(0)``. :class:`QuietTrimmer` does that once after each period of work, when no
reconcile has run for ``quiet_s`` seconds, so it never competes with reconciles.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import time
from collections.abc import Callable

__all__ = ["QUIET_SECONDS", "QuietTrimmer", "give_memory_back"]

logger = logging.getLogger(__name__)

QUIET_SECONDS = 30.0
"""How long without a reconcile before the operator gives freed memory back."""


def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        function = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim
        return None
    function.argtypes = [ctypes.c_size_t]
    function.restype = ctypes.c_int
    return function


_MALLOC_TRIM = _malloc_trim()


def give_memory_back() -> None:
    """Collect cyclic garbage, then hand glibc's free pages back to the system (a no-op
    without glibc)."""
    gc.collect()
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


class QuietTrimmer:
    """Calls ``trim`` once after each period of activity, when ``activity()`` (a count that
    grows with the work done, e.g. reconciles) has not changed for ``quiet_s`` seconds.
    :meth:`check` is called periodically by its owner."""

    def __init__(
        self,
        activity: Callable[[], int],
        *,
        quiet_s: float = QUIET_SECONDS,
        trim: Callable[[], None] = give_memory_back,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._activity = activity
        self._quiet_s = quiet_s
        self._trim = trim
        self._clock = clock
        self._seen = activity()
        self._changed_at = clock()
        self._worked = False  # work done since the last trim

    def check(self) -> bool:
        """Trim if the work stopped ``quiet_s`` ago and nothing was trimmed since; returns
        whether it trimmed."""
        now, count = self._clock(), self._activity()
        if count != self._seen:
            self._seen, self._changed_at, self._worked = count, now, True
            return False
        if not self._worked or now - self._changed_at < self._quiet_s:
            return False
        started = time.perf_counter()
        self._trim()
        self._worked = False
        logger.debug("gave freed memory back in %.3f s", time.perf_counter() - started)
        return True
