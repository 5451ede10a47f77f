"""JAX train functions for the runtime tests (importable by Ray workers by module name).

* ``collective_train``: every process contributes ``rank + 1`` to real cross-process
  collectives (``process_allgather`` and a ``pmap`` ``psum``) and writes what it saw, where it
  ran and its TPU/MEGASCALE environment to ``config["out_dir"]/rank_<rank>.json``; rank 0's
  view is reported with a checkpoint (``Result.metrics``, as in Ray Train 2.60).
* ``steps_train``: a resumable step loop whose parameters are a numpy array updated from a
  cross-process mean, checkpointed with ``np.save`` by rank 0 and logged per start.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

import trainer_runtime as tr
from tests.runtime.workloads import report_with_checkpoint
from trainer_runtime import Checkpoint

#: Environment variables the TPU tests look at.
ENV_KEYS = (
    "RANK",
    "WORLD_SIZE",
    "JAX_PLATFORMS",
    "TPU_NAME",
    "TPU_WORKER_ID",
    "TPU_WORKER_HOSTNAMES",
    "TRAINJOB_TPU_SLICE_ID",
    "TRAINJOB_TPU_SLICE_NAME",
    "MEGASCALE_NUM_SLICES",
    "MEGASCALE_SLICE_ID",
    "MEGASCALE_COORDINATOR_ADDRESS",
    "MEGASCALE_PORT",
)


def worker_probe() -> dict[str, Any]:
    """Where this process runs and its TPU-related environment (for ``WorkerGroup.execute``)."""
    import ray

    return {
        "node_id": ray.get_runtime_context().get_node_id() if ray.is_initialized() else None,
        "pid": os.getpid(),
        "env": {k: os.environ.get(k) for k in ENV_KEYS},
    }


def collective_train(config: dict[str, Any]) -> None:
    """Cross-process collectives; writes ``rank_<rank>.json`` and reports rank 0's view with
    a checkpoint (so it is ``Result.metrics``)."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import multihost_utils

    rank = tr.get_context().get_world_rank()
    gathered = multihost_utils.process_allgather(np.array([rank + 1.0], np.float32))
    summed = jax.pmap(lambda x: jax.lax.psum(x, "i"), axis_name="i")(
        jnp.full((jax.local_device_count(),), rank + 1.0)
    )
    record = {
        "rank": rank,
        "process_index": jax.process_index(),
        "process_count": jax.process_count(),
        "device_count": jax.device_count(),
        "platform": jax.devices()[0].platform,
        "gathered": np.asarray(gathered).ravel().tolist(),
        "psum": float(np.asarray(summed)[0]),
        **worker_probe(),
    }
    if config.get("out_dir"):
        Path(config["out_dir"], f"rank_{rank}.json").write_text(json.dumps(record))
    report_with_checkpoint(
        {
            k: record[k]
            for k in ("rank", "process_count", "device_count", "platform", "gathered", "psum")
        }
    )


def steps_train(config: dict[str, Any]) -> None:
    """Steps ``start..steps-1``: ``w += mean over processes of (rank + 1)`` each step.

    Rank 0 saves ``w`` (``np.save``) and the step every ``ckpt_every`` steps; a resumed run
    loads them from ``get_checkpoint()`` and continues, so after ``n`` steps in total
    ``w == n * mean(rank + 1)`` however the run was split. ``config["fail"] = {"rank",
    "step", "attempts"}`` raises on that rank at that step.
    """
    import jax
    from jax.experimental import multihost_utils

    ctx = tr.get_context()
    rank = ctx.get_world_rank()
    w = np.zeros(3, np.float32)
    start = 0
    checkpoint = tr.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            w = np.load(Path(folder) / "w.npy")
            start = json.loads((Path(folder) / "meta.json").read_text())["step"] + 1
    if config.get("log"):
        with open(config["log"], "a") as fh:
            entry = {
                "rank": rank,
                "attempt": ctx.attempt,
                "start": start,
                "pid": os.getpid(),
                "processes": jax.process_count(),
            }
            fh.write(json.dumps(entry) + "\n")
    fail = config.get("fail")
    for step in range(start, config["steps"]):
        if (
            fail
            and fail["rank"] == rank
            and fail["step"] == step
            and ctx.attempt in fail.get("attempts", [0])
        ):
            raise RuntimeError(f"injected failure at step {step}")
        contributions = multihost_utils.process_allgather(np.array([rank + 1.0], np.float32))
        w = w + np.float32(np.mean(contributions))
        ckpt = None
        if rank == 0 and (step + 1) % config.get("ckpt_every", 1) == 0:
            out = Path(tempfile.mkdtemp(prefix="jax_ckpt_"))
            np.save(out / "w.npy", w)
            (out / "meta.json").write_text(json.dumps({"step": step}))
            ckpt = Checkpoint.from_directory(out)
        tr.report({"step": step, "w": float(w[0]), "processes": jax.process_count()}, ckpt)
