"""A process for the preemption tests: ``python -m tests.faults.preemption_main CONFIG_JSON``.

Runs :func:`preemptible_train` (local mode with ``num_workers`` 0, else Ray workers on a
local Ray) and prints one JSON line: how ``fit()`` ended and the committed checkpoints.

``Result.metrics`` is the latest checkpoint's metrics, as in Ray Train 2.60; what a run
reported last (a resumed run's ``{"start": ...}``, without a checkpoint) is seen through a
:class:`LastReport` callback.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import trainer_runtime as tr
from trainer_runtime import (
    DataParallelTrainer,
    PreemptionError,
    RunConfig,
    ScalingConfig,
    UserCallback,
)
from trainer_runtime.preemption import node_id


class LastReport(UserCallback):
    """Rank 0's metrics of the last report round (``after_report``, on the driver)."""

    def __init__(self) -> None:
        self.metrics: dict[str, Any] | None = None

    def after_report(self, run_context: Any, metrics: Any, checkpoint: Any) -> None:
        self.metrics = dict(metrics[0])


def preemptible_train(config: dict[str, Any]) -> None:
    """Steps forever; rank ``signal_rank`` writes its pid and node to ``ready_file`` after
    two steps (the test then sends SIGTERM or drains the node). On a preemption notice
    every rank saves one checkpoint. Started from a checkpoint (a new run, or the worker
    group restarted in place), it only reports where it starts and returns; each rank then
    writes its Ray node to ``<resumed_dir>/rank<N>`` when ``resumed_dir`` is set.

    ``ignore_notice``: never asks for notices, and saves one checkpoint at step 1 instead
    (the attempt then ends at the notice's deadline)."""
    rank = tr.get_context().get_world_rank()
    start = 0
    if (ckpt := tr.get_checkpoint()) is not None:
        with ckpt.as_directory() as d:
            start = json.loads(Path(d, "state.json").read_text())["step"] + 1
        if config.get("resumed_dir"):
            Path(config["resumed_dir"], f"rank{rank}").write_text(node_id())
        tr.report({"start": start})
        return
    saved = False
    for step in range(start, 1_000_000):
        if config.get("ignore_notice"):
            if step == 1:
                d = tempfile.mkdtemp()
                if rank == 0:
                    Path(d, "state.json").write_text(json.dumps({"step": step}))
                tr.report({"step": step}, checkpoint=tr.Checkpoint.from_directory(d))
                saved = True
                continue
            info = None
        else:
            info = tr.get_preemption_info()
        if info is not None and not saved:
            d = tempfile.mkdtemp()
            if rank == 0:
                Path(d, "state.json").write_text(json.dumps({"step": step}))
            Path(d, f"rank{rank}.txt").write_text(str(info.preempted_ranks))
            tr.report(
                {
                    "step": step,
                    "preempted_ranks": info.preempted_ranks,
                    "deadline_ms": info.deadline_ms,
                    "final": True,
                },
                checkpoint=tr.Checkpoint.from_directory(d),
            )
            saved = True
            continue
        if step == start + 2 and rank == config["signal_rank"]:
            node = node_id()
            Path(config["ready_file"]).write_text(json.dumps({"pid": os.getpid(), "node": node}))
        tr.report({"step": step})


# ------------------------------------------------- multi-node scenarios (drain, node process)


def spread_trainer(
    storage: Path,
    config: dict[str, Any],
    failure: tr.FailureConfig | None = None,
    callbacks: list[Any] | None = None,
) -> DataParallelTrainer:
    """Two workers of :func:`preemptible_train` on two different Ray nodes."""
    return DataParallelTrainer(
        preemptible_train,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=2, placement_strategy="SPREAD"),
        run_config=RunConfig(
            name="run",
            storage_path=str(storage),
            failure_config=failure,
            callbacks=callbacks or [],
        ),
    )


