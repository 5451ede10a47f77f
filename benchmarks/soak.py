"""The soak: one long TrainJob on the real node with a random production fault every few minutes.

``make soak`` (as root on Debian bookworm, as the real-node tier: it provisions and starts the
same single-node cluster, :class:`tests.support.node.Node`, with the chart installed from its
image and fake-gcs-server in a pod, :mod:`tests.support.real_cluster`).

The job is the quickstart (``examples/quickstart.yaml`` in the examples image, sized for this
node, checkpoints in a bucket of fake-gcs-server) with ``--epochs`` epochs of small batches,
the pods given 90 s of grace and the train function checking for a preemption notice every
5 batches. Once it has committed its first checkpoint, every ``--min-gap-s`` to
``--max-gap-s`` seconds (random, ``--seed``) the soak waits for the job to be ``Running``
again and does one of :data:`FAULTS` to it (each once per round, in random order),
until ``--minutes`` have passed since the job was created; then it lets the job run to its
end.

At the end it checks that the job ``Succeeded`` at its last step and **the commit invariant**:
every checkpoint folder in storage has its commit marker (none half-written by a pod that went
away) and :meth:`trainjob_operator.sdk.TrainJobClient.result` lists exactly those. It reports
each fault with the seconds until the job's next step, and the **goodput**: the steps done
over the steps a failure-free run does in the same time, where the failure-free rate is the
job's own rate over the interval before its first fault (from its first committed checkpoint),
and the time is from that checkpoint to the end. The result goes to
``benchmarks/results/soak.json``; ``python benchmarks/run_all.py --render-only`` writes it up
in ``docs/benchmarks.md``.

Usage::

    python benchmarks/soak.py [--minutes 15] [--epochs 120] [--min-gap-s 120]
        [--max-gap-s 180] [--seed 1]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
import traceback
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common

NAME = "soak"
NAMESPACE_PREFIX = "soak"


def _faults() -> dict[str, Callable[[Any, str], str]]:
    """Fault name -> a function of (cluster, namespace) that does it and says what it did."""
    from tests.support.real_cluster import (
        JOB,
        OPERATOR_NAMESPACE,
        kill_in_container,
        terminate_a_worker_pod_gracefully,
    )

    def worker_preempted(cluster: Any, namespace: str) -> str:
        terminate_a_worker_pod_gracefully(cluster, namespace)
        return f"{JOB}-w1 deleted with its 90 s grace period (a preemption notice)"

    def worker_ray_node_killed(cluster: Any, namespace: str) -> str:
        kill_in_container(cluster, namespace, f"{JOB}-w1", "raylet")
        return f"the raylet of {JOB}-w1 killed"

    def delete(what: str, *args: str) -> Callable[[Any, str], str]:
        def fault(cluster: Any, namespace: str) -> str:
            if args[0] == "--operator":
                cluster.node.kubectl(
                    "delete", "pods", "--all", "-n", OPERATOR_NAMESPACE, "--wait=false"
                )
            else:
                cluster.node.kubectl("delete", "pod", *args, "-n", namespace, "--wait=false")
            return what

        return fault

    return {
        "worker pod preempted": worker_preempted,
        "worker Ray node killed": worker_ray_node_killed,
        "driver pod deleted": delete(f"{JOB}-driver deleted", f"{JOB}-driver"),
        "head pod deleted": delete(f"{JOB}-head deleted", f"{JOB}-head"),
        "every pod deleted": delete("every pod of the job deleted at once", "--all"),
        "operator pod deleted": delete("the operator's pod deleted", "--operator"),
    }


FAULTS = (
    "worker pod preempted",
    "worker Ray node killed",
    "driver pod deleted",
    "head pod deleted",
    "every pod deleted",
    "operator pod deleted",
)
"""What the soak does to the job, one at a time, each once per round in random order (the list
of issue 39 that one
node can do: a node lost and the control plane restarted need more than one node or stop
the cluster itself; the tier tests those)."""


def _step(cluster: Any, namespace: str) -> int | None:
    progress = cluster.status(namespace).get("progress") or {}
    step = progress.get("step")
    return None if step is None else int(step)


def _wait_running(cluster: Any, namespace: str, timeout_s: float) -> None:
    from tests.support.waiting import wait_for

    def running() -> bool:
        status = cluster.status(namespace)
        if status.get("phase") in ("Failed", "Succeeded"):
            raise RuntimeError(f"the job ended: {status.get('phase')}: {status.get('message')}")
        return status.get("phase") == "Running"

    wait_for("the job Running", running, timeout=timeout_s, every=1.0)


def soak(cluster: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Run the job with its faults on ``cluster``; what happened (see the module's doc)."""
    from tests.support.real_cluster import (
        GRACEFUL_TERMINATION,
        JOB,
        checkpoint_folders,
        make_job,
        wait_for_a_committed_checkpoint,
    )
    from trainjob_operator.sdk import TrainJobClient

    rng = random.Random(args.seed)
    faults = _faults()
    namespace = f"{NAMESPACE_PREFIX}-{uuid.uuid4().hex[:6]}"
    cluster.core.create_namespace({"metadata": {"name": namespace}})
    created = time.monotonic()
    body = make_job(
        cluster,
        namespace,
        {"epochs": args.epochs, "batch_size": 8, **GRACEFUL_TERMINATION["config"]},
        failure={"maxFailures": 1000},
        podTemplate=GRACEFUL_TERMINATION["podTemplate"],
    )
    wait_for_a_committed_checkpoint(cluster, namespace)
    first_checkpoint = time.monotonic()
    first_step = _step(cluster, namespace) or 0
    print(
        f"[soak] first checkpoint {first_checkpoint - created:.0f} s after the create", flush=True
    )
    done: list[dict[str, Any]] = []
    order: list[str] = []
    free_rate: float | None = None
    while time.monotonic() - created < args.minutes * 60:
        gap = rng.uniform(args.min_gap_s, args.max_gap_s)
        fire_at = time.monotonic() + gap
        while time.monotonic() < fire_at:
            status = cluster.status(namespace)
            if status.get("phase") in ("Succeeded", "Failed"):
                break
            time.sleep(2.0)
        if cluster.status(namespace).get("phase") in ("Succeeded", "Failed"):
            print("[soak] the job ended before the soak's time was up", flush=True)
            break
        _wait_running(cluster, namespace, timeout_s=900)
        step = _step(cluster, namespace)
        fired = time.monotonic()
        if free_rate is None and step is not None:
            free_rate = (step - first_step) / (fired - first_checkpoint)
        if not order:
            order = rng.sample(FAULTS, len(FAULTS))  # each fault once per round, in random order
        name = order.pop()
        record: dict[str, Any] = {"fault": name, "at_s": fired - created, "step": step}
        try:
            record["what"] = faults[name](cluster, namespace)
        except Exception as exc:  # noqa: BLE001 - a pod not there at that moment: recorded
            record["error"] = f"{type(exc).__name__}: {exc}"[:300]
        record["next_step_s"] = _seconds_to_next_step(cluster, namespace, step, timeout_s=900)
        done.append(record)
        print(f"[soak] {record}", flush=True)
    status = cluster.wait_phase(namespace, "Succeeded", timeout=3600)
    ended = time.monotonic()
    folders, committed = checkpoint_folders(cluster, body["bucket"])
    result = TrainJobClient(namespace=namespace, kubeconfig=cluster.node.kubeconfig).result(JOB)
    listed = {r.name for r in result.checkpoints}
    last_step = int(status["progress"]["step"])
    expected = free_rate * (ended - first_checkpoint) if free_rate else None
    out = {
        "params": vars(args),
        "namespace": namespace,
        "faults": done,
        "minutes": (ended - created) / 60,
        "first_checkpoint_s": first_checkpoint - created,
        "first_step": first_step,
        "last_step": last_step,
        "failure_free_steps_per_s": free_rate,
        "goodput": (last_step - first_step) / expected if expected else None,
        "restarts": status.get("restarts", 0),
        "ignored_restarts": status.get("ignoredRestarts", 0),
        "worker_failures": status.get("workerFailures", 0),
        "restart_history": status.get("restartHistory") or [],
        "checkpoints_in_storage": len(folders),
        "checkpoints_committed": len(committed),
        "checkpoints_listed": len(listed),
        "invariant_holds": folders == committed == listed
        and status["latestCheckpoint"]["step"] == args.epochs - 1
        and last_step == args.epochs - 1,
    }
    cluster.node.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
    return out


