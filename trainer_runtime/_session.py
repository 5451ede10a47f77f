"""The worker-side session behind ``report()``, ``get_checkpoint()`` and ``get_context()``.

One session exists per worker process while its train function runs. It turns
``report()`` calls into events for the controller and runs checkpoint uploads
(in the calling thread for SYNC, in the background uploader for ASYNC).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainer_runtime import preemption
from trainer_runtime._events import (
    Event,
    ReportEvent,
    RequestEvent,
    UploadDoneEvent,
    UploadFailedEvent,
    WorkerFinishedEvent,
)
from trainer_runtime._fencing import FenceCheck, FencedStorage
from trainer_runtime._layout import (
    COMMIT_MARKER,
    checkpoint_dir_name_problem,
    default_checkpoint_dir_name,
)
from trainer_runtime._metrics import validate_metrics
from trainer_runtime._snapshot import take_snapshot
from trainer_runtime._uploader import AsyncUploader, UploadJob, run_upload
from trainer_runtime.checkpoint import Checkpoint, CheckpointUploadMode
from trainer_runtime.config import ValidationTaskConfig
from trainer_runtime.context import TrainContext
from trainer_runtime.errors import CheckpointUploadError, ReportError, UserConfigError
from trainer_runtime.reported_checkpoint import CheckpointConsistencyMode
from trainer_runtime.storage import Storage, TransferStats, get_storage, join_uri
from trainer_runtime.storage.base import describe_error, is_permanent_error

logger = logging.getLogger(__name__)

Sink = Callable[[Event], None]

#: ``broadcast_from_rank_zero`` warns above this many pickled bytes (Ray Train's limit).
MAX_BROADCAST_SIZE_BYTES = 1000
#: How often a rank waiting for the controller checks that the run is still healthy.
_REPLY_POLL_S = 0.5


class _Reply:
    """One answer a rank waits for (see :meth:`TrainSession.request`)."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.value: Any = None


__all__ = ["TrainSession", "default_checkpoint_dir_name", "get_session", "set_session"]


