"""Which checkpoints a run keeps, and the manifest that lets a new driver resume.

The invariant: a checkpoint the runtime lists as committed has its commit marker
(``.trainjob_committed.json`` inside the folder) and every file the ranks reported, with
the size and fingerprint they were stored with; nothing outside the run's own checkpoint
folders is ever deleted.

The commit marker is written after every file is stored and checked:
:meth:`CheckpointManager.commit` lists the folder in storage and compares it with what every
rank reported storing (:func:`verified_files`) before it writes the marker. It holds the
checkpoint's record: name, round, metrics and the list of its files. The
manifest (``<run_path>/checkpoint_manifest.json``) is an index over the markers: which
checkpoints are kept, and what validation added later (status, validation metrics). It is
strict JSON: non-finite metric values are written as the strings ``"NaN"``, ``"Infinity"``
and ``"-Infinity"`` (read back as floats).

:meth:`CheckpointManager.restore` trusts no index: it reads every folder's marker and checks
the folder's files against it. A damaged or hand-edited run folder (a folder or file
removed, a marker or the manifest truncated) degrades to "resume from the newest checkpoint
that verifies", with a warning naming what was skipped; an unreadable manifest is rebuilt
from the markers.

Deleting a checkpoint first turns its marker into a tombstone, so a deletion
cut short leaves an uncommitted folder, never a marked, partial one. A driver
that starts deletes the run's uncommitted folders (interrupted uploads and
deletions) before its workers start, so a new checkpoint never reuses a
folder that still holds stale files.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from trainer_runtime._layout import (
    COMMIT_MARKER,
    MANIFEST_FILE,
    is_store_temp,
    round_of_default_name,
)
from trainer_runtime.checkpoint import Checkpoint
from trainer_runtime.config import CheckpointConfig
from trainer_runtime.errors import UserConfigError, WorkerFailure
from trainer_runtime.reported_checkpoint import ReportedCheckpoint, ReportedCheckpointStatus
from trainer_runtime.storage import Storage, join_uri
from trainer_runtime.storage.base import StoredFile, describe_error

logger = logging.getLogger(__name__)

__all__ = [
    "MANIFEST_FILE",
    "CheckpointManager",
    "CheckpointRecord",
    "CheckpointStatus",
    "dumps_strict",
    "verified_files",
]

#: 2: metrics live in the commit markers only (a manifest rewrite no longer copies every
#: checkpoint's metrics); markers list the checkpoint's files.
MANIFEST_VERSION = 2
_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _finite_json(value: Any) -> Any:
    """``value`` with non-finite floats replaced by their JSON-safe strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: _finite_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite_json(v) for v in value]
    return value


def _metrics_from_json(value: Any) -> Any:
    """Inverse of :func:`_finite_json` for metric values."""
    if isinstance(value, str):
        return _NON_FINITE.get(value, value)
    if isinstance(value, dict):
        return {k: _metrics_from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_metrics_from_json(v) for v in value]
    return value


def dumps_strict(data: Any, indent: int | None = None) -> bytes:
    """Strict JSON (RFC 8259): non-finite floats as ``"NaN"``/``"Infinity"``/``"-Infinity"``."""
    return json.dumps(_finite_json(data), indent=indent, allow_nan=False).encode()


#: ``CheckpointRecord.validation_source`` of a checkpoint validated by the run-level
#: ``ValidationConfig.validate_fn`` (a new driver can re-queue it) ...
VALIDATE_FN_OF_RUN = "run"
#: ... by the trainer's ``ValidationConfig.fn`` at ``report(validation=...)``'s request (a new
#: driver can re-queue it with the recorded ``validation_kwargs``) ...
VALIDATE_FN_OF_CONFIG = "config"
#: ... and by a ``validate_fn`` passed to ``report()`` (it cannot be recovered by another process).
VALIDATE_FN_OF_REPORT = "report"


