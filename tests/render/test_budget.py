"""Resource exhaustion: the CRD's maxima and the operator's per-TrainJob pod budget, which
fails the one job that exceeds it (a condition naming the field), not the operator."""

from __future__ import annotations

import datetime as dt

import pytest

from tests.render.helpers import UID, make_job
from trainjob_operator.api import ConditionType, parse_trainjob
from trainjob_operator.api.crd import render_crd
from trainjob_operator.api.errors import ManifestError
from trainjob_operator.reconcile.state_machine import plan_trainjob
from trainjob_operator.render import RenderOptions, render_children, renderer_for
from trainjob_operator.render.options import render_options_from_env

NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)
BUDGET = RenderOptions(max_pods_per_job=10)


def test_a_job_over_the_budget_is_refused_before_rendering() -> None:
    within = make_job(
        scaling={"numWorkers": 6}, validation={"entrypoint": "p.m:v", "pool": {"maxReplicas": 2}}
    )
    assert render_children(within, uid=UID, options=BUDGET)  # 2 + 6 + 2 = 10 pods
    over = make_job(
        scaling={"numWorkers": 7}, validation={"entrypoint": "p.m:v", "pool": {"maxReplicas": 2}}
    )
    with pytest.raises(
        ValueError,
        match=r"spec.scaling.numWorkers: this TrainJob asks for up to 11 pods \(head, driver, 7 "
        r"worker\(s\), 2 validation pod\(s\)\), more than the 10 pods per TrainJob this operator "
        r"allows \(hint: .*limits.maxPodsPerTrainJob\)",
    ):
        render_children(over, uid=UID, options=BUDGET)


def test_the_reconciler_fails_only_that_job_with_a_condition() -> None:
    job = make_job(scaling={"numWorkers": 50})
    plan = plan_trainjob(job, UID, {}, {}, [], renderer_for(BUDGET), NOW, generation=1)
    assert plan.status["phase"] == "Failed"
    assert plan.create == []
    failed = plan.new_status.condition(ConditionType.FAILED)
    assert failed is not None and failed.reason == "InvalidSpec"
    assert "more than the 10 pods per TrainJob" in failed.message
    ok = plan_trainjob(make_job(), UID, {}, {}, [], renderer_for(BUDGET), NOW, generation=1)
    assert ok.status.get("phase") != "Failed" and ok.create


def test_the_budget_comes_from_the_chart() -> None:
    assert render_options_from_env({"TRAINJOB_MAX_PODS_PER_JOB": "64"}).max_pods_per_job == 64
    for bad in ("0", "-1", "many"):
        with pytest.raises(ValueError, match="TRAINJOB_MAX_PODS_PER_JOB: expected a positive"):
            render_options_from_env({"TRAINJOB_MAX_PODS_PER_JOB": bad})


def test_the_crd_caps_workers_and_slices() -> None:
    scaling = render_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"][
        "spec"
    ]["properties"]["scaling"]["properties"]
    assert scaling["numWorkers"]["maximum"] == 5000
    assert scaling["tpu"]["properties"]["numSlices"]["maximum"] == 64
    body = {
        "apiVersion": "trainjob.dev/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "big"},
        "spec": {"entrypoint": "p.m:f", "scaling": {"numWorkers": 1000000}},
    }
    with pytest.raises(ManifestError, match=r"spec\.scaling\.numWorkers"):
        parse_trainjob(body)
