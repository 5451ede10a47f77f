"""Failure rules: what a failed or disrupted head or driver pod means for the job.

``spec.failure.rules`` and then :data:`~trainjob_operator.api.spec.DEFAULT_FAILURE_RULES`
turn a pod into a decision (:func:`decide_pod_failure`: fail the job, restart without counting
against ``maxRestarts``, or a counted restart), after Ray Train V2's failure policy; the state
machine applies the decision (``Reconcile.pod_failed`` in
:mod:`~trainjob_operator.reconcile.state_machine`). Also whether a finished job keeps its
driver pod (:func:`keep_driver_pod`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainjob_operator.api.spec import DEFAULT_FAILURE_RULES, FailureRule, FailureRuleAction
from trainjob_operator.api.status import Phase
from trainjob_operator.constants import DRIVER_INVALID_INPUT_EXIT_CODE
from trainjob_operator.reconcile.pods import pod_conditions, terminations

#: The driver's exit status for invalid input (its own validation of the TrainJob failed):
#: no restart can fix it, so the job fails at once (``trainjob_operator.launcher.driver``).
INVALID_INPUT_EXIT_CODE = DRIVER_INVALID_INPUT_EXIT_CODE


def failure_rule_matches(rule: FailureRule, pod: dict[str, Any]) -> bool:
    """Whether ``rule`` matches a failed or disrupted pod.

    ``onExitCodes``: some terminated container (the named one only, when given) exited with
    a code In (or NotIn, and not 0) the values. ``onPodConditions``: the pod has one of the
    conditions with that status (see :func:`pod_conditions`).
    """
    if rule.on_exit_codes is not None:
        match = rule.on_exit_codes
        codes = [
            t.exit_code for t in terminations(pod, match.container_name) if t.exit_code is not None
        ]
        if match.operator == "In":
            return any(code in match.values for code in codes)
        return any(code != 0 and code not in match.values for code in codes)
    conditions = pod_conditions(pod)
    return any(conditions.get(c.type) == c.status for c in rule.on_pod_conditions)


@dataclass(frozen=True)
class FailureDecision:
    """What :func:`decide_pod_failure` found for a failed or disrupted head or driver pod."""

    action: FailureRuleAction
    #: which rule decided: ``failure.rules[i]``, ``default rule i`` or ``no rule matched``.
    rule: str
    #: the index in :data:`DEFAULT_FAILURE_RULES` when a default rule decided.
    default_index: int | None = None


def decide_pod_failure(pod: dict[str, Any], rules: list[FailureRule]) -> FailureDecision:
    """The first rule of ``failure.rules`` then :data:`DEFAULT_FAILURE_RULES` that matches
    ``pod`` decides; ``Count`` when none does."""
    for index, rule in enumerate(rules):
        if failure_rule_matches(rule, pod):
            return FailureDecision(FailureRuleAction(rule.action), f"failure.rules[{index}]")
    for index, rule in enumerate(DEFAULT_FAILURE_RULES):
        if failure_rule_matches(rule, pod):
            return FailureDecision(FailureRuleAction(rule.action), f"default rule {index}", index)
    return FailureDecision(FailureRuleAction.COUNT, "no rule matched")


def keep_driver_pod(policy: str, phase: str) -> bool:
    """Whether a finished job (``phase`` Succeeded or Failed) keeps its driver pod for its logs.

    ``spec.keepDriverPod``: ``Always`` keeps it, ``OnFailure`` only when the job failed,
    ``Never`` deletes it with the rest of the cluster.
    """
    if policy == "Always":
        return True
    if policy == "OnFailure":
        return phase == Phase.FAILED
    return False
