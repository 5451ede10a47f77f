"""Polling until something holds, for tests that wait on processes and API objects."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 120.0
"""Generous: only a failing test waits this long, and the machines are shared and slow."""

CANCEL = threading.Event()
"""Set, every :func:`wait_for` gives up at once (e.g. in the threads of scenarios that run at the
same time, when the session is interrupted: :mod:`tests.support.concurrent`)."""


class Cancelled(AssertionError):
    """A :func:`wait_for` given up because :data:`CANCEL` was set."""


_recording = threading.local()


def record_waits(into: list[tuple[str, float]] | None) -> None:
    """From now on, in this thread, every :func:`wait_for` appends ``(what, seconds waited)``
    to ``into`` (None stops): a scenario's timeline, to see where its time goes."""
    _recording.into = into


def _record(what: str, started: float) -> None:
    into = getattr(_recording, "into", None)
    if into is not None:
        into.append((what, time.monotonic() - started))


def wait_for(
    what: str,
    check: Callable[[], T | None],
    timeout: float = DEFAULT_TIMEOUT_S,
    every: float = 0.5,
) -> T:
    """Call ``check`` every ``every`` seconds until it returns something truthy, and return
    that; after ``timeout`` seconds raise AssertionError naming ``what`` and the last value."""
    started = time.monotonic()
    deadline = started + timeout
    while True:
        if CANCEL.is_set():
            raise Cancelled(f"cancelled while waiting for {what}")
        last = check()
        if last:
            _record(what, started)
            return last
        if time.monotonic() > deadline:
            _record(f"{what} (timed out)", started)
            raise AssertionError(
                f"timed out after {timeout:.0f}s waiting for {what}; last value: {last!r}"
            )
        time.sleep(every)
