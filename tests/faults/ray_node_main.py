"""A process for the Ray-node preemption test: ``python -m tests.faults.ray_node_main WORKDIR``.

As in a TrainJob's pods: a Ray head (no CPUs) and three worker nodes, each started the way
the operator renders a worker pod's command, ``python -m trainjob_operator.launcher.ray_node
--wait-for-head=<head> -- ray start --address=<head> --block ...`` with
``TRAINJOB_TERMINATION_GRACE_PERIOD_S``. A two-worker job runs; the test sends SIGTERM (the
kubelet's termination notice) to the node process of rank 1, as the kubelet does to a pod's
main process. With Ray Train's defaults the worker group then restarts from the final
checkpoint on the other two nodes, in the same ``fit()``. It prints one JSON line
(``RESULT {...}``) with what it observed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.faults.preemption_main import BackgroundFit, scenario_main
from tests.support.ports import own_ray_port_flags
from tests.support.waiting import wait_for as _wait_for
from trainjob_operator.constants import TERMINATION_GRACE_ENV
from trainjob_operator.launcher.ray_node import RAY_NODE_LOG_IDLE, raylet_node_id

GRACE_S = 120
"""The pods' grace period: long, so that stopping when idle is told apart from the deadline."""
NODES = 3
"""Two for the job's workers, one spare for the worker group restarted in place."""


def _start_node(head: str, log: Path) -> subprocess.Popen[bytes]:
    ports = own_ray_port_flags()
    argv = [
        sys.executable,
        "-m",
        "trainjob_operator.launcher.ray_node",
        f"--wait-for-head={head}",
        "--",
        "ray",
        "start",
        f"--address={head}",
        "--num-cpus=1",
        "--block",
        "--disable-usage-stats",
        *ports,
    ]
    # As in the image: `ray` on PATH, next to the interpreter.
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    env = {**os.environ, "PATH": path, TERMINATION_GRACE_ENV: str(GRACE_S)}
    with log.open("wb") as out:
        return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)


JOIN_TIMEOUT_S = 240
"""How long a node may take to join: ``ray start`` on a 2-core machine running other tiers
beside this one takes from seconds to minutes."""
JOIN_ATTEMPTS = 3
"""Tries to start a node whose ``ray start`` exited before joining: the ports picked for it
(:func:`~tests.support.ports.own_ray_port_flags`) can be taken by another process of this
host in the meantime, which cannot happen between pods, each with a network of its own."""


def _join_node(head: str, log: Path, alive_nodes: int) -> subprocess.Popen[bytes]:
    """Start a node and wait until the cluster has ``alive_nodes`` nodes alive; start it again
    (fresh ports) if its ``ray start`` exits first. The error names the log and quotes it."""
    import ray

    for attempt in range(1, JOIN_ATTEMPTS + 1):
        proc = _start_node(head, log)

        def joined(proc: subprocess.Popen[bytes] = proc) -> bool | str:
            if sum(1 for n in ray.nodes() if n["Alive"]) >= alive_nodes:
                return True
            return "exited" if proc.poll() is not None else False

        try:
            if _wait_for(f"a node joining (log: {log})", joined, JOIN_TIMEOUT_S) is True:
                return proc
        except AssertionError as e:
            raise AssertionError(f"{e}\n--- {log} ---\n{log.read_text()[-3000:]}") from None
        print(f"ray start exited before joining (try {attempt}):\n{log.read_text()[-2000:]}")
    raise AssertionError(f"ray start exited before joining, {JOIN_ATTEMPTS} times (log: {log})")


def run(workdir: Path) -> dict[str, Any]:
    """Run the scenario in ``workdir`` and return what was observed."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False}
    )
    logs = [workdir / f"node{i}.log" for i in range(NODES)]
    procs: list[subprocess.Popen[bytes]] = []
    out: dict[str, Any] = {}
    try:
        ray.init(address=cluster.address)
        for i, log in enumerate(logs):  # one at a time: a loaded 2-core machine
            procs.append(_join_node(cluster.address, log, alive_nodes=i + 2))
        node_of = {
            p.pid: _wait_for("a raylet", lambda p=p: raylet_node_id(p.pid), 60) for p in procs
        }
        fit = BackgroundFit(workdir)
        node = fit.node_of_rank_1()
        victim = next(p for p in procs if node_of[p.pid] == node)
        victim_log = logs[procs.index(victim)]
        noticed_at = time.time()
        victim.send_signal(signal.SIGTERM)  # the kubelet's termination notice
        fit.thread.join(timeout=GRACE_S + 180)
        if fit.thread.is_alive():  # the notice was lost: report it instead of hanging
            out["error"] = "fit() still running after the grace period"
            out["victim_log"] = victim_log.read_text()
            return out
        out["victim_exit_code"] = victim.wait(timeout=GRACE_S)
        out.update(
            fit.describe(),
            victim_log=victim_log.read_text(),
            idle_message=RAY_NODE_LOG_IDLE,
            noticed_at_ms=int(noticed_at * 1000),
            grace_s=GRACE_S,
            drained_node=node,
        )
    finally:
        ray.shutdown()
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for proc in procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        cluster.shutdown()
    return out


if __name__ == "__main__":
    scenario_main(run)
