"""A driver process for the fault suite: ``python -m tests.faults.driver_main CONFIG_JSON``.

It connects to the Ray cluster at ``RAY_ADDRESS`` and runs :func:`integrity_train` with two
workers, so a test can SIGKILL the driver while its workers are uploading.
"""

from __future__ import annotations

import json
import sys

from tests.faults.workloads import integrity_train
from trainer_runtime import DataParallelTrainer, FailureConfig, RunConfig, ScalingConfig


def main() -> None:
    """Run the job described by the JSON in argv[1]."""
    spec = json.loads(sys.argv[1])
    DataParallelTrainer(
        integrity_train,
        train_loop_config=spec["config"],
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            name="run", storage_path=spec["storage"], failure_config=FailureConfig(1)
        ),
    ).fit()


if __name__ == "__main__":
    main()