class BackgroundFit:
    """``spread_trainer(...).fit()`` in a thread, rank 1 writing ``ready`` once running.

    ``workdir``: where the ready file, the run folder (``runs``) and the resumed ranks'
    nodes (``resumed``) go. ``failure``: the run's FailureConfig (Ray Train's defaults:
    a preemption restarts the worker group in place, any number of times)."""

    def __init__(
        self,
        workdir: Path,
        failure: tr.FailureConfig | None = None,
        ignore_notice: bool = False,
    ) -> None:
        self.ready = workdir / "ready"
        self.storage = workdir / "runs"
        self.resumed_dir = workdir / "resumed"
        self.resumed_dir.mkdir(parents=True, exist_ok=True)
        self.outcome: list[BaseException] = []
        self.result: tr.Result | None = None
        self.last_report = LastReport()
        self.ended_at: float | None = None
        config = {
            "ready_file": str(self.ready),
            "signal_rank": 1,
            "resumed_dir": str(self.resumed_dir),
            "ignore_notice": ignore_notice,
        }
        self.thread = threading.Thread(target=self._fit, args=(config, failure))
        self.thread.start()

    def _fit(self, config: dict[str, Any], failure: tr.FailureConfig | None) -> None:
        try:
            self.result = spread_trainer(self.storage, config, failure, [self.last_report]).fit()
        except BaseException as exc:  # noqa: BLE001 - reported by describe()
            self.outcome.append(exc)
        self.ended_at = time.time()

    def node_of_rank_1(self) -> str:
        """Wait until rank 1 has run two steps; the Ray node id it runs on."""
        while not self.ready.exists() or not self.ready.read_text():
            if not self.thread.is_alive():
                raise RuntimeError(f"fit() ended before rank 1 was ready: {self.outcome!r}")
            time.sleep(0.05)
        return str(json.loads(self.ready.read_text())["node"])

    def describe(self) -> dict[str, Any]:
        """How ``fit()`` ended: the exception names; for a ``PreemptionError`` its notice;
        the result's checkpoint and metrics (``result_metrics``: the latest checkpoint's);
        rank 0's last reported metrics (``metrics``); the committed checkpoints' metrics,
        oldest first; the Ray nodes of the ranks that resumed (rank -> node id)."""
        out: dict[str, Any] = {
            "outcomes": [type(exc).__name__ for exc in self.outcome],
            "ended_at_ms": None if self.ended_at is None else int(self.ended_at * 1000),
        }
        error = self.outcome[0] if self.outcome else None
        result = self.result
        if isinstance(error, PreemptionError):
            info = error.preemption_info
            out["preempted_node_ids"] = info.preempted_node_ids
            out["preempted_ranks"] = info.preempted_ranks
            out["deadline_ms"] = info.deadline_ms
            out["drain_timed_out"] = error.drain_timed_out
            result = error.result
        elif error is not None or result is None:
            out["error"] = repr(error)
            return out
        checkpoint = None if result is None else result.checkpoint
        out["checkpoint"] = None if checkpoint is None else checkpoint.path
        out["result_metrics"] = None if result is None else result.metrics
        out["metrics"] = self.last_report.metrics
        stored = tr.Result.from_path(self.storage / "run")
        out["committed"] = [dict(m) for _, m in sorted(stored.best_checkpoints, key=_step)]
        out["resumed_nodes"] = {
            int(p.name.removeprefix("rank")): p.read_text() for p in self.resumed_dir.iterdir()
        }
        return out


def _step(pair: tuple[Any, dict[str, Any]]) -> int:
    return int(pair[1].get("step", -1))


def resumed_metrics(storage: Path) -> dict[str, Any]:
    """A new run with the same storage: the metrics it reports (where it started)."""
    last = LastReport()
    spread_trainer(storage, {"signal_rank": 0}, callbacks=[last]).fit()
    assert last.metrics is not None
    return last.metrics


#: How many times a scenario's Ray cluster is started when its head times out starting.
CLUSTER_STARTS = 3


def _new_cluster() -> Any:
    """A ``ray.cluster_utils.Cluster`` with a head without CPUs, started again when Ray gave up
    on the head's start: it waits a fixed 30 s for the raylet to register, which a loaded
    machine can pass (``The current node timed out during startup``). What a failed start
    left behind (its own GCS) goes with the scenario's process group (:func:`run_scenario`).
    Its worker nodes are retried with the whole cluster (:func:`_started_cluster`)."""
    from ray.cluster_utils import Cluster

    for attempt in range(1, CLUSTER_STARTS + 1):
        try:
            return Cluster(
                initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False}
            )
        except Exception as exc:  # Ray raises a bare Exception for it
            if "timed out during startup" not in str(exc) or attempt == CLUSTER_STARTS:
                raise
            print(f"Ray's head timed out starting (attempt {attempt}); again", file=sys.stderr)
    raise AssertionError("unreachable")


def _started_cluster() -> tuple[Any, list[Any]]:
    """:func:`_new_cluster` and three one-CPU nodes. A node whose start Ray gave up on (the
    same fixed 30 s as the head's) fails the whole start: that cluster is shut down (a node
    that registers late dies with its GCS, it cannot join the next one) and a new one
    started, up to :data:`CLUSTER_STARTS` times in all."""
    for attempt in range(1, CLUSTER_STARTS + 1):
        cluster = _new_cluster()
        try:
            return cluster, [cluster.add_node(num_cpus=1) for _ in range(3)]
        except Exception as exc:  # Ray raises a bare Exception for it
            cluster.shutdown()
            if "timed out during startup" not in str(exc) or attempt == CLUSTER_STARTS:
                raise
            print(f"a Ray node timed out starting (attempt {attempt}); again", file=sys.stderr)
    raise AssertionError("unreachable")


