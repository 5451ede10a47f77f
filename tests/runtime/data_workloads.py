"""A TrainJob's ``spec.data.datasets`` function and a train function reading its shards, for
the launcher's datasets test (imported by module name by the Ray workers)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trainer_runtime as tr


def _tag_node(batch: dict[str, Any]) -> dict[str, Any]:
    """``map_batches`` body: each row gets the Ray node id its batch ran on."""
    import ray

    node = ray.get_runtime_context().get_node_id()
    batch["node"] = [node] * len(batch["id"])
    return batch


def pool_datasets(config: dict[str, Any]) -> dict[str, Any]:
    """``train``: ``config["rows"]`` rows preprocessed by ``map_batches`` (split among the
    workers); ``valid``: 4 rows (whole to every worker when not in ``datasetsToSplit``)."""
    import ray.data

    train = ray.data.range(config["rows"], override_num_blocks=4).map_batches(_tag_node)
    return {"train": train, "valid": ray.data.range(4).map_batches(_tag_node)}


def read_shards(config: dict[str, Any]) -> None:
    """Each rank reads its ``train`` shard and the ``valid`` dataset once and appends what it
    got (row ids, the nodes that preprocessed them) to ``config["log"]``."""
    rank = tr.get_context().get_world_rank()
    seen: dict[str, Any] = {"rank": rank}
    for name in ("train", "valid"):
        rows = list(tr.get_dataset_shard(name).iter_rows())
        seen[name] = sorted(int(r["id"]) for r in rows)
        seen[f"{name}_nodes"] = sorted({str(r["node"]) for r in rows})
    with Path(config["log"]).open("a") as log:
        log.write(json.dumps(seen) + "\n")
    tr.report({"rows": len(seen["train"])})