class CheckpointStatus(StrEnum):
    """Life-cycle states of a committed checkpoint (see ``STATUS_TRANSITIONS``)."""

    COMMITTED = "committed"
    PENDING_VALIDATION = "pending_validation"
    VALIDATED = "validated"
    VALIDATION_FAILED = "validation_failed"
    VALIDATION_TIMEOUT = "validation_timeout"
    VALIDATION_LOST = "validation_lost"

    @property
    def is_pending(self) -> bool:
        """Whether a validation is still to come (the checkpoint is protected from eviction)."""
        return self is CheckpointStatus.PENDING_VALIDATION


#: The only status changes a committed checkpoint can make, all through the manager: a
#: checkpoint is committed either without validation (``COMMITTED``, final) or waiting for
#: one (``PENDING_VALIDATION``), which ends in exactly one of the other states.
STATUS_TRANSITIONS: dict[CheckpointStatus, frozenset[CheckpointStatus]] = {
    CheckpointStatus.COMMITTED: frozenset(),
    CheckpointStatus.PENDING_VALIDATION: frozenset(
        {
            CheckpointStatus.VALIDATED,
            CheckpointStatus.VALIDATION_FAILED,
            CheckpointStatus.VALIDATION_TIMEOUT,
            CheckpointStatus.VALIDATION_LOST,
        }
    ),
    CheckpointStatus.VALIDATED: frozenset(),
    CheckpointStatus.VALIDATION_FAILED: frozenset(),
    CheckpointStatus.VALIDATION_TIMEOUT: frozenset(),
    CheckpointStatus.VALIDATION_LOST: frozenset(),
}


@dataclass
class CheckpointRecord:
    """A committed checkpoint: where it is, which report round made it, its metrics."""

    name: str
    path: str
    round: int
    metrics: dict[str, Any]
    committed_at: float = field(default_factory=time.time)
    status: CheckpointStatus = CheckpointStatus.COMMITTED
    validation_metrics: dict[str, Any] | None = None
    validation_error: str | None = None
    #: Which validate function was queued for it: ``VALIDATE_FN_OF_RUN``,
    #: ``VALIDATE_FN_OF_REPORT``, or None (no validation).
    validation_source: str | None = None
    #: The ``fn_kwargs`` of a ``VALIDATE_FN_OF_CONFIG`` validation (JSON, as Ray requires).
    validation_kwargs: dict[str, Any] | None = None
    #: Every file of the checkpoint (relative path -> size and fingerprint), as stored and
    #: checked at commit; None for checkpoints committed before files were recorded.
    files: dict[str, StoredFile] | None = field(default=None, repr=False)

    @property
    def checkpoint(self) -> Checkpoint:
        """The :class:`Checkpoint` handle (with the run's custom filesystem, if any)."""
        return Checkpoint(self.path, self.__dict__.get("_filesystem"))

    def attach_filesystem(self, filesystem: Any) -> CheckpointRecord:
        """Make :attr:`checkpoint` carry ``filesystem`` (``RunConfig.storage_filesystem``);
        not part of the record's JSON."""
        self.__dict__["_filesystem"] = filesystem
        return self

    @property
    def all_metrics(self) -> dict[str, Any]:
        """Training metrics with validation metrics merged over them (validation keys win)."""
        merged = dict(self.metrics)
        merged.update(self.validation_metrics or {})
        return merged

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict (the commit marker's content)."""
        data = asdict(self)
        data["files"] = (
            None if self.files is None else {k: v.to_json() for k, v in self.files.items()}
        )
        return data

    def index_json(self) -> dict[str, Any]:
        """What the manifest keeps of a record: everything but its metrics and files."""
        data = self.to_json()
        del data["metrics"], data["files"]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CheckpointRecord:
        """Inverse of :meth:`to_json` (unknown keys ignored); ValueError when malformed."""
        if not isinstance(data, dict):
            raise ValueError(f"a checkpoint record must be a JSON object, got {data!r:.80}")
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        for key in ("metrics", "validation_metrics"):
            if known.get(key) is not None:
                known[key] = _metrics_from_json(known[key])
        known.setdefault("metrics", {})
        files = known.pop("files", None)
        try:
            known["status"] = CheckpointStatus(known.get("status", CheckpointStatus.COMMITTED))
            record = cls(**known)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"not a checkpoint record: {exc}") from None
        if not isinstance(record.name, str) or not isinstance(record.path, str):
            raise ValueError("a checkpoint record needs a string name and path")
        if not isinstance(record.round, int) or not isinstance(record.metrics, dict):
            raise ValueError("a checkpoint record needs an integer round and a metrics object")
        if files is not None:
            if not isinstance(files, dict):
                raise ValueError("a checkpoint record's files must be an object")
            record.files = {str(k): StoredFile.from_json(v) for k, v in files.items()}
        return record


