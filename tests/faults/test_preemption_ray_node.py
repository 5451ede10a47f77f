"""The kubelet's termination notice to a Ray worker pod becomes a Ray node drain.

The pod's main process (``trainjob_operator.launcher.ray_node``, in front of ``ray start
--block``) gets SIGTERM; instead of stopping Ray it drains its node for preemption with the
deadline now + the pod's grace period. Every rank's ``get_preemption_info()`` names the ranks
on that node, the train function commits a last checkpoint, the worker group restarts from
it on the other nodes (Ray Train's default ``max_preemption_failures=-1``), and the drained
node stops once its workers are gone (well before the deadline).

The scenario needs a Ray cluster of its own (a head and three ``ray start`` nodes), so it runs
in a separate process (``tests/faults/ray_node_main.py``).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.faults.preemption_main import run_scenario
from trainjob_operator.launcher import ray_node

pytestmark = pytest.mark.ray  # real Ray nodes started as processes

REPO = Path(__file__).resolve().parents[2]


def test_sigterm_to_a_ray_node_pod_drains_it_and_the_job_checkpoints_and_resumes(
    tmp_path: Path,
) -> None:
    seen = run_scenario("tests.faults.ray_node_main", tmp_path)

    assert seen["outcomes"] == [], seen
    final = seen["committed"][-1]
    assert final["final"] is True and 1 in final["preempted_ranks"], seen
    # The drain's deadline is the notice + the pod's grace period (the process's own clock).
    expected = seen["noticed_at_ms"] + seen["grace_s"] * 1000
    assert abs(final["deadline_ms"] - expected) < 5_000, seen
    # The same fit() went on from the final checkpoint, off the drained node.
    assert seen["metrics"] == {"start": final["step"] + 1}  # the last report
    assert seen["result_metrics"] == final  # the latest checkpoint's, as Ray Train
    assert sorted(seen["resumed_nodes"]) == ["0", "1"]  # JSON keys
    assert seen["drained_node"] not in seen["resumed_nodes"].values(), seen
    # The node stopped because its workers were done, not at the end of the grace period.
    assert seen["idle_message"] in seen["victim_log"], seen["victim_log"]
    assert "drained" in seen["victim_log"]
    assert seen["victim_exit_code"] == 0  # a clean stop, as Kubernetes asked


def test_the_ray_start_command_and_its_address_are_read_from_the_argv() -> None:
    argv = ["ray", "start", "--address=head.ns:6379", "--block"]
    assert ray_node.gcs_address_of(argv) == "head.ns:6379"
    assert ray_node.gcs_address_of(["ray", "start", "--address", "h:1"]) == "h:1"
    assert ray_node.gcs_address_of(["ray", "start", "--head"]) is None


@pytest.mark.parametrize(("grace", "margin"), [(30.0, 5.0), (12.0, 2.0), (0.0, 0.0)])
def test_ray_stops_before_the_deadline_by_a_margin_the_grace_period_allows(
    grace: float, margin: float
) -> None:
    assert ray_node.stop_margin_s(grace) == margin


def test_a_fresh_ray_node_has_a_raylet_id_and_no_busy_workers(tmp_path: Path) -> None:
    """Ray's own processes under a node (the raylet's agents, pooled idle workers) are not
    work: a drained node without actors or tasks stops at once."""
    import signal

    from tests.support.ports import free_port, own_ray_port_flags
    from tests.support.waiting import wait_for

    ray_bin = str(Path(sys.executable).with_name("ray"))
    argv = [ray_bin, "start", "--head", f"--port={free_port()}", "--num-cpus=1", "--block"]
    argv += ["--include-dashboard=false", "--disable-usage-stats", *own_ray_port_flags()]
    node = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )

    def agents() -> list[str] | None:
        titles = [" ".join(ray_node.cmdline(p)) for p in ray_node.descendants(node.pid)]
        return titles if any(t.startswith("ray::") and "Agent" in t for t in titles) else None

    try:
        node_id = wait_for("the raylet", lambda: ray_node.raylet_node_id(node.pid), 120)
        assert len(node_id) == 56 and int(node_id, 16) >= 0
        titles = wait_for("Ray's agents under the node", agents, 120)
        assert any(t.startswith("ray::") for t in titles), titles
        assert ray_node.busy_ray_workers(node.pid) == []
    finally:
        # To `ray start` alone, which stops what it started (in seconds); SIGTERM to the whole
        # group reached its children too and the stop hung for a minute.
        node.send_signal(signal.SIGTERM)
        try:
            node.wait(timeout=60)
        except subprocess.TimeoutExpired:  # `ray stop` can hang on a loaded machine
            node.kill()
            node.wait(timeout=60)
        with contextlib.suppress(ProcessLookupError):  # whatever is left of the node
            os.killpg(node.pid, signal.SIGKILL)


def test_a_notice_while_waiting_for_the_head_exits_at_once(tmp_path: Path) -> None:
    # No head answers at this address: the process waits, then leaves on SIGTERM, exit 0.
    import signal
    import time

    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trainjob_operator.launcher.ray_node",
            "--wait-for-head=127.0.0.1:1",
            "--",
            "ray",
            "start",
            "--address=127.0.0.1:1",
            "--block",
        ],
        cwd=REPO,
        env={
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 120
    assert child.stdout is not None
    line = child.stdout.readline()
    while "waiting for the Ray head" not in line and time.monotonic() < deadline:
        line = child.stdout.readline()
    assert "waiting for the Ray head at 127.0.0.1:1" in line
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=60) == 0


def test_a_notice_during_the_health_check_stops_it_and_exits_at_once() -> None:
    # Something listens at the address but never answers as a GCS: `ray health-check` would
    # take about 40 seconds to fail; the notice kills it and the process leaves at once.
    import signal
    import socket
    import time

    from tests.support.waiting import wait_for

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        child = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "trainjob_operator.launcher.ray_node",
                f"--wait-for-head={address}",
                "--",
                "ray",
                "start",
                f"--address={address}",
                "--block",
            ],
            cwd=REPO,
            env={
                **os.environ,
                "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            },
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:

            def health_check_running() -> bool:
                return any(
                    "health-check" in ray_node.cmdline(pid)
                    for pid in ray_node.descendants(child.pid)
                )

            wait_for("ray health-check under the launcher", health_check_running, 60, 0.1)
            noticed = time.monotonic()
            child.send_signal(signal.SIGTERM)
            assert child.wait(timeout=30) == 0
            assert time.monotonic() - noticed < 10  # not the health check's 40 seconds
            assert not health_check_running()
        finally:
            if child.poll() is None:
                child.kill()
