"""The driver pod's start (``trainjob_operator.launcher.driver_start``) as a real process, with
stub ``ray`` and ``python`` executables on PATH that record their arguments, and a real TCP
listener standing in for the head's GCS port."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainjob_operator.constants import DRIVER_PREEMPTED_EXIT_CODE
from trainjob_operator.launcher.driver_start import join_cluster
from trainjob_operator.launcher.stop_flag import StopFlag

MODULE = "trainjob_operator.launcher.driver_start"


def _stub(directory: Path, name: str, body: str) -> None:
    path = directory / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.fixture
def head() -> Iterator[str]:
    """A listening TCP socket: the head's GCS port as seen from the driver pod."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield f"127.0.0.1:{server.getsockname()[1]}"


def _env(tmp_path: Path, address: str) -> dict[str, str]:
    return {
        **os.environ,
        "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}",
        "RAY_ADDRESS": address,
        "TRAINJOB_NAME": "dj",
    }


def test_waits_for_the_head_joins_as_a_zero_resource_node_then_becomes_the_driver(
    tmp_path: Path, head: str
) -> None:
    calls = tmp_path / "calls"
    record = f"""{sys.executable} -c 'import json,sys; print(json.dumps(sys.argv[1:]))' \\
"$(basename "$0")" "$@" >> {calls}
"""
    _stub(tmp_path, "ray", record)
    _stub(tmp_path, "python", record + 'echo "$TRAINJOB_NAME"; exit 7\n')
    done = subprocess.run(
        [sys.executable, "-m", MODULE],
        env=_env(tmp_path, head),
        timeout=60,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 7, done  # the driver's exit status is the pod's (exec)
    assert done.stdout.strip().splitlines()[-1] == "dj"
    lines = [json.loads(line) for line in calls.read_text().splitlines()]
    assert lines == [
        ["ray", "health-check", f"--address={head}"],
        ["ray", "start", f"--address={head}", "--num-cpus=0", "--num-gpus=0",
         "--disable-usage-stats"],
        ["python", "-m", "trainjob_operator.launcher.driver"],
    ]  # fmt: skip


def test_ray_start_is_tried_three_times_with_ray_stop_between(
    tmp_path: Path, head: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = tmp_path / "calls"
    _stub(tmp_path, "ray", f'echo "$1" >> {calls}\n[ "$1" = start ] && exit 1\nexit 0\n')
    monkeypatch.setenv("PATH", _env(tmp_path, head)["PATH"])
    assert join_cluster(head, StopFlag(), retry_s=0) is False
    assert calls.read_text().split() == ["start", "stop"] * 2 + ["start"]
    out = capsys.readouterr().out
    assert "ray start failed (try 2 of 3): trying again" in out
    assert f"ray start failed 3 times: the driver cannot join the Ray cluster at {head}" in out
    # A transient failure: joined at the second try.
    calls.unlink()
    failed_once = tmp_path / "failed-once"
    _stub(
        tmp_path,
        "ray",
        f'echo "$1" >> {calls}\n'
        f'if [ "$1" = start ] && [ ! -e {failed_once} ]; then touch {failed_once}; exit 1; fi\n',
    )
    assert join_cluster(head, StopFlag(), retry_s=0) is True
    assert calls.read_text().split() == ["start", "stop", "start"]


def test_sigterm_while_waiting_for_the_head_stops_at_once_as_preempted(tmp_path: Path) -> None:
    """The pod deleted before its head came up: no wait for the kubelet's SIGKILL."""
    with socket.create_server(("127.0.0.1", 0)) as reserved:
        address = f"127.0.0.1:{reserved.getsockname()[1]}"
    # Nothing listens there now: the launcher keeps waiting, printing a line per try.
    proc = subprocess.Popen(
        [sys.executable, "-m", MODULE],
        env=_env(tmp_path, address),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    assert "waiting for the Ray head" in proc.stdout.readline()
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == DRIVER_PREEMPTED_EXIT_CODE
    assert time.monotonic() - sent < 5
