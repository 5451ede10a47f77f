"""A Ray worker node's pod process, in front of ``ray start --block``.

``python -m trainjob_operator.launcher.ray_node [--wait-for-head ADDRESS] -- ray start ... --block``

The worker and validation-pool pods run this as their container's main process (PID 1) in
front of ``ray start --block``. It turns the kubelet's termination notice into a Ray node
drain, which is how a preemption notice reaches Ray Train 2.60 and this runtime:

1. It runs the ``ray start`` command as a child and exits with its exit status (0 after a
   stop it made on a termination notice).
2. On the first SIGTERM (spot reclaim, node drain, TPU maintenance, a scale-down) it does not
   pass the signal on: it drains its own Ray node through the GCS (reason
   ``DRAIN_NODE_REASON_PREEMPTION``, deadline now + ``TRAINJOB_TERMINATION_GRACE_PERIOD_S``,
   which the operator sets from the pod's ``terminationGracePeriodSeconds``). Ray then places
   nothing new on the node, and the train controller sees the node in
   ``get_draining_nodes()``: every rank's ``get_preemption_info()`` names the preempted
   ranks, so the train function can save and ``report()`` a last checkpoint.
3. It keeps the node up while Ray workers are busy on it (processes ``ray::<name>`` under
   its raylet; ``ray::IDLE`` ones do not count), so that checkpoint can be written and
   committed; when none is left, when the head has been unreachable for
   :data:`HEAD_GONE_S` (the whole cluster is going: nothing more can be committed), or
   :data:`STOP_MARGIN_S` before the deadline at the latest, it stops the node (SIGTERM to
   ``ray start``, which stops the raylet) and exits.
4. A second SIGTERM, or SIGINT, is passed on at once.

Without it the kubelet's SIGTERM reached ``ray start --block`` itself, which stops the raylet
and kills its workers at once: the notice was lost, and up to a checkpoint interval of work
with it.

Before starting Ray it can wait for the head (``--wait-for-head ADDRESS``: its GCS port opens,
then ``ray health-check`` passes) and leaves promptly on SIGTERM while it waits.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from types import FrameType

from trainer_runtime.preemption import HEAD_GONE_S, HeadWatch, grace_period_s, head_reachable
from trainjob_operator.launcher.stop_flag import StopFlag

logger = logging.getLogger("trainjob_operator.launcher.ray_node")

STOP_MARGIN_S = 5.0
"""Stop Ray this long before the deadline (at most a sixth of the grace period), so that the
raylet has time to exit cleanly before the kubelet's SIGKILL."""
POLL_S = 0.5
"""How often the node's busy workers are counted while it drains."""
HEAD_POLL_S = 2.0
"""How often ``ray health-check`` is tried while waiting for the head."""
RAY_NODE_LOG_IDLE = "no busy Ray workers left on this node: stopping Ray"
"""Logged when the drained node stops because its workers are done (before the deadline)."""
RAY_NODE_LOG_HEAD_GONE = "the Ray head is gone: nothing more can be committed; stopping Ray"
"""Logged when the drained node stops because its head went away."""
NOT_WORK_PROCTITLES = (
    "ray::IDLE",
    "ray::DashboardAgent",
    "ray::RuntimeEnvAgent",
    "ray::SpillWorker",
    "ray::RestoreWorker",
)
"""Titles (prefixes) of ``ray::`` processes that run no user work: pooled idle workers (also
``ray::IDLE_SpillWorker``...), the per-node agents every raylet starts, object spilling."""


def stop_margin_s(grace_s: float) -> float:
    """How long before the deadline Ray is stopped: :data:`STOP_MARGIN_S`, at most grace / 6."""
    return min(STOP_MARGIN_S, grace_s / 6)


def _parent_pids() -> dict[int, int]:
    """pid -> parent pid of every process this one can see (``/proc``; Linux, as in a pod)."""
    parents = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # gone meanwhile
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        fields = stat[stat.rindex(b")") + 2 :].split()
        parents[int(entry.name)] = int(fields[1])
    return parents


