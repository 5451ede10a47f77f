"""The chart's monitoring objects: the drivers' PodMonitor, the PrometheusRule alerts and the
Grafana dashboards; the alerts checked and unit-tested by the real ``promtool`` (Debian's
``prometheus`` package) on series that fire them and series that do not.

That the names match what the processes export is checked twice: here against the metrics the
code registers, and by a real Prometheus scraping a real driver
(``tests/runtime/test_prometheus.py``) and the real operator (``tests/k8s/test_metrics.py``).
"""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

from tests.chart.helpers import CHART_DIR, all_of, one, render
from tests.render.helpers import UID, make_job
from tests.support.prometheus import MISSING, PROMTOOL, dashboard_queries, metric_names
from trainjob_operator.render.driver import render_driver_pod

MONITORING: dict[str, Any] = {
    "driverPodMonitor": {"enabled": True, "labels": {"release": "prom"}},
    "prometheusRule": {"enabled": True, "labels": {"release": "prom"}},
    "grafanaDashboards": {"enabled": True},
}
ALERTS = {
    "TrainJobNoProgress",
    "TrainJobCheckpointTooOld",
    "TrainJobValidationBacklogGrowing",
    "TrainJobWorkerGroupRestartLoop",
    "TrainJobRestartLoop",
}
DASHBOARD_FILES = ("trainjob-training.json", "trainjob-operator.json")


