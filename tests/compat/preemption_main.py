"""The differential preemption scenario: ``python -m tests.compat.preemption_main WORKDIR [API]``.

For ``ray.train`` 2.60 and for ``trainer_runtime`` in turn, on a multi-node Ray cluster of
its own (``ray.cluster_utils.Cluster``: a head without CPUs and three one-CPU nodes; one
process can drive one cluster only, so this cannot run in the pytest process), two runs of
:func:`tests.compat.workloads.preemptible_train` with two workers, each with the node of
rank 1 drained for preemption through the GCS drain API mid-run (as a cloud's notice
reaches Ray):

- ``default``: Ray Train's ``FailureConfig``; the worker group restarts in place.
- ``no_retries``: ``FailureConfig(max_preemption_failures=0)``; ``fit()`` raises.
- ``relaxed`` / ``strict``: ``max_preemption_failures=0`` with
  ``relax_collectives_on_preemption`` True / False; rank 1 hangs before its next collective
  and its node is drained. Relaxed, rank 0 is told of the notice without rank 1, the
  scenario then removes rank 1's node (a stuck worker reclaimed) and rank 0 reports the
  checkpoint a few seconds later; strict, rank 0 waits for rank 1 until the deadline.

The drained node is replaced by a fresh one between runs. Prints one JSON line
(``RESULT {...}``): per API and run, how ``fit()`` ended, the result's metrics, the kept
checkpoints' metrics and steps, the drained node and the nodes the restarted ranks ran on.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")

from tests.compat.workloads import preemptible_train, read_step
from tests.faults.preemption_main import (
    add_node,
    drain_for_preemption,
    scenario_main,
    spare_node_cluster,
)

APIS = ("ray.train", "trainer_runtime")
#: The drain's deadline: Ray Train keeps the workers running until it passes.
DEADLINE_S = 12.0
#: How long rank 0 waits, once told, before reporting in the relaxed run (rank 1's node is
#: removed meanwhile).
SURVIVOR_DELAY_S = 3.0


def _trainer(name: str, workdir: Path, retries: bool, relax: bool | None) -> Any:
    # The DataParallelTrainer (TorchTrainer's base): the workload uses no torch, whose import
    # and process group cost each worker of each group seconds of CPU.
    if name == "ray.train":
        import ray.train as train
        from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer
    else:
        import trainer_runtime as train
        from trainer_runtime import DataParallelTrainer  # type: ignore[assignment]
    failure = train.FailureConfig() if retries else train.FailureConfig(max_preemption_failures=0)
    config: dict[str, Any] = {
        "api": name,
        "ready_file": str(workdir / "ready"),
        "resumed_dir": str(workdir / "resumed"),
    }
    if relax is not None:
        failure = train.FailureConfig(
            max_preemption_failures=0, relax_collectives_on_preemption=relax
        )
        config.update(told_file=str(workdir / "told"), survivor_delay_s=SURVIVOR_DELAY_S)
    return DataParallelTrainer(
        preemptible_train,
        train_loop_config=config,
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(
            name="run", storage_path=str(workdir / "runs"), failure_config=failure
        ),
    )


def _wait_for(path: Path, thread: threading.Thread, timeout: float = 120.0) -> str | None:
    """The text ``path`` gets, or None if ``fit()`` ended or ``timeout`` passed first."""
    end = time.monotonic() + timeout
    while not path.exists() or not path.read_text():
        if not thread.is_alive() or time.monotonic() > end:
            return None
        time.sleep(0.05)
    return path.read_text()


def _run(
    name: str,
    workdir: Path,
    retries: bool,
    relax: bool | None = None,
    cluster: Any = None,
    nodes: list[Any] | None = None,
) -> dict[str, Any]:
    (workdir / "resumed").mkdir(parents=True)
    trainer = _trainer(name, workdir, retries, relax)
    ended: dict[str, Any] = {}

    def fit() -> None:
        try:
            ended["result"] = trainer.fit()
        except BaseException as exc:  # noqa: BLE001 - reported below
            ended["error"] = exc

    thread = threading.Thread(target=fit)
    thread.start()
    node = _wait_for(workdir / "ready", thread)
    if node is None:
        return {"error": repr(ended.get("error"))}
    drain_for_preemption(node, int((time.time() + DEADLINE_S) * 1000))
    removed = None
    if relax is not None and _wait_for(workdir / "told", thread) is not None:
        # rank 0 was told without the hanging rank 1: its node goes away under it
        for gone in [n for n in nodes or [] if n.node_id == node]:
            cluster.remove_node(gone, allow_graceful=False)
            removed = node
    thread.join(timeout=600)
    error = ended.get("error")
    result = ended.get("result")
    out: dict[str, Any] = {"drained_node": node, "outcome": type(error).__name__ if error else None}
    if relax is not None:
        out["removed_node"] = removed
        out["kept"] = _kept(name, workdir)
    if error is not None:
        info = getattr(error, "preemption_info", None)
        out["preempted_ranks"] = None if info is None else list(info.preempted_ranks)
        out["preempted_node_ids"] = None if info is None else list(info.preempted_node_ids)
        out["drain_timed_out"] = getattr(error, "drain_timed_out", None)
        out["message"] = str(error)[:500]
    if result is not None:
        out["metrics"] = dict(result.metrics)
        out["kept"] = [
            {
                "step": m.get("step"),
                "preempted_ranks": m.get("preempted_ranks"),
                "saved": read_step(c),
            }
            for c, m in result.best_checkpoints
        ]
    out["resumed"] = {
        p.name: json.loads(p.read_text()) for p in sorted((workdir / "resumed").iterdir())
    }
    return out


def _kept(name: str, workdir: Path) -> list[dict[str, Any]] | str:
    """The run's kept checkpoints as ``Result.from_path`` of API ``name`` reads them."""
    if name == "ray.train":
        from ray.train import Result
    else:
        from trainer_runtime import Result  # type: ignore[assignment]
    try:
        result = Result.from_path(str(workdir / "runs" / "run"))
    except Exception as exc:  # noqa: BLE001 - compared as text
        return f"{type(exc).__name__}"
    return [
        {"step": m.get("step"), "preempted_ranks": m.get("preempted_ranks"), "saved": read_step(c)}
        for c, m in result.best_checkpoints
    ]


def _replace_drained(cluster: Any, nodes: list[Any], seen: dict[str, Any]) -> None:
    """The preempted node goes away (if the run did not remove it); a new one replaces it."""
    for node in [n for n in nodes if n.node_id == seen.get("drained_node")]:
        if seen.get("removed_node") != node.node_id:
            cluster.remove_node(node)
        nodes.remove(node)
        nodes.append(add_node(cluster))
    cluster.wait_for_nodes()


def run(workdir: Path, *apis: str) -> dict[str, Any]:
    """The runs of ``apis`` (both by default), one after another; what was observed. The
    test runs one process per API, at the same time (each has a cluster of its own)."""
    out: dict[str, Any] = {}
    for name in apis or APIS:
        with spare_node_cluster() as (cluster, nodes):
            out[name] = {}
            for run_name in ("default", "no_retries"):
                seen = _run(name, workdir / name / run_name, retries=run_name == "default")
                out[name][run_name] = seen
                _replace_drained(cluster, nodes, seen)
            for run_name, relax in (("relaxed", True), ("strict", False)):
                seen = _run(name, workdir / name / run_name, False, relax, cluster, nodes)
                out[name][run_name] = seen
                _replace_drained(cluster, nodes, seen)
    return out


if __name__ == "__main__":
    scenario_main(run)
