"""A real Prometheus server (Debian's ``prometheus``) scraping a real driver while it trains.

The run is a Ray run on the session's local Ray cluster (two worker actors): one worker fails
once (a worker group restart), every step commits a checkpoint, and each checkpoint's validation
takes longer than a step, so the validation queue grows. The driver serves its metrics because
``TRAINJOB_METRICS_PORT`` is set, as in a driver pod. Prometheus then answers every query the
chart ships for the drivers: each alert's expression, and each panel of the training dashboard
returns series (so the names match what the driver exports), and the restart-loop alert fires at
a threshold of one restart. The operator's side is ``tests/k8s/test_operator.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from tests.chart.test_monitoring import alert_exprs, rule_groups
from tests.runtime.workloads import counting_train, score_validation
from tests.support.ports import free_port
from tests.support.prometheus import (
    MISSING,
    PROMETHEUS,
    PrometheusServer,
    dashboard_queries,
    metric_names,
)
from tests.support.waiting import wait_for
from trainer_runtime import (
    CheckpointConfig,
    DataParallelTrainer,
    FailureConfig,
    RunConfig,
    ScalingConfig,
    ValidationConfig,
    _driver_metrics,
)
from trainjob_operator.constants import METRICS_PORT_ENV

pytestmark = pytest.mark.skipif(PROMETHEUS is None, reason=MISSING)

#: The operator's metrics (scraped from the operator, not from a driver).
OPERATOR_METRICS = {"trainjob_job_restarts"}


def _value(server: PrometheusServer, expr: str) -> float | None:
    result = server.query(expr)
    return float(result[0]["value"][1]) if result else None


def test_prometheus_scrapes_a_training_driver_and_answers_the_alerts_and_panels(
    ray_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    # The driver serves on this port when it starts; served now already, so that Prometheus
    # has the counters' values before the run (an increase needs the sample before it).
    monkeypatch.setenv(METRICS_PORT_ENV, str(port))
    _driver_metrics.serve(port, "127.0.0.1")
    server = PrometheusServer(tmp_path / "prometheus", {"driver": [f"127.0.0.1:{port}"]})
    try:
        server.wait_for_scrapes("driver", count=1)
        DataParallelTrainer(
            counting_train,
            train_loop_config={"steps": 8, "sleep": 0.3, "fail": {"rank": 1, "step": 2}},
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(
                name="prometheus",
                storage_path=str(tmp_path / "storage"),
                checkpoint_config=CheckpointConfig(num_to_keep=2),
                failure_config=FailureConfig(max_failures=1),
                validation_config=ValidationConfig(
                    validate_fn=score_validation,
                    validate_config={"sleep": 2.0},
                    wait_for_validations=False,
                ),
            ),
        ).fit()
        # Prometheus has what the driver has now, after the run.
        committed = REGISTRY.get_sample_value("trainjob_train_checkpoints_committed_total")
        wait_for(
            "the final values scraped",
            lambda: _value(server, "trainjob_train_checkpoints_committed_total") == committed,
            timeout=30,
        )

        # The run's events, as Prometheus saw them.
        assert _value(server, 'trainjob_train_restarts_total{cause="failure"}')
        assert _value(server, 'max_over_time(trainjob_train_validations{state="queued"}[5m])')
        assert _value(server, "trainjob_train_step") == 7
        assert _value(server, "increase(trainjob_train_reports_total[5m])")

        # Every alert's expression is answered, and every metric it reads has series.
        for alert, expr in alert_exprs(rule_groups()).items():
            server.query(expr)  # a query error raises
            for name in metric_names(expr) - OPERATOR_METRICS:
                assert server.query(name), f"{alert}: no series of {name}"
        # The worker group restart fires the restart loop at a threshold of 1 in 1 minute.
        looping = alert_exprs(rule_groups({"restartLoop": {"restarts": 1, "minutes": 1}}))
        assert server.query(looping["TrainJobWorkerGroupRestartLoop"])

        # Every panel of the training dashboard returns series.
        for title, expr in dashboard_queries("trainjob-training.json"):
            if metric_names(expr) <= OPERATOR_METRICS:
                continue
            assert server.query(expr), f"panel {title!r}: no series for {expr}"
    finally:
        server.stop()
