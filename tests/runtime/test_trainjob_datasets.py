"""``spec.data`` through the launcher (:func:`~trainjob_operator.launcher.trainer.build_trainer`,
what the in-cluster driver runs) on a real local Ray: the datasets function's datasets reach
``get_dataset_shard`` (``datasetsToSplit`` split, the others whole), and with the driver pod's
data-pool selector every Ray Data task of them runs on the node labelled as the data pool,
none on the head, whose free CPUs the train workers leave. Where they land on the operator's
real pods is the real node's check (not here)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from trainjob_operator.api import parse_trainjob
from trainjob_operator.constants import DATA_LABELS_ENV
from trainjob_operator.launcher.trainer import build_trainer, plan_run
from trainjob_operator.render import render_driver_pod


def _job(tmp_path: Path) -> Any:
    return parse_trainjob(
        {
            "apiVersion": "trainjob.dev/v1alpha1",
            "kind": "TrainJob",
            "metadata": {"name": "data-job", "namespace": "default"},
            "spec": {
                "entrypoint": "tests.runtime.data_workloads:read_shards",
                "config": {"rows": 40, "log": str(tmp_path / "shards.jsonl")},
                "scaling": {"numWorkers": 2, "resourcesPerWorker": {"cpu": "1"}},
                "data": {
                    "datasets": "tests.runtime.data_workloads:pool_datasets",
                    "datasetsToSplit": ["train"],
                    "pool": {"resources": {"cpu": "2"}},
                },
                "storage": {"path": str(tmp_path / "storage")},
            },
        }
    )


def test_datasets_feed_the_shards_and_run_on_the_data_pool_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ray_data_node: str
) -> None:
    from ray.data import DataContext

    job = _job(tmp_path)
    [container] = render_driver_pod(job, uid="uid-1")["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    # The driver pod's data selector; not its worker selector: the local head carries no
    # trainjob.dev/pool=train label, the workers go there.
    monkeypatch.setenv(DATA_LABELS_ENV, env[DATA_LABELS_ENV])
    options = DataContext.get_current().execution_options
    before = options.label_selector
    try:
        result = build_trainer(plan_run(job), [], forward_env=False).fit()
    finally:
        options.label_selector = before
    assert result.error is None
    ranks = sorted(
        (json.loads(line) for line in (tmp_path / "shards.jsonl").read_text().splitlines()),
        key=lambda seen: seen["rank"],
    )
    assert [seen["rank"] for seen in ranks] == [0, 1]
    train = [seen["train"] for seen in ranks]
    assert len(train[0]) == len(train[1]) == 20  # equal splits ...
    assert sorted(train[0] + train[1]) == list(range(40))  # ... reading each row once
    assert all(seen["valid"] == [0, 1, 2, 3] for seen in ranks)  # not split: whole to each
    nodes = {node for seen in ranks for key in ("train_nodes", "valid_nodes") for node in seen[key]}
    assert nodes == {ray_data_node}  # every map_batches batch ran on the data pool's node
