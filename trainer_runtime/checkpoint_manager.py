"""Which checkpoints a run keeps, and the manifest that lets a new driver resume.

The manifest (``<run_path>/checkpoint_manifest.json``) lists the committed
checkpoints with their metrics and status. A checkpoint is committed when its
commit marker (``.trainjob_committed.json`` inside the folder) is written,
after every file is stored; :meth:`CheckpointManager.restore` also picks up
markers the manifest missed (a driver that died between the two writes), so a
committed checkpoint is never lost, and a folder without a marker is never used.

Deleting a checkpoint first turns its marker into a tombstone, so a deletion
cut short leaves an uncommitted folder, never a marked, partial one. A driver
that starts deletes the run's uncommitted folders (interrupted uploads and
deletions) before its workers start, so a new checkpoint never reuses a
folder that still holds stale files.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from trainer_runtime.checkpoint import COMMIT_MARKER, Checkpoint
from trainer_runtime.config import CheckpointConfig
from trainer_runtime.errors import UserConfigError
from trainer_runtime.storage import Storage, join_uri

logger = logging.getLogger(__name__)

MANIFEST_FILE = "checkpoint_manifest.json"
MANIFEST_VERSION = 1

#: ``CheckpointRecord.validation_source`` of a checkpoint validated by the run-level
#: ``ValidationConfig.validate_fn`` (a new driver can re-queue it) ...
VALIDATE_FN_OF_RUN = "run"
#: ... and by a ``validate_fn`` passed to ``report()`` (it cannot be recovered by another process).
VALIDATE_FN_OF_REPORT = "report"


class CheckpointStatus:
    """Life-cycle states of a committed checkpoint."""

    COMMITTED = "committed"
    PENDING_VALIDATION = "pending_validation"
    VALIDATED = "validated"
    VALIDATION_FAILED = "validation_failed"
    VALIDATION_TIMEOUT = "validation_timeout"
    VALIDATION_LOST = "validation_lost"

    PENDING = (PENDING_VALIDATION,)


@dataclass
class CheckpointRecord:
    """A committed checkpoint: where it is, which report round made it, its metrics."""

    name: str
    path: str
    round: int
    metrics: dict[str, Any]
    committed_at: float = field(default_factory=time.time)
    status: str = CheckpointStatus.COMMITTED
    validation_metrics: dict[str, Any] | None = None
    validation_error: str | None = None
    #: Which validate function was queued for it: ``VALIDATE_FN_OF_RUN``,
    #: ``VALIDATE_FN_OF_REPORT``, or None (no validation).
    validation_source: str | None = None

    @property
    def checkpoint(self) -> Checkpoint:
        """The :class:`Checkpoint` handle."""
        return Checkpoint(self.path)

    @property
    def all_metrics(self) -> dict[str, Any]:
        """Training metrics with validation metrics merged over them (validation keys win)."""
        merged = dict(self.metrics)
        merged.update(self.validation_metrics or {})
        return merged

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CheckpointRecord:
        """Inverse of :meth:`to_json` (unknown keys ignored)."""
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)


class CheckpointManager:
    """Top-k retention by score, deletion of evicted checkpoints, and the run manifest."""

    def __init__(self, run_path: str, config: CheckpointConfig, storage: Storage) -> None:
        self.run_path = run_path
        self.config = config
        self.storage = storage
        self.records: list[CheckpointRecord] = []
        self.next_round = 0

    # -- queries --------------------------------------------------------------------------
    @property
    def latest(self) -> CheckpointRecord | None:
        """The most recently committed checkpoint."""
        return self.records[-1] if self.records else None

    def get(self, name: str) -> CheckpointRecord | None:
        """The record named ``name``, if kept."""
        return next((r for r in self.records if r.name == name), None)

    def score(self, record: CheckpointRecord) -> float | None:
        """The record's score (None when it has none yet, e.g. pending validation)."""
        attr = self.config.checkpoint_score_attribute
        if attr is None:
            return None
        value = record.all_metrics.get(attr)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        return float(value)

    def ranked(self) -> list[CheckpointRecord]:
        """Kept checkpoints, best first (by score; most recent first without a score attribute).

        Checkpoints with no score (validation failed or pending) come last.
        """
        if self.config.checkpoint_score_attribute is None:
            return list(reversed(self.records))
        sign = -1.0 if self.config.checkpoint_score_order == "max" else 1.0
        scored = [r for r in self.records if self.score(r) is not None]
        unscored = [r for r in self.records if self.score(r) is None]
        scored.sort(key=lambda r: (sign * (self.score(r) or 0.0), -r.round))
        return scored + list(reversed(unscored))

    def best(self) -> CheckpointRecord | None:
        """The best checkpoint with a score, or the latest when no score attribute is set."""
        if self.config.checkpoint_score_attribute is None:
            return self.latest
        scored = [r for r in self.ranked() if self.score(r) is not None]
        return scored[0] if scored else None

    # -- changes --------------------------------------------------------------------------
    def check_score_attribute(self, record: CheckpointRecord) -> None:
        """Fail clearly when the score attribute can never be computed for ``record``."""
        attr = self.config.checkpoint_score_attribute
        if attr is None or record.status in CheckpointStatus.PENDING:
            return
        if record.status != CheckpointStatus.COMMITTED:
            return  # validation ran and failed: the record simply has no score
        if attr not in record.all_metrics:
            raise UserConfigError(
                f"CheckpointConfig.checkpoint_score_attribute={attr!r} is not among the metrics "
                f"reported with checkpoint {record.name}; metrics seen: "
                f"{sorted(record.all_metrics)}. Report {attr!r} in the same report() call as "
                "the checkpoint (or return it from validate_fn), or change "
                "checkpoint_score_attribute"
            )
        if self.score(record) is None:
            raise UserConfigError(
                f"CheckpointConfig.checkpoint_score_attribute={attr!r} must be a number, got "
                f"{record.all_metrics[attr]!r} in checkpoint {record.name}"
            )

    def register(self, record: CheckpointRecord) -> list[CheckpointRecord]:
        """Add a newly committed checkpoint, evict what no longer fits, save the manifest."""
        self.check_score_attribute(record)
        self.records = [r for r in self.records if r.name != record.name] + [record]
        self.next_round = max(self.next_round, record.round + 1)
        return self._evict_and_save()

    def update(self, record: CheckpointRecord) -> list[CheckpointRecord]:
        """Re-rank after ``record`` changed (e.g. validation results merged in)."""
        return self._evict_and_save()

    def _evict_and_save(self) -> list[CheckpointRecord]:
        evicted = self._select_evictions()
        if evicted:
            names = {r.name for r in evicted}
            self.records = [r for r in self.records if r.name not in names]
        # The manifest is written before deleting: a crash in between leaves a folder
        # the manifest no longer lists (harmless), never a listed folder that is gone.
        self.save()
        for record in evicted:
            logger.info(
                "Deleting checkpoint %s (not in the top %s)", record.name, self.config.num_to_keep
            )
            self.delete_checkpoint(record.path)
        return evicted

    def delete_checkpoint(self, path: str) -> None:
        """Delete a checkpoint folder so that no crash can leave it marked but partial.

        The commit marker is overwritten with a tombstone first (storage writes are
        atomic), then the folder is deleted: a deletion cut short leaves a folder
        that :meth:`restore` treats as uncommitted and removes.
        """
        tombstone = {"tombstone": True, "deleted_at": time.time()}
        self.storage.write_bytes(join_uri(path, COMMIT_MARKER), json.dumps(tombstone).encode())
        self.storage.delete_dir(path)

    def _select_evictions(self) -> list[CheckpointRecord]:
        keep_n = self.config.num_to_keep
        if keep_n is None or len(self.records) <= keep_n:
            return []
        latest = self.latest
        protected = {r.name for r in self.records if r.status in CheckpointStatus.PENDING}
        if latest is not None:
            protected.add(latest.name)
        keep = {r.name for r in self.ranked()[:keep_n]} | protected
        return [r for r in self.records if r.name not in keep]

    def note_round(self, round_index: int) -> None:
        """Remember that ``round_index`` was used, so a resumed run never reuses its name."""
        self.next_round = max(self.next_round, round_index + 1)

    # -- persistence ----------------------------------------------------------------------
    @property
    def manifest_uri(self) -> str:
        """Where the manifest lives."""
        return join_uri(self.run_path, MANIFEST_FILE)

    def save(self) -> None:
        """Write the manifest (atomic object/file write)."""
        data = {
            "version": MANIFEST_VERSION,
            "run_path": self.run_path,
            "next_round": self.next_round,
            "latest": self.latest.name if self.latest else None,
            "best": (b.name if (b := self.best()) else None),
            "checkpoints": [r.to_json() for r in self.records],
            "updated_at": time.time(),
        }
        self.storage.write_bytes(self.manifest_uri, json.dumps(data, indent=1).encode())

    def read_marker(self, name: str) -> CheckpointRecord | None:
        """The record in folder ``name``'s commit marker; None when the folder is not committed.

        A missing marker (an interrupted upload), a tombstone (an interrupted deletion),
        an unreadable marker, or one describing another folder (copied along with a
        checkpoint's files) all mean "not committed".
        """
        marker = join_uri(self.run_path, name, COMMIT_MARKER)
        try:
            data = json.loads(self.storage.read_bytes(marker))
        except FileNotFoundError:
            return None
        except ValueError:
            logger.warning("Ignoring unreadable commit marker %s", marker)
            return None
        if not isinstance(data, dict) or data.get("tombstone") or data.get("name") != name:
            return None
        try:
            return CheckpointRecord.from_json(data)
        except TypeError:
            logger.warning("Ignoring commit marker %s without a checkpoint record", marker)
            return None

    def restore(self, delete_uncommitted: bool = False) -> list[str]:
        """Load the manifest and any committed checkpoint it does not list yet.

        With ``delete_uncommitted`` (the run's driver, before any worker starts), every
        sub-folder of the run folder that is not a committed checkpoint is deleted: it
        holds files of an interrupted upload or deletion, can never be resumed from, and
        would otherwise end up inside a new checkpoint written to the same folder name.
        Returns the names of the deleted folders.
        """
        records: dict[str, CheckpointRecord] = {}
        try:
            data = json.loads(self.storage.read_bytes(self.manifest_uri))
        except FileNotFoundError:
            data = {}
        for item in data.get("checkpoints", []):
            record = CheckpointRecord.from_json(item)
            records[record.name] = record
        self.next_round = int(data.get("next_round", 0))
        deleted: list[str] = []
        for name in self.storage.list_dirs(self.run_path):
            if name in records:
                continue
            found = self.read_marker(name)
            if found is None:
                if delete_uncommitted:
                    logger.warning(
                        "Deleting uncommitted checkpoint folder %s (left by an interrupted "
                        "upload or deletion; it can never be resumed from)",
                        join_uri(self.run_path, name),
                    )
                    self.storage.delete_dir(join_uri(self.run_path, name))
                    deleted.append(name)
                continue
            logger.info("Recovered committed checkpoint %s missing from the manifest", name)
            records[name] = found
        self.records = sorted(records.values(), key=lambda r: r.round)
        for record in self.records:
            self.next_round = max(self.next_round, record.round + 1)
        return deleted
