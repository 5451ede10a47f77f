"""A stop request that a signal handler may set: :class:`threading.Event`'s interface without
its lock.

Python runs a signal handler on the main thread between two bytecodes, possibly while that
thread is inside ``Event.wait()`` holding the Event's internal lock. ``Event.set()`` in the
handler then waits for that lock forever: the process hangs until the kubelet's SIGKILL (seen
as a launcher that ignored SIGTERM now and then). :class:`StopFlag` is a plain attribute that
the handler sets and the waiting side polls; waits are short sleeps, which a signal
interrupts (the handler runs, then the sleep resumes for what is left of it, PEP 475).
"""

from __future__ import annotations

import time

__all__ = ["POLL_S", "StopFlag"]

POLL_S = 0.05
"""The longest a :meth:`StopFlag.wait` sleeps between two looks at the flag."""


class StopFlag:
    """Set once (by a signal handler or any thread), polled by the main loop."""

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        """Request the stop; safe in a signal handler (one attribute write, no lock)."""
        self._set = True

    def is_set(self) -> bool:
        """Whether the stop was requested."""
        return self._set

    def wait(self, timeout: float | None = None) -> bool:
        """Sleep until the flag is set or ``timeout`` seconds passed (None: no limit);
        returns whether it is set, as :meth:`threading.Event.wait` does."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._set:
            if deadline is None:
                time.sleep(POLL_S)
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(POLL_S, left))
        return True
