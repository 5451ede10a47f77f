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
