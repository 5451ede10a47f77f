"""``Result``: what ``fit()`` returns (the shape of ``ray.train.Result``)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from trainer_runtime.checkpoint import Checkpoint
from trainer_runtime.checkpoint_manager import MANIFEST_FILE, CheckpointRecord
from trainer_runtime.storage import get_storage, join_uri


@dataclass
class Result:
    """The outcome of a run.

    ``metrics``: rank 0's last reported metrics. ``checkpoint``: the latest
    committed checkpoint. ``best_checkpoints``: kept checkpoints as
    ``(Checkpoint, metrics)`` pairs, best first. ``checkpoints``: every kept
    checkpoint's record, with its validation status.
    """

    metrics: dict[str, Any] | None
    checkpoint: Checkpoint | None
    path: str
    error: BaseException | None = None
    best_checkpoints: list[tuple[Checkpoint, dict[str, Any]]] = field(default_factory=list)
    checkpoints: list[CheckpointRecord] = field(default_factory=list)
    best_checkpoint: Checkpoint | None = None
    restarts: int = 0

    def checkpoint_status(self, checkpoint: Checkpoint) -> str | None:
        """The status of a kept checkpoint (``committed``, ``validated``, ...)."""
        return next((r.status for r in self.checkpoints if r.path == checkpoint.path), None)

    def get_best_checkpoint(self, metric: str, mode: str = "max") -> Checkpoint | None:
        """The kept checkpoint with the best ``metric`` (``mode`` ``max`` or ``min``)."""
        if mode not in ("max", "min"):
            raise ValueError(f"mode must be 'max' or 'min', got {mode!r}")
        scored = [
            (c, m[metric])
            for c, m in self.best_checkpoints
            if isinstance(m.get(metric), int | float)
        ]
        if not scored:
            return None
        pick = max if mode == "max" else min
        return pick(scored, key=lambda cm: cm[1])[0]

    @classmethod
    def from_path(cls, path: str) -> Result:
        """Rebuild a Result from a run folder's manifest (e.g. after the driver exited)."""
        storage = get_storage(path)
        data = json.loads(storage.read_bytes(join_uri(path, MANIFEST_FILE)))
        records = [CheckpointRecord.from_json(d) for d in data.get("checkpoints", [])]
        latest = records[-1] if records else None
        best_name = data.get("best")
        best = next((r for r in records if r.name == best_name), None)
        return cls(
            metrics=latest.all_metrics if latest else None,
            checkpoint=latest.checkpoint if latest else None,
            path=path,
            best_checkpoints=[(r.checkpoint, r.all_metrics) for r in records],
            checkpoints=records,
            best_checkpoint=best.checkpoint if best else None,
        )
