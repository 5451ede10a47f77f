"""``get_all_reported_checkpoints()``'s types, as in Ray Train 2.60
(``ray.train.ReportedCheckpoint``, ``ReportedCheckpointStatus``, ``CheckpointConsistencyMode``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainer_runtime.checkpoint import Checkpoint


class ReportedCheckpointStatus(Enum):
    """Where a kept checkpoint stands (Ray's values).

    * COMMITTED: stored, no validation requested.
    * PENDING_VALIDATION: stored, validation queued or running.
    * VALIDATED: stored and validated (the validation's metrics are in ``metrics``).
    * VALIDATION_TIMEOUT: the validation ran past its ``timeout_s``.
    * VALIDATION_FAILED: the validation raised (or, ours: was lost with an earlier driver).
    """

    COMMITTED = "COMMITTED"
    PENDING_VALIDATION = "PENDING_VALIDATION"
    VALIDATED = "VALIDATED"
    VALIDATION_TIMEOUT = "VALIDATION_TIMEOUT"
    VALIDATION_FAILED = "VALIDATION_FAILED"


class CheckpointConsistencyMode(Enum):
    """What ``get_all_reported_checkpoints()`` waits for.

    * COMMITTED: every ``report()`` this rank made so far is processed (its checkpoint
      stored and committed, or evicted).
    * VALIDATED: that, and no validation is pending.
    """

    COMMITTED = "COMMITTED"
    VALIDATED = "VALIDATED"


@dataclass
class ReportedCheckpoint:
    """A kept checkpoint, its metrics (validation's merged in) and its status."""

    checkpoint: Checkpoint
    metrics: dict[str, Any]
    status: ReportedCheckpointStatus