class TrainSession:
    """State of one worker's train function run."""

    def __init__(
        self,
        context: TrainContext,
        sink: Sink,
        latest_checkpoint: Checkpoint | None,
        round_offset: int,
        health_check: Callable[[], None] | None = None,
        max_pending_uploads: int | None = None,
        default_upload_mode: str | None = None,
        driver_epoch: int | None = None,
        validation_fn_set: bool = False,
        claim_uploads: bool = False,
        dataset_shards: dict[str, Any] | None = None,
    ) -> None:
        self.context = context
        #: This rank's Ray Data iterators by dataset name (``get_dataset_shard``).
        self.dataset_shards: dict[str, Any] = dict(dataset_shards or {})
        self.run_path = context.get_run_path()
        storage = get_storage(self.run_path, context.storage_filesystem)
        #: Every write of this worker into the run goes through the fence: it stops once a
        #: newer driver owns the run (see ``_fencing``).
        self.storage: Storage = (
            FencedStorage(storage, FenceCheck(storage, self.run_path, driver_epoch))
            if driver_epoch
            else storage
        )
        self._sink = sink
        self.latest_checkpoint = latest_checkpoint
        self.next_round = round_offset
        #: How long the previous ``report()`` call took (sent with the next report).
        self._previous_report_s: float | None = None
        self._health_check = health_check
        self._max_pending = max_pending_uploads or int(
            os.environ.get("TRAINJOB_MAX_PENDING_UPLOADS", "2")
        )
        self.default_upload_mode = default_upload_mode or CheckpointUploadMode.SYNC.value
        #: Whether the trainer has a ``ValidationConfig.fn`` (``report(validation=True)``).
        self.validation_fn_set = validation_fn_set
        #: ``FailureConfig.relax_collectives_on_preemption``: a round may commit without this
        #: rank, so each upload first asks the controller whether its round is still open
        #: (see :meth:`_claim_upload`).
        self.claim_uploads = claim_uploads and context.world_size > 1
        self._uploader: AsyncUploader | None = None
        self._lock = threading.Lock()
        #: See :meth:`_protected_local_folders` (None: not looked up yet).
        self._protected: tuple[tuple[str, Path, frozenset[tuple[int, int]]], ...] | None = None
        #: Answers this rank waits for, by request id (see :meth:`request`).
        self._replies: dict[int, _Reply] = {}
        self._next_request = 0
        #: Collectives entered so far (every rank enters them in the same order).
        self.collective_seq = 0

    # -- datasets -------------------------------------------------------------------------
    def get_dataset_shard(self, dataset_name: str | None) -> Any:
        """See :func:`trainer_runtime.get_dataset_shard`."""
        try:
            return self.dataset_shards[dataset_name]  # type: ignore[index]
        except KeyError:
            given = sorted(self.dataset_shards)
            # Ray Train's sentence first (code may match it), then what was given and the fix.
            raise KeyError(
                f"Dataset shard for '{dataset_name}' not found. Please ensure that the dataset "
                "is passed through the Trainer `datasets` argument. "
                + (
                    f"The trainer's datasets are {given}"
                    if given
                    else "The trainer was given no datasets"
                )
                + f": pass datasets={{{dataset_name!r}: ray.data.Dataset}} to the trainer, "
                "or read one of the given names"
            ) from None

    # -- report ---------------------------------------------------------------------------
    def report(
        self,
        metrics: dict[str, Any],
        checkpoint: Checkpoint | None = None,
        checkpoint_dir_name: str | None = None,
        checkpoint_upload_mode: CheckpointUploadMode | str | None = None,
        delete_local_checkpoint_after_upload: bool | None = None,
        validation: bool | ValidationTaskConfig = False,
        validate_fn: Callable[..., Any] | None = None,
        validate_config: dict[str, Any] | None = None,
        checkpoint_upload_fn: Callable[[Checkpoint, str], Checkpoint] | None = None,
    ) -> None:
        """See :func:`trainer_runtime.report`.

        The steps: check the arguments (before anything is sent), then a round without a
        checkpoint is reported at once; a checkpoint gets its folder in the run's storage,
        and is then stored by the user (``NO_UPLOAD``), by ``checkpoint_upload_fn``, or
        uploaded by the runtime, now (SYNC) or in the background (ASYNC). The report event
        carries the validation to run once its round commits.
        """
        started = time.monotonic()
        try:
            self._report(
                metrics,
                checkpoint,
                checkpoint_dir_name,
                checkpoint_upload_mode,
                delete_local_checkpoint_after_upload,
                validation,
                validate_fn,
                validate_config,
                checkpoint_upload_fn,
            )
        finally:
            self._previous_report_s = time.monotonic() - started

    def _report(
        self,
        metrics: dict[str, Any],
        checkpoint: Checkpoint | None,
        checkpoint_dir_name: str | None,
        checkpoint_upload_mode: CheckpointUploadMode | str | None,
        delete_local_checkpoint_after_upload: bool | None,
        validation: bool | ValidationTaskConfig,
        validate_fn: Callable[..., Any] | None,
        validate_config: dict[str, Any] | None,
        checkpoint_upload_fn: Callable[[Checkpoint, str], Checkpoint] | None,
    ) -> None:
        task = self._validation_task(validation, checkpoint)
        self._raise_if_run_failed()
        clean_metrics = validate_metrics(metrics)
        mode = self._upload_mode(checkpoint_upload_mode)
        _check_report_arguments(
            checkpoint, checkpoint_dir_name, checkpoint_upload_fn, validate_fn, validate_config
        )
        round_index = self.next_round
        rank = self.context.world_rank
        if checkpoint is None:  # validate_fn and validate_config are ignored, as in Ray
            self.next_round += 1
            self._sink(
                ReportEvent(
                    rank,
                    round_index,
                    clean_metrics,
                    upload_mode=mode.value,
                    previous_report_s=self._previous_report_s,
                )
            )
            return

        dest, folder_stat = self._checkpoint_destination(
            checkpoint, checkpoint_dir_name, mode, checkpoint_upload_fn is not None, round_index
        )
        self.next_round += 1
        delete_after = self._delete_after_upload(
            checkpoint, mode, delete_local_checkpoint_after_upload, folder_stat
        )
        event = ReportEvent(
            rank,
            round_index,
            clean_metrics,
            checkpoint_uri=dest,
            upload_mode=mode.value,
            validate_fn=validate_fn,
            validate_config=validate_config,
            validation=task,
            previous_report_s=self._previous_report_s,
        )
        if mode is CheckpointUploadMode.NO_UPLOAD:
            self._report_stored(event, dest)
        elif checkpoint_upload_fn is not None:
            self._report_with_upload_fn(
                event, checkpoint, checkpoint_upload_fn, dest, mode, delete_after
            )
        else:
            self._report_with_upload(event, checkpoint, dest, mode, delete_after)

    def _raise_if_run_failed(self) -> None:
        """Raise, before this round is reported, what already failed: the run's health
        check (another rank or the controller failed) or an earlier ASYNC upload."""
        if self._health_check is not None:
            self._health_check()
        if self._uploader is not None:
            self._uploader.raise_if_failed()

    def _upload_mode(self, requested: CheckpointUploadMode | str | None) -> CheckpointUploadMode:
        """``report(checkpoint_upload_mode=...)``, or the trainer's default when not given."""
        try:
            return CheckpointUploadMode.parse(
                requested if requested is not None else self.default_upload_mode
            )
        except ValueError as exc:
            raise ReportError(f"report(): {exc}") from None

    def _checkpoint_destination(
        self,
        checkpoint: Checkpoint,
        checkpoint_dir_name: str | None,
        mode: CheckpointUploadMode,
        has_upload_fn: bool,
        round_index: int,
    ) -> tuple[str, os.stat_result | None]:
        """The checkpoint's folder in the run's storage, and the reported local folder's
        ``os.stat`` (None when not local or not to be uploaded).

        ``NO_UPLOAD``: the checkpoint must already be a folder of the run's folder. Otherwise
        the folder is ``checkpoint_dir_name`` or the round's default name, and (without a
        ``checkpoint_upload_fn``) the checkpoint must be local.
        """
        if mode is CheckpointUploadMode.NO_UPLOAD:
            dest = checkpoint.path
            if join_uri(self.run_path, dest.rsplit("/", 1)[-1]) != dest:
                raise ReportError(
                    f"report(checkpoint_upload_mode=NO_UPLOAD): checkpoint {dest} is not a "
                    f"folder of this run's folder {self.run_path}; write it to "
                    "get_context().get_storage().build_checkpoint_path_from_name(NAME), or "
                    "let report() upload it (SYNC or ASYNC)"
                )
            if (problem := checkpoint_dir_name_problem(dest.rsplit("/", 1)[-1])) is not None:
                raise ReportError(f"report(): checkpoint folder {dest}: {problem}")
            return dest, None
        if not has_upload_fn and not checkpoint.is_local:
            raise ReportError(
                f"report(): checkpoint {checkpoint.path} is already in remote storage; "
                "pass checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD for it"
            )
        folder_stat = _stat_reported_folder(checkpoint.path) if checkpoint.is_local else None
        name = checkpoint_dir_name or default_checkpoint_dir_name(round_index)
        return join_uri(self.run_path, name), folder_stat

    def _delete_after_upload(
        self,
        checkpoint: Checkpoint,
        mode: CheckpointUploadMode,
        requested: bool | None,
        folder_stat: os.stat_result | None,
    ) -> bool:
        """Whether the reported folder is deleted once uploaded (by default: ASYNC only);
        refuses a folder that holds the run's own storage."""
        delete_after = requested if requested is not None else mode is CheckpointUploadMode.ASYNC
        if delete_after and mode is not CheckpointUploadMode.NO_UPLOAD and checkpoint.is_local:
            self._refuse_deleting_storage(Path(checkpoint.path), bool(requested), folder_stat)
        return delete_after

    def _report_stored(self, event: ReportEvent, dest: str) -> None:
        """``NO_UPLOAD``: the user stored the checkpoint in ``dest``; it is reported as
        uploaded at once."""
        self._sink(event)
        self._sink(UploadDoneEvent(event.rank, event.round, dest, stored=None))
        self.latest_checkpoint = Checkpoint(dest)

    def _report_with_upload(
        self,
        event: ReportEvent,
        checkpoint: Checkpoint,
        dest: str,
        mode: CheckpointUploadMode,
        delete_after: bool,
    ) -> None:
        """SYNC or ASYNC upload of the local folder by the runtime (a folder that already
        holds a commit marker is uploaded from a copy without it)."""
        local_dir = Path(checkpoint.path)
        snapshot = take_snapshot(local_dir)
        if snapshot.has_commit_marker:
            local_dir = _copy_without_commit_marker(checkpoint)
            delete_after = True  # the copy is ours; the reported folder is left as it is
            snapshot = take_snapshot(local_dir)
        job = UploadJob(event.round, local_dir, dest, delete_after, snapshot)
        job.claim = self._claim_for(event.round)
        if mode is not CheckpointUploadMode.SYNC:
            self._sink(event)
            self._get_uploader().submit(job)
            return
        try:
            stats = run_upload(self.storage, job)
        except Exception as exc:
            if local_dir != Path(checkpoint.path):
                shutil.rmtree(local_dir, ignore_errors=True)
            self._sink(event)
            self._on_upload_failed(job, exc)
            if isinstance(exc, ReportError):
                raise
            raise CheckpointUploadError(
                f"uploading checkpoint {checkpoint.path} to {dest} failed: {describe_error(exc)}"
            ) from exc
        if stats is None:  # the round was committed without this rank
            return
        self._sink(event)
        self._on_upload_done(job, stats)

    def _report_with_upload_fn(
        self,
        event: ReportEvent,
        checkpoint: Checkpoint,
        upload_fn: Callable[[Checkpoint, str], Checkpoint],
        dest: str,
        mode: CheckpointUploadMode,
        delete_after: bool,
    ) -> None:
        """``report(checkpoint_upload_fn=fn)``: ``fn(checkpoint, checkpoint_dir_name)`` stores
        the checkpoint itself (SYNC: now, ASYNC: in the background uploader, in report
        order) and returns a Checkpoint of the stored folder, which must be ``dest``
        (``get_context().get_storage().build_checkpoint_path_from_name(name)``). The commit
        then lists that folder, as for ``NO_UPLOAD``."""
        name = dest.rsplit("/", 1)[-1]

        def upload() -> str:
            stored = upload_fn(checkpoint, name)
            if not isinstance(stored, Checkpoint):
                # Ray Train's sentence first (users match its text), then ours.
                raise ReportError(
                    "checkpoint_upload_fn must return a `ray.train.Checkpoint`. Actual type "
                    f"is {type(stored)}. Here: return a `trainer_runtime.Checkpoint` of the "
                    "folder it stored the files in."
                )
            if not _same_folder(stored, dest):
                raise ReportError(
                    "Your `checkpoint_upload_fn` returned a checkpoint outside the experiment "
                    f"directory's folder for this checkpoint: it returned {stored.path}, and "
                    f"must store the files in {dest} (get_context().get_storage()."
                    "build_checkpoint_path_from_name(checkpoint_dir_name)) and return "
                    "Checkpoint(that path)"
                )
            if delete_after:
                _delete_source(checkpoint)
            return dest

        job = UploadJob(event.round, Path(checkpoint.path), dest, False, upload_fn=upload)
        job.claim = self._claim_for(event.round)
        if mode is CheckpointUploadMode.SYNC:
            # The user's exception propagates from report(), as in Ray Train.
            stats = run_upload(self.storage, job)
            if stats is None:  # the round was committed without this rank
                return
            self._sink(event)
            self._on_upload_done(job, stats)
            return
        self._sink(event)
        self._get_uploader().submit(job)

    def _validation_task(
        self, validation: bool | ValidationTaskConfig, checkpoint: Checkpoint | None
    ) -> ValidationTaskConfig | None:
        """``report(validation=...)`` as a task config (None: no validation), or Ray's errors."""
        if validation is False or validation is None:
            return None
        if not isinstance(validation, bool | ValidationTaskConfig):
            raise ReportError(
                "report(validation=...) must be True, False or a ValidationTaskConfig, got "
                f"{validation!r}"
            )
        if not self.validation_fn_set:
            raise ReportError(
                "`validation_config` was not set on the trainer, but a validation was requested."
            )
        if checkpoint is None:
            raise ReportError(
                "Validation requires a checkpoint to be provided. Pass the checkpoint to "
                "validate in the same report() call: report(metrics, checkpoint=..., "
                "validation=...)."
            )
        task = ValidationTaskConfig() if validation is True else validation
        try:
            json.dumps(task.fn_kwargs)
        except (TypeError, ValueError) as exc:
            raise ReportError(
                f"report(validation=ValidationTaskConfig(fn_kwargs=...)): fn_kwargs must be "
                f"JSON-serialisable ({exc})"
            ) from None
        return task

    def _refuse_deleting_storage(
        self, folder: Path, explicit: bool, folder_stat: os.stat_result | None = None
    ) -> None:
        """Refuse to delete, after its upload, a folder that holds the run's own storage:
        one that is the run folder, the storage root, or a folder above either, however
        named (a symlink or bind mount included: folders are compared by device and inode).
        ``folder_stat``: ``os.stat(folder)`` when the caller has it."""
        protected = self._protected_local_folders()
        if not protected:
            return
        try:
            st = folder_stat if folder_stat is not None else os.stat(folder)
        except OSError:
            return  # nothing there to delete
        for what, path, folders in protected:
            if (st.st_dev, st.st_ino) in folders:
                why = "" if explicit else " (the default with CheckpointUploadMode.ASYNC)"
                raise ReportError(
                    f"report(): checkpoint folder {folder.resolve()} contains this run's {what} "
                    f"{path}, and delete_local_checkpoint_after_upload=True{why} would delete "
                    "it. Write the checkpoint to a new temporary folder (tempfile.mkdtemp()), or "
                    "pass delete_local_checkpoint_after_upload=False"
                )

    def _protected_local_folders(self) -> tuple[tuple[str, Path, frozenset[tuple[int, int]]], ...]:
        """The run folder and the storage root, each with the (device, inode) of itself and
        of every folder above it; empty when the run's storage is not local. Kept once every
        one of those folders exists (they do not move during a run), so report() costs one
        ``stat`` of the reported folder instead of a realpath walk per folder."""
        if self._protected is not None:
            return self._protected
        if not self.storage.local_path(self.run_path):
            self._protected = ()
            return self._protected
        protected = []
        complete = True
        for what, where in (
            ("run folder", self.run_path),
            ("storage_path", self.context.storage_path),
        ):
            path = Path(where).resolve()
            folders = set()
            for folder in (path, *path.parents):
                try:
                    st = os.stat(folder)
                except OSError:
                    complete = False  # not created yet: look again at the next report()
                    continue
                folders.add((st.st_dev, st.st_ino))
            protected.append((what, path, frozenset(folders)))
        result = tuple(protected)
        if complete:
            self._protected = result
        return result

    # -- uploads --------------------------------------------------------------------------
    def _claim_for(self, round_index: int) -> Callable[[], bool] | None:
        """The claim an upload of round ``round_index`` makes first (None: no claim needed)."""
        if not self.claim_uploads:
            return None
        return lambda: self._claim_upload(round_index)

    def _claim_upload(self, round_index: int) -> bool:
        """Ask the controller to wait for this rank's upload of ``round_index``; False when
        the round was already committed without this rank (relaxed collectives), so nothing
        may be written into its folder. Race-free: the controller applies the claim and the
        commit under one lock, and a round it accepted a claim for waits for that upload."""
        return bool(self.request("upload_claim", round_index))

    def prestart_uploader(self) -> None:
        """Start the background uploader before the train function runs.

        Started lazily, the first ASYNC ``report()`` waited for the new thread to be scheduled,
        which on a busy machine can take tens of milliseconds.
        """
        self._get_uploader()

    def _get_uploader(self) -> AsyncUploader:
        with self._lock:
            if self._uploader is None:
                self._uploader = AsyncUploader(
                    self.storage, self._on_upload_done, self._on_upload_failed, self._max_pending
                )
            return self._uploader

    def _on_upload_done(self, job: UploadJob, stats: TransferStats) -> None:
        # What get_checkpoint() returns now.
        self.latest_checkpoint = Checkpoint(job.dest_uri, self.storage.filesystem)
        self._sink(
            UploadDoneEvent(
                self.context.world_rank,
                job.round,
                job.dest_uri,
                stats.files,
                stats.bytes,
                stats.seconds,
                # A checkpoint_upload_fn stored the files: the commit lists the folder.
                stored=None if job.upload_fn is not None else stats.stored,
            )
        )

    def _on_upload_failed(self, job: UploadJob, exc: BaseException) -> None:
        self._sink(
            UploadFailedEvent(
                self.context.world_rank,
                job.round,
                job.dest_uri,
                describe_error(exc),
                permanent=is_permanent_error(exc),
                source_error=isinstance(exc, ReportError),
                # A checkpoint_upload_fn's own exception is the worker's failure (as in Ray).
                exception=exc if job.upload_fn is not None and _sendable(exc) else None,
            )
        )

    # -- answers from the controller --------------------------------------------------------
    def request(self, kind: str, payload: Any) -> Any:
        """Send a request to the controller and wait for its answer (delivered through
        :meth:`deliver`); while waiting, a failed run (local mode) is raised here."""
        with self._lock:
            request_id = self._next_request
            self._next_request += 1
            reply = self._replies[request_id] = _Reply()
        self._sink(RequestEvent(self.context.world_rank, request_id, kind, payload))
        while not reply.event.wait(_REPLY_POLL_S):
            if self._health_check is not None:
                self._health_check()
        if isinstance(reply.value, _Failed):
            raise reply.value.error
        return reply.value

    def deliver(self, request_id: int, value: Any) -> None:
        """The controller's answer to request ``request_id``."""
        with self._lock:
            reply = self._replies.pop(request_id, None)
        if reply is not None:
            reply.value = value
            reply.event.set()

    def broadcast_from_rank_zero(self, data: Any, caller: str) -> Any:
        """Wait until every rank called a collective; return rank 0's ``data``."""
        if data is not None:
            size = len(_dumps(data))  # unpicklable data raises here, as in Ray Train
            if size > MAX_BROADCAST_SIZE_BYTES:
                logger.warning(
                    "Data size %d bytes exceeds the maximum broadcast size of %d bytes",
                    size,
                    MAX_BROADCAST_SIZE_BYTES,
                )
        self.collective_seq += 1
        if self.context.world_size == 1:
            return data
        return self.request("collective", (self.collective_seq, caller, data))

    def get_preemption_info(self) -> Any:
        """See :func:`trainer_runtime.get_preemption_info`: a collective that gathers every
        rank's notice and returns the controller's one answer."""
        if self._health_check is not None:
            self._health_check()
        noticed, deadline_ms = preemption.local_notice()
        self.collective_seq += 1
        return self.request(
            "collective",
            (
                self.collective_seq,
                preemption.PREEMPTION_CALLER,
                (preemption.node_id(), noticed, deadline_ms),
            ),
        )

    def get_all_reported_checkpoints(self, consistency_mode: Any, timeout_s: float | None) -> Any:
        """See :func:`trainer_runtime.get_all_reported_checkpoints`."""
        if isinstance(consistency_mode, str):
            consistency_mode = CheckpointConsistencyMode(consistency_mode.upper())
        if not isinstance(consistency_mode, CheckpointConsistencyMode):
            raise ValueError(f"Unexpected CheckpointConsistencyMode: {consistency_mode}")
        if timeout_s is not None and timeout_s < 0:
            raise ValueError(f"timeout_s must be None or >= 0, got {timeout_s}")
        return self.request(
            "reported_checkpoints", (self.next_round, consistency_mode.value, timeout_s)
        )

    @property
    def upload_blocked_seconds(self) -> float:
        """Time ``report()`` spent waiting for a free upload slot."""
        return self._uploader.blocked_seconds if self._uploader else 0.0

    def finish(
        self,
        error: BaseException | None,
        traceback_text: str | None = None,
        return_value: Any = None,
    ) -> None:
        """Wait for pending uploads, then tell the controller how the train function ended
        (``return_value``: what it returned; only rank 0's is sent, as Ray Train keeps
        rank 0's in ``Result.return_value``)."""
        if self.context.world_rank != 0:
            return_value = None
        if self._uploader is not None:
            try:
                self._uploader.drain()
            except CheckpointUploadError as exc:
                if error is None:
                    error = exc
                    traceback_text = None
            finally:
                self._uploader.close()
        self._sink(
            WorkerFinishedEvent(
                self.context.world_rank,
                error=None if error is None else f"{type(error).__name__}: {error}",
                traceback=traceback_text,
                exception=error if error is not None and _sendable(error) else None,
                config_error=isinstance(error, ReportError | UserConfigError),
                return_value=None if error is not None else return_value,
            )
        )


