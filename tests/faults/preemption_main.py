"""A process for the preemption tests: ``python -m tests.faults.preemption_main CONFIG_JSON``.

Runs :func:`preemptible_train` (local mode with ``num_workers`` 0, else Ray workers on a
local Ray) and prints one JSON line: how ``fit()`` ended and the committed checkpoints.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import trainer_runtime as tr
from trainer_runtime import DataParallelTrainer, PreemptionError, RunConfig, ScalingConfig
from trainer_runtime.preemption import node_id


def preemptible_train(config: dict[str, Any]) -> None:
    """Steps forever; rank ``signal_rank`` writes its pid and node to ``ready_file`` after
    two steps (the test then sends SIGTERM or drains the node). On a preemption notice
    every rank saves one checkpoint; with ``resume`` it only records where it starts."""
    rank = tr.get_context().get_world_rank()
    start = 0
    if (ckpt := tr.get_checkpoint()) is not None:
        with ckpt.as_directory() as d:
            start = json.loads(Path(d, "state.json").read_text())["step"] + 1
    if config.get("resume"):
        tr.report({"start": start})
        return
    saved = False
    for step in range(start, 1_000_000):
        info = tr.get_preemption_info()
        if info is not None and not saved:
            d = tempfile.mkdtemp()
            if rank == 0:
                Path(d, "state.json").write_text(json.dumps({"step": step}))
            Path(d, f"rank{rank}.txt").write_text(str(info.preempted_ranks))
            tr.report(
                {"step": step, "preempted_ranks": info.preempted_ranks, "final": True},
                checkpoint=tr.Checkpoint.from_directory(d),
            )
            saved = True
            continue
        if step == start + 2 and rank == config["signal_rank"]:
            node = node_id()
            Path(config["ready_file"]).write_text(json.dumps({"pid": os.getpid(), "node": node}))
        tr.report({"step": step})


def main() -> None:
    """Run the job described by the JSON in argv[1] and print how it ended."""
    spec = json.loads(sys.argv[1])
    if spec["num_workers"]:
        import ray

        ray.init(address="local", num_cpus=spec["num_workers"], include_dashboard=False)
    trainer = DataParallelTrainer(
        preemptible_train,
        train_loop_config=spec["config"],
        scaling_config=ScalingConfig(num_workers=spec["num_workers"]),
        run_config=RunConfig(name="run", storage_path=spec["storage"]),
    )
    out: dict[str, Any] = {}
    try:
        result = trainer.fit()
        out["metrics"] = result.metrics
    except PreemptionError as exc:
        assert exc.result is not None
        out["preempted_ranks"] = exc.preemption_info.preempted_ranks
        out["deadline_ms"] = exc.preemption_info.deadline_ms
        out["metrics"] = exc.result.metrics
        out["checkpoint"] = exc.result.checkpoint.path if exc.result.checkpoint else None
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
