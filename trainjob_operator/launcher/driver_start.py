"""The driver pod's main process until training starts, then the driver itself.

``python -m trainjob_operator.launcher.driver_start`` (the driver container's command):

1. waits for the Ray head at ``$RAY_ADDRESS`` the way the worker pods do
   (:func:`trainjob_operator.launcher.ray_node.wait_for_head`: the GCS port opens, then
   ``ray health-check`` passes), printing a line per try;
2. joins the Ray cluster as a zero-resource node (``ray start --num-cpus=0 --num-gpus=0``),
   up to :data:`RAY_START_TRIES` times, ``ray stop --force`` between tries: a raylet that does
   not register in time ("The current node timed out during startup", a loaded node or GCS) is
   transient, and the pod's failure would end the job when ``failure.maxRestarts`` is 0;
3. replaces itself with the driver (``exec python -m trainjob_operator.launcher.driver``), so
   the driver is the container's PID 1 and its exit status is the pod's.

A SIGTERM or SIGINT before step 3 (the pod deleted while it waits for its head) stops it at
once with :data:`~trainjob_operator.constants.DRIVER_PREEMPTED_EXIT_CODE`: nothing was trained,
nothing is lost. (A shell script did this before; as PID 1 it ignored SIGTERM until the
kubelet's SIGKILL.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from types import FrameType

from trainjob_operator.constants import DRIVER_PREEMPTED_EXIT_CODE
from trainjob_operator.launcher.ray_node import wait_for_head
from trainjob_operator.launcher.stop_flag import StopFlag

__all__ = ["DRIVER_MAIN_MODULE", "RAY_START_RETRY_S", "RAY_START_TRIES", "join_cluster", "main"]

DRIVER_MAIN_MODULE = "trainjob_operator.launcher.driver"
"""The driver proper, which this process becomes once it joined the Ray cluster."""
RAY_START_TRIES = 3
"""How many times the driver pod tries to join the Ray cluster before it fails."""
RAY_START_RETRY_S = 5.0
"""Seconds between two tries of ``ray start``."""
JOIN_FAILED_EXIT_CODE = 1
"""Exit status when every ``ray start`` failed: a failure of the pod, counted as such."""


def ray_start_command(address: str) -> list[str]:
    """``ray start`` joining ``address`` as a node that takes no task or actor."""
    return [
        "ray",
        "start",
        f"--address={address}",
        "--num-cpus=0",
        "--num-gpus=0",
        "--disable-usage-stats",
    ]


def _run(command: Sequence[str], stopped: StopFlag) -> int | None:
    """Run ``command``; its exit status, or None when ``stopped`` was set first (it is then
    killed)."""
    proc = subprocess.Popen(list(command))
    while proc.poll() is None:
        if stopped.wait(0.2):
            proc.kill()
            proc.wait()
            return None
    return proc.returncode


def join_cluster(
    address: str,
    stopped: StopFlag,
    *,
    tries: int = RAY_START_TRIES,
    retry_s: float = RAY_START_RETRY_S,
) -> bool | None:
    """Join the Ray cluster at ``address`` (up to ``tries`` times, ``ray stop --force``
    between them). True when joined, False when every try failed, None when ``stopped``."""
    for attempt in range(1, tries + 1):
        status = _run(ray_start_command(address), stopped)
        if status is None:
            return None
        if status == 0:
            return True
        if attempt == tries:
            break
        print(f"ray start failed (try {attempt} of {tries}): trying again in {retry_s:g} s")
        sys.stdout.flush()
        subprocess.run(
            ["ray", "stop", "--force"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )
        if stopped.wait(retry_s):
            return None
    print(f"ray start failed {tries} times: the driver cannot join the Ray cluster at {address}")
    return False


def main(argv: Sequence[str] | None = None) -> int:
    """Wait for the head, join, then exec the driver; see the module docstring."""
    del argv  # no arguments: everything comes from the pod's environment
    address = os.environ["RAY_ADDRESS"]
    stopped = StopFlag()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        # Nothing that takes a lock (no print: stdout's buffer has one): see StopFlag.
        del signum, frame
        stopped.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    joined = join_cluster(address, stopped) if wait_for_head(address, stopped) else None
    if joined is None:
        print("stopped (SIGTERM or SIGINT) before training started", flush=True)
        return DRIVER_PREEMPTED_EXIT_CODE
    if not joined:
        return JOIN_FAILED_EXIT_CODE
    sys.stdout.flush()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the driver installs its own
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.execvp("python", ["python", "-m", DRIVER_MAIN_MODULE])
    return JOIN_FAILED_EXIT_CODE  # pragma: no cover (execvp does not return)


if __name__ == "__main__":
    sys.exit(main())
