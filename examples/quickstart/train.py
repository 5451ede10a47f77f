"""The quickstart model: a small MLP classifying two interleaved spirals, trained with DDP.

Used by ``examples/quickstart.yaml`` (``trainjob run``) and ``examples/torch_quickstart.py``
(the Python API). Resumable: a restarted run continues from the latest checkpoint.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import trainer_runtime as tr
from trainer_runtime import Checkpoint
from trainer_runtime.torch import get_device, prepare_data_loader, prepare_model


def make_spirals(n: int, seed: int) -> TensorDataset:
    """Two interleaved spirals with a little noise: a task a linear model cannot solve."""
    g = torch.Generator().manual_seed(seed)
    t = torch.rand(n, generator=g) * 3 * math.pi + 0.5
    label = torch.randint(0, 2, (n,), generator=g)
    angle = t + label * math.pi
    x = torch.stack([t * torch.cos(angle), t * torch.sin(angle)], dim=1) / 10
    x = x + 0.02 * torch.randn(n, 2, generator=g)
    return TensorDataset(x, label)


def make_model() -> nn.Module:
    """A 2-64-64-2 MLP."""
    return nn.Sequential(
        nn.Linear(2, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2)
    )


def train_func(config: dict[str, Any]) -> None:
    """Train for ``config['epochs']`` epochs; checkpoint and validate after every epoch.

    On a preemption notice (checked every ``preemption_check_every`` batches, default 10) it
    checkpoints at once; the runtime then stops it, and the resumed run repeats that epoch
    from those weights.
    """
    batch_size = int(config.get("batch_size", 64))
    loader = prepare_data_loader(
        DataLoader(make_spirals(8192, seed=0), batch_size=batch_size, shuffle=True)
    )
    _train(config, lambda: loader, dict)


def build_datasets(config: dict[str, Any]) -> dict[str, Any]:
    """The training spirals as a Ray Data dataset, ``{"train": ...}``: a TrainJob's
    ``spec.data.datasets`` (called on the driver). A ``map_batches`` step tags every row with
    the Ray node that ran it (``node``, 12 characters), so a run can show where its data work
    ran (in a TrainJob: the data pool's nodes)."""
    import ray

    data = make_spirals(int(config.get("samples", 8192)), seed=0)
    features, labels = data.tensors[0].numpy(), data.tensors[1].numpy()
    rows = [{"x": features[i], "y": int(labels[i])} for i in range(len(labels))]
    blocks = int(config.get("data_blocks", 4))
    dataset = ray.data.from_items(rows, override_num_blocks=blocks)
    return {"train": dataset.map_batches(_tag_with_node, batch_size=None)}


def _tag_with_node(batch: dict[str, Any]) -> dict[str, Any]:
    import numpy as np
    import ray

    node = ray.get_runtime_context().get_node_id()[:12]
    batch["node"] = np.array([node] * len(batch["y"]))
    return batch


def train_func_on_datasets(config: dict[str, Any]) -> None:
    """:func:`train_func` reading its batches from ``get_dataset_shard("train")`` (the
    datasets of :func:`build_datasets`, streamed to each worker by Ray Data) instead of a
    DataLoader. Each report also carries ``ingest_nodes``, the Ray nodes that ran the
    ``map_batches`` of the rows this rank read, and ``data_pool_nodes``, the alive Ray nodes
    labelled ``trainjob.dev/pool=data``."""
    import numpy as np
    import ray

    batch_size = int(config.get("batch_size", 64))
    shard = tr.get_dataset_shard("train")
    seen: set[str] = set()

    def batches() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for batch in shard.iter_batches(batch_size=batch_size, batch_format="numpy"):
            seen.update(str(node) for node in batch["node"])
            x = torch.as_tensor(np.stack(batch["x"]), dtype=torch.float32)
            yield x, torch.as_tensor(batch["y"], dtype=torch.long)

    def where() -> dict[str, Any]:
        pool = [
            node["NodeID"][:12]
            for node in ray.nodes()
            if node["Alive"] and (node.get("Labels") or {}).get("trainjob.dev/pool") == "data"
        ]
        return {"ingest_nodes": sorted(seen), "data_pool_nodes": sorted(pool)}

    _train(config, batches, where)


def _train(
    config: dict[str, Any],
    epoch_batches: Callable[[], Iterable[tuple[torch.Tensor, torch.Tensor]]],
    more_metrics: Callable[[], dict[str, Any]],
) -> None:
    """The training loop of :func:`train_func`: ``epoch_batches()`` gives one epoch's
    ``(x, y)`` batches; ``more_metrics()`` is added to each epoch's report."""
    epochs = int(config.get("epochs", 3))
    lr = float(config.get("lr", 0.05))
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr / 10)
    start_epoch = 0
    checkpoint = tr.get_checkpoint()
    if checkpoint is not None:  # resume
        with checkpoint.as_directory() as folder:
            state = torch.load(Path(folder) / "state.pt", map_location="cpu")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start_epoch = state["epoch"] + 1
    model = prepare_model(model)
    rank = tr.get_context().get_world_rank()
    preempt_every = int(config.get("preemption_check_every", 10))
    preempted = False
    for epoch in range(start_epoch, epochs):
        total, count = 0.0, 0
        for batch, (x, y) in enumerate(epoch_batches()):
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item() * len(x)
            count += len(x)
            # A preemption notice (spot reclaim, node drain, TPU maintenance): save the
            # weights now and report them; the runtime stops the workers once that
            # checkpoint is committed, and the next run repeats this epoch from these
            # weights. Every rank calls get_preemption_info() at the same batches (it is a
            # collective) and gets the same answer.
            if (
                not preempted
                and (batch + 1) % preempt_every == 0
                and tr.get_preemption_info() is not None
            ):
                tr.report(
                    {"epoch": epoch - 1, "train_loss": total / count, "preempted": True},
                    checkpoint=_save(model, optimizer, epoch - 1, rank),
                )
                preempted = True
        # Upload mode and validation come from the run's configuration (the TrainJob's
        # spec.checkpoint.uploadMode and spec.validation), so this call stays the same
        # everywhere; pass checkpoint_upload_mode=/validate_fn= here to override them.
        tr.report(
            {"epoch": epoch, "train_loss": total / max(count, 1), **more_metrics()},
            checkpoint=_save(model, optimizer, epoch, rank),
        )


