"""The suite runner's report of what failed (tests/suite.py), read from pytest's JUnit XML."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

from tests.suite import failure_lines

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="2" failures="1" skipped="0" tests="4">
<testcase classname="tests.runtime.test_tpu" name="test_a" file="tests/runtime/test_tpu.py">
  <error message="failed on setup with &quot;RuntimeError: hosts exited&quot;">trace</error>
</testcase>
<testcase classname="tests.runtime.test_tpu" name="test_b" file="tests/runtime/test_tpu.py">
  <error message="failed on setup with &quot;RuntimeError: hosts exited&quot;">trace</error>
</testcase>
<testcase classname="tests.k8s.test_x" name="test_c" file="tests/k8s/test_x.py">
  <failure message="AssertionError: assert 120.0 &gt; 120.0&#10;  where 120.0 = f()">long</failure>
</testcase>
<testcase classname="tests.k8s.test_x" name="test_d" file="tests/k8s/test_x.py"/>
</testsuite></testsuites>
"""


def test_failure_lines_name_each_failure_once_with_its_message(tmp_path: Path) -> None:
    junit = tmp_path / "tier.xml"
    junit.write_text(JUNIT)
    assert failure_lines(junit) == [
        'tests/runtime/test_tpu.py::test_a and 1 more (error): failed on setup with "RuntimeError:'
        ' hosts exited"',
        "tests/k8s/test_x.py::test_c (failure): AssertionError: assert 120.0 > 120.0 where 120.0"
        " = f()",
    ]
    assert failure_lines(tmp_path / "missing.xml") == []
    assert failure_lines(junit, limit=10)[1].endswith("(failure): AssertionE [...]")


def test_scenario_summary_lists_each_scenarios_long_waits(monkeypatch: Any) -> None:
    """Scenarios run in threads record their wait_for waits; the summary shows the long ones
    under each scenario (what the real-node tier's time went to)."""
    from tests.support import concurrent
    from tests.support.waiting import wait_for

    monkeypatch.setattr(concurrent, "FINISHED", [])
    monkeypatch.setattr(concurrent, "SHOWN_WAIT_S", 0.05)
    scenarios = concurrent.ScenarioSet[None]()

    @scenarios.register
    def waits_twice(_: None) -> None:
        deadline = time.monotonic() + 0.1
        wait_for("a slow thing", lambda: time.monotonic() > deadline, every=0.01)
        wait_for("a quick thing", lambda: True)

    with scenarios.start(["waits_twice"], lambda _: contextlib.nullcontext(), max_at_once=1) as s:
        s.check("waits_twice")
    [(name, outcome)] = concurrent.FINISHED
    assert name == "waits_twice"
    assert [what for what, _ in outcome.waits] == ["a slow thing", "a quick thing"]
    lines = concurrent.summary_lines()
    assert lines[0].startswith("scenario waits_twice: ")
    assert lines[1].endswith(" s waiting for a slow thing") and len(lines) == 3, lines
    wait_for("no recording outside a scenario", lambda: True)
    assert len(outcome.waits) == 2


def test_the_node_tier_sets_up_during_the_ray_tier_and_its_scenarios_wait_for_its_end(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """The real-node tier runs in the light lane after k8s (its node and chart start while the
    Ray tier runs); its scenarios wait on the Ray tier's gate file, which the Ray tier's end
    creates, and a tier run without the Ray tier waits for nothing."""
    import threading

    from tests import suite
    from tests.support import waiting

    by_name = {t.name: t for t in suite.TIERS}
    assert by_name["node"].after == "ray" and by_name["node"].lane != by_name["ray"].lane
    monkeypatch.setattr(suite, "LOGS", tmp_path)
    assert suite.Gates.for_tiers([by_name["node"]]).files == {}  # `--tier node`: no gate
    gates = suite.Gates.for_tiers(list(suite.TIERS))
    gate = gates.files["ray"]
    assert gate.parent == tmp_path and not gate.exists()

    monkeypatch.setenv(waiting.SUITE_GATE_ENV, str(gate))
    waited: list[float] = []
    waiter = threading.Thread(target=lambda: waited.append(waiting.wait_for_suite_gate("t")))
    waiter.start()
    waiter.join(1.5)
    assert waiter.is_alive()  # the Ray tier has not ended: still waiting
    gates.open("ray")
    waiter.join(10)
    assert not waiter.is_alive() and waited[0] >= 1.0
    assert gate.exists() and "ray" in gates.opened_at
    assert waiting.wait_for_suite_gate("t") == 0.0  # already open
    monkeypatch.delenv(waiting.SUITE_GATE_ENV)
    assert waiting.wait_for_suite_gate("t") == 0.0  # plain pytest
