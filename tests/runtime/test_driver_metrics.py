"""The driver's Prometheus metrics (``trainer_runtime._driver_metrics``), fed by a real run.

A local-mode run (no Ray) with checkpoints and validations, its metrics read from the
``/metrics`` endpoint that ``TRAINJOB_METRICS_PORT`` turns on: the values the events put there.
The Prometheus server itself reads them in ``tests/runtime/test_prometheus.py``.
"""

from __future__ import annotations

import socket
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.runtime.workloads import validating_train
from trainer_runtime import (
    CheckpointConfig,
    DataParallelTrainer,
    RunConfig,
    ScalingConfig,
    ValidationConfig,
)
from trainer_runtime import _driver_metrics as dm


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("trainjob_train_")
    }


def test_a_run_feeds_the_driver_metrics_served_on_the_port_asked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = _free_port()
    monkeypatch.setenv(dm.METRICS_PORT_ENV, str(port))
    before = time.time()
    served_before = set(dm._served)
    DataParallelTrainer(
        validating_train,
        train_loop_config={"steps": 3, "validate": {"sleep": 0.05}},
        scaling_config=ScalingConfig(num_workers=0),
        run_config=RunConfig(
            name="metrics",
            storage_path=str(tmp_path / "storage"),
            checkpoint_config=CheckpointConfig(num_to_keep=1),
            validation_config=ValidationConfig(),
        ),
    ).fit()
    assert port in set(dm._served) - served_before
    after = _scrape(port)

    def value(name: str, **labels: str) -> float:
        return after[(name, tuple(sorted(labels.items())))]

    # The counters are process-wide: compare with what this run added.
    assert value("trainjob_train_step") == 2  # the metrics' "step" of the last report
    assert value("trainjob_train_reports_total") >= 3
    assert value("trainjob_train_checkpoints_committed_total") >= 3
    assert value("trainjob_train_checkpoint_commit_seconds_count") >= 3
    assert value("trainjob_train_checkpoint_upload_seconds_count") >= 3
    assert value("trainjob_train_checkpoint_upload_bytes_total") >= 3 * len('{"step": 0}')
    # every report() after the first carries the time the previous one took
    assert value("trainjob_train_report_blocked_seconds_count") >= 2
    assert value("trainjob_train_validation_lag_seconds_count") >= 3
    assert value("trainjob_train_validations", state="queued") == 0  # fit() waited for them
    assert value("trainjob_train_validations", state="running") == 0
    assert before <= value("trainjob_train_last_checkpoint_timestamp_seconds") <= time.time()
    assert before <= value("trainjob_train_last_progress_timestamp_seconds") <= time.time()
    for cause in dm.RESTART_CAUSES:  # exported from the start, at 0 here
        assert ("trainjob_train_restarts_total", (("cause", cause),)) in after
    assert ("trainjob_train_preemptions_total", ()) in after


def test_the_port_is_served_only_when_asked_and_a_bad_one_is_not_fatal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(dm.METRICS_PORT_ENV, raising=False)
    assert dm.serve_from_env() is None
    monkeypatch.setenv(dm.METRICS_PORT_ENV, "0")
    assert dm.serve_from_env() is None
    monkeypatch.setenv(dm.METRICS_PORT_ENV, "not-a-port")
    assert dm.serve_from_env() is None
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        monkeypatch.setenv(dm.METRICS_PORT_ENV, str(taken.getsockname()[1]))
        assert dm.serve_from_env() is None  # logged; training goes on


def test_step_of_reads_the_step_keys_in_order() -> None:
    assert dm.step_of({"epoch": 3, "global_step": 70}, 5) == 70
    assert dm.step_of({"step": True, "loss": 1.0}, 5) == 5  # a bool is no step
    assert dm.step_of(None, 0) == 0