def rule_groups(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The rendered PrometheusRule's groups (``prometheusRule`` values merged in)."""
    merged = copy.deepcopy(MONITORING)
    merged["prometheusRule"].update(values or {})
    groups: list[dict[str, Any]] = one(render(merged), "PrometheusRule")["spec"]["groups"]
    return groups


def alert_exprs(groups: list[dict[str, Any]]) -> dict[str, str]:
    return {rule["alert"]: rule["expr"] for group in groups for rule in group["rules"]}


def test_monitoring_objects_render_when_enabled() -> None:
    objects = render(MONITORING)
    monitor = one(objects, "PodMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    # it selects the driver pods the operator renders, on their named metrics port
    driver = render_driver_pod(make_job(name="dj"), uid=UID)
    assert monitor["spec"]["selector"]["matchLabels"].items() <= (
        driver["metadata"]["labels"].items()
    )
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "metrics"
    assert {p["name"] for p in driver["spec"]["containers"][0]["ports"]} == {"metrics"}
    assert endpoint["relabelings"] == [
        {
            "sourceLabels": ["__meta_kubernetes_pod_label_trainjob_dev_name"],
            "targetLabel": "trainjob",
        }
    ]
    assert monitor["spec"]["namespaceSelector"] == {"any": True}
    scoped = one(render({**MONITORING, "watchNamespaces": ["a", "b"]}), "PodMonitor")
    assert scoped["spec"]["namespaceSelector"] == {"matchNames": ["a", "b"]}

    rule = one(objects, "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "prom"
    assert set(alert_exprs(rule["spec"]["groups"])) == ALERTS

    [dashboards] = [
        o for o in all_of(objects, "ConfigMap") if o["metadata"]["name"].endswith("-dashboards")
    ]
    assert dashboards["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert set(dashboards["data"]) == set(DASHBOARD_FILES)
    for name in DASHBOARD_FILES:
        board = json.loads(dashboards["data"][name])
        assert board["uid"] and board["panels"]


def test_lint_passes_with_monitoring() -> None:
    report = helm.lint(CHART_DIR, MONITORING, strict=True, namespace="ops", kube_version="v1.20.2")
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_thresholds_come_from_values() -> None:
    exprs = alert_exprs(
        rule_groups(
            {
                "noProgressMinutes": 7,
                "checkpointAgeMinutes": 11,
                "validationBacklog": {"queued": 4, "minutes": 13},
                "restartLoop": {"restarts": 2, "minutes": 17},
            }
        )
    )
    assert "> 420" in exprs["TrainJobNoProgress"]
    assert "> 660" in exprs["TrainJobCheckpointTooOld"]
    assert ">= 4" in exprs["TrainJobValidationBacklogGrowing"]
    assert "offset 13m" in exprs["TrainJobValidationBacklogGrowing"]
    assert "[17m]" in exprs["TrainJobRestartLoop"] and ">= 2" in exprs["TrainJobRestartLoop"]
    assert "[17m]" in exprs["TrainJobWorkerGroupRestartLoop"]


def _exported_names() -> set[str]:
    """Every sample name the operator's and the driver's registered metrics export."""
    import trainer_runtime._driver_metrics as driver
    import trainjob_operator.operator_main as operator
    import trainjob_operator.pod_watch as pod_watch

    suffixes = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}
    names = set()
    for module in (driver, operator, pod_watch):
        for value in vars(module).values():
            if isinstance(value, MetricWrapperBase):
                names |= {value._name + suffix for suffix in suffixes[str(value._type)]}
    return names


def test_every_alert_and_panel_reads_metrics_the_code_exports() -> None:
    exported = _exported_names()
    queries = [(name, expr) for name, expr in alert_exprs(rule_groups()).items()]
    for board in DASHBOARD_FILES:
        queries += dashboard_queries(board)
    for where, expr in queries:
        names = metric_names(expr)
        assert names, f"{where}: reads no trainjob_ metric: {expr}"
        assert names <= exported, f"{where}: {sorted(names - exported)} are not exported"


# --------------------------------------------------------------------------- promtool

#: Series that fire each alert (pod or trainjob "bad") and series that do not ("good"), at the
#: default thresholds (values.yaml), scraped every minute.
PROMTOOL_TESTS: dict[str, Any] = {
    "evaluation_interval": "1m",
    "tests": [
        {
            "interval": "1m",
            "input_series": [
                # last progress at t=0, then none: older than 30 minutes from 31m on
                {
                    "series": 'trainjob_train_last_progress_timestamp_seconds{pod="bad"}',
                    "values": "0x40",
                },
                # a report every minute
                {
                    "series": 'trainjob_train_last_progress_timestamp_seconds{pod="good"}',
                    "values": "0+60x40",
                },
            ],
            "alert_rule_test": [
                {"eval_time": "29m", "alertname": "TrainJobNoProgress", "exp_alerts": []},
                {
                    "eval_time": "31m",
                    "alertname": "TrainJobNoProgress",
                    "exp_alerts": [{"exp_labels": {"pod": "bad", "severity": "warning"}}],
                },
            ],
        },
        {
            "interval": "1m",
            "input_series": [
                # committed once at t=60s: older than 120 minutes from 122m on
                {
                    "series": 'trainjob_train_last_checkpoint_timestamp_seconds{pod="bad"}',
                    "values": "60x130",
                },
                # one every minute
                {
                    "series": 'trainjob_train_last_checkpoint_timestamp_seconds{pod="good"}',
                    "values": "0+60x130",
                },
                # never committed one (0): no alert, however long it runs
                {
                    "series": 'trainjob_train_last_checkpoint_timestamp_seconds{pod="none"}',
                    "values": "0x130",
                },
            ],
            "alert_rule_test": [
                {"eval_time": "120m", "alertname": "TrainJobCheckpointTooOld", "exp_alerts": []},
                {
                    "eval_time": "125m",
                    "alertname": "TrainJobCheckpointTooOld",
                    "exp_alerts": [{"exp_labels": {"pod": "bad", "severity": "warning"}}],
                },
            ],
        },
        {
            "interval": "1m",
            "input_series": [
                # one more queued every minute
                {
                    "series": 'trainjob_train_validations{state="queued",pod="bad"}',
                    "values": "0+1x60",
                },
                # a steady queue of 6: long, but not growing
                {
                    "series": 'trainjob_train_validations{state="queued",pod="steady"}',
                    "values": "6x60",
                },
                # growing, but below 5
                {
                    "series": 'trainjob_train_validations{state="queued",pod="small"}',
                    "values": "0+0.1x60",
                },
                {
                    "series": 'trainjob_train_validations{state="running",pod="bad"}',
                    "values": "1x60",
                },
            ],
            "alert_rule_test": [
                {
                    "eval_time": "40m",
                    "alertname": "TrainJobValidationBacklogGrowing",
                    "exp_alerts": [
                        {"exp_labels": {"pod": "bad", "state": "queued", "severity": "warning"}}
                    ],
                },
            ],
        },
        {
            "interval": "1m",
            "input_series": [
                # a restart every minute
                {
                    "series": 'trainjob_train_restarts_total{cause="failure",pod="bad"}',
                    "values": "0+1x60",
                },
                {
                    "series": 'trainjob_train_restarts_total{cause="preemption",pod="bad"}',
                    "values": "0x60",
                },
                # two restarts long ago, then none
                {
                    "series": 'trainjob_train_restarts_total{cause="failure",pod="good"}',
                    "values": "0 1 2 2x60",
                },
                # the operator's whole-cluster restarts: one every 5 minutes, and two long ago
                {
                    "series": 'trainjob_job_restarts{namespace="ns",trainjob="bad"}',
                    "values": "0+0.2x60",
                },
                {
                    "series": 'trainjob_job_restarts{namespace="ns",trainjob="good"}',
                    "values": "0 1 2 2x60",
                },
            ],
            "alert_rule_test": [
                {
                    "eval_time": "45m",
                    "alertname": "TrainJobWorkerGroupRestartLoop",
                    "exp_alerts": [{"exp_labels": {"pod": "bad", "severity": "warning"}}],
                },
                {
                    "eval_time": "45m",
                    "alertname": "TrainJobRestartLoop",
                    "exp_alerts": [
                        {
                            "exp_labels": {
                                "namespace": "ns",
                                "trainjob": "bad",
                                "severity": "warning",
                            }
                        }
                    ],
                },
            ],
        },
    ],
}


@pytest.mark.skipif(PROMTOOL is None, reason=MISSING)
def test_promtool_checks_the_rules_and_each_alert_fires_only_when_it_should(
    tmp_path: Path,
) -> None:
    assert PROMTOOL is not None
    groups = rule_groups()
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": groups}))
    check = subprocess.run(
        [PROMTOOL, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in check.stdout
    # The unit tests compare labels; the annotations (checked above) are left out of them.
    bare = copy.deepcopy(groups)
    for group in bare:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "bare.yaml").write_text(yaml.safe_dump({"groups": bare}))
    tests = tmp_path / "tests.yaml"
    tests.write_text(yaml.safe_dump({"rule_files": ["bare.yaml"], **PROMTOOL_TESTS}))
    done = subprocess.run(
        [PROMTOOL, "test", "rules", str(tests)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
