"""The phase transitions of a TrainJob: every move of ``status.phase`` the planner may make.

:data:`PHASE_TRANSITIONS` is the one table; every phase change goes through
:func:`check_transition` (``Reconcile.set_phase``, ``Plan.fail`` and ``plan_invalid_spec`` in
:mod:`~trainjob_operator.reconcile.plan`), so a step that would
move a job along an edge not declared here raises :class:`UndeclaredTransition` instead of
writing it (``tests/reconcile/test_transitions.py``). Staying in a phase is not a transition.
The docs' state diagram (``docs/concepts/state-machine.md``) is drawn from this table by
``scripts/gen_reference.py``.

A status without a phase (a new TrainJob) counts as Pending. Several moves may happen in one
reconcile (Suspended -> Pending -> Starting when a job resumes); each is checked.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from trainjob_operator.api.status import Phase

__all__ = ["PHASE_TRANSITIONS", "UndeclaredTransition", "check_transition"]

_DRIVER_SUCCEEDED = "the driver succeeded"
_RESTART = "the head or driver failed or is disrupted (failure.rules, maxRestarts)"
_SUSPEND = "spec.suspend"
_FAIL = "a deadline, invalid input, a rejected child, maxRestarts used up, FailJob"
_INVALID_SPEC = "the spec no longer parses or renders (InvalidSpec)"

#: from phase -> {to phase: what causes the move}. Every phase has an entry (Failed: none).
PHASE_TRANSITIONS: Mapping[Phase, Mapping[Phase, str]] = MappingProxyType(
    {
        Phase.PENDING: MappingProxyType(
            {
                Phase.STARTING: "the pods of the attempt are created",
                Phase.RUNNING: "head, workers and driver are already up",
                Phase.RESTARTING: _RESTART,
                Phase.SUSPENDED: _SUSPEND,
                Phase.SUCCEEDED: _DRIVER_SUCCEEDED,
                Phase.FAILED: _FAIL,
            }
        ),
        Phase.STARTING: MappingProxyType(
            {
                Phase.RUNNING: "head, workers and driver are up",
                Phase.RESTARTING: _RESTART,
                Phase.SUSPENDED: _SUSPEND,
                Phase.SUCCEEDED: _DRIVER_SUCCEEDED,
                Phase.FAILED: _FAIL,
            }
        ),
        Phase.RUNNING: MappingProxyType(
            {
                Phase.RESTARTING: _RESTART + "; the head or driver pod disappeared",
                Phase.SUSPENDED: _SUSPEND,
                Phase.SUCCEEDED: _DRIVER_SUCCEEDED,
                Phase.FAILED: _FAIL,
            }
        ),
        Phase.RESTARTING: MappingProxyType(
            {
                Phase.STARTING: "the next attempt's pods are created",
                Phase.RUNNING: "the next attempt's pods are all up",
                Phase.SUSPENDED: _SUSPEND,
                Phase.SUCCEEDED: _DRIVER_SUCCEEDED,
                Phase.FAILED: _FAIL,
            }
        ),
        Phase.SUSPENDED: MappingProxyType(
            {
                Phase.PENDING: "spec.suspend turned false (resume)",
                Phase.FAILED: _INVALID_SPEC,
            }
        ),
        Phase.SUCCEEDED: MappingProxyType({Phase.FAILED: _INVALID_SPEC}),
        Phase.FAILED: MappingProxyType({}),
    }
)


class UndeclaredTransition(RuntimeError):
    """A phase change that :data:`PHASE_TRANSITIONS` does not declare (a planner bug)."""


def check_transition(current: Phase | None, to: Phase) -> None:
    """Raise :class:`UndeclaredTransition` unless moving from ``current`` (None: a new job,
    Pending) to ``to`` stays in the phase or is declared in :data:`PHASE_TRANSITIONS`."""
    before = current or Phase.PENDING
    if before != to and to not in PHASE_TRANSITIONS[before]:
        raise UndeclaredTransition(f"undeclared phase transition {before} -> {to}")
