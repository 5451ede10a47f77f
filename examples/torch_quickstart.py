"""Train the quickstart model with 2 Ray workers on this machine (the Python API).

    python examples/torch_quickstart.py [--epochs N] [--storage-path PATH]

Checkpoints upload asynchronously after every epoch and are validated as Ray tasks on the
local "validation" resource. Run it twice: the second run resumes from the first's latest
checkpoint (same storage path and name) and trains the remaining epochs.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `examples` importable

import ray

from examples.quickstart.train import train_func, validate_func
from trainer_runtime import (
    CheckpointConfig,
    FailureConfig,
    RunConfig,
    ScalingConfig,
    TrainingFailedError,
    ValidationConfig,
)
from trainer_runtime.torch import TorchTrainer


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--storage-path", default="/tmp/trainjob-runs")
    parser.add_argument("--name", default="torch-quickstart")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")

    ray.init(
        address="local",
        num_cpus=4,
        resources={"validation": 2},
        include_dashboard=False,
        runtime_env={"env_vars": {"PYTHONPATH": str(Path(__file__).resolve().parent.parent)}},
    )
    trainer = TorchTrainer(
        train_func,
        train_loop_config={"epochs": args.epochs, "lr": 0.05, "batch_size": 64},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            name=args.name,
            storage_path=args.storage_path,
            checkpoint_config=CheckpointConfig(
                num_to_keep=2, checkpoint_score_attribute="val_loss", checkpoint_score_order="min"
            ),
            failure_config=FailureConfig(max_failures=2),
            # report() calls without an explicit mode upload in the background...
            checkpoint_upload_mode="async",
            # ...and every checkpoint is scored by validate_func as a Ray task on the
            # "validation" resource, off the training workers.
            validation_config=ValidationConfig(
                validate_fn=validate_func, validate_config={"samples": 2048}
            ),
        ),
    )
    try:
        result = trainer.fit()
    except TrainingFailedError as exc:
        print(f"FAILED: {exc}", file=sys.stderr)
        return 1
    print(f"\nfinal metrics:     {result.metrics}")
    print(f"latest checkpoint: {result.checkpoint.path if result.checkpoint else None}")
    for record in result.checkpoints:
        print(f"  {record.name}: {record.status} {record.all_metrics}")
    print(f"best checkpoint:   {result.best_checkpoint.path if result.best_checkpoint else None}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
