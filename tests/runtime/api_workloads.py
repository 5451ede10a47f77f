"""Train functions for the tests of Ray Train 2.60's newer API (importable by Ray workers):
``collective``, ``get_all_reported_checkpoints``, ``checkpoint_upload_fn``."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import trainer_runtime as tr
from trainer_runtime import collective


def _append(path: str, record: Any) -> None:
    with open(path, "a") as fh:
        fh.write(json.dumps(record) + "\n")


def read_lines(path: str | Path) -> list[Any]:
    """What the workloads appended to ``path``."""
    p = Path(path)
    return [json.loads(line) for line in p.read_text().splitlines()] if p.exists() else []


def _step_of(checkpoint: tr.Checkpoint | None) -> int | None:
    if checkpoint is None:
        return None
    with checkpoint.as_directory() as folder:
        return int(json.loads((Path(folder) / "state.json").read_text())["step"])


def _save(step: int) -> tr.Checkpoint:
    folder = tempfile.mkdtemp(prefix="api_")
    (Path(folder) / "state.json").write_text(json.dumps({"step": step}))
    return tr.Checkpoint.from_directory(folder)


def collective_train(config: dict[str, Any]) -> None:
    """Rank 0 broadcasts a value; rank 0 reaches the barrier ``delay_s`` late; everyone logs
    what it got and when it left the barrier."""
    rank = tr.get_context().get_world_rank()
    got = collective.broadcast_from_rank_zero({"from": rank, "seed": 42} if rank == 0 else rank)
    if rank == 0:
        time.sleep(config.get("delay_s", 0.0))
        arrived = time.time()
    else:
        arrived = 0.0
    collective.barrier()
    left = time.time()
    arrived = collective.broadcast_from_rank_zero(arrived)
    _append(config["log"], {"rank": rank, "got": got, "left_after": left >= arrived})
    if config.get("skip_barrier_on") == rank:
        return  # returns without joining the next collective
    collective.barrier()


def reported_train(config: dict[str, Any]) -> None:
    """Report ``losses`` with a checkpoint each; rank 0 logs get_all_reported_checkpoints()."""
    rank = tr.get_context().get_world_rank()
    mode = getattr(tr.CheckpointUploadMode, config.get("mode", "SYNC"))
    for step, loss in enumerate(config["losses"]):
        kwargs: dict[str, Any] = {}
        if config.get("validate") and rank == 0:
            kwargs["validation"] = True
        tr.report(
            {"step": step, "loss": loss},
            checkpoint=_save(step) if rank == 0 else None,
            checkpoint_upload_mode=mode,
            **kwargs,
        )
    consistency = getattr(tr.CheckpointConsistencyMode, config.get("consistency", "VALIDATED"))
    reported = tr.get_all_reported_checkpoints(consistency, timeout_s=config.get("timeout_s"))
    if rank == 0:
        _append(
            config["log"],
            [[_step_of(r.checkpoint), r.metrics, r.status.value] for r in reported],
        )


def slow_validate(checkpoint: tr.Checkpoint, delay_s: float = 0.0) -> dict[str, Any]:
    """A validation taking ``delay_s`` seconds; scores the checkpoint's step."""
    time.sleep(delay_s)
    step = _step_of(checkpoint)
    assert step is not None
    return {"val": float(step)}


def copy_upload(checkpoint: tr.Checkpoint, checkpoint_dir_name: str) -> tr.Checkpoint:
    """A ``checkpoint_upload_fn`` that stores the folder itself (local or a custom filesystem)."""
    storage = tr.get_context().get_storage()
    dest = storage.build_checkpoint_path_from_name(checkpoint_dir_name)
    if storage.custom_filesystem is None and "://" not in dest:
        shutil.copytree(checkpoint.path, dest, dirs_exist_ok=True)
        return tr.Checkpoint(dest)
    import pyarrow.fs

    fs = storage.storage_filesystem
    pyarrow.fs.copy_files(checkpoint.path, dest, destination_filesystem=fs)
    return tr.Checkpoint(dest, filesystem=fs)


def upload_fn_train(config: dict[str, Any]) -> None:
    """Report ``steps`` checkpoints stored by ``copy_upload``; log what report() left."""
    rank = tr.get_context().get_world_rank()
    mode = getattr(tr.CheckpointUploadMode, config.get("mode", "SYNC"))
    sources = []
    for step in range(config["steps"]):
        checkpoint = _save(step)
        sources.append(checkpoint.path)
        tr.report(
            {"step": step},
            checkpoint=checkpoint,
            checkpoint_upload_mode=mode,
            checkpoint_upload_fn=copy_upload,
            delete_local_checkpoint_after_upload=config.get("delete"),
        )
    tr.get_all_reported_checkpoints(tr.CheckpointConsistencyMode.COMMITTED)
    if rank == 0:
        _append(
            config["log"],
            {
                "latest": _step_of(tr.get_checkpoint()),
                "sources_left": [Path(p).exists() for p in sources],
            },
        )


def placement_probe(config: dict[str, Any]) -> None:
    """Write where this worker runs, the Ray resources it holds and its TPU/JAX environment
    (no trainer API used, so Ray Train's trainers can run it too)."""
    import os

    import ray

    ctx = ray.get_runtime_context()
    record = {
        "node_id": ctx.get_node_id(),
        "resources": ctx.get_assigned_resources(),
        "env": {
            k: v
            for k, v in os.environ.items()
            if k.startswith(("TPU_", "JAX_PLATFORMS", "MEGASCALE_"))
            or k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")
        },
    }
    Path(config["out"]).write_text(json.dumps(record))


def returning_train(config: dict[str, Any]) -> Any:
    """Reports a metric with a tuple, then returns a value naming its rank (Ray Train's
    ``Result.return_value`` is rank 0's); with ``tensor``, returns a torch tensor (Ray refuses
    it); with ``marker``, rank 0 fails once first (the value comes from the attempt that
    succeeded)."""
    rank = tr.get_context().get_world_rank()
    marker = config.get("marker")
    if marker and rank == 0 and not Path(marker).exists():
        Path(marker).write_text("x")
        raise KeyError("once")
    tr.report({"pair": (rank, "x")})
    if config.get("tensor"):
        import torch

        return {"weights": [torch.zeros(2)]}
    return {"rank": rank, "pair": (1, 2), "attempt": bool(marker)}
