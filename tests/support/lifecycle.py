"""``with`` support for the test harnesses that start and stop processes."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class StartStop:
    """``with harness:`` calls ``start()`` (returning the harness) and, on the way out,
    ``stop()``, whatever happened inside. Subclasses define both."""

    def start(self) -> Self:
        """Start what the harness runs; returns it."""
        raise NotImplementedError

    def stop(self) -> None:
        """Stop what the harness runs (safe to call twice)."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
