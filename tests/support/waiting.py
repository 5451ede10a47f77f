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


SUITE_GATE_ENV = "TRAINJOB_SUITE_GATE"
"""A file that ``python -m tests.suite`` creates when the tier this one waits for has ended
(:attr:`tests.suite.Tier.after`): the real-node tier starts its node while the Ray tier still
runs, and its scenarios wait for the Ray tier's end, so that the two never load the cores at
once. Unset (a tier run alone, plain pytest): nothing to wait for."""


def wait_for_suite_gate(what: str) -> float:
    """Block until the file named by :data:`SUITE_GATE_ENV` exists (when it is set); returns
    the seconds waited. ``what`` says what waits, in the progress line."""
    import os
    from pathlib import Path

    gate = os.environ.get(SUITE_GATE_ENV)
    if not gate or Path(gate).exists():
        return 0.0
    started = time.monotonic()
    print(f"{what}: waiting for the tier before it to end ({gate})", flush=True)
    wait_for("the tier before this one to end", Path(gate).exists, timeout=3 * 3600, every=1.0)
    waited = time.monotonic() - started
    print(f"{what}: went on after {waited:.0f}s", flush=True)
    return waited
