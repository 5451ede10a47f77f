"""A process for the preemption tests: ``python -m tests.faults.preemption_main CONFIG_JSON``.

Runs :func:`preemptible_train` (local mode with ``num_workers`` 0, else Ray workers on a
local Ray) and prints one JSON line: how ``fit()`` ended and the committed checkpoints.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
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


# ------------------------------------------------- multi-node scenarios (drain, node process)


def spread_trainer(storage: Path, config: dict[str, Any]) -> DataParallelTrainer:
    """Two workers of :func:`preemptible_train` on two different Ray nodes."""
    return DataParallelTrainer(
        preemptible_train,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=2, placement_strategy="SPREAD"),
        run_config=RunConfig(name="run", storage_path=str(storage)),
    )


class BackgroundFit:
    """``spread_trainer(...).fit()`` in a thread, rank 1 writing ``ready`` once running."""

    def __init__(self, storage: Path, ready: Path) -> None:
        self.ready = ready
        self.outcome: list[BaseException] = []
        config = {"ready_file": str(ready), "signal_rank": 1}
        self.thread = threading.Thread(target=self._fit, args=(storage, config))
        self.thread.start()

    def _fit(self, storage: Path, config: dict[str, Any]) -> None:
        try:
            spread_trainer(storage, config).fit()
        except BaseException as exc:  # noqa: BLE001 - reported by describe()
            self.outcome.append(exc)

    def node_of_rank_1(self) -> str:
        """Wait until rank 1 has run two steps; the Ray node id it runs on."""
        while not self.ready.exists() or not self.ready.read_text():
            if not self.thread.is_alive():
                raise RuntimeError(f"fit() ended before rank 1 was ready: {self.outcome!r}")
            time.sleep(0.05)
        return str(json.loads(self.ready.read_text())["node"])

    def describe(self) -> dict[str, Any]:
        """How ``fit()`` ended: the exception names and, for a ``PreemptionError``, its
        notice and the result's checkpoint and metrics."""
        out: dict[str, Any] = {"outcomes": [type(exc).__name__ for exc in self.outcome]}
        error = self.outcome[0] if self.outcome else None
        if not isinstance(error, PreemptionError):
            out["error"] = repr(error)
            return out
        info = error.preemption_info
        out["preempted_node_ids"] = info.preempted_node_ids
        out["preempted_ranks"] = info.preempted_ranks
        out["deadline_ms"] = info.deadline_ms
        result = error.result
        checkpoint = None if result is None else result.checkpoint
        out["checkpoint"] = None if checkpoint is None else checkpoint.path
        out["metrics"] = None if result is None else result.metrics
        return out


def resumed_metrics(storage: Path) -> dict[str, Any]:
    """A new run with the same storage: the metrics it reports (where it started)."""
    return dict(spread_trainer(storage, {"resume": True, "signal_rank": 0}).fit().metrics)


def run_scenario(module: str, workdir: Path) -> dict[str, Any]:
    """Run ``python -m <module> WORKDIR`` (a scenario with a Ray cluster of its own: one
    process can drive one cluster only) and return the JSON of its ``RESULT`` line."""
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-m", module, str(workdir)],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=900,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise AssertionError(proc.stdout[-4000:] + proc.stderr[-4000:])
    return dict(json.loads(lines[-1].removeprefix("RESULT ")))


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
