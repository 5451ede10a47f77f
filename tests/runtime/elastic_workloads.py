"""Train functions of the elastic-training tests (importable by Ray workers by module name)."""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import trainer_runtime as tr


def elastic_train(config: dict[str, Any]) -> None:
    """A resumable step loop that records, on rank 0, each attempt's world size and start.

    Rank ``die_rank`` of a group of ``die_world`` workers exits its process at step
    ``die_step`` (a lost worker). The run ends once a group of ``final_world`` workers has
    taken a step, or at ``max_steps``.
    """
    ctx = tr.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    checkpoint = tr.get_checkpoint()
    start = 0
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            start = json.loads((Path(folder) / "state.json").read_text())["step"] + 1
    if rank == 0:
        with open(config["log"], "a") as fh:
            fh.write(json.dumps({"world": world, "start": start}) + "\n")
    for step in range(start, int(config["max_steps"])):
        if (world, rank, step) == (config["die_world"], config["die_rank"], config["die_step"]):
            os._exit(1)
        time.sleep(float(config["step_s"]))
        saved = None
        if rank == 0:
            folder = tempfile.mkdtemp(prefix="elastic_")
            (Path(folder) / "state.json").write_text(json.dumps({"step": step, "world": world}))
            saved = tr.Checkpoint.from_directory(folder)
        tr.report({"step": step, "world": world}, checkpoint=saved)
        if world == config["final_world"] and step > start:
            return