class CheckpointManager:
    """Top-k retention by score, deletion of evicted checkpoints, and the run manifest."""

    def __init__(
        self,
        run_path: str,
        config: CheckpointConfig,
        storage: Storage,
    ) -> None:
        self.run_path = run_path
        self.config = config
        #: The run's storage; the run's driver hands a ``_fencing.FencedStorage``, so that
        #: every write into the run folder stops once another driver took the run over.
        self.storage = storage
        self.records: list[CheckpointRecord] = []
        self.next_round = 0
        #: The manifest as :meth:`restore` read it (None: none, or unreadable).
        self.manifest_data: dict[str, Any] | None = None

    @classmethod
    def for_reading(cls, run_path: str, storage: Storage) -> CheckpointManager:
        """A manager restored from a run folder with the CheckpointConfig its manifest
        recorded (default config when it recorded none); it deletes nothing."""
        manager = cls(run_path, CheckpointConfig(), storage)
        manager.restore()
        recorded = (manager.manifest_data or {}).get("checkpoint_config")
        if isinstance(recorded, dict):
            try:
                manager.config = CheckpointConfig(
                    **{k: recorded.get(k) for k in ("num_to_keep", "checkpoint_score_attribute")},
                    checkpoint_score_order=recorded.get("checkpoint_score_order") or "max",
                )
            except (TypeError, ValueError):
                logger.warning("Ignoring the manifest's unreadable checkpoint_config")
        return manager

    # -- queries --------------------------------------------------------------------------
    @property
    def latest(self) -> CheckpointRecord | None:
        """The most recently committed checkpoint."""
        return self.records[-1] if self.records else None

    def get(self, name: str) -> CheckpointRecord | None:
        """The record named ``name``, if kept."""
        return next((r for r in self.records if r.name == name), None)

    def score(self, record: CheckpointRecord) -> float | None:
        """The record's score: None when it has none (pending or failed validation, or a
        non-finite value such as NaN, which ranks below every real score)."""
        attr = self.config.checkpoint_score_attribute
        if attr is None:
            return None
        value = record.all_metrics.get(attr)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        score = float(value)
        return score if math.isfinite(score) else None

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

    def top_k(self) -> list[CheckpointRecord]:
        """``Result.best_checkpoints`` as Ray Train orders it: the ``num_to_keep`` best, worst
        first (without a score attribute: the ``num_to_keep`` most recent, oldest first).

        The latest checkpoint and those pending validation are kept too (resume needs them)
        but are listed here only when they are among the best, as in Ray Train.
        """
        ranked = self.ranked()
        keep_n = self.config.num_to_keep
        return list(reversed(ranked if keep_n is None else ranked[:keep_n]))

    def reported_order(self) -> list[CheckpointRecord]:
        """Kept checkpoints in Ray Train's order of ``get_all_reported_checkpoints()``:
        ascending by Ray's score key, worst first (a missing score counts as ``-inf``
        before the ``min`` sign flip, NaN below everything; ties by report order); without a
        score attribute, oldest first."""
        attr = self.config.checkpoint_score_attribute
        if attr is None:
            return sorted(self.records, key=lambda r: r.round)
        factor = 1.0 if self.config.checkpoint_score_order == "max" else -1.0

        def key(record: CheckpointRecord) -> tuple[bool, float, int]:
            value = record.all_metrics.get(attr, -math.inf)
            try:
                score = factor * float(value)
            except (TypeError, ValueError):
                score = -math.inf
            if math.isnan(score):
                return (False, -math.inf, record.round)
            return (True, score, record.round)

        return sorted(self.records, key=key)

    def reported_checkpoints(self) -> list[Any]:
        """``get_all_reported_checkpoints()``'s answer: a ``ReportedCheckpoint`` per kept
        checkpoint, in :meth:`reported_order` (a lost validation reads ``VALIDATION_FAILED``)."""
        statuses = {
            CheckpointStatus.COMMITTED: ReportedCheckpointStatus.COMMITTED,
            CheckpointStatus.PENDING_VALIDATION: ReportedCheckpointStatus.PENDING_VALIDATION,
            CheckpointStatus.VALIDATED: ReportedCheckpointStatus.VALIDATED,
            CheckpointStatus.VALIDATION_FAILED: ReportedCheckpointStatus.VALIDATION_FAILED,
            CheckpointStatus.VALIDATION_TIMEOUT: ReportedCheckpointStatus.VALIDATION_TIMEOUT,
            CheckpointStatus.VALIDATION_LOST: ReportedCheckpointStatus.VALIDATION_FAILED,
        }
        return [
            ReportedCheckpoint(r.checkpoint, r.all_metrics, statuses[r.status])
            for r in self.reported_order()
        ]

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
        if attr is None or record.status not in (
            CheckpointStatus.COMMITTED,
            CheckpointStatus.VALIDATED,
        ):
            return  # pending, or validation ran and failed: the record simply has no score
        if attr not in record.all_metrics:
            raise UserConfigError(
                f"CheckpointConfig.checkpoint_score_attribute={attr!r} is not among the metrics "
                f"reported with checkpoint {record.name}; metrics seen: "
                f"{sorted(record.all_metrics)}. Report {attr!r} in the same report() call as "
                "the checkpoint (or return it from validate_fn), or change "
                "checkpoint_score_attribute"
            )
        value = record.all_metrics[attr]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise UserConfigError(
                f"CheckpointConfig.checkpoint_score_attribute={attr!r} must be a number, got "
                f"{record.all_metrics[attr]!r} in checkpoint {record.name}"
            )

    def commit(
        self,
        record: CheckpointRecord,
        validating: bool = False,
        stored: Mapping[int, dict[str, StoredFile] | None] | None = None,
    ) -> list[CheckpointRecord]:
        """Write ``record``'s commit marker (its files are stored and checked), then register.

        ``stored``: what each rank reported storing (rank -> relative path -> file; None for a
        rank that wrote in place). When given, the folder is first checked in storage against
        it (:func:`verified_files`) and ``record.files`` becomes what storage holds; a folder
        that fails the checks is not committed (UserConfigError or WorkerFailure).
        ``validating``: a validation is queued for it, so it starts ``PENDING_VALIDATION``
        (else ``COMMITTED``). Raises :class:`~trainer_runtime.errors.FencedError` (nothing
        written) when another driver owns the run now.
        """
        if stored is not None:
            record.files = verified_files(self.storage, record.path, record.round, stored)
        record.status = (
            CheckpointStatus.PENDING_VALIDATION if validating else CheckpointStatus.COMMITTED
        )
        # Before the marker: a checkpoint that can never be ranked must not look committed.
        self.check_score_attribute(record)
        self.storage.write_bytes(
            join_uri(record.path, COMMIT_MARKER), dumps_strict(record.to_json())
        )
        return self.register(record)

    def register(self, record: CheckpointRecord) -> list[CheckpointRecord]:
        """Add a newly committed checkpoint, evict what no longer fits, save the manifest."""
        record.attach_filesystem(self.storage.filesystem)
        self.check_score_attribute(record)
        self.records = [r for r in self.records if r.name != record.name] + [record]
        self.next_round = max(self.next_round, record.round + 1)
        return self._evict_and_save()

    def record_validation(
        self,
        name: str,
        status: CheckpointStatus,
        metrics: dict[str, Any] | None = None,
        error: str | None = None,
    ) -> CheckpointRecord | None:
        """Record how a checkpoint's validation ended, re-rank, save; the updated record.

        Returns None when the checkpoint is no longer kept. A validation that succeeded
        without returning the score attribute is recorded as failed, with the reason.
        """
        record = self.get(name)
        if record is None:
            return None
        if status is CheckpointStatus.VALIDATED:
            try:
                self.check_score_attribute(
                    CheckpointRecord(
                        record.name,
                        record.path,
                        record.round,
                        record.all_metrics | (metrics or {}),
                        status=CheckpointStatus.VALIDATED,
                    )
                )
            except UserConfigError as exc:
                logger.error("%s", exc)
                status, error = CheckpointStatus.VALIDATION_FAILED, str(exc)
        self._transition(record, status)
        record.validation_metrics = metrics
        record.validation_error = error
        self._evict_and_save()
        return record

    def mark_validations_lost(self, names: Iterable[str], reason: str) -> list[CheckpointRecord]:
        """Record that the validations of ``names`` will never run (one manifest write)."""
        lost = []
        for name in names:
            record = self.get(name)
            if record is not None:
                self._transition(record, CheckpointStatus.VALIDATION_LOST)
                record.validation_error = reason
                lost.append(record)
        if lost:
            self._evict_and_save()
        return lost

    def _transition(self, record: CheckpointRecord, status: CheckpointStatus) -> None:
        if status not in STATUS_TRANSITIONS[record.status]:
            raise ValueError(
                f"checkpoint {record.name}: status {record.status.value} cannot change to "
                f"{status.value}"
            )
        record.status = status

    def _evict_and_save(self) -> list[CheckpointRecord]:
        evicted = self._select_evictions()
        if evicted:
            names = {r.name for r in evicted}
            self.records = [r for r in self.records if r.name not in names]
        # The manifest is written before deleting: a crash in between leaves a folder
        # the manifest no longer lists (harmless), never a listed folder that is gone.
        self.save()
        for record in evicted:
            if not self.owns(record.path):
                logger.warning(
                    "Checkpoint %s is no longer kept (not in the top %s) but is not in the run "
                    "folder %s (reported with CheckpointUploadMode.NO_UPLOAD?): leaving its "
                    "files where they are",
                    record.path,
                    self.config.num_to_keep,
                    self.run_path,
                )
                continue
            logger.info(
                "Deleting checkpoint %s (not in the top %s)", record.name, self.config.num_to_keep
            )
            self.delete_checkpoint(record.path)
        return evicted

    def owns(self, path: str) -> bool:
        """Whether ``path`` is a checkpoint folder directly inside the run folder."""
        return path.rstrip("/") == join_uri(self.run_path, path.rstrip("/").rsplit("/", 1)[-1])

    def delete_checkpoint(self, path: str) -> None:
        """Delete a checkpoint folder so that no crash can leave it marked but partial.

        The commit marker is overwritten with a tombstone first (storage writes are
        atomic), then the folder is deleted: a deletion cut short leaves a folder
        that :meth:`restore` treats as uncommitted and removes.
        """
        if not self.owns(path):
            raise ValueError(f"refusing to delete {path}: not a folder of run {self.run_path}")
        tombstone = {"tombstone": True, "deleted_at": time.time()}
        self.storage.write_bytes(join_uri(path, COMMIT_MARKER), dumps_strict(tombstone))
        self.storage.delete_dir(path)

    def _select_evictions(self) -> list[CheckpointRecord]:
        keep_n = self.config.num_to_keep
        if keep_n is None or len(self.records) <= keep_n:
            return []
        latest = self.latest
        protected = {r.name for r in self.records if r.status.is_pending}
        if latest is not None:
            protected.add(latest.name)
        keep = {r.name for r in self.ranked()[:keep_n]} | protected
        return [r for r in self.records if r.name not in keep]

    def delete_uncommitted(self, path: str) -> None:
        """Delete a folder of this run that holds no committed checkpoint (never a kept one)."""
        name = path.rstrip("/").rsplit("/", 1)[-1]
        if not self.owns(path) or self.get(name) is not None or self.read_marker(name):
            raise ValueError(f"refusing to delete {path}: not an uncommitted folder of this run")
        self.storage.delete_dir(path)

    def delete_orphans(self) -> list[str]:
        """Delete the run's folders that hold no committed checkpoint; returns their names.

        Run by the driver when a run ends: a folder a fenced-off writer (a worker of an
        earlier driver) created after this driver started is removed here.
        """
        kept = {r.name for r in self.records}
        deleted = []
        for name in self.storage.list_dirs(self.run_path):
            if round_of_default_name(name) is None:  # not a name the runtime picked itself
                continue
            if name in kept or self.read_marker(name) is not None:
                continue
            logger.warning(
                "Deleting uncommitted folder %s of run %s (an interrupted or fenced-off upload)",
                name,
                self.run_path,
            )
            self.storage.delete_dir(join_uri(self.run_path, name))
            deleted.append(name)
        return deleted

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
        self.storage.write_bytes(self.manifest_uri, dumps_strict(self._manifest(), indent=1))

    def _manifest(self) -> dict[str, Any]:
        config = self.config
        return {
            "version": MANIFEST_VERSION,
            "run_path": self.run_path,
            "next_round": self.next_round,
            "latest": self.latest.name if self.latest else None,
            "best": (b.name if (b := self.best()) else None),
            "checkpoint_config": {
                "num_to_keep": config.num_to_keep,
                "checkpoint_score_attribute": config.checkpoint_score_attribute,
                "checkpoint_score_order": config.checkpoint_score_order,
            },
            "checkpoints": [r.index_json() for r in self.records],
            "updated_at": time.time(),
        }

    def read_manifest(self) -> dict[str, Any] | None:
        """The manifest as a dict; None when there is none or it cannot be read as one."""
        try:
            raw = self.storage.read_bytes(self.manifest_uri)
        except FileNotFoundError:
            return None
        except (IsADirectoryError, NotADirectoryError, PermissionError) as exc:
            logger.warning(
                "Cannot read the manifest %s (%s); rebuilding the checkpoint list from the "
                "commit markers",
                self.manifest_uri,
                describe_error(exc),
            )
            return None
        try:
            data = json.loads(raw)
        except ValueError as exc:
            logger.warning(
                "The manifest %s is damaged (%s); rebuilding the checkpoint list from the "
                "commit markers",
                self.manifest_uri,
                exc,
            )
            return None
        if not isinstance(data, dict) or not isinstance(data.get("checkpoints", []), list):
            logger.warning(
                "The manifest %s is not a checkpoint manifest; rebuilding the checkpoint list "
                "from the commit markers",
                self.manifest_uri,
            )
            return None
        return data

    def read_marker(self, name: str) -> CheckpointRecord | None:
        """The record in folder ``name``'s commit marker; None when the folder is not committed.

        A missing marker (an interrupted upload), a tombstone (an interrupted deletion),
        an unreadable marker, or one describing another folder (copied along with a
        checkpoint's files) all mean "not committed".
        """
        marker = join_uri(self.run_path, name, COMMIT_MARKER)
        try:
            data = json.loads(self.storage.read_bytes(marker))
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None
        except ValueError:
            logger.warning("Ignoring unreadable commit marker %s", marker)
            return None
        if not isinstance(data, dict) or data.get("tombstone") or data.get("name") != name:
            return None
        try:
            record = CheckpointRecord.from_json(data)
        except ValueError as exc:
            logger.warning("Ignoring commit marker %s: %s", marker, exc)
            return None
        record.path = join_uri(self.run_path, name)  # the run folder may have been moved
        return record.attach_filesystem(self.storage.filesystem)

    def restore(self, delete_uncommitted: bool = False) -> list[str]:
        """Load the run's committed checkpoints, checking each against its commit marker.

        Every sub-folder of the run folder is read: a folder whose marker is valid and whose
        files match the marker's list is a committed checkpoint (the manifest adds what
        validation recorded later); a folder with a valid marker but missing or changed
        files is skipped with a warning and left alone; a folder without a valid marker is
        uncommitted. A record the manifest lists whose folder is gone or damaged is
        skipped with a warning.

        With ``delete_uncommitted`` (the run's driver, before any worker starts), uncommitted
        folders are deleted (they hold files of an interrupted upload or deletion, and can
        never be resumed from) and a manifest that disagrees with the markers is rewritten.
        Returns the names of the deleted folders.
        """
        manifest = self.manifest_data = self.read_manifest()
        indexed: dict[str, dict[str, Any]] = {}
        for item in (manifest or {}).get("checkpoints", []):
            if isinstance(item, dict) and isinstance(item.get("name"), str):
                indexed[item["name"]] = item
        next_round = (manifest or {}).get("next_round", 0)
        self.next_round = next_round if isinstance(next_round, int) else 0

        listing = self.storage.list_stored(self.run_path, fingerprints=False)  # sizes suffice
        by_folder: dict[str, dict[str, StoredFile]] = {}
        for rel, stored in listing.items():
            folder, sep, inner = rel.partition("/")
            if sep:
                by_folder.setdefault(folder, {})[inner] = stored
        folders = sorted(set(by_folder) | set(self.storage.list_dirs(self.run_path)))

        records: list[CheckpointRecord] = []
        deleted: list[str] = []
        for name in folders:
            default_round = round_of_default_name(name)
            if default_round is not None:  # never reuse a name that is or was in use
                self.note_round(default_round)
            record = self.read_marker(name)
            if record is None:
                if default_round is None:
                    # Not a name the runtime picks by itself: leave it alone. A new checkpoint
                    # under this name is checked against stray files before its commit.
                    logger.info("Folder %s of the run holds no committed checkpoint", name)
                    continue
                if delete_uncommitted:
                    logger.warning(
                        "Deleting uncommitted checkpoint folder %s (left by an interrupted "
                        "upload or deletion; it can never be resumed from)",
                        join_uri(self.run_path, name),
                    )
                    self.storage.delete_dir(join_uri(self.run_path, name))
                    deleted.append(name)
                continue
            problem = _files_problem(record, by_folder.get(name, {}))
            if problem is not None:
                logger.warning(
                    "Skipping checkpoint %s: %s. It is not resumed from and not listed; its "
                    "files are left as they are",
                    record.path,
                    problem,
                )
                continue
            later = indexed.get(name)
            if later is not None:
                _apply_index(record, later)
            elif manifest is not None:
                logger.info("Recovered committed checkpoint %s missing from the manifest", name)
            records.append(record)
        verified = {r.name for r in records}
        for name in sorted(set(indexed) - verified):
            logger.warning(
                "The manifest lists checkpoint %s but its folder is missing or damaged; "
                "skipping it",
                join_uri(self.run_path, name),
            )
        self.records = sorted(records, key=lambda r: r.round)
        for record in self.records:
            self.note_round(record.round)
        if delete_uncommitted and (manifest is not None or self.records):
            listed = [item.get("name") for item in (manifest or {}).get("checkpoints", [])]
            if manifest is None or listed != [r.name for r in self.records]:
                logger.warning(
                    "Rewriting the manifest %s from the commit markers", self.manifest_uri
                )
                self.save()
        return deleted


