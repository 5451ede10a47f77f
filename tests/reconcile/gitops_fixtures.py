"""TrainJobs in every phase, with the status the operator's own state machine writes
(:func:`~trainjob_operator.reconcile.state_machine.plan_reconcile` and
:func:`~trainjob_operator.reconcile.state_machine.plan_invalid_spec`, at a fixed time): what
GitOps tools read (``tests/reconcile/test_gitops_health.py``).

They are also the inputs of the Argo CD health check's tests, in Argo CD's layout
(``deploy/argocd/resource_customizations/trainjob.dev/TrainJob/testdata/``); regenerate those
with ``python -m tests.reconcile.gitops_fixtures``.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from tests.reconcile.test_plan import NOW, _desired, _job, _running
from trainjob_operator.api import Phase, TrainJob, TrainJobStatus
from trainjob_operator.reconcile.state_machine import plan_invalid_spec, plan_reconcile

REPO = Path(__file__).resolve().parents[2]
HEALTH_DIR = REPO / "deploy" / "argocd" / "resource_customizations" / "trainjob.dev" / "TrainJob"
TESTDATA = HEALTH_DIR / "testdata"
GENERATION = 1


def _object(job: TrainJob, status: dict[str, Any] | None, generation: int) -> dict[str, Any]:
    """The TrainJob as the API server returns it (what Argo CD and Flux read); its spec as
    written (:func:`~tests.reconcile.test_plan._job`'s, without the defaults the models add),
    so that a new spec default does not change the fixtures."""
    spec = job.to_dict()["spec"]
    written: dict[str, Any] = {
        "entrypoint": spec["entrypoint"],
        "scaling": {"numWorkers": spec["scaling"]["numWorkers"]},
    }
    if spec["suspend"]:
        written["suspend"] = True
    if spec["failure"]["maxRestarts"]:
        written["failure"] = {"maxRestarts": spec["failure"]["maxRestarts"]}
    obj: dict[str, Any] = {
        "apiVersion": "trainjob.dev/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "tj", "namespace": "ns", "generation": generation},
        "spec": written,
    }
    if status is not None:
        obj["status"] = status
    return obj


def _ended(phase: str) -> list[dict[str, Any]]:
    """The pods of a running job whose driver pod ended in ``phase``."""
    pods = _running()
    driver = next(p for p in pods if p["metadata"]["name"] == "tj-driver")
    driver["status"] = {"phase": phase}
    if phase == "Failed":
        driver["status"]["containerStatuses"] = [
            {"name": "driver", "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}
        ]
    return pods


def trainjobs() -> dict[str, dict[str, Any]]:
    """name -> a TrainJob object, each with the status the operator wrote for it."""
    job = _job()
    g = GENERATION
    starting = plan_reconcile(job, {}, [], _desired(), NOW, generation=g).status
    running = plan_reconcile(job, starting, _running(), _desired(), NOW, generation=g).status
    succeeded = plan_reconcile(job, running, _ended("Succeeded"), _desired(), NOW, g).status
    retried = _job(failure={"maxRestarts": 3})
    restarting = plan_reconcile(retried, running, _ended("Failed"), _desired(), NOW, g).status
    no_restarts = _job(failure={"maxRestarts": 0})
    failed = plan_reconcile(no_restarts, running, _ended("Failed"), _desired(), NOW, g).status
    invalid = plan_invalid_spec(running, "spec.podTemplate.bogus: unknown key", g, NOW).status
    suspend = _job(suspend=True)
    suspended = plan_reconcile(suspend, running, _running(), _desired(), NOW, g).status
    # Pending is the phase of a status being written between two reconciles only (a new or
    # resumed job is Starting by the end of its reconcile): the same rule sets its conditions.
    pending_status = TrainJobStatus(phase=Phase.PENDING, observed_generation=g)
    pending_status.set_summary_conditions(g, NOW)
    pending = pending_status.to_dict()
    return {
        "no-status": _object(job, None, g),
        "pending": _object(job, pending, g),
        "starting": _object(job, starting, g),
        "running": _object(job, running, g),
        "restarting": _object(retried, restarting, g),
        "suspended": _object(suspend, suspended, g),
        "succeeded": _object(job, succeeded, g),
        "failed": _object(no_restarts, failed, g),
        "failed-invalid-spec": _object(job, invalid, g),
        # spec changed (generation 2) and the operator has not reconciled it yet
        "succeeded-spec-not-observed": _object(job, copy.deepcopy(succeeded), g + 1),
    }


def fixture_text(obj: dict[str, Any]) -> str:
    return yaml.safe_dump(obj, sort_keys=False, width=100)


def main() -> None:
    TESTDATA.mkdir(parents=True, exist_ok=True)
    for name, obj in trainjobs().items():
        (TESTDATA / f"{name}.yaml").write_text(fixture_text(obj), encoding="utf-8")


if __name__ == "__main__":
    main()