def descendants(root_pid: int) -> list[int]:
    """Every process below ``root_pid`` (children, grandchildren...)."""
    children: dict[int, list[int]] = {}
    for pid, parent in _parent_pids().items():
        children.setdefault(parent, []).append(pid)
    found, todo = [], list(children.get(root_pid, []))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def cmdline(pid: int) -> list[str]:
    """A process's argv (``/proc/<pid>/cmdline``; a process title set by Ray included), or
    ``[]`` when it is gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return []
    return [arg.decode(errors="replace") for arg in raw.split(b"\0") if arg]


def raylet_node_id(root_pid: int) -> str | None:
    """The Ray node id (hex) of the raylet started under ``root_pid``, from its
    ``--node_id=`` argument, or None while there is none."""
    for pid in descendants(root_pid):
        argv = cmdline(pid)
        if argv and os.path.basename(argv[0]) == "raylet":
            for arg in argv:
                if arg.startswith("--node_id="):
                    return arg.split("=", 1)[1]
    return None


def busy_ray_workers(root_pid: int) -> list[str]:
    """Process titles of the Ray workers under ``root_pid`` that run an actor or a task
    (``ray::<name>``; Ray's own processes, :data:`NOT_WORK_PROCTITLES`, are left out)."""
    titles = []
    for pid in descendants(root_pid):
        title = " ".join(cmdline(pid)).strip()
        if title.startswith("ray::") and not title.startswith(NOT_WORK_PROCTITLES):
            titles.append(title)
    return titles


def drain_ray_node(gcs_address: str, node_id: str, deadline_ms: int, message: str) -> bool:
    """Ask the GCS to drain ``node_id`` for preemption by ``deadline_ms``; whether it agreed."""
    from ray._raylet import GcsClient  # type: ignore[attr-defined]
    from ray.core.generated.autoscaler_pb2 import DrainNodeReason  # type: ignore[attr-defined]

    gcs = GcsClient(address=gcs_address)
    accepted, why = gcs.drain_node(
        node_id=node_id,
        reason=DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"),
        reason_message=message,
        deadline_timestamp_ms=deadline_ms,
    )
    if not accepted:
        logger.warning("the Ray GCS refused to drain node %s: %s", node_id, why)
    return bool(accepted)


def gcs_address_of(ray_argv: Sequence[str]) -> str | None:
    """The ``--address`` of a ``ray start`` command line."""
    args = list(ray_argv)
    for i, arg in enumerate(args):
        if arg.startswith("--address="):
            return arg.split("=", 1)[1]
        if arg == "--address" and i + 1 < len(args):
            return args[i + 1]
    return None


class RayNode:
    """``ray start --block`` as a child process, drained on the first termination notice."""

    def __init__(
        self,
        ray_argv: Sequence[str],
        *,
        grace_s: float,
    ) -> None:
        self.ray_argv = list(ray_argv)
        self.grace_s = grace_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._notices = 0
        self._noticed = StopFlag()  # set by the SIGTERM handler: no lock (see StopFlag)

    # -- signals ------------------------------------------------------------------------------

    def on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        """First SIGTERM: a notice (handled by :meth:`run`). Later: passed on to Ray."""
        self._notices += 1
        if self._notices == 1:
            self._noticed.set()
        else:
            self._forward(signal.SIGTERM)

    def on_sigint(self, signum: int, frame: FrameType | None) -> None:
        """SIGINT: passed on to Ray at once."""
        self._forward(signal.SIGINT)

    def _forward(self, sig: int) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(sig)

    # -- lifecycle ----------------------------------------------------------------------------

    def run(self) -> int:
        """Start Ray, serve until it exits, drain on a notice; Ray's exit status."""
        try:
            self._proc = subprocess.Popen(self.ray_argv)
        except OSError as exc:
            logger.error("cannot run %s: %s", self.ray_argv[0], exc)
            return 127
        while self._proc.poll() is None:
            if self._noticed.wait(POLL_S):
                try:
                    self._on_notice()
                except Exception:  # never leave Ray running without its supervisor
                    logger.exception("draining on the termination notice failed")
                self._forward(signal.SIGTERM)
                break
        code = self._proc.wait()
        logger.info("ray start exited with status %s", code)
        if self._notices:
            # Stopped as Kubernetes asked (`ray start --block` exits 1 on SIGTERM): a clean
            # end of the pod, not a failure.
            return 0
        return 128 - code if code < 0 else code

    def _on_notice(self) -> None:
        assert self._proc is not None
        deadline = time.time() + self.grace_s
        stop_at = deadline - stop_margin_s(self.grace_s)
        node = raylet_node_id(self._proc.pid)
        address = gcs_address_of(self.ray_argv)
        drained = False
        if node is not None and address is not None:
            try:
                drained = drain_ray_node(
                    address,
                    node,
                    int(deadline * 1000),
                    f"pod termination notice (grace period {self.grace_s:g} s)",
                )
            except Exception as exc:  # noqa: BLE001 - the GCS may be gone: stop as before
                logger.warning("draining Ray node %s failed: %s", node, exc)
        if drained:
            logger.info(
                "termination notice: Ray node %s drained, deadline in %.0f s; "
                "waiting for its workers to finish",
                node,
                self.grace_s,
            )
            self._wait_until_idle(stop_at)
        else:
            logger.info("termination notice: stopping Ray (node not drained)")

    def _wait_until_idle(self, stop_at: float) -> None:
        """Return once no Ray worker is busy on this node, its head has been unreachable
        for :data:`HEAD_GONE_S`, Ray exited, or ``stop_at`` (epoch seconds) passed."""
        assert self._proc is not None
        address = gcs_address_of(self.ray_argv)
        head = (
            HeadWatch(address, gone_after_s=HEAD_GONE_S, poll_s=HEAD_POLL_S)
            if address is not None
            else None
        )
        while self._proc.poll() is None and time.time() < stop_at:
            busy = busy_ray_workers(self._proc.pid)
            if not busy:
                logger.info(RAY_NODE_LOG_IDLE)
                return
            if head is not None and head.gone():
                logger.info(RAY_NODE_LOG_HEAD_GONE)
                return
            time.sleep(POLL_S)
        if self._proc.poll() is None:
            logger.warning("grace period almost over: stopping Ray with workers still busy")


def _health_check(address: str, stopped: StopFlag) -> bool:
    """Run ``ray health-check --address``; True if it passed, False if it failed or
    ``stopped`` was set meanwhile (the check is then killed, so a notice is obeyed at once)."""
    check = subprocess.Popen(  # FileNotFoundError without `ray` on PATH: nothing can start
        ["ray", "health-check", f"--address={address}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    while check.poll() is None:
        if stopped.wait(POLL_S):
            check.kill()
            check.wait()
            return False
    return check.returncode == 0


def wait_for_head(address: str, stopped: StopFlag) -> bool:
    """Wait until the head answers: its GCS port opens (:func:`head_reachable`), then
    ``ray health-check`` passes. Prints a line per try; False if ``stopped`` first."""
    while not stopped.is_set():
        if head_reachable(address) and _health_check(address, stopped):
            return True
        if stopped.is_set():
            break
        print(f"waiting for the Ray head at {address}", flush=True)
        stopped.wait(HEAD_POLL_S)
    return False


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``[--wait-for-head ADDRESS] -- ray start ... --block`` and run it."""
    parser = argparse.ArgumentParser(
        prog="python -m trainjob_operator.launcher.ray_node",
        description="Run `ray start --block`; drain the Ray node on the first SIGTERM.",
    )
    parser.add_argument("--wait-for-head", metavar="ADDRESS", help="wait for this Ray GCS first")
    parser.add_argument("ray_argv", nargs=argparse.REMAINDER, help="-- ray start ... --block")
    args = parser.parse_args(argv)
    ray_argv = args.ray_argv[1:] if args.ray_argv[:1] == ["--"] else args.ray_argv
    if not ray_argv:
        parser.error("give the ray start command after --")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    node = RayNode(ray_argv, grace_s=grace_period_s())
    stopped = StopFlag()

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        stopped.set()
        node.on_sigterm(signum, frame)

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        stopped.set()
        node.on_sigint(signum, frame)

    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGINT, on_sigint)
    if args.wait_for_head and not wait_for_head(args.wait_for_head, stopped):
        return 0
    return node.run()


if __name__ == "__main__":
    sys.exit(main())