def add_node(cluster: Any) -> Any:
    """``cluster.add_node(num_cpus=1)``, again (up to :data:`CLUSTER_STARTS` tries) when Ray
    gives up on the node's start (its fixed 30 s: under a loaded machine a raylet can take
    longer to get the GCS's config, or die waiting for it, as in a run beside the Kubernetes
    build). Used for the nodes that replace a drained one, in a cluster already running."""
    for attempt in range(1, CLUSTER_STARTS + 1):
        try:
            return cluster.add_node(num_cpus=1)
        except Exception as exc:  # Ray raises a bare Exception for it
            if "timed out during startup" not in str(exc) or attempt == CLUSTER_STARTS:
                raise
            print(f"a Ray node timed out starting (attempt {attempt}); again", file=sys.stderr)
    raise AssertionError("unreachable")


@contextlib.contextmanager
def spare_node_cluster() -> Iterator[tuple[Any, list[Any]]]:
    """A Ray cluster of this process's own (``ray.cluster_utils.Cluster``): a head without
    CPUs and three one-CPU nodes, two for a job's workers and one spare; this process is its
    driver. Yields the cluster and its three nodes; shut down on exit."""
    import ray

    cluster, nodes = _started_cluster()
    try:
        ray.init(address=cluster.address)
        cluster.wait_for_nodes()
        yield cluster, nodes
    finally:
        ray.shutdown()
        cluster.shutdown()


def drain_for_preemption(node_id: str, deadline_ms: int) -> None:
    """Drain a Ray node through the GCS as a cloud's preemption notice does (reason
    preemption, the given deadline); ``node_id`` in hex, as ``get_draining_nodes()`` names it."""
    import ray
    from ray._raylet import GcsClient
    from ray.core.generated.autoscaler_pb2 import DrainNodeReason

    gcs = GcsClient(address=ray.get_runtime_context().gcs_address)
    accepted, why = gcs.drain_node(
        node_id=node_id,
        reason=DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"),
        reason_message="spot reclaim (test)",
        deadline_timestamp_ms=deadline_ms,
    )
    if not accepted:
        raise RuntimeError(f"drain_node refused: {why}")


def scenario_main(run: Callable[..., dict[str, Any]]) -> None:
    """The ``main()`` of a scenario module: ``run(argv[1], *argv[2:])``, printed as one
    ``RESULT`` line (what :func:`run_scenario` reads)."""
    print("RESULT " + json.dumps(run(Path(sys.argv[1]), *sys.argv[2:])), flush=True)
    os._exit(0)  # a fit() thread still running must not keep the process alive


#: How long a scenario process may run: under pytest-timeout's 600 s, so that a scenario that
#: hangs fails with its own output, and its Ray cluster is stopped with it.
SCENARIO_TIMEOUT_S = 480


def run_scenario(module: str, workdir: Path, *args: str) -> dict[str, Any]:
    """Run ``python -m <module> WORKDIR ARGS...`` (a scenario with a Ray cluster of its own:
    one process can drive one cluster only) and return the JSON of its ``RESULT`` line. One
    running past :data:`SCENARIO_TIMEOUT_S` is killed with its process group (its Ray
    cluster's processes) and fails with what it printed."""
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [sys.executable, "-m", module, str(workdir), *args],
        cwd=repo,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )

    def kill_group() -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)

    try:
        stdout, stderr = proc.communicate(timeout=SCENARIO_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        kill_group()
        stdout, stderr = proc.communicate()
        raise AssertionError(
            f"{module} {' '.join(args)} still ran after {SCENARIO_TIMEOUT_S} s: "
            + stdout[-4000:]
            + stderr[-6000:]
        ) from None
    finally:  # whatever of its Ray processes outlived it (a node whose start failed)
        kill_group()
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise AssertionError(stdout[-4000:] + stderr[-4000:])
    return dict(json.loads(lines[-1].removeprefix("RESULT ")))


def main() -> None:
    """Run the job described by the JSON in argv[1] and print how it ended."""
    spec = json.loads(sys.argv[1])
    if spec["num_workers"]:
        import ray

        ray.init(address="local", num_cpus=spec["num_workers"], include_dashboard=False)
    failure = tr.FailureConfig(**spec.get("failure", {}))
    last = LastReport()
    trainer = DataParallelTrainer(
        preemptible_train,
        train_loop_config=spec["config"],
        scaling_config=ScalingConfig(num_workers=spec["num_workers"]),
        run_config=RunConfig(
            name="run", storage_path=spec["storage"], failure_config=failure, callbacks=[last]
        ),
    )
    out: dict[str, Any] = {}
    try:
        result = trainer.fit()
        out["result_metrics"] = result.metrics
        out["metrics"] = last.metrics
    except PreemptionError as exc:
        assert exc.result is not None
        out["preempted_ranks"] = exc.preemption_info.preempted_ranks
        out["deadline_ms"] = exc.preemption_info.deadline_ms
        out["metrics"] = exc.result.metrics
        out["checkpoint"] = exc.result.checkpoint.path if exc.result.checkpoint else None
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
