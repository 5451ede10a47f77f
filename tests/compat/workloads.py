"""User train functions for the differential tests: each runs unchanged under ``ray.train``
2.60 and under ``trainer_runtime``; ``config["api"]`` picks the import, nothing else differs.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any


def api(config: dict[str, Any]) -> ModuleType:
    """``ray.train`` or ``trainer_runtime``: the only line that differs between the two."""
    if config["api"] == "ray.train":
        import ray.train

        return ray.train
    import trainer_runtime

    return trainer_runtime


def read_step(checkpoint: Any) -> int | None:
    """The step a checkpoint of these workloads was saved at (None for no checkpoint)."""
    if checkpoint is None:
        return None
    with checkpoint.as_directory() as folder:
        return int(json.loads((Path(folder) / "state.json").read_text())["step"])


def _save(step: int, rank: int, shards: bool) -> str:
    folder = tempfile.mkdtemp(prefix="compat_")
    if rank == 0:
        (Path(folder) / "state.json").write_text(json.dumps({"step": step}))
    if shards:
        (Path(folder) / f"shard_{rank}.txt").write_text(f"{step}:{rank}")
    return folder


def steps_train(config: dict[str, Any]) -> None:
    """Report ``steps`` steps with a checkpoint each (rank 0, or every rank with ``shards``).

    ``losses`` gives the ``loss`` metric per step; ``mode`` the upload mode; ``fail_at``
    raises on rank 0 at that step while ``fail_marker`` does not exist yet (creating it, so
    the next attempt passes); ``always_fail`` raises ZeroDivisionError on rank 0 at step 1;
    ``log`` collects what ``get_checkpoint()`` returned on rank 0 at the start and after each
    report.
    """
    train = api(config)
    ctx = train.get_context()
    rank = ctx.get_world_rank()
    start = read_step(train.get_checkpoint())
    seen = [start]
    first = 0 if start is None else start + 1
    mode = getattr(train.CheckpointUploadMode, config.get("mode", "SYNC"))
    for step in range(first, int(config["steps"])):
        if config.get("always_fail") and step == 1 and rank == 0:
            raise ZeroDivisionError("the user's bug")
        marker = config.get("fail_marker")
        if rank == 0 and step == config.get("fail_at") and marker and not os.path.exists(marker):
            Path(marker).write_text("failed once")
            raise RuntimeError(f"injected failure at step {step}")
        shards = bool(config.get("shards"))
        checkpoint = None
        if rank == 0 or shards:
            checkpoint = train.Checkpoint.from_directory(_save(step, rank, shards))
        metrics: dict[str, Any] = {"step": step}
        if "losses" in config:
            metrics["loss"] = config["losses"][step]
        kwargs: dict[str, Any] = {}
        if config.get("validation") and checkpoint is not None:
            kwargs["validation"] = (
                train.ValidationTaskConfig(fn_kwargs={"offset": step})
                if config["validation"] == "task"
                else True
            )
        train.report(
            metrics,
            checkpoint=checkpoint,
            checkpoint_dir_name=f"ckpt_{step:03d}" if shards else None,
            checkpoint_upload_mode=mode,
            **kwargs,
        )
        latest = train.get_checkpoint()
        if rank == 0:  # other ranks' shards may still be on their way
            seen.append(read_step(latest))
    if config.get("log") and rank == 0:
        with open(config["log"], "a") as fh:
            fh.write(json.dumps(seen) + "\n")


def validate(checkpoint: Any, offset: int = 0, scale: float = 1.0) -> dict[str, Any]:
    """A Ray 2.60 validation function: ``fn(checkpoint, **fn_kwargs)``."""
    step = read_step(checkpoint)
    assert step is not None
    return {"val_score": scale * (step + offset)}


def validation_without_config(config: dict[str, Any]) -> None:
    """Asks for a validation although the trainer has no ``validation_config``."""
    train = api(config)
    folder = _save(0, 0, False)
    train.report({"step": 0}, checkpoint=train.Checkpoint.from_directory(folder), validation=True)
