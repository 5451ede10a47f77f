"""The phase transition table: ``set_phase`` (and every other phase change of the planner)
refuses a move :data:`PHASE_TRANSITIONS` does not declare, and the planner's moves over a
sweep of phases and pod states are exactly the declared ones."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from tests.reconcile.test_plan import NOW, _desired, _job, _pod, _running
from trainjob_operator.api import Phase, Reason, TrainJobStatus
from trainjob_operator.reconcile import transitions
from trainjob_operator.reconcile.plan import Plan
from trainjob_operator.reconcile.state_machine import Reconcile, plan_invalid_spec, plan_reconcile
from trainjob_operator.reconcile.transitions import (
    PHASE_TRANSITIONS,
    UndeclaredTransition,
    check_transition,
)


def test_the_table_names_every_phase_and_no_self_moves() -> None:
    assert set(PHASE_TRANSITIONS) == set(Phase)
    for before, moves in PHASE_TRANSITIONS.items():
        assert before not in moves
        assert all(why for why in moves.values())
    assert PHASE_TRANSITIONS[Phase.FAILED] == {}  # terminal


@pytest.mark.parametrize(
    ("before", "to"),
    [
        (Phase.FAILED, Phase.RUNNING),
        (Phase.SUCCEEDED, Phase.STARTING),
        (Phase.RUNNING, Phase.PENDING),
        (Phase.RUNNING, Phase.STARTING),
        (Phase.SUSPENDED, Phase.RUNNING),
        (None, Phase.PENDING),  # staying (a new job is Pending) is allowed
    ],
)
def test_set_phase_refuses_an_undeclared_transition(before: Phase | None, to: Phase) -> None:
    status: dict[str, Any] = {"phase": before.value} if before else {}
    r = Reconcile.start(_job(), status, [], [], NOW, generation=1)
    if before is None or to in PHASE_TRANSITIONS[before]:
        r.set_phase(to, Reason.STARTING, "allowed")
        return
    with pytest.raises(UndeclaredTransition, match=f"{before} -> {to}"):
        r.set_phase(to, Reason.STARTING, "not declared")
    assert r.status.phase == before  # nothing written


def test_failing_a_finished_job_is_checked_too() -> None:
    plan = Plan(TrainJobStatus(phase=Phase.FAILED))
    plan.fail(Reason.DEADLINE_EXCEEDED, "again", 1, NOW)  # staying Failed
    assert plan.events == []
    check_transition(Phase.SUCCEEDED, Phase.FAILED)  # InvalidSpec after success
    with pytest.raises(UndeclaredTransition):
        check_transition(Phase.FAILED, Phase.SUCCEEDED)


def _scenarios() -> dict[str, list[dict[str, Any]]]:
    driver_done = _running()
    driver_done[-1]["status"] = {"phase": "Succeeded"}
    driver_failed = _running()
    driver_failed[-1]["status"] = {"phase": "Failed"}
    head_failed = _running()
    head_failed[0]["status"] = {"phase": "Failed"}
    no_head = [p for p in _running() if p["metadata"]["name"] != "tj-head"]
    return {
        "none": [],
        "pending": _desired(),
        "running": _running(),
        "driver succeeded": driver_done,
        "driver failed": driver_failed,
        "head failed": head_failed,
        "head lost": no_head,
        "stale": [_pod("tj-head", "head", 7, "Running", True)],
    }


def test_the_planners_moves_are_the_declared_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every phase x pod state x suspend x restart budget: no reconcile raises, and the edges
    taken cover the table (an edge no reconcile can take would be a stale declaration)."""
    taken: set[tuple[Phase, Phase]] = set()
    real = transitions.check_transition

    def record(current: Phase | None, to: Phase) -> None:
        real(current, to)
        before = current or Phase.PENDING
        if before != to:
            taken.add((before, to))

    import trainjob_operator.reconcile.plan as plan_module
    import trainjob_operator.reconcile.state_machine as state_machine

    for module in (plan_module, state_machine):
        monkeypatch.setattr(module, "check_transition", record)
    scenarios = _scenarios()
    for phase, observed, suspend, budget in itertools.product(
        Phase, scenarios.values(), (False, True), (0, 3)
    ):
        job = _job(suspend=suspend, failure={"maxRestarts": budget, "activeDeadlineSeconds": 60})
        status = {"phase": phase.value, "startTime": "2026-12-01T11:59:30Z"}
        plan_reconcile(job, status, observed, _desired(), NOW, generation=1)
        late = {**status, "startTime": "2026-12-01T11:00:00Z"}  # past the deadline
        plan_reconcile(job, late, observed, _desired(), NOW, generation=1)
    for phase in Phase:
        plan_invalid_spec({"phase": phase.value}, "bad spec", 1, NOW)
    declared = {(a, b) for a, moves in PHASE_TRANSITIONS.items() for b in moves}
    assert taken == declared