def _check_report_arguments(
    checkpoint: Checkpoint | None,
    checkpoint_dir_name: str | None,
    checkpoint_upload_fn: Callable[..., Any] | None,
    validate_fn: Callable[..., Any] | None,
    validate_config: dict[str, Any] | None,
) -> None:
    """The types of ``report()``'s arguments and the combinations it refuses."""
    if checkpoint is not None and not isinstance(checkpoint, Checkpoint):
        raise ReportError(
            f"report(checkpoint=...) must be a trainer_runtime.Checkpoint (use "
            f"Checkpoint.from_directory(path)), got {type(checkpoint).__name__}"
        )
    if checkpoint_upload_fn is not None and not callable(checkpoint_upload_fn):
        raise ReportError(
            f"report(checkpoint_upload_fn=...) must be callable, got {checkpoint_upload_fn!r}"
        )
    if validate_fn is not None and not callable(validate_fn):
        raise ReportError(f"report(validate_fn=...) must be callable, got {validate_fn!r}")
    if validate_config is not None and not isinstance(validate_config, dict):
        raise ReportError("report(validate_config=...) must be a dict")
    if validate_config is not None and validate_fn is None:
        raise ReportError(
            "report(validate_config=...) was given without validate_fn; pass the function "
            "that validates the checkpoint as validate_fn"
        )
    if checkpoint_dir_name is not None and (
        problem := checkpoint_dir_name_problem(checkpoint_dir_name)
    ):
        raise ReportError(f"report(checkpoint_dir_name={checkpoint_dir_name!r}): {problem}")


