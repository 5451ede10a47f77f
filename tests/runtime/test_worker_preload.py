"""``Preloader`` / ``TrainWorker(preload=...)``: background imports before the set-up runs."""

from __future__ import annotations

import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainer_runtime._worker import Preloader, TrainWorker


@pytest.fixture
def slow_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """A module ``preload_probe`` whose import blocks until the returned event is set."""
    gate = threading.Event()
    (tmp_path / "preload_probe.py").write_text(
        textwrap.dedent(
            """
            import builtins

            builtins._preload_gate.wait(30)
            LOADED = True
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr("builtins._preload_gate", gate, raising=False)
    monkeypatch.delitem(sys.modules, "preload_probe", raising=False)
    yield gate
    sys.modules.pop("preload_probe", None)


def test_preloader_imports_in_the_background(slow_module: threading.Event) -> None:
    preloader = Preloader(["preload_probe"])  # returns while the import is blocked
    slow_module.set()
    preloader.wait()
    assert sys.modules["preload_probe"].LOADED is True


def test_a_failing_preload_is_left_to_the_real_import() -> None:
    preloader = Preloader(["trainer_runtime_no_such_module", "json"])
    preloader.wait()  # no exception here: the set-up's own import raises it
    assert "json" in sys.modules


def test_worker_set_up_waits_for_the_preload(
    slow_module: threading.Event, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (not this process's SIGTERM handler)
    monkeypatch.setattr("trainer_runtime._worker.install_sigterm_handler", lambda: False)
    worker = TrainWorker(preload=["preload_probe"])
    results: list[bool] = []
    done = threading.Event()

    def set_up() -> None:
        results.append(worker.execute(lambda: sys.modules["preload_probe"].LOADED))
        done.set()

    threading.Thread(target=set_up, daemon=True).start()
    assert not done.wait(0.2)  # still importing: execute waits
    slow_module.set()
    assert done.wait(30)
    assert results == [True]


def test_process_start_time_orders_processes_by_when_they_started() -> None:
    """The clock the prestarted-worker count compares against ``fit()``'s request time."""
    import subprocess
    import time

    from trainer_runtime._worker import process_start_time

    mine = process_start_time()
    before = time.time()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        started = process_start_time(child.pid)
        assert mine is not None and started is not None
        assert mine < before - 0.05  # this interpreter started well before
        assert before - 0.05 < started < time.time() + 0.05
    finally:
        child.kill()
        child.wait()
    assert process_start_time(2**22 + 1) is None  # no such process


def test_prestarted_count_counts_processes_older_than_the_request() -> None:
    from trainer_runtime.worker_group import prestarted_count

    infos = [{"process_started": 90.0}, {"process_started": 101.0}, {"process_started": None}, {}]
    assert prestarted_count(infos, requested=100.0) == 1
    # A node that joined after the request: its raylet prestarted the process after it too.
    late_node = {"process_started": 102.0, "raylet_prestarted": True}
    assert prestarted_count([*infos, late_node], requested=100.0) == 2


@pytest.mark.ray  # a local Ray in a child process
def test_raylet_prestarted_processes_carry_the_nil_job_id() -> None:
    """What Ray puts in a worker process's environment, checked on a real local Ray: a process
    the raylet prestarted has the nil job id, one it starts for this job's actor the job's."""
    import os
    import subprocess

    script = textwrap.dedent(
        """
        import os, time, ray
        from trainer_runtime._worker import started_without_job
        ray.init(address="local", num_cpus=1, include_dashboard=False)
        @ray.remote(num_cpus=0)
        def probe():
            return started_without_job(os.environ)
        deadline = time.monotonic() + 60
        # Ray prestarts one process per CPU when it starts; wait until a probe runs in it.
        while not ray.get(probe.remote()) and time.monotonic() < deadline:
            time.sleep(0.5)
        prestarted = ray.get(probe.remote())
        # A runtime_env asks for a new process, started for this job.
        fresh = ray.get(probe.options(runtime_env={"env_vars": {"X": "1"}}).remote())
        print("RESULT", prestarted, fresh)
        """
    )
    env = {**os.environ, "RAY_enable_worker_prestart": "1", "RAY_num_workers_soft_limit": "1"}
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=180
    )
    assert "RESULT True False" in out.stdout, out.stdout + out.stderr[-3000:]


def test_prestart_keep_alive_reads_whole_seconds() -> None:
    from trainer_runtime._raylet import DEFAULT_PRESTART_KEEP_ALIVE_S, prestart_keep_alive_s
    from trainer_runtime.errors import UserConfigError

    assert prestart_keep_alive_s({}) == DEFAULT_PRESTART_KEEP_ALIVE_S
    assert prestart_keep_alive_s({"TRAINJOB_PRESTART_KEEP_ALIVE_S": " 0 "}) == 0
    assert prestart_keep_alive_s({"TRAINJOB_PRESTART_KEEP_ALIVE_S": "300"}) == 300
    for bad in ("-1", "1.5", "soon"):
        with pytest.raises(UserConfigError, match="TRAINJOB_PRESTART_KEEP_ALIVE_S"):
            prestart_keep_alive_s({"TRAINJOB_PRESTART_KEEP_ALIVE_S": bad})


@pytest.mark.ray  # a local Ray in a child process
def test_next_worker_group_starts_in_processes_the_last_one_asked_for() -> None:
    """On a real local Ray: a group shut down with ``prestart_successor=True`` leaves idle
    processes of the job that the next group's actors start in; shut down without it, the
    next group waits for new processes (Ray's own prestarted ones were taken by the first)."""
    import os
    import subprocess

    script = textwrap.dedent(
        """
        import os, time, ray
        from trainer_runtime.config import ScalingConfig
        from trainer_runtime.worker_group import WorkerGroup, prestarted_count

        ray.init(address="local", num_cpus=2, include_dashboard=False)
        job = ray.get_runtime_context().get_job_id()

        def parent(pid):
            with open(f"/proc/{pid}/stat") as f:
                return int(f.read().rsplit(")", 1)[1].split()[1])

        # This cluster's raylet, the parent of its worker processes (other local Ray clusters
        # on the machine number their first job the same way: only its children count).
        node = ray._private.worker._global_node
        raylet = {node.all_processes["raylet"][0].process.pid}

        def idle_of_this_job(any_job=False):
            pids = []
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        title = f.read()
                    with open(f"/proc/{pid}/environ", "rb") as f:
                        env = f.read().split(b"\\0")
                    ours = parent(pid) in raylet
                except (OSError, ValueError, IndexError):
                    continue
                of_job = any_job or f"RAY_JOB_ID={job}".encode() in env
                if ours and title.startswith(b"ray::IDLE") and of_job:
                    pids.append(int(pid))
            return sorted(pids)

        def wait_for_idle(count, any_job=False):
            deadline = time.monotonic() + 120
            while len(idle_of_this_job(any_job)) < count and time.monotonic() < deadline:
                time.sleep(0.2)
            return idle_of_this_job(any_job)

        def group_counts(prestart):
            group = WorkerGroup(ScalingConfig(num_workers=2))
            requested = time.time()
            group.start()
            infos = ray.get([w.actor.node_info.remote() for w in group.workers])
            pids = sorted(info["pid"] for info in infos)
            group.shutdown(prestart_successor=prestart)
            return prestarted_count(infos, requested), pids

        # The raylet prestarts 2 processes (of no job yet): on a loaded machine they may still
        # be starting, and a group asking now would get processes of its own, leaving Ray's
        # idle for the groups after it. Wait for them, so the first group takes exactly those.
        ray_prestarted = wait_for_idle(2, any_job=True)
        group_counts(prestart=True)  # takes Ray's 2 prestarted processes, asks for 2 more
        idle = wait_for_idle(2)
        second, second_pids = group_counts(prestart=False)
        time.sleep(3)
        idle_before_third = idle_of_this_job()
        third, _ = group_counts(prestart=False)
        print("RESULT", set(second_pids) <= set(idle), second, third)
        print("PIDS Ray's", ray_prestarted, "idle", idle, "second group", second_pids,
              "idle before the third", idle_before_third)
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "TRAINJOB_PRESTART_KEEP_ALIVE_S"}
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=240
    )
    assert "RESULT True 2 0" in out.stdout, out.stdout + out.stderr[-3000:]


def test_idle_worker_requests_ask_nothing_without_a_keep_alive_or_ray() -> None:
    """The requests are an optimisation: no keep-alive, no workers or no Ray means no requests,
    and sending to a raylet that is not there skips it instead of raising."""
    import socket

    from trainer_runtime._raylet import (
        IdleWorkerRequest,
        idle_worker_requests,
        send_idle_worker_requests,
    )

    assert idle_worker_requests({"node": 2}, keep_alive_s=0) == []
    assert idle_worker_requests({"node": 0}, keep_alive_s=60) == []
    assert idle_worker_requests({"node": 2}, keep_alive_s=60) == []  # no ray.init() here
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        closed_port = sock.getsockname()[1]
    request = IdleWorkerRequest("node", f"127.0.0.1:{closed_port}", b"\x01\x00\x00\x00", 2, 60)
    assert send_idle_worker_requests([request]) == []
