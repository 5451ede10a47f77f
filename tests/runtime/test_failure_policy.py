"""FailurePolicy.decide on its own, and the controller states a local run moves through
(no Ray)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import trainer_runtime as tr
import trainer_runtime.trainer as trainer_module
from trainer_runtime import DataParallelTrainer, FailureConfig, RunConfig, ScalingConfig, preemption
from trainer_runtime._controller import STATE_TRANSITIONS, ControllerState
from trainer_runtime._failure_policy import (
    DECIDED_ERRORS,
    FailureAction,
    FailureDecision,
    FailurePolicy,
)
from trainer_runtime._local import LocalController
from trainer_runtime.errors import (
    FencedError,
    PreemptionStop,
    TrainingFailedError,
    UserConfigError,
    ValidationDispatchError,
    WorkerFailure,
)
from trainer_runtime.preemption import PreemptionInfo

RETRY = FailureDecision.RETRY
RAISE = FailureDecision.RAISE


def _preempted() -> PreemptionStop:
    return PreemptionStop(PreemptionInfo(deadline_ms=None, preempted_node_to_ranks={"n": [1]}))


def test_worker_failures_restart_with_a_growing_back_off_until_max_failures() -> None:
    policy = FailurePolicy(
        FailureConfig(max_failures=3, restart_backoff_s=1.0, max_restart_backoff_s=3.0),
        preemption_in_place=True,
    )
    actions = [policy.decide(WorkerFailure("boom", rank=0), progressed=False) for _ in range(4)]
    assert actions == [
        FailureAction(RETRY, delay_s=1.0, counted=True),
        FailureAction(RETRY, delay_s=2.0, counted=True),
        FailureAction(RETRY, delay_s=3.0, counted=True),  # capped by max_restart_backoff_s
        FailureAction(RAISE, counted=True),  # the 4th failure is one too many
    ]
    assert [a.will_restart for a in actions] == [True, True, True, False]
    assert (policy.failures, policy.preemptions) == (4, 0)


def test_the_back_off_starts_over_after_an_attempt_committed_a_checkpoint() -> None:
    policy = FailurePolicy(
        FailureConfig(max_failures=-1, restart_backoff_s=0.5, max_restart_backoff_s=60),
        preemption_in_place=False,
    )
    delays = [
        policy.decide(WorkerFailure("boom"), progressed=progressed).delay_s
        for progressed in (False, False, True, False)
    ]
    assert delays == [0.5, 1.0, 0.5, 1.0]
    assert policy.failures == 4  # -1: unlimited, every failure restarts


def test_no_back_off_when_zero_and_no_restart_with_max_failures_zero() -> None:
    assert FailurePolicy(
        FailureConfig(max_failures=1, restart_backoff_s=0), preemption_in_place=False
    ).decide(WorkerFailure("boom"), progressed=False) == FailureAction(RETRY, counted=True)
    policy = FailurePolicy(FailureConfig(max_failures=0), preemption_in_place=False)
    assert policy.decide(WorkerFailure("boom"), progressed=False) == FailureAction(
        RAISE, counted=True
    )


@pytest.mark.parametrize(
    "error",
    [
        WorkerFailure("permission denied", rank=0, permanent=True),
        UserConfigError("bad report() call"),
        ValidationDispatchError("the dispatcher broke"),
        FencedError("another driver took over"),
    ],
    ids=["permanent-worker-failure", "config", "validation-dispatcher", "fenced"],
)
def test_errors_no_restart_can_fix_fail_the_run_uncounted(error: BaseException) -> None:
    policy = FailurePolicy(FailureConfig(max_failures=-1), preemption_in_place=True)
    assert policy.decide(error, progressed=False) == FailureAction(RAISE)
    assert (policy.failures, policy.preemptions) == (0, 0)
    assert isinstance(error, DECIDED_ERRORS)


def test_preemptions_restart_in_place_up_to_max_preemption_failures_uncounted() -> None:
    policy = FailurePolicy(
        FailureConfig(max_failures=0, max_preemption_failures=2, restart_backoff_s=5),
        preemption_in_place=True,
    )
    decisions = [policy.decide(_preempted(), progressed=False) for _ in range(3)]
    assert decisions == [
        FailureAction(FailureDecision.RETRY_PREEMPTED),  # at once: no back-off
        FailureAction(FailureDecision.RETRY_PREEMPTED),
        FailureAction(FailureDecision.RAISE_PREEMPTION),
    ]
    assert decisions[0].will_restart and not decisions[2].will_restart
    assert (policy.failures, policy.preemptions) == (0, 3)  # max_failures is not spent


def test_a_preemption_stops_the_run_where_workers_cannot_move() -> None:
    """Local mode: this very process is going away."""
    policy = FailurePolicy(FailureConfig(max_preemption_failures=-1), preemption_in_place=False)
    assert policy.decide(_preempted(), progressed=True) == FailureAction(
        FailureDecision.RAISE_PREEMPTION
    )
    assert policy.preemptions == 1


def test_a_preemption_of_the_driver_itself_stops_the_run_with_ray_workers_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The driver's own SIGTERM (its pod deleted): no restart in place, the driver is
    going away; it stops before the grace period ends, keeping time to shut down."""
    policy = FailurePolicy(FailureConfig(max_preemption_failures=-1), preemption_in_place=True)
    stop = _preempted()
    stop.driver = True
    assert policy.decide(stop, progressed=True) == FailureAction(FailureDecision.RAISE_PREEMPTION)
    monkeypatch.setenv(preemption.GRACE_ENV, "30")
    assert preemption.driver_stop_time() is None
    preemption.notify(1_000_000)
    try:
        assert preemption.driver_stop_time() == 1000 - 10  # min(10 s, a third of 30 s)
        monkeypatch.setenv(preemption.GRACE_ENV, "6")
        assert preemption.driver_stop_time() == 1000 - 2
    finally:
        preemption.clear()