def _dumps(data: Any) -> bytes:
    """Pickle as Ray does (cloudpickle: lambdas and local classes too) when Ray is there."""
    try:
        from ray import cloudpickle
    except ImportError:
        return pickle.dumps(data)
    out: bytes = cloudpickle.dumps(data)
    return out


def _same_folder(checkpoint: Checkpoint, dest: str) -> bool:
    """Whether ``checkpoint`` is the folder ``dest``: the same path or URI, or (a checkpoint
    with a filesystem) the URI's path without its scheme, as Ray Train spells it."""
    path = checkpoint.path.rstrip("/")
    if path == dest:
        return True
    return checkpoint._filesystem is not None and "://" in dest and dest.split("://", 1)[1] == path


class _Failed:
    """An answer that is an error to raise in the waiting rank."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


def _delete_source(checkpoint: Checkpoint) -> None:
    """Delete a reported folder after ``checkpoint_upload_fn`` stored it (best effort, as Ray)."""
    try:
        if checkpoint.is_local:
            shutil.rmtree(checkpoint.path)
        else:
            get_storage(checkpoint.path, checkpoint._filesystem).delete_dir(checkpoint.path)
    except Exception:  # the upload succeeded; Ray logs and goes on too
        logger.exception(
            "Failed to delete the local checkpoint after a successful upload: %s", checkpoint
        )


def _sendable(exc: BaseException) -> bool:
    """Whether ``exc`` survives pickling (it travels from a Ray worker to the controller)."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:  # noqa: BLE001 - any failure means "send the text only"
        return False
    return True


