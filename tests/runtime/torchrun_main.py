"""Entry point run by ``torchrun --nproc-per-node=2`` in test_torchrun.py.

Usage: torchrun ... torchrun_main.py STORAGE_PATH OUT_DIR STEPS
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import trainer_runtime as tr
from tests.runtime.workloads import counting_train
from trainer_runtime import CheckpointConfig, RunConfig, ScalingConfig, collective
from trainer_runtime.torch import TorchTrainer, prepare_model


def train(config: dict) -> None:
    model = prepare_model(torch.nn.Linear(2, 1))
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)  # the process group really spans both processes
    rank = tr.get_context().get_world_rank()
    got = collective.broadcast_from_rank_zero({"from": rank})  # through rank 0's controller
    collective.barrier()
    Path(config["out"], f"pg_{rank}.json").write_text(
        json.dumps(
            {
                "sum": t.item(),
                "ddp": type(model).__name__,
                "world": dist.get_world_size(),
                "broadcast": got,
            }
        )
    )
    counting_train(config)
    kept = tr.get_all_reported_checkpoints(tr.CheckpointConsistencyMode.COMMITTED)
    Path(config["out"], f"reported_{rank}.json").write_text(
        json.dumps([r.checkpoint.path.rsplit("/", 1)[-1] for r in kept])
    )


def main() -> None:
    storage, out, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    result = TorchTrainer(
        train,
        train_loop_config={"steps": steps, "out": out, "log": f"{out}/log", "mode": "async"},
        scaling_config=ScalingConfig(num_workers=0),
        run_config=RunConfig(
            name="torchrun", storage_path=storage, checkpoint_config=CheckpointConfig(num_to_keep=2)
        ),
    ).fit()
    rank = os.environ["RANK"]
    Path(out, f"result_{rank}.json").write_text(
        json.dumps(
            {
                "metrics": result.metrics,
                "checkpoint": result.checkpoint.path if result.checkpoint else None,
            }
        )
    )


if __name__ == "__main__":
    main()
