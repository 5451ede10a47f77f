"""What the apply layer and the operator keep: the apply layer answers with values
(``Applied``, ``ReconcileOutcome``) and leaves the plan as it was decided; the operator keeps
one ``JobState`` per TrainJob and drops it when it holds nothing."""

from __future__ import annotations

from typing import Any

import pytest

from tests.reconcile.test_phases import FakeClient, _trainjob_object
from tests.reconcile.test_plan import NOW, _desired, _job
from trainjob_operator import operator_main
from trainjob_operator.api import Phase, TrainJobStatus
from trainjob_operator.operator_main import JobState, Operator
from trainjob_operator.reconcile.apply import ReconcileOutcome, execute_plan, reconcile_trainjob
from trainjob_operator.reconcile.state_machine import plan_reconcile


def test_a_rejected_child_fails_a_copy_of_the_plan_not_the_plan() -> None:
    plan = plan_reconcile(_job(), {}, [], _desired(), NOW, generation=1)
    decided = plan.status
    events = list(plan.events)
    client = FakeClient(reject=frozenset({"tj-w0"}))
    applied = execute_plan(client, _trainjob_object(), plan, NOW)  # type: ignore[arg-type]
    assert plan.status == decided and plan.events == events  # left as it was decided
    assert applied.plan is not plan and applied.plan.new_status.phase == Phase.FAILED
    assert [e.reason for e in applied.plan.events][-1] == "InvalidChild"
    (written,) = [c[2] for c in client.calls if c[0] == "patch"]
    assert applied.trainjob_after == written


def test_reconcile_trainjob_answers_with_an_outcome() -> None:
    client = FakeClient(_trainjob_object())
    outcome = reconcile_trainjob(client, "ns", "tj", lambda *a: _desired(), now=NOW)  # type: ignore[arg-type]
    assert isinstance(outcome, ReconcileOutcome) and outcome.plan is not None
    assert outcome.new_status is outcome.plan.new_status
    assert outcome.new_status.phase == Phase.STARTING
    assert outcome.generation_read == 1 and outcome.fingerprint_after is not None
    assert outcome.requeue_after == outcome.plan.requeue_after


def test_the_operator_keeps_one_state_per_trainjob_and_drops_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def fake(client: Any, namespace: str, name: str, render: Any, obj: Any = None) -> Any:
        return ReconcileOutcome(TrainJobStatus(phase=Phase.RUNNING), generation_read=4)

    monkeypatch.setattr(operator_main, "reconcile_trainjob", fake)
    op = Operator(client=None, render=lambda *a: [], resync_seconds=60)  # type: ignore[arg-type]
    op.reconcile("ns", "a", "create")
    state = op._jobs[("ns", "a")]
    assert isinstance(state, JobState)
    assert (state.phase, state.reconciled, state.generation, state.waiting) == (
        Phase.RUNNING,
        True,
        4,
        False,
    )
    assert state.timer_due > 0
    op.forget(("ns", "a"))
    assert op._jobs == {}  # nothing kept about a deleted TrainJob
    assert JobState().empty and not JobState(waiting=True).empty