def _apply_index(record: CheckpointRecord, item: dict[str, Any]) -> None:
    """Merge what the manifest recorded after the commit (validation) into ``record``."""
    status = item.get("status")
    if isinstance(status, str) and status in {s.value for s in CheckpointStatus}:
        record.status = CheckpointStatus(status)
    metrics = item.get("validation_metrics")
    if isinstance(metrics, dict):
        record.validation_metrics = _metrics_from_json(metrics)
    error = item.get("validation_error")
    if isinstance(error, str):
        record.validation_error = error
    # Manifests of version 1 carry the metrics too; the marker's copy is the same.


def _files_problem(record: CheckpointRecord, stored: dict[str, StoredFile]) -> str | None:
    """Why the stored folder does not match ``record``'s file list (None when it does)."""
    present = {rel: f for rel, f in stored.items() if Path(rel).name != COMMIT_MARKER}
    if record.files is None:  # committed before markers listed files
        return None if present else "the folder holds no files"
    missing = sorted(set(record.files) - set(present))
    if missing:
        return f"{len(missing)} of its {len(record.files)} file(s) are missing ({missing[0]}, ...)"
    changed = sorted(r for r in record.files if present[r].size != record.files[r].size)
    if changed:
        return f"{len(changed)} file(s) changed size since the commit ({changed[0]}, ...)"
    return None


