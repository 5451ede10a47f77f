"""Polling until something holds, for tests that wait on processes and API objects."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 120.0
"""Generous: only a failing test waits this long, and the machines are shared and slow."""


def wait_for(
    what: str,
    check: Callable[[], T | None],
    timeout: float = DEFAULT_TIMEOUT_S,
    every: float = 0.5,
) -> T:
    """Call ``check`` every ``every`` seconds until it returns something truthy, and return
    that; after ``timeout`` seconds raise AssertionError naming ``what`` and the last value."""
    deadline = time.monotonic() + timeout
    while True:
        last = check()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout:.0f}s waiting for {what}; last value: {last!r}"
            )
        time.sleep(every)
