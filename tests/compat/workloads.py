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

    ``losses`` gives the ``loss`` metric per step; ``mode`` the upload mode (``modes``: one
    per step, taking turns); ``validation`` ``"default"``/``"task"`` validates each checkpoint
    (``"mixed"``: the two take turns, the default on even steps); ``fail_at``
    raises on rank 0 at that step while ``fail_marker`` does not exist yet (creating it, so
    the next attempt passes); ``always_fail`` raises ZeroDivisionError on rank 0 at step 1;
    ``log`` collects what ``get_checkpoint()`` returned on rank 0 at the start and after each
    report (a line per attempt, the failed one's too).
    """
    train = api(config)
    ctx = train.get_context()
    rank = ctx.get_world_rank()
    start = read_step(train.get_checkpoint())
    seen = [start]
    first = 0 if start is None else start + 1
    modes = config.get("modes") or [config.get("mode", "SYNC")]
    for step in range(first, int(config["steps"])):
        mode = getattr(train.CheckpointUploadMode, modes[step % len(modes)])
        if config.get("always_fail") and step == 1 and rank == 0:
            raise ZeroDivisionError("the user's bug")
        marker = config.get("fail_marker")
        if rank == 0 and step == config.get("fail_at") and marker and not os.path.exists(marker):
            Path(marker).write_text("failed once")
            if config.get("log"):  # what get_checkpoint() returned until the failure
                _step_log(config, seen)
            # Fail only once the checkpoints reported so far are registered (Ray Train's
            # controller takes them in asynchronously: under load a failure could otherwise
            # outrun the registration and the retry would start from scratch).
            train.get_all_reported_checkpoints()
            raise RuntimeError(f"injected failure at step {step}")
        shards = bool(config.get("shards"))
        checkpoint = None
        if rank == 0 or shards:
            checkpoint = train.Checkpoint.from_directory(_save(step, rank, shards))
        metrics: dict[str, Any] = {"step": step}
        if "losses" in config:
            metrics["loss"] = config["losses"][step]
        kwargs: dict[str, Any] = {}
        how = config.get("validation")
        if how == "mixed":
            how = "default" if step % 2 == 0 else "task"
        if how and checkpoint is not None:
            kwargs["validation"] = (
                train.ValidationTaskConfig(fn_kwargs={"offset": step}) if how == "task" else True
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
        _step_log(config, seen)


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


def _step_log(config: dict[str, Any], record: Any) -> None:
    with open(config["log"], "a") as fh:
        fh.write(json.dumps(record) + "\n")


def upload_fn_train(config: dict[str, Any]) -> None:
    """Rank 0 reports ``steps`` checkpoints per case of ``cases`` (``[mode, upload_fn,
    delete]``: the report's ``checkpoint_upload_mode``, whether a ``checkpoint_upload_fn``
    stores it or the runtime does, and ``delete_local_checkpoint_after_upload``, None for the
    default), one case after another in one run; logs per case what ``get_checkpoint()``
    returned after each report and which reported folders were left on disk. Without
    ``cases``, one case from ``mode``/``upload_fn``/``delete``."""
    train = api(config)
    rank = train.get_context().get_world_rank()
    cases = config.get("cases") or [
        [config.get("mode", "SYNC"), config.get("upload_fn", False), config.get("delete")]
    ]

    def upload(checkpoint: Any, checkpoint_dir_name: str) -> Any:
        import pyarrow.fs

        storage = train.get_context().get_storage()
        dest = storage.build_checkpoint_path_from_name(checkpoint_dir_name)
        if config.get("bad_upload"):
            return checkpoint  # left where it was: outside the run folder
        storage.storage_filesystem.create_dir(dest)  # as Ray's own upload does
        pyarrow.fs.copy_files(
            checkpoint.path, dest, destination_filesystem=storage.storage_filesystem
        )
        return train.Checkpoint(dest)

    logs: list[dict[str, Any]] = []
    step = 0
    for mode_name, upload_fn, delete in cases:
        mode = getattr(train.CheckpointUploadMode, mode_name)
        seen, sources = [], []
        for _ in range(int(config["steps"])):
            checkpoint = None
            if rank == 0:
                checkpoint = train.Checkpoint.from_directory(_save(step, rank, False))
                sources.append(checkpoint.path)
            kwargs: dict[str, Any] = {}
            if delete is not None:
                kwargs["delete_local_checkpoint_after_upload"] = delete
            train.report(
                {"step": step},
                checkpoint=checkpoint,
                checkpoint_upload_mode=mode,
                checkpoint_upload_fn=upload if upload_fn else None,
                **kwargs,
            )
            seen.append(read_step(train.get_checkpoint()) if rank == 0 else None)
            step += 1
        logs.append({"seen": seen, "sources": sources})
    train.get_all_reported_checkpoints(train.CheckpointConsistencyMode.COMMITTED)
    if rank == 0:
        for log in logs:
            left = [os.path.exists(p) for p in log["sources"]]
            _step_log(config, {"seen": log["seen"], "sources_left": left})


def reported_train(config: dict[str, Any]) -> None:
    """Report ``losses`` (rank 0 with a checkpoint, validated at the steps ``validate_steps``
    lists); then rank 0 logs ``get_all_reported_checkpoints()``: step, metrics and status of
    each, in order."""
    train = api(config)
    rank = train.get_context().get_world_rank()
    for step, loss in enumerate(config["losses"]):
        checkpoint = None
        kwargs: dict[str, Any] = {}
        if rank == 0:
            checkpoint = train.Checkpoint.from_directory(_save(step, rank, False))
            if step in config.get("validate_steps", ()):
                kwargs["validation"] = True
        train.report({"step": step, "loss": loss}, checkpoint=checkpoint, **kwargs)
    mode = getattr(train.CheckpointConsistencyMode, config.get("consistency", "VALIDATED"))
    reported = train.get_all_reported_checkpoints(consistency_mode=mode)
    if rank == 0:
        _step_log(
            config,
            [
                [read_step(r.checkpoint), dict(sorted(r.metrics.items())), r.status.value]
                for r in reported
            ],
        )


def collective_train(config: dict[str, Any]) -> None:
    """Every rank logs what ``broadcast_from_rank_zero`` gave it, around a ``barrier()``."""
    if config["api"] == "ray.train":
        from ray.train import collective
    else:
        from trainer_runtime import collective  # type: ignore[no-redef]
    train = api(config)
    rank = train.get_context().get_world_rank()
    got = collective.broadcast_from_rank_zero({"lr": 0.1, "from": rank})
    collective.barrier()
    again = collective.broadcast_from_rank_zero(rank * 10)
    _step_log(config, {"rank": rank, "got": got, "again": again})
    train.report({"rank": rank, "got": got["from"]})


class _Recording:
    """The body of a ``UserCallback`` that appends what it sees to a file (the callback runs
    in Ray Train's controller actor, so it cannot keep it in memory for the test)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def _write(self, record: Any) -> None:
        with open(self.path, "a") as fh:
            fh.write(json.dumps(record) + "\n")

    def after_report(self, run_context: Any, metrics: Any, checkpoint: Any) -> None:
        self._write(["after_report", metrics, read_step(checkpoint)])

    def after_exception(self, run_context: Any, worker_exceptions: Any) -> None:
        self._write(
            ["after_exception", {str(k): type(v).__name__ for k, v in worker_exceptions.items()}]
        )


def recording_callback(name: str, path: str) -> Any:
    """A ``UserCallback`` of API ``name`` that records its hooks in ``path``."""
    base = api({"api": name}).UserCallback
    return type("RecordingCallback", (_Recording, base), {})(path)


def jax_train(config: dict[str, Any]) -> None:
    """A JAX computation per rank; rank 0 reports its result with a checkpoint."""
    import jax.numpy as jnp

    train = api(config)
    rank = train.get_context().get_world_rank()
    for step in range(2):
        value = float(jnp.arange(4.0).sum() * (step + 1))
        checkpoint = None
        if rank == 0:
            checkpoint = train.Checkpoint.from_directory(_save(step, rank, False))
        train.report({"step": step, "value": value}, checkpoint=checkpoint)


def preemptible_train(config: dict[str, Any]) -> None:
    """Steps until told of a preemption (``get_preemption_info()`` every step, on every
    rank), then saves one checkpoint (rank 0's) and steps on. Rank 1 writes its Ray node to
    ``ready_file`` after two steps (the scenario then drains that node). Started from a
    checkpoint it reports where it starts, writes its node and that step to
    ``<resumed_dir>/rank<N>`` (JSON) and returns.

    ``told_file``: rank 1 hangs once it wrote ``ready_file`` (a worker stuck, then reclaimed,
    before its next collective); a rank told of the preemption writes its node to
    ``told_file`` and waits ``survivor_delay_s`` (the scenario removes rank 1's node
    meanwhile) before reporting the checkpoint."""
    import time

    import ray

    train = api(config)
    rank = train.get_context().get_world_rank()
    node = ray.get_runtime_context().get_node_id()
    checkpoint = train.get_checkpoint()
    if checkpoint is not None:
        start = int(read_step(checkpoint) or 0) + 1
        resumed = {"node": node, "start": start}
        (Path(config["resumed_dir"]) / f"rank{rank}").write_text(json.dumps(resumed))
        train.report({"start": start})
        return
    saved = False
    for step in range(1_000_000):
        info = train.get_preemption_info()
        if info is not None and not saved:
            if config.get("told_file"):
                Path(config["told_file"]).write_text(node)
                time.sleep(config["survivor_delay_s"])
            folder = _save(step, rank, shards=False)
            train.report(
                {"step": step, "preempted_ranks": list(info.preempted_ranks)},
                checkpoint=train.Checkpoint.from_directory(folder) if rank == 0 else None,
            )
            saved = True
            continue
        if step == 2 and rank == 1:
            Path(config["ready_file"]).write_text(node)
            if config.get("told_file"):
                time.sleep(3600)
        train.report({"step": step})
        time.sleep(0.05)


def data_draw(row: dict[str, Any]) -> dict[str, Any]:
    """A Ray Data ``map`` that draws a random number per row: a dataset executed again (the
    next epoch) draws other numbers."""
    import random

    return {"id": row["id"], "draw": random.random()}


def data_train(config: dict[str, Any]) -> None:
    """Ray Data ingestion: ``epochs`` passes over this rank's ``train`` shard and over its
    ``valid`` shard; with ``fail_once`` (the default) every rank fails once after its first
    epoch (a new worker group gets a new split). Logs what each rank read, the shards' types
    and the ``DataContext`` it sees."""
    from ray.data import DataContext

    train = api(config)
    rank = train.get_context().get_world_rank()
    marker = Path(config["fail_dir"]) / str(rank)
    first_attempt = config.get("fail_once", True) and not marker.exists()
    for epoch in range(config["epochs"]):
        shard = train.get_dataset_shard("train")
        valid = train.get_dataset_shard("valid")
        rows = list(shard.iter_rows())
        valid_ids = [int(i) for batch in valid.iter_batches(batch_size=4) for i in batch["id"]]
        _step_log(
            config,
            {
                "rank": rank,
                "first_attempt": first_attempt,
                "epoch": epoch,
                "ids": sorted(int(r["id"]) for r in rows),
                "draws": sorted(float(r["draw"]) for r in rows),
                "valid": sorted(valid_ids),
                "types": [type(shard).__name__, type(valid).__name__],
                "context": DataContext.get_current().get_config("compat_marker", None),
            },
        )
        train.report({"epoch": epoch, "rows": len(rows)})
        if first_attempt:
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text("failed once")
            raise RuntimeError(f"rank {rank} fails once after its first epoch")


def shared_names_train(config: dict[str, Any]) -> dict[str, Any]:
    """Checkpoint shapes of Ray Train's own tests, then a return value: every rank writes its
    shard and an identical ``checkpoint.pkl`` into its own folder, reported under one
    ``checkpoint_dir_name`` (the shards merge into it); every rank writes its shard
    into one folder of this machine (``config["shared"]``) and reports it; every rank reports
    an empty folder. Returns a value naming the rank (``Result.return_value``: rank 0's)."""
    train = api(config)
    rank = train.get_context().get_world_rank()
    own = Path(tempfile.mkdtemp(prefix="compat_"))
    (own / f"shard_{rank}.txt").write_text(f"0:{rank}")
    (own / "checkpoint.pkl").write_bytes(b"the same on every rank" * 50)
    train.report(
        {"step": 0},
        checkpoint=train.Checkpoint.from_directory(str(own)),
        checkpoint_dir_name="ckpt_shards",
    )
    shared = Path(config["shared"])
    shared.mkdir(parents=True, exist_ok=True)
    aside = own.parent / f"{own.name}.shard_{rank}.txt"  # renamed in whole (see faults/)
    aside.write_text(f"1:{rank}")
    os.replace(aside, shared / f"shard_{rank}.txt")
    train.report({"step": 1}, checkpoint=train.Checkpoint.from_directory(str(shared)))
    empty = tempfile.mkdtemp(prefix="compat_")
    train.report({"step": 2}, checkpoint=train.Checkpoint.from_directory(empty))
    return {"rank": rank, "answer": [42, "x"]}


def world_size_train(config: dict[str, Any]) -> None:
    """One report with a checkpoint from rank 0: the group's size and the ranks that ran."""
    train = api(config)
    ctx = train.get_context()
    rank = ctx.get_world_rank()
    checkpoint = train.Checkpoint.from_directory(_save(0, rank, False)) if rank == 0 else None
    train.report({"world_size": ctx.get_world_size(), "rank": rank}, checkpoint=checkpoint)