def verified_files(
    storage: Storage,
    uri: str,
    round_index: int,
    stored: Mapping[int, dict[str, StoredFile] | None],
) -> dict[str, StoredFile]:
    """The checkpoint's files, checked in storage against what every rank stored.

    A checkpoint with no files is valid (every rank reported an empty folder), as in Ray
    Train. Refuses (nothing is committed) a checkpoint whose files are missing
    or not the ones the ranks wrote (another writer, such as a worker of an earlier
    driver, touched the folder), or files no rank reported. ``stored``: rank -> what it
    stored (None: it wrote in place, so the folder may hold files no rank listed).
    """
    listed = {
        rel: f
        for rel, f in storage.list_stored(uri).items()
        if rel != COMMIT_MARKER and not is_store_temp(rel)  # a dead writer's, not a file
    }
    expected: dict[str, list[tuple[int, StoredFile]]] = {}
    in_place = False
    for rank, files in sorted(stored.items()):
        if files is None:
            in_place = True
            continue
        for rel, f in files.items():
            expected.setdefault(rel, []).append((rank, f))
    for rel, by_rank in sorted(expected.items()):
        sizes = {f.size for _, f in by_rank}
        if len(sizes) > 1:
            ranks = ", ".join(f"rank {r}: {f.size} bytes" for r, f in by_rank)
            raise UserConfigError(
                f"checkpoint {uri}: ranks wrote different files under the same name "
                f"{rel} ({ranks}); only one survives. Give each rank's files their own "
                "names (e.g. f'shard_{rank}.pt')"
            )
        now = listed.get(rel)
        if now is None:
            raise WorkerFailure(f"checkpoint {uri} is incomplete: {rel} is missing")
        if all(now != f for _, f in by_rank):
            raise WorkerFailure(
                f"checkpoint {uri}: {rel} was overwritten after rank "
                f"{by_rank[-1][0]} stored it (another process wrote into the folder)"
            )
    if not in_place:
        extra = sorted(set(listed) - set(expected))
        if extra:
            raise WorkerFailure(
                f"checkpoint {uri} holds {len(extra)} file(s) no rank reported ("
                f"{', '.join(extra[:3])}{', ...' if len(extra) > 3 else ''}), e.g. left "
                "by a worker of an earlier attempt; it is not committed"
            )
    return listed
