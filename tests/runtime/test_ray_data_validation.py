"""The quickstart's Ray Data validation (``validate_with_ray_data``) on a real local Ray: the
same scores as the plain ``validate_func``, computed by ``map_batches`` tasks. Where those
tasks land in a TrainJob (the validation pool's nodes only) is checked on the real node
(``tests/cluster/test_real_node.py``, the quickstart scenario)."""

from __future__ import annotations

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
