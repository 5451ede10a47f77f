"""How GitOps tools read a TrainJob's health from the status the operator writes (issue 37).

- Flux (and ``kubectl wait``) read the kstatus conventions: ``status.observedGeneration`` on
  every status write, the abnormal-true ``Reconciling`` and ``Stalled`` conditions, and
  ``Ready``. :func:`kstatus` below is kstatus' own decision (``sigs.k8s.io/cli-utils``
  ``pkg/kstatus/status``: the generic rules, then the ``Ready`` condition) for a custom resource.
- Argo CD runs the Lua health check of
  ``deploy/argocd/resource_customizations/trainjob.dev/TrainJob/health.lua``; here it runs in a
  real Lua 5.1 interpreter (lupa; Argo CD runs gopher-lua, a Lua 5.1), on the TrainJobs the
  state machine itself produced (:mod:`tests.reconcile.gitops_fixtures`), with the cases of its
  ``health_test.yaml`` in Argo CD's own test layout (``testdata/``).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
import yaml

from tests.docs._gen import DOCS, load_generator
from tests.reconcile.gitops_fixtures import (
    GENERATION,
    HEALTH_DIR,
    TESTDATA,
    fixture_text,
    trainjobs,
)
from tests.reconcile.test_plan import NOW, _desired, _job, _running
from trainjob_operator.api import ConditionType, Phase, TrainJobStatus
from trainjob_operator.api.status import READY_PHASES, RECONCILING_PHASES
from trainjob_operator.reconcile.plan import Plan
from trainjob_operator.reconcile.state_machine import plan_invalid_spec, plan_reconcile

#: What each fixture must show in Argo CD (the contract of the issue, written by hand).
ARGO_HEALTH = {
    "no-status": "Progressing",
    "pending": "Progressing",
    "starting": "Progressing",
    "running": "Progressing",
    "restarting": "Progressing",
    "suspended": "Suspended",
    "succeeded": "Healthy",
    "failed": "Degraded",
    "failed-invalid-spec": "Degraded",
    "succeeded-spec-not-observed": "Progressing",
}
#: What kstatus (Flux's health checks) must compute for each fixture.
KSTATUS = {
    "no-status": "Current",  # kstatus cannot tell before the first status write
    "pending": "InProgress",
    "starting": "InProgress",
    "running": "Current",  # as a batch/v1 Job: Current once it runs
    "restarting": "InProgress",
    "suspended": "Current",
    "succeeded": "Current",
    "failed": "Failed",
    "failed-invalid-spec": "Failed",
    "succeeded-spec-not-observed": "InProgress",
}


def _conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}


def kstatus(obj: dict[str, Any]) -> str:
    """kstatus' status of a custom resource (``status.Compute``: ``checkGenericProperties``,
    then ``checkReadyCondition``; no deletion timestamp here)."""
    generation = obj["metadata"].get("generation")
    observed = (obj.get("status") or {}).get("observedGeneration")
    if generation is not None and observed is not None and observed != generation:
        return "InProgress"
    conditions = _conditions(obj)
    if conditions.get("Reconciling", {}).get("status") == "True":
        return "InProgress"
    if conditions.get("Stalled", {}).get("status") == "True":
        return "Failed"
    ready = conditions.get("Ready")
    if ready is not None and ready["status"] != "True":
        return "InProgress"
    return "Current"


# --------------------------------------------------------------------------- kstatus (Flux)


@pytest.mark.parametrize("name", sorted(KSTATUS))
def test_kstatus_reads_each_phase_as_flux_should(name: str) -> None:
    assert kstatus(trainjobs()[name]) == KSTATUS[name]


@pytest.mark.parametrize("phase", list(Phase))
def test_summary_conditions_follow_the_phase(phase: Phase) -> None:
    status = TrainJobStatus(phase=phase, message=f"now {phase}")
    if phase == Phase.FAILED:
        status.set_condition(ConditionType.FAILED, True, "DeadlineExceeded", "too late", 4, NOW)
    status.set_summary_conditions(4, NOW)
    found = {c.type: c for c in status.conditions}
    assert found[ConditionType.READY].status == str(phase in READY_PHASES)
    assert found[ConditionType.RECONCILING].status == str(phase in RECONCILING_PHASES)
    assert found[ConditionType.STALLED].status == str(phase == Phase.FAILED)
    for ctype in (ConditionType.READY, ConditionType.RECONCILING, ConditionType.STALLED):
        condition = found[ctype]
        assert condition.observed_generation == 4
        if phase == Phase.FAILED:  # the failure's own reason and message
            assert (condition.reason, condition.message) == ("DeadlineExceeded", "too late")
        else:
            assert (condition.reason, condition.message) == (phase.value, f"now {phase}")
    # Ready is True exactly when kstatus' Job rule says Current and nothing is abnormal
    assert not (READY_PHASES & RECONCILING_PHASES) and Phase.FAILED not in READY_PHASES


def test_every_plan_sets_observed_generation_and_the_summary_conditions() -> None:
    """Every status the operator writes: a reconcile, a spec that does not render, a child
    the API server rejected."""
    running = plan_reconcile(_job(), {}, _running(), _desired(), NOW, generation=5)
    invalid = plan_invalid_spec(running.status, "bad", 6, NOW)
    rejected = running.failed_by_rejected_child(_desired()[0], {"message": "no"}, NOW)
    for plan, generation in ((running, 5), (invalid, 6), (rejected, 5)):
        status = plan.status
        assert status["observedGeneration"] == generation
        conditions = _conditions({"status": status})
        assert {"Ready", "Reconciling", "Stalled"} <= set(conditions)
        for ctype in ("Ready", "Reconciling", "Stalled"):
            assert conditions[ctype]["observedGeneration"] == generation
    assert _conditions({"status": running.status})["Ready"]["status"] == "True"
    for failed in (invalid, rejected):
        assert _conditions({"status": failed.status})["Stalled"]["status"] == "True"
        assert _conditions({"status": failed.status})["Ready"]["status"] == "False"


def test_the_summary_conditions_cost_no_extra_status_write() -> None:
    """A steady state still writes nothing; the transition time moves only with the status."""
    first = plan_reconcile(_job(), {}, _running(), _desired(), NOW, generation=1)
    later = NOW + dt.timedelta(minutes=5)
    again = plan_reconcile(_job(), first.status, _running(), _desired(), later, generation=1)
    assert again.status_patch() is None
    ready = again.new_status.condition(ConditionType.READY)
    assert ready is not None and ready.last_transition_time == NOW


def test_a_failure_of_a_plan_is_stalled() -> None:
    plan = Plan(new_status=TrainJobStatus(phase=Phase.RUNNING))
    plan.fail("DeadlineExceeded", "activeDeadlineSeconds=1 exceeded", 2, NOW)
    stalled = plan.new_status.condition(ConditionType.STALLED)
    assert stalled is not None and stalled.status == "True"
    assert stalled.reason == "DeadlineExceeded"


# --------------------------------------------------------------------------- Argo CD (Lua)


def _lua_health(obj: dict[str, Any], script: str | None = None) -> dict[str, Any]:
    """Run the health check as Argo CD does: ``obj`` a global table, the script's return."""
    lupa = pytest.importorskip("lupa")
    try:
        from lupa import lua51 as lua
    except ImportError:  # an older lupa with one Lua: a warning, as Argo CD's is 5.1
        lua = lupa
    runtime = lua.LuaRuntime(unpack_returned_tuples=False)
    assert "Lua 5.1" in str(runtime.eval("_VERSION")) or lua is lupa
    runtime.globals().obj = runtime.table_from(obj, recursive=True)
    source = script if script is not None else (HEALTH_DIR / "health.lua").read_text()
    result = runtime.execute(source)
    return {str(k): v for k, v in dict(result).items()}