def test_the_state_table_ends_in_finished_or_errored() -> None:
    assert not STATE_TRANSITIONS[ControllerState.FINISHED]
    assert not STATE_TRANSITIONS[ControllerState.ERRORED]
    assert ControllerState.FINISHED.is_terminal and ControllerState.ERRORED.is_terminal
    assert STATE_TRANSITIONS[ControllerState.RESTARTING] == {ControllerState.SCHEDULING}


def _fit_recording(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail_attempts: int, max_failures: int
) -> tuple[list[LocalController], Any]:
    controllers: list[LocalController] = []

    class Recording(LocalController):
        def __init__(self, spec: Any) -> None:
            super().__init__(spec)
            controllers.append(self)

    monkeypatch.setattr(trainer_module, "LocalController", Recording)
    calls = [0]

    def train(config: dict[str, Any]) -> None:
        calls[0] += 1
        tr.report({"step": calls[0]})
        if calls[0] <= fail_attempts:
            raise RuntimeError(f"failure {calls[0]}")

    trainer = DataParallelTrainer(
        train,
        scaling_config=ScalingConfig(num_workers=0),
        run_config=RunConfig(
            name="run",
            storage_path=str(tmp_path),
            failure_config=FailureConfig(max_failures=max_failures, restart_backoff_s=0),
        ),
    )
    try:
        outcome: Any = trainer.fit()
    except TrainingFailedError as exc:
        outcome = exc
    return controllers, outcome


def test_a_local_run_restarts_then_finishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    [controller], result = _fit_recording(tmp_path, monkeypatch, fail_attempts=1, max_failures=1)
    assert result.restarts == 1
    s = ControllerState
    assert controller.state_history == [
        s.INITIALIZING,
        s.SCHEDULING,
        s.RUNNING,
        s.RESTARTING,
        s.SCHEDULING,
        s.RUNNING,
        s.FINISHED,
    ]


def test_a_local_run_that_runs_out_of_restarts_ends_errored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    [controller], error = _fit_recording(tmp_path, monkeypatch, fail_attempts=5, max_failures=1)
    assert isinstance(error, TrainingFailedError) and "failure 2" in str(error)
    assert controller.state_history[-3:] == [
        ControllerState.SCHEDULING,
        ControllerState.RUNNING,
        ControllerState.ERRORED,
    ]
    assert controller.state is ControllerState.ERRORED and controller.failures == 2
