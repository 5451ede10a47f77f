"""Signal handlers that take no lock: a SIGTERM handler runs on the main thread between two
bytecodes, possibly while that thread holds the very lock the handler would take
(``threading.Event``'s, the preemption notice's), and then the process hangs until the
kubelet's SIGKILL. Each case runs in a child process that fires a real signal every
millisecond (``setitimer``) at a main thread busy with the waits and reads of production code;
before the fix every case hung within a second."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SIGNALS_FOR_S = 1.0

CASES = {
    "preemption notice (the driver's and the workers' SIGTERM handler)": """
        import os
        import types

        from trainer_runtime import preemption

        # A notice already recorded makes the handler terminate the process (a second
        # SIGTERM): here that path only records the call, so both paths run, many times.
        preemption.os = types.SimpleNamespace(
            environ=os.environ, getpid=os.getpid, kill=lambda pid, sig: None
        )
        preemption.signal = types.SimpleNamespace(
            SIGTERM=15, SIG_DFL=0, signal=lambda sig, handler: None
        )
        handler = preemption._on_sigterm

        def busy():
            preemption.local_notice()
            preemption.driver_stop_time()
            preemption._sigterm_deadline_ms = None  # the next signal a first notice again
    """,
    "ray_node's termination notice (RayNode._noticed)": """
        from trainjob_operator.launcher.ray_node import RayNode

        node = RayNode(["true"], grace_s=30)

        def handler(signum, frame):
            node._notices = 0  # every signal a first notice (no child: nothing forwarded)
            node.on_sigterm(signum, frame)

        def busy():
            node._noticed.wait(0.0001)
    """,
    "driver_start's and ray_node's stop request (StopFlag)": """
        from trainjob_operator.launcher.stop_flag import StopFlag

        flag = StopFlag()
        handler = lambda signum, frame: flag.set()

        def busy():
            flag.wait(0.0001)
            flag._set = False
    """,
}

RUNNER = """
import signal, sys, time
handled = 0
def counting(signum, frame):
    global handled
    handled += 1
    handler(signum, frame)
signal.signal(signal.SIGALRM, counting)
signal.setitimer(signal.ITIMER_REAL, 0.001, 0.001)
end = time.monotonic() + {seconds}
while time.monotonic() < end:
    busy()
signal.setitimer(signal.ITIMER_REAL, 0)
print("handled", handled)
"""


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_signal_every_millisecond_never_hangs_the_main_thread(case: str) -> None:
    script = textwrap.dedent(CASES[case]) + RUNNER.format(seconds=SIGNALS_FOR_S)
    try:
        done = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=30
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{case}: the main thread hung in a signal handler")
    assert done.returncode == 0, done.stderr[-2000:]
    handled = int(done.stdout.split()[-1])
    assert handled > 100, done.stdout  # the signals did arrive while the main thread worked