def _argo_cases() -> list[dict[str, Any]]:
    return yaml.safe_load((HEALTH_DIR / "health_test.yaml").read_text())["tests"]


def test_the_testdata_are_what_the_operator_writes() -> None:
    """The Argo CD fixtures are the state machine's statuses; regenerate them with
    ``python -m tests.reconcile.gitops_fixtures``."""
    generated = trainjobs()
    assert sorted(p.stem for p in TESTDATA.glob("*.yaml")) == sorted(generated)
    for name, obj in generated.items():
        assert (TESTDATA / f"{name}.yaml").read_text() == fixture_text(obj), name
    assert generated["running"]["status"]["observedGeneration"] == GENERATION


def test_health_test_yaml_covers_every_fixture_with_the_contract() -> None:
    cases = _argo_cases()
    inputs = [c["inputPath"] for c in cases]
    assert sorted(inputs) == sorted(f"testdata/{name}.yaml" for name in ARGO_HEALTH)
    for case in cases:
        name = case["inputPath"].removeprefix("testdata/").removesuffix(".yaml")
        assert case["healthStatus"]["status"] == ARGO_HEALTH[name], name
        assert case["healthStatus"]["message"], name


@pytest.mark.parametrize("case", _argo_cases(), ids=lambda c: c["inputPath"])
def test_the_lua_health_check_gives_argo_cds_expected_health(case: dict[str, Any]) -> None:
    obj = yaml.safe_load((HEALTH_DIR / case["inputPath"]).read_text())
    assert _lua_health(obj) == case["healthStatus"]


