"""``trainjob run`` as a person sees it: run in a tmux pane, the pane captured and read.

The command runs with the environment a user has (no ``CI``, no ``RAY_AUTH_MODE``, no
``PYTHONPATH``), on a terminal, so the progress display is the live one. The train function
prints on the workers' stdout and stderr: that output belongs in the worker log file whose
path the run prints, not on the screen.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO_ROOT

TMUX = shutil.which("tmux")
pytestmark = [
    pytest.mark.ray,
    pytest.mark.skipif(
        TMUX is None,
        reason="tmux is not installed (make test installs it with apt-get when run as root)",
    ),
]

WORKER_STDOUT = "hello from the train function"
WORKER_STDERR = "a note on the train function's stderr"
# The live status line (events such as "Running: 2 worker(s) started" are not it).
LIVE_LINE = re.compile(r"^\[ *[\dhms.]+\] (Starting \d+ worker|(Running|Restarting)( \||$))")


def chatty_train(config: dict[str, Any]) -> None:
    """The quickstart's train function, after printing on both streams (entrypoint below)."""
    from examples.quickstart.train import train_func

    print(WORKER_STDOUT, flush=True)
    print(WORKER_STDERR, file=sys.stderr, flush=True)
    train_func(config)


class Pane:
    """A detached tmux session of its own (private server socket, no user config)."""

    def __init__(self, socket: Path, command: str, env: dict[str, str]) -> None:
        assert TMUX is not None
        self.base = [TMUX, "-S", str(socket), "-f", "/dev/null"]
        subprocess.run(
            [*self.base, "new-session", "-d", "-s", "run", "-x", "120", "-y", "50", command],
            env=env,
            check=True,
            timeout=30,
        )

    def capture(self, history: bool = False) -> str:
        extra = ["-J", "-S", "-"] if history else []
        return subprocess.run(
            [*self.base, "capture-pane", "-p", *extra, "-t", "run"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout

    def close(self) -> None:
        subprocess.run([*self.base, "kill-server"], capture_output=True, timeout=30)


def test_trainjob_run_in_a_terminal(tmp_path: Path) -> None:
    doc = yaml.safe_load((REPO_ROOT / "examples" / "quickstart.yaml").read_text())
    doc["spec"]["entrypoint"] = "tests.test_run_terminal:chatty_train"
    doc["spec"]["config"]["epochs"] = 2
    doc["spec"]["storage"]["path"] = str(tmp_path / "storage")
    manifest = tmp_path / "job.yaml"
    manifest.write_text(yaml.safe_dump(doc))
    trainjob = Path(sys.executable).with_name("trainjob")
    command = (
        f'cd {REPO_ROOT} && {trainjob} run {manifest}; echo "[exit $?]"; sleep 600'
        if trainjob.exists()
        else f"cd {REPO_ROOT} && {sys.executable} -m trainjob_operator.cli run {manifest}; "
        'echo "[exit $?]"; sleep 600'
    )
    drop = ("CI", "RAY_AUTH_MODE", "RAY_ADDRESS", "PYTHONPATH", "TMUX", "TMUX_PANE")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("PYTEST")}
    env["TERM"] = "xterm-256color"
    pane = Pane(tmp_path / "tmux.sock", command, env)
    snapshots: list[str] = []
    try:
        deadline = time.monotonic() + 420
        while "[exit " not in (screen := pane.capture()):
            assert time.monotonic() < deadline, "trainjob run did not finish:\n" + screen
            snapshots.append(screen)
            time.sleep(0.3)
        final = pane.capture(history=True)
    finally:
        pane.close()

    lines = [line.rstrip() for line in final.splitlines() if line.strip()]
    text = "\n".join(lines)
    assert "[exit 0]" in text, text

    # While it ran: one live status line at the bottom, showing the phase, then the step.
    live = [[line for line in snap.splitlines() if LIVE_LINE.match(line)] for snap in snapshots]
    assert all(len(found) <= 1 for found in live), snapshots
    shown = [found[0] for found in live if found]
    assert any("Starting 2 worker(s)" in line for line in shown), shown
    assert any(re.search(r"Running \| step \d+: epoch=\d+ train_loss=", line) for line in shown), (
        shown
    )

    # After it: the events and the outcome stay, the live line is gone.
    assert not [line for line in lines if LIVE_LINE.match(line)], text
    assert re.search(r"\] Running: 2 worker\(s\) started; run folder .*/storage/quickstart", text)
    assert "checkpoint_000001 committed (step 1: epoch=1 train_loss=" in text
    assert re.search(r"checkpoint_000001 validated: val_loss=[\d.]+ val_accuracy=[\d.]+", text)
    assert re.search(
        r"\] Succeeded: step 1, 2 checkpoint\(s\) \(2 validated\), best checkpoint_00000\d "
        r"val_loss=",
        text,
    ), text
    assert "\nstatus:\n  phase: Succeeded\n" in text  # the final TrainJob status, as YAML

    # The workers' own output is in the log file named at the start, not on the screen.
    found = re.search(r"^Ray worker logs: (\S+) \(--verbose shows them here\)$", text, re.M)
    assert found, text
    log = Path(found.group(1)).read_text()
    assert re.search(rf"^\(TrainWorker pid=\d+\) {WORKER_STDOUT}$", log, re.M), log
    assert re.search(rf"^\(TrainWorker pid=\d+\) {WORKER_STDERR}$", log, re.M), log
    for noise in (
        WORKER_STDOUT,
        WORKER_STDERR,
        "pid=",
        "repeated",
        "NumPy",
        "Token authentication",
        "warning",
        "deprecat",
    ):
        assert noise.lower() not in text.lower(), f"{noise!r} on the screen:\n{text}"