def _save(
    model: nn.Module, optimizer: torch.optim.Optimizer, epoch: int, rank: int
) -> Checkpoint | None:
    """Rank 0's checkpoint of the weights and optimizer after ``epoch`` (None elsewhere: one
    copy of the weights; every rank still calls report())."""
    if rank != 0:
        return None
    folder = Path(tempfile.mkdtemp(prefix="quickstart_"))
    module = model.module if hasattr(model, "module") else model
    torch.save(
        {"model": module.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch},
        folder / "state.pt",
    )
    return Checkpoint.from_directory(folder)


def validate_func(checkpoint: Checkpoint, config: dict[str, Any]) -> dict[str, Any]:
    """Score a committed checkpoint on held-out spirals: ``val_loss`` and ``val_accuracy``."""
    data = make_spirals(int(config.get("samples", 2048)), seed=1)
    model = make_model()
    with checkpoint.as_directory() as folder:
        state = torch.load(Path(folder) / "state.pt", map_location="cpu")
    model.load_state_dict(state["model"])
    model.to(get_device()).eval()
    with torch.no_grad():
        logits = model(data.tensors[0])
        loss = nn.functional.cross_entropy(logits, data.tensors[1]).item()
        accuracy = (logits.argmax(1) == data.tensors[1]).float().mean().item()
    return {"val_loss": loss, "val_accuracy": accuracy}


def _score_batch(batch: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
    """One Ray Data batch scored with the checkpoint's weights: summed loss, correct count,
    size, and the Ray node it ran on."""
    import numpy as np
    import ray

    model = make_model()
    model.load_state_dict(state)
    model.eval()
    x = torch.as_tensor(np.stack(batch["x"]), dtype=torch.float32)
    y = torch.as_tensor(batch["y"], dtype=torch.long)
    with torch.no_grad():
        logits = model(x)
        loss = nn.functional.cross_entropy(logits, y, reduction="sum").item()
        correct = int((logits.argmax(1) == y).sum().item())
    node = ray.get_runtime_context().get_node_id()
    return {"loss": [loss], "correct": [correct], "n": [len(y)], "node": [node]}


def validate_with_ray_data(checkpoint: Checkpoint, config: dict[str, Any]) -> dict[str, Any]:
    """:func:`validate_func`'s scores, computed with Ray Data: the held-out spirals as a
    dataset, scored in batches by ``map_batches`` tasks (``config['val_blocks']`` blocks,
    default 4).

    In a TrainJob the validation runs on the validation pool and the Ray Data tasks it starts
    land on the pool's nodes too: those are the only Ray nodes with CPUs free (the training
    workers hold their pods' CPUs and select their own nodes). ``data_nodes`` and
    ``validation_nodes`` (Ray node IDs, 12 characters) show where they ran.
    """
    import ray

    data = make_spirals(int(config.get("samples", 2048)), seed=1)
    with checkpoint.as_directory() as folder:
        state = torch.load(Path(folder) / "state.pt", map_location="cpu")["model"]
    features, labels = data.tensors[0].numpy(), data.tensors[1].numpy()
    rows = [{"x": features[i], "y": int(labels[i])} for i in range(len(labels))]
    blocks = int(config.get("val_blocks", 4))
    scored = (
        ray.data.from_items(rows, override_num_blocks=blocks)
        .map_batches(_score_batch, fn_kwargs={"state": state}, batch_size=None)
        .take_all()
    )
    total = sum(row["n"] for row in scored)
    validation_nodes = [
        node["NodeID"][:12]
        for node in ray.nodes()
        if node["Alive"] and node["Resources"].get("validation")
    ]
    return {
        "val_loss": sum(row["loss"] for row in scored) / total,
        "val_accuracy": sum(row["correct"] for row in scored) / total,
        "data_nodes": sorted({row["node"][:12] for row in scored}),
        "validation_nodes": sorted(validation_nodes),
    }