def _seconds_to_next_step(
    cluster: Any, namespace: str, step: int | None, timeout_s: float
) -> float | None:
    """Seconds until the job's progress passes ``step`` (or it succeeded), None on timeout."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        status = cluster.status(namespace)
        now = _step(cluster, namespace)
        if status.get("phase") == "Succeeded" or (now is not None and now > (step or -1)):
            return time.monotonic() - started
        if status.get("phase") == "Failed":
            raise RuntimeError(f"the job failed: {status.get('message')}")
        time.sleep(1.0)
    return None


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=15.0, help="faults for this long")
    parser.add_argument("--epochs", type=int, default=120, help="the job's length")
    parser.add_argument("--min-gap-s", type=float, default=120.0)
    parser.add_argument("--max-gap-s", type=float, default=180.0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)

    from tests.cluster.conftest import NODE_IMAGES
    from tests.support import ensure_assets
    from tests.support.node import Node, build_images, provision_host, unsupported_reason
    from tests.support.real_cluster import ready_cluster
    from trainer_runtime.storage.factory import reset_storage_cache

    reason = unsupported_reason()
    if reason is not None:
        raise SystemExit(f"the soak needs the real node: {reason}")
    common.setup_paths()
    assets, cache = ensure_assets(), provision_host()
    images = build_images(jax=False)
    started = time.monotonic()
    with (
        Node(assets, cache, [images[key] for key in NODE_IMAGES]) as node,
        ready_cluster(node, images) as cluster,
    ):
        print(f"[soak] cluster ready in {time.monotonic() - started:.0f} s", flush=True)
        # TrainJobClient.result reads gs:// from here through the bridge to fake-gcs-server.
        os.environ["STORAGE_EMULATOR_HOST"] = cluster.gcs_url
        reset_storage_cache()
        try:
            out = soak(cluster, args)
        except Exception:
            traceback.print_exc()
            raise
    common.write_result(NAME, out)
    print(
        f"[soak] {len(out['faults'])} faults in {out['minutes']:.1f} min; goodput "
        f"{common.fmt(out['goodput'], 3)}; checkpoints {out['checkpoints_committed']} committed "
        f"of {out['checkpoints_in_storage']} in storage; invariant "
        f"{'holds' if out['invariant_holds'] else 'BROKEN'}",
        flush=True,
    )
    if not out["invariant_holds"]:
        raise SystemExit(1)
    return out


if __name__ == "__main__":
    main()