def _stat_reported_folder(path: str) -> os.stat_result:
    """``os.stat`` of a reported local checkpoint folder; ReportError when it is not one.

    One stat answers "is it a folder" and identifies the folder for the storage guard
    (``TrainSession._refuse_deleting_storage``): report() runs in the training loop's
    thread, where every system call counts."""
    with contextlib.suppress(OSError):
        found = os.stat(path)
        if stat.S_ISDIR(found.st_mode):
            return found
    raise ReportError(
        f"report(): checkpoint directory {path} does not exist; write the checkpoint files "
        "before calling report()"
    )


def _copy_without_commit_marker(checkpoint: Checkpoint) -> Path:
    """A temporary copy of a reported folder that holds a commit marker, without the marker.

    The folder is a committed checkpoint (or a copy of one, marker included). Uploading
    the marker would make the new folder look committed before its other files are
    stored, and with another checkpoint's record; the folder itself is left untouched,
    since it may be a committed checkpoint of this or another run.
    """
    logger.warning(
        "Checkpoint folder %s holds a commit marker (%s), e.g. it is or was copied from a "
        "committed checkpoint; uploading a copy without the marker and leaving the folder as "
        "it is. Use Checkpoint.to_directory() to copy a checkpoint without its marker",
        checkpoint.path,
        COMMIT_MARKER,
    )
    return Path(checkpoint.to_directory(tempfile.mkdtemp(prefix="trainjob_upload_")))


# -- the process-wide current session -------------------------------------------------------
_current: TrainSession | None = None


def set_session(session: TrainSession | None) -> None:
    """Install (or clear) the session of this process."""
    global _current
    _current = session


def get_session(caller: str) -> TrainSession:
    """The current session, or a clear error when called outside a train function."""
    if _current is None:
        raise RuntimeError(
            f"trainer_runtime.{caller}() was called outside a training function. Call it from "
            "the train_loop_per_worker passed to TorchTrainer/JaxTrainer, and start the run "
            "with trainer.fit() (ScalingConfig(num_workers=0) runs it in this process)."
        )
    return _current


def has_session() -> bool:
    """Whether a train function is running in this process."""
    return _current is not None
