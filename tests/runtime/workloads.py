"""Train functions used by the runtime tests (importable by Ray workers by module name).

``counting_train`` is a resumable step loop: each rank writes its own shard
file into the checkpoint, so a resumed run can be checked rank by rank. It
appends one line per (attempt, rank) start to ``config["log"]`` so tests can
see where each attempt resumed.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

import trainer_runtime as tr
from trainer_runtime import Checkpoint


def _log(config: dict[str, Any], **fields: Any) -> None:
    if config.get("log"):
        with open(config["log"], "a") as fh:
            fh.write(json.dumps(fields) + "\n")


def read_log(path: str | Path) -> list[dict[str, Any]]:
    """The lines ``counting_train`` logged."""
    p = Path(path)
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line]


def report_with_checkpoint(metrics: dict[str, Any]) -> None:
    """``tr.report(metrics)`` with a one-file checkpoint from rank 0, so that rank 0's
    ``metrics`` become ``Result.metrics``: as in Ray Train 2.60, a Result carries the latest
    checkpoint's metrics, not those of a metrics-only report."""
    checkpoint = None
    if tr.get_context().get_world_rank() == 0:
        folder = Path(tempfile.mkdtemp(prefix="ckpt_"))
        (folder / "metrics.json").write_text(json.dumps(metrics))
        checkpoint = Checkpoint.from_directory(folder)
    tr.report(metrics, checkpoint=checkpoint)


def counting_train(config: dict[str, Any]) -> None:
    """Count steps ``0..steps-1``, checkpointing every ``ckpt_every`` steps (all ranks)."""
    ctx = tr.get_context()
    rank = ctx.get_world_rank()
    start = 0
    ckpt = tr.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as folder:
            shard = json.loads((Path(folder) / f"rank_{rank}.json").read_text())
        start = shard["step"] + 1
    _log(
        config,
        event="start",
        rank=rank,
        attempt=ctx.attempt,
        start=start,
        pid=os.getpid(),
        world_size=ctx.get_world_size(),
        local_rank=ctx.get_local_rank(),
        node_rank=ctx.get_node_rank(),
        name=ctx.get_experiment_name(),
        checkpoint=ckpt.path if ckpt else None,
    )
    if config.get("pid_dir"):
        Path(config["pid_dir"], f"rank_{rank}_attempt_{ctx.attempt}").write_text(str(os.getpid()))
    fail = config.get("fail")
    for step in range(start, config["steps"]):
        if (
            fail
            and fail["rank"] == rank
            and fail["step"] == step
            and ctx.attempt in fail.get("attempts", [0])
        ):
            raise RuntimeError(f"injected failure at step {step}")
        time.sleep(config.get("sleep", 0.0))
        metrics = {"step": step, "loss": 1.0 / (step + 1), "rank": rank}
        checkpoint = None
        if (step + 1) % config.get("ckpt_every", 1) == 0:
            folder = Path(tempfile.mkdtemp(prefix="ckpt_"))
            (folder / f"rank_{rank}.json").write_text(json.dumps({"step": step}))
            if config.get("payload_bytes"):
                (folder / f"payload_{rank}.bin").write_bytes(os.urandom(config["payload_bytes"]))
            checkpoint = Checkpoint.from_directory(folder)
        tr.report(
            metrics, checkpoint=checkpoint, checkpoint_upload_mode=config.get("mode", "async")
        )
    _log(config, event="end", rank=rank, attempt=ctx.attempt)


