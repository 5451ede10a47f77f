"""What the controller does when a worker group's attempt ends in an error.

Modelled on Ray Train V2's ``FailurePolicy`` (``failure_handling/``): the controller hands
each error that ended an attempt to :meth:`FailurePolicy.decide`, which counts it against
``FailureConfig`` and returns the :class:`FailureAction` to take; the controller carries it
out (callbacks, clean-up, back-off, the exception ``fit()`` raises).

* A preemption (:class:`~trainer_runtime.errors.PreemptionStop`) restarts the worker group
  on other nodes, at once, while ``max_preemption_failures`` allows and the controller can
  move workers off a preempted node (Ray; not local mode); it never counts against
  ``max_failures``. Otherwise, and always when the driver process itself got the notice
  (its pod is going away), ``fit()`` raises ``PreemptionError``.
* A worker failure that a restart may fix (a non-permanent
  :class:`~trainer_runtime.errors.WorkerFailure`) counts against ``max_failures`` and
  restarts after ``FailureConfig.backoff_s`` (the back-off grows with failures in a row
  and starts over once a checkpoint was committed) while the limit allows.
* Anything else (a permanent worker failure, a bad configuration, a broken validation
  dispatcher, a fenced-off driver) fails the run at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from trainer_runtime.config import FailureConfig
from trainer_runtime.errors import (
    FencedError,
    PreemptionStop,
    UserConfigError,
    ValidationDispatchError,
    WorkerFailure,
)

#: The errors that end an attempt and are decided on by the policy; any other exception
#: propagates from ``fit()`` as it is.
DECIDED_ERRORS: tuple[type[BaseException], ...] = (
    UserConfigError,
    ValidationDispatchError,
    FencedError,
    PreemptionStop,
    WorkerFailure,
)


class FailureDecision(StrEnum):
    """What to do about an error that ended an attempt."""

    #: Restart the worker group after :attr:`FailureAction.delay_s` (a counted failure).
    RETRY = "retry"
    #: Restart the worker group on other nodes, at once (a preemption, not counted
    #: against ``max_failures``).
    RETRY_PREEMPTED = "retry_preempted"
    #: Fail the run: ``fit()`` raises ``WorkerGroupError`` / ``ControllerError``.
    RAISE = "raise"
    #: Stop the run for the preemption: ``fit()`` raises ``PreemptionError``.
    RAISE_PREEMPTION = "raise_preemption"


@dataclass(frozen=True)
class FailureAction:
    """The policy's answer for one error."""

    decision: FailureDecision
    #: Seconds to wait before restarting (``RETRY`` only).
    delay_s: float = 0.0
    #: The error counted against ``FailureConfig.max_failures`` (callbacks' ``on_failure``
    #: hear of it, with :attr:`will_restart`).
    counted: bool = False

    @property
    def will_restart(self) -> bool:
        """Whether a new worker group is started."""
        return self.decision in (FailureDecision.RETRY, FailureDecision.RETRY_PREEMPTED)


class FailurePolicy:
    """Counts failures and preemptions against ``config`` and decides what each error needs.

    ``preemption_in_place``: whether a preemption may restart the worker group within this
    ``fit()`` (only Ray workers can move off a preempted node).
    """

    def __init__(self, config: FailureConfig, *, preemption_in_place: bool) -> None:
        self.config = config
        self.preemption_in_place = preemption_in_place
        #: Counted failures so far (``Result.restarts``).
        self.failures = 0
        #: Preemptions so far (``max_preemption_failures``).
        self.preemptions = 0
        #: Counted failures since a checkpoint was last committed (the back-off's exponent).
        self.failures_in_a_row = 0

    def decide(self, error: BaseException, *, progressed: bool) -> FailureAction:
        """Count ``error`` and return what to do about it.

        ``progressed``: the failed attempt committed a checkpoint (the back-off starts over).
        """
        if isinstance(error, PreemptionStop):
            self.preemptions += 1
            if (
                self.preemption_in_place
                and not error.driver
                and self.config.allows_preemption(self.preemptions)
            ):
                return FailureAction(FailureDecision.RETRY_PREEMPTED)
            return FailureAction(FailureDecision.RAISE_PREEMPTION)
        if isinstance(error, WorkerFailure) and not error.permanent:
            self.failures += 1
            self.failures_in_a_row = 1 if progressed else self.failures_in_a_row + 1
            if not self.config.allows(self.failures):
                return FailureAction(FailureDecision.RAISE, counted=True)
            delay = self.config.backoff_s(self.failures_in_a_row)
            return FailureAction(FailureDecision.RETRY, delay_s=delay, counted=True)
        return FailureAction(FailureDecision.RAISE)
