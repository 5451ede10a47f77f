"""Slow scenarios that mostly wait (on pods, on a cluster, on a deadline) run at the same time,
each in a thread of its own, while each is still reported as a test of its own.
Leaving the block (the module's last test done, or the session interrupted) cancels the
:func:`~tests.support.waiting.wait_for` waits of the scenarios still running, so they clean up
and end at once.

A module registers its scenarios in a :class:`ScenarioSet`; one module-scoped fixture starts
the scenarios that the session's selected tests ask for (:meth:`ScenarioSet.start`), and each
test waits for its own scenario (:meth:`RunningScenarios.check`): a failure fails that test
only, with the scenario's traceback (and any notes its ``around`` context added, e.g. a dump of
the cluster's state). The time the scenarios share shows up on the first test that waits;
``check`` prints how long its own scenario took, and records it in :data:`FINISHED`, which
:func:`summary_lines` lists for a ``pytest_terminal_summary`` hook (each scenario's own
seconds, in the order they were checked: what to look at when the tier grows).

Example::

    SCENARIOS = ScenarioSet[tuple[Cluster, str]]()

    @SCENARIOS.register
    def quickstart_succeeds(env: tuple[Cluster, str]) -> None: ...

    @pytest.fixture(scope="module")
    def scenarios(request, cluster):
        names = SCENARIOS.selected(request.session, __name__)
        with SCENARIOS.start(names, lambda name: in_a_namespace(cluster, name), max_at_once=4) as s:
            yield s

    @pytest.mark.parametrize("name", SCENARIOS.names())
    def test_scenario(scenarios, name):
        scenarios.check(name)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import pytest

from tests.support.waiting import CANCEL, record_waits

A = TypeVar("A")

SCENARIO_MARKER = "scenario"
"""``@pytest.mark.scenario("name")``: the test checks that scenario (for tests that are not
parametrized by scenario name, e.g. because they need a fixture of their own)."""


@dataclass
class Outcome:
    """How one scenario ended."""

    seconds: float
    error: BaseException | None = None
    #: its :func:`~tests.support.waiting.wait_for` waits in order: (what, seconds waited)
    waits: list[tuple[str, float]] = field(default_factory=list)


FINISHED: list[tuple[str, Outcome]] = []
"""Every scenario checked in this session, in order, with how it ended."""

SHOWN_WAIT_S = 10.0
"""The waits :func:`summary_lines` lists under each scenario: the ones this long or longer."""


def summary_lines() -> list[str]:
    """``scenario NAME: N s`` for each scenario of :data:`FINISHED` (``failed`` added when it
    failed), each followed by its waits of :data:`SHOWN_WAIT_S` or more (``  N s waiting for
    WHAT``), then their sum; empty when none ran."""
    lines = []
    for name, outcome in FINISHED:
        lines.append(
            f"scenario {name}: {outcome.seconds:.0f} s" + (" (failed)" if outcome.error else "")
        )
        lines += [
            f"  {seconds:.0f} s waiting for {what}"
            for what, seconds in outcome.waits
            if seconds >= SHOWN_WAIT_S
        ]
    if lines:
        total = sum(outcome.seconds for _, outcome in FINISHED)
        lines.append(f"{len(FINISHED)} scenarios, {total:.0f} s in all (they overlap)")
    return lines


@dataclass
class RunningScenarios:
    """The scenarios started together, by name."""

    futures: dict[str, Future[Outcome]] = field(default_factory=dict)

    def check(self, name: str, timeout: float | None = None) -> None:
        """Wait for scenario ``name`` and fail the calling test as the scenario failed."""
        if name not in self.futures:
            pytest.fail(f"scenario {name} was not started", pytrace=False)
        outcome = self.futures[name].result(timeout=timeout)
        print(f"scenario {name}: {outcome.seconds:.1f}s")
        FINISHED.append((name, outcome))
        if outcome.error is not None:
            raise outcome.error


class ScenarioSet(Generic[A]):
    """Named scenario functions, each taking what its ``around`` context yields (``A``)."""

    def __init__(self) -> None:
        self._scenarios: dict[str, Callable[[A], None]] = {}

    def register(self, fn: Callable[[A], None]) -> Callable[[A], None]:
        """Decorator: add ``fn`` under its own name."""
        if fn.__name__ in self._scenarios:
            raise ValueError(f"scenario {fn.__name__} registered twice")
        self._scenarios[fn.__name__] = fn
        return fn

    def names(self, *, exclude: Iterable[str] = ()) -> list[str]:
        """The registered scenarios' names in registration order, less ``exclude``."""
        left_out = set(exclude)
        return [name for name in self._scenarios if name not in left_out]

    @staticmethod
    def selected(session: pytest.Session, module: str, param: str = "name") -> list[str]:
        """The scenario names that the session's selected tests of ``module`` check: a
        ``scenario`` marker's argument, or the value of their ``param`` parameter."""
        names = []
        for item in session.items:
            item_module = getattr(item, "module", None)
            if item_module is None or item_module.__name__ != module:
                continue
            marker = item.get_closest_marker(SCENARIO_MARKER)
            callspec = getattr(item, "callspec", None)
            if marker is not None:
                names.append(str(marker.args[0]))
            elif callspec is not None and param in callspec.params:
                names.append(str(callspec.params[param]))
        return names

    @contextmanager
    def start(
        self,
        names: Iterable[str],
        around: Callable[[str], AbstractContextManager[A]],
        *,
        max_at_once: int,
    ) -> Iterator[RunningScenarios]:
        """Run the scenarios ``names``, in that order and at most ``max_at_once`` at a time,
        each inside ``around(name)`` (which sets up what the scenario gets and cleans it up);
        leaving the block waits for every scenario."""
        wanted = list(dict.fromkeys(names))
        unknown = [name for name in wanted if name not in self._scenarios]
        if unknown:
            raise KeyError(f"unknown scenario(s) {unknown}; known: {self.names()}")

        def run(name: str) -> Outcome:
            started = time.monotonic()
            waits: list[tuple[str, float]] = []
            record_waits(waits)
            try:
                with around(name) as arg:
                    self._scenarios[name](arg)
            except BaseException as error:  # noqa: BLE001 - raised again in the test's thread
                return Outcome(time.monotonic() - started, error, waits)
            finally:
                record_waits(None)
            return Outcome(time.monotonic() - started, waits=waits)

        running = RunningScenarios()
        pool = ThreadPoolExecutor(max_workers=max(1, max_at_once), thread_name_prefix="scenario")
        CANCEL.clear()
        try:
            for name in wanted:
                running.futures[name] = pool.submit(run, name)
            yield running
        finally:
            # Every test that wanted a scenario has had it, or the session was interrupted (a
            # fixture's teardown cannot tell): what still runs gives up its waits, cleans up.
            CANCEL.set()
            pool.shutdown(wait=True, cancel_futures=True)
            CANCEL.clear()