def rendezvous_env_train() -> None:
    """Report every rank's view of the process group and the env:// variables (rank 0's
    report, with a checkpoint: ``Result.metrics``)."""
    import torch.distributed as dist

    mine = {
        "master": (os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")),
        "rank": (dist.get_rank(), int(os.environ["RANK"])),
        "world": (dist.get_world_size(), int(os.environ["WORLD_SIZE"])),
        "backend": dist.get_backend(),
    }
    views: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(views, mine)
    report_with_checkpoint({"views": views})


def ddp_train(config: dict[str, Any]) -> None:
    """A real DDP regression: parameters must stay identical across ranks."""
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, TensorDataset

    from trainer_runtime.torch import prepare_data_loader, prepare_model

    torch.manual_seed(0)
    x = torch.randn(256, 8)
    y = x @ torch.arange(8, dtype=torch.float32).unsqueeze(1) + 0.5
    loader = prepare_data_loader(DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True))
    torch.manual_seed(tr.get_context().get_world_rank())  # different init per rank: DDP syncs
    model = prepare_model(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    seen = 0
    for epoch in range(config.get("epochs", 3)):
        total = 0.0
        for xb, yb in loader:
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item()
            seen += len(xb)
        flat = torch.cat([p.detach().flatten() for p in model.parameters()])
        gathered = [torch.zeros_like(flat) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, flat)
        in_sync = all(torch.allclose(gathered[0], g) for g in gathered)
        folder = Path(tempfile.mkdtemp())
        if tr.get_context().get_world_rank() == 0:
            torch.save(model.state_dict(), folder / "model.pt")
        tr.report(
            {
                "epoch": epoch,
                "loss": total / len(loader),
                "in_sync": in_sync,
                "samples_seen": seen,
                "ddp": type(model).__name__,
            },
            checkpoint=Checkpoint.from_directory(folder)
            if tr.get_context().get_world_rank() == 0
            else None,
            checkpoint_upload_mode="async",
        )


def uneven_reports() -> None:
    """Rank 1 reports one more time than rank 0 (a user bug the controller must name)."""
    tr.report({"x": 0})
    if tr.get_context().get_world_rank() == 1:
        tr.report({"x": 1})


def mismatched_checkpoint_names() -> None:
    """Ranks give different checkpoint folder names in one round."""
    folder = Path(tempfile.mkdtemp())
    (folder / "f").write_text("x")
    rank = tr.get_context().get_world_rank()
    tr.report(
        {"x": 0},
        checkpoint=Checkpoint.from_directory(folder),
        checkpoint_dir_name=f"ckpt_rank{rank}",
    )


def score_validation(checkpoint: Checkpoint, config: dict[str, Any]) -> dict[str, Any]:
    """A validate_fn: val_loss is smallest at ``best_step``; logs start/end for overlap checks."""
    with checkpoint.as_directory() as folder:
        step = json.loads((Path(folder) / "rank_0.json").read_text())["step"]
    node_id = None
    try:
        import ray

        if ray.is_initialized():
            node_id = ray.get_runtime_context().get_node_id()
    except ImportError:  # pragma: no cover
        pass
    start = time.time()
    if step in config.get("hang_on", []):
        time.sleep(600)
    time.sleep(config.get("sleep_steps", {}).get(step, config.get("sleep", 0.0)))
    if step in config.get("fail_on", []):
        raise ValueError(f"validation data for step {step} is corrupt")
    if config.get("log"):
        with open(config["log"], "a") as fh:
            fh.write(
                json.dumps(
                    {
                        "step": step,
                        "start": start,
                        "end": time.time(),
                        "node_id": node_id,
                        "pid": os.getpid(),
                        "path": checkpoint.path,
                    }
                )
                + "\n"
            )
    val_loss = float(abs(step - config.get("best_step", 0)))
    metrics = {"val_loss": val_loss, "val_step": step, "node_id": node_id}
    if config.get("as_loss"):
        metrics["loss"] = val_loss  # also a training metric's name: the validation's value wins
    return metrics


@ray.remote(num_cpus=0)
def score_shard(path: str, shard: int, log: str) -> float:
    """One shard of ``fanout_validation``; logs the node it ran on."""
    with open(log, "a") as fh:
        node_id = ray.get_runtime_context().get_node_id()
        fh.write(json.dumps({"shard": shard, "node_id": node_id}) + "\n")
    step = json.loads((Path(path) / "rank_0.json").read_text())["step"]
    return float(step + shard)


def fanout_validation(checkpoint: Checkpoint, config: dict[str, Any]) -> dict[str, Any]:
    """The README's fan-out pattern: shards with no Ray resources, pinned to this node."""
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    shard_task = score_shard.options(scheduling_strategy=here)
    losses = ray.get(
        [shard_task.remote(checkpoint.path, i, config["log"]) for i in range(config["shards"])]
    )
    return {"val_loss": sum(losses) / len(losses)}


VALIDATE_FNS = {"score_validation": score_validation, "fanout_validation": fanout_validation}


def validating_train(config: dict[str, Any]) -> None:
    """Report a checkpoint every step, validated by ``config["validate_fn"]``.

    The validate_fn (``score_validation`` by default) is passed to ``report()`` at the
    steps in ``config["per_report_steps"]`` (default: every step); at the other steps
    ``report()`` gets none, so the run-level ``ValidationConfig.validate_fn`` applies.
    """
    rank = tr.get_context().get_world_rank()
    validate_fn = VALIDATE_FNS[config.get("validate_fn", "score_validation")]
    per_report = config.get("per_report_steps")
    for step in range(config["steps"]):
        folder = Path(tempfile.mkdtemp(prefix="ckpt_"))
        (folder / f"rank_{rank}.json").write_text(json.dumps({"step": step}))
        own = per_report is None or step in per_report
        tr.report(
            {"step": step, "loss": 1.0 / (step + 1)},
            checkpoint=Checkpoint.from_directory(folder),
            checkpoint_upload_mode="async",
            validate_fn=validate_fn if own else None,
            validate_config=config.get("validate") if own else None,
        )
        time.sleep(config.get("sleep", 0.0))


def bad_report_train(config: dict[str, Any]) -> None:
    """Log that it ran, then call report() with a tensor metric (a ReportError)."""
    import torch

    ctx = tr.get_context()
    _log(config, event="start", rank=ctx.get_world_rank(), attempt=ctx.attempt)
    tr.report({"loss": torch.tensor(0.5)})


def max_overlap(entries: list[dict[str, Any]]) -> int:
    """The largest number of [start, end] intervals that overlap at one time."""
    points = sorted([(e["start"], 1) for e in entries] + [(e["end"], -1) for e in entries])
    best = current = 0
    for _, delta in points:
        current += delta
        best = max(best, current)
    return best