def test_a_degraded_job_shows_the_failed_conditions_message() -> None:
    failed = trainjobs()["failed"]
    condition = _conditions(failed)["Failed"]
    health = _lua_health(failed)
    assert health["status"] == "Degraded"
    assert health["message"] == f"{condition['reason']}: {condition['message']}"
    # without the condition, the status message
    failed["status"]["conditions"] = []
    assert _lua_health(failed)["message"] == failed["status"]["message"]


def test_the_lua_health_check_edge_cases() -> None:
    base: dict[str, Any] = {"apiVersion": "trainjob.dev/v1alpha1", "kind": "TrainJob"}
    no_generation = {**base, "metadata": {"name": "tj"}, "status": {"phase": "Succeeded"}}
    assert _lua_health(no_generation) == {"status": "Healthy", "message": "Succeeded"}
    older = {**base, "metadata": {"generation": 3}, "status": {"phase": "Running"}}
    assert _lua_health(older)["status"] == "Progressing"  # no observedGeneration: lenient
    odd = {**base, "metadata": {"generation": 1}, "status": {"phase": "Exploded"}}
    assert _lua_health(odd) == {"status": "Unknown", "message": "Unknown TrainJob phase Exploded"}
    empty = {**base, "metadata": {"generation": 1}, "status": {}}
    assert _lua_health(empty)["status"] == "Progressing"


def test_the_argocd_cm_snippet_is_the_script() -> None:
    """docs/guides/gitops.md includes docs/snippets/argocd-cm.yaml: generated from health.lua
    (``scripts/gen_reference.py``), so the documented health check is the tested one."""
    gen = load_generator()
    committed = (DOCS / "snippets" / "argocd-cm.yaml").read_text(encoding="utf-8")
    assert committed == gen.argocd_cm_snippet(), "run `python scripts/gen_reference.py`"
    data = yaml.safe_load(committed)["data"]
    assert data == {gen.ARGOCD_HEALTH_KEY: (HEALTH_DIR / "health.lua").read_text()}
    assert gen.ARGOCD_HEALTH_KEY == "resource.customizations.health.trainjob.dev_TrainJob"
    script = data[gen.ARGOCD_HEALTH_KEY]
    assert _lua_health(trainjobs()["failed"], script)["status"] == "Degraded"
    guide = (DOCS / "guides" / "gitops.md").read_text(encoding="utf-8")
    assert '--8<-- "argocd-cm.yaml"' in guide
