"""The quickstart's validation, plus where it ran (imported by the pods' Ray workers)."""

from __future__ import annotations

import os
from typing import Any

from examples.quickstart.train import validate_func as quickstart_validate
from trainer_runtime import Checkpoint


def validate_func(checkpoint: Checkpoint, config: dict[str, Any]) -> dict[str, Any]:
    """``examples.quickstart.train:validate_func`` plus ``validated_on`` (the ``HOSTNAME`` of
    the pod whose Ray node ran this task) and ``ray_nodes`` (alive nodes in the cluster)."""
    import ray

    metrics = quickstart_validate(checkpoint, config)
    metrics["validated_on"] = os.environ.get("HOSTNAME", "")
    metrics["ray_nodes"] = sum(1 for node in ray.nodes() if node["Alive"])
    return metrics
