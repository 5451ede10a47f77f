"""The quickstart's Ray Data validation (``validate_with_ray_data``) on a real local Ray: the
same scores as the plain ``validate_func``, computed by ``map_batches`` tasks. Where those
tasks land in a TrainJob (the validation pool's nodes only) is checked on the real node
(``tests/cluster/test_real_node.py``, the quickstart scenario)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch

from examples.quickstart.train import make_model, validate_func, validate_with_ray_data
from trainer_runtime import Checkpoint


def test_ray_data_validation_scores_as_the_plain_one(ray_cluster: Any) -> None:
    torch.manual_seed(0)
    folder = Path(tempfile.mkdtemp())
    torch.save({"model": make_model().state_dict(), "epoch": 0}, folder / "state.pt")
    checkpoint = Checkpoint.from_directory(str(folder))
    config = {"samples": 512, "val_blocks": 3}
    plain = validate_func(checkpoint, config)
    scored = validate_with_ray_data(checkpoint, config)
    assert scored["val_loss"] == pytest.approx(plain["val_loss"], rel=1e-5)
    assert scored["val_accuracy"] == pytest.approx(plain["val_accuracy"])
    head = ray_cluster.get_runtime_context().get_node_id()[:12]
    assert scored["data_nodes"] == [head]  # one node here: the batches ran on it


def test_in_the_pool_ray_data_selects_the_pools_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The env the validation pool's pods carry becomes Ray Data's label selector before the
    validate function runs (the real node checks where the tasks then land)."""
    from ray.data import DataContext

    from trainer_runtime._validation import DATA_LABELS_ENV, validation_task
    from trainjob_operator.constants import VALIDATION_DATA_LABELS_ENV

    assert DATA_LABELS_ENV == VALIDATION_DATA_LABELS_ENV  # the operator's name is the runtime's
    options = DataContext.get_current().execution_options
    before = options.label_selector
    try:
        monkeypatch.setenv(DATA_LABELS_ENV, '{"trainjob.dev/pool": "validation"}')

        def seen(checkpoint: Checkpoint, config: dict[str, Any]) -> dict[str, Any]:
            selector = DataContext.get_current().execution_options.label_selector
            return {"selector": json.dumps(selector, sort_keys=True)}

        _, metrics = list(validation_task(seen, Checkpoint.from_directory(tempfile.mkdtemp()), {}))
        assert metrics == {"selector": '{"trainjob.dev/pool": "validation"}'}
    finally:
        options.label_selector = before
